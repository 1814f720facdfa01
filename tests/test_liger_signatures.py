"""Liger-Kernel's names called as Liger documents them (issue 21). Every ``liger_*`` function and ``Liger*`` module
that :mod:`tigon.liger_coverage` maps to ``tigon.functional`` / ``tigon.nn`` has Liger-Kernel 0.8.5's positional
parameters (names, order, defaults) recorded here from its wheel, and Tigon's signature is checked against that copy
(and against the installed Liger, where there is one), each documented difference listed with its reason.

The cross-entropy names take every option positionally: each is called here with all of Liger's arguments
positionally and compared with the keyword call. Calls in Tigon's former order are refused, naming it."""

import importlib.metadata
import importlib.util
import inspect

import pytest
import torch

from tigon import functional as F
from tigon._checks import UNSET
from tigon import nn as tnn

LIGER = importlib.util.find_spec("liger_kernel") is not None

# Liger-Kernel 0.8.x's positional parameters, (name, default) in order (src/liger_kernel/transformers/functional.py,
# cross_entropy.py, fused_linear_cross_entropy.py); Tigon calls the first input logits / hidden.
LIGER_CE = [("input", None), ("target", None), ("weight", None), ("size_average", None), ("ignore_index", -100),
            ("reduce", None), ("reduction", "mean"), ("label_smoothing", 0.0), ("lse_square_scale", 0.0),
            ("softcap", None), ("return_z_loss", False), ("return_token_accuracy", False),
            ("return_predicted_tokens", False)]
LIGER_FLCE = [("input", None), ("weight", None), ("target", None), ("bias", None), ("ce_weight", None),
              ("ignore_index", -100), ("lse_square_scale", 0.0), ("label_smoothing", 0.0), ("reduction", "mean"),
              ("softcap", None), ("return_z_loss", False), ("accum_dtype", None), ("use_token_scaling", False),
              ("return_token_accuracy", False), ("return_predicted_tokens", False)]
LIGER_CE_MODULE = [("weight", None), ("ignore_index", -100), ("lse_square_scale", 0.0), ("label_smoothing", 0.0),
                   ("reduction", "mean"), ("softcap", None), ("return_z_loss", False),
                   ("return_token_accuracy", False), ("return_predicted_tokens", False)]
LIGER_FLCE_MODULE = [("ce_weight", None), *LIGER_CE_MODULE[1:7], ("accum_dtype", None), ("use_token_scaling", False),
                     ("return_token_accuracy", False), ("return_predicted_tokens", False)]
RENAMED = {"input": ("logits", "hidden")}


def _positional(fn, skip_self=False):
    params = [p for p in inspect.signature(fn).parameters.values() if p.kind == p.POSITIONAL_OR_KEYWORD]
    return [(p.name, None if p.default is inspect.Parameter.empty or p.default is UNSET else p.default)
            for p in params[skip_self:]]


def _same_order(tigon, liger):
    assert len(tigon) >= len(liger)
    for (name, default), (lname, ldefault) in zip(tigon, liger):
        assert name == lname or name in RENAMED.get(lname, ()), (name, lname)
        assert default == ldefault, (name, default, ldefault)


def test_positional_order_and_defaults_are_ligers():
    _same_order(_positional(F.cross_entropy), LIGER_CE)
    _same_order(_positional(F.fused_linear_cross_entropy), LIGER_FLCE)
    _same_order(_positional(tnn.CrossEntropyLoss.__init__, True), LIGER_CE_MODULE)
    _same_order(_positional(tnn.FusedLinearCrossEntropyLoss.__init__, True), LIGER_FLCE_MODULE)


@pytest.mark.skipif(not LIGER, reason="liger_kernel is not installed")
def test_positional_order_matches_the_installed_liger():
    from liger_kernel.transformers import LigerCrossEntropyLoss, LigerFusedLinearCrossEntropyLoss
    from liger_kernel.transformers import functional as LF

    _same_order(_positional(F.cross_entropy), _positional(LF.liger_cross_entropy))
    _same_order(_positional(F.fused_linear_cross_entropy), _positional(LF.liger_fused_linear_cross_entropy))
    _same_order(_positional(tnn.CrossEntropyLoss.__init__, True), _positional(LigerCrossEntropyLoss.__init__, True))
    _same_order(_positional(tnn.FusedLinearCrossEntropyLoss.__init__, True),
                _positional(LigerFusedLinearCrossEntropyLoss.__init__, True))


def _equal(a, b):
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    assert type(a) is type(b)
    return all(x is None and y is None or torch.equal(x, y) for x, y in zip(a, b))


def _case(device):
    h = torch.randn(7, 16, device=device)
    w = torch.randn(30, 16, device=device) / 2
    b = torch.randn(30, device=device)
    t = torch.randint(0, 30, (7,), device=device)
    t[2] = 0  # ignore_index=0 below: a real class id, so this token is ignored
    return h, w, b, t, torch.rand(30, device=device) + 0.5


def test_cross_entropy_all_arguments_positionally(device):
    h, w, _, t, cw = _case(device)
    x = h @ w.T
    # input, target, weight, size_average, ignore_index, reduce, reduction, label_smoothing, lse_square_scale,
    # softcap, return_z_loss, return_token_accuracy, return_predicted_tokens
    got = F.cross_entropy(x, t, cw, None, 0, None, "sum", 0.1, 1e-3, 5.0, True, True, True)
    want = F.cross_entropy(x, t, weight=cw, ignore_index=0, reduction="sum", label_smoothing=0.1,
                           lse_square_scale=1e-3, softcap=5.0, return_z_loss=True, return_token_accuracy=True,
                           return_predicted_tokens=True)
    assert got.accuracy is not None and got.predicted_tokens[2] == -1 and _equal(got, want)
    m = tnn.CrossEntropyLoss(cw, 0, 1e-3, 0.1, "sum", 5.0, True, True, True)
    assert _equal(m(x, t), want)
    assert (m.ignore_index, m.lse_square_scale, m.label_smoothing, m.reduction, m.softcap) == (0, 1e-3, 0.1, "sum", 5.0)


def test_cross_entropy_legacy_size_average_and_reduce(device):
    # torch's deprecated options, positional in torch's and Liger's order: torch's meaning (Liger ignores them)
    h, w, _, t, _ = _case(device)
    x = h @ w.T
    for size_average, reduce, reduction in [(False, None, "sum"), (None, False, "none"), (True, True, "mean")]:
        with pytest.warns(UserWarning, match=f"use reduction='{reduction}'"):
            got = F.cross_entropy(x, t, None, size_average, -100, reduce)
        assert torch.equal(got, F.cross_entropy(x, t, reduction=reduction))
        with pytest.warns(UserWarning):
            want = torch.nn.functional.cross_entropy(x.double(), t, None, size_average, -100, reduce)
        torch.testing.assert_close(got.double(), want)


def test_flce_all_arguments_positionally(device):
    h, w, b, t, cw = _case(device)
    # input, weight, target, bias, ce_weight, ignore_index, lse_square_scale, label_smoothing, reduction, softcap,
    # return_z_loss, accum_dtype, use_token_scaling, return_token_accuracy, return_predicted_tokens
    got = F.fused_linear_cross_entropy(h, w, t, b, cw, 0, 1e-3, 0.1, "sum", 5.0, True, torch.float32, True, True,
                                       True)
    want = F.fused_linear_cross_entropy(h, w, t, b, class_weight=cw, ignore_index=0, lse_square_scale=1e-3,
                                        label_smoothing=0.1, reduction="sum", softcap=5.0, return_z_loss=True,
                                        accum_dtype=torch.float32, use_token_scaling=True, return_accuracy=True,
                                        return_predicted_tokens=True)
    assert got.z_loss is not None and got.accuracy is not None and _equal(got, want)
    m = tnn.FusedLinearCrossEntropyLoss(cw, 0, 1e-3, 0.1, "sum", 5.0, True, torch.float32, True, True, True)
    assert _equal(m(h, w, t, b), want)
    assert torch.equal(m.class_weight, cw) and m.use_token_scaling and m.accum_dtype == torch.float32


def test_former_positional_order_is_refused_naming_it(device):
    h, w, _, t, _ = _case(device)
    x = h @ w.T
    with pytest.raises(TypeError, match="size_average must be None or a bool.*ignore_index is the 5th"):
        F.cross_entropy(x, t, None, -100, "sum")  # Tigon's former order: ignore_index, reduction
    with pytest.raises(TypeError, match="reduce must be None or a bool.*reduction is the 7th"):
        F.cross_entropy(x, t, None, None, -100, "sum")
    with pytest.raises(TypeError, match="lse_square_scale must be a number.*reduction is the fifth"):
        tnn.CrossEntropyLoss(None, -100, "sum")
    with pytest.raises(TypeError, match="ce_weight must be None or a .V,. tensor.*ignore_index the second"):
        tnn.FusedLinearCrossEntropyLoss(-100, "sum")


def test_chunk_mem_const_is_checked_and_changes_nothing():
    # Liger 0.8.5's 16th positional argument: taken for drop-in calls; Tigon's chunks follow `memory`.
    import torch
    from tigon import functional as TF

    h, w = torch.randn(6, 8, requires_grad=True), torch.randn(11, 8)
    t = torch.tensor([1, 2, -100, 4, 5, 10])
    base = TF.fused_linear_cross_entropy(h, w, t)
    assert torch.equal(TF.fused_linear_cross_entropy(h, w, t, None, None, -100, 0.0, 0.0, "mean", None, False, None,
                                                     False, False, False, 4), base)
    for bad in (0, True, 1.5):
        with pytest.raises(ValueError, match="chunk_mem_const must be a positive int"):
            TF.fused_linear_cross_entropy(h, w, t, chunk_mem_const=bad)


# ---- every mapped name: Liger-Kernel 0.8.5's signatures, recorded ----------------------------------------------------
REQ = inspect.Parameter.empty  # no default
# (name, default) of the positional parameters, in order (``self`` left out), read from the liger_kernel 0.8.5 wheel:
# transformers/functional.py, transformers/rope.py, transformers/*.py (the modules), chunked_loss/*.py.
LIGER_085 = {
    "liger_cross_entropy": [("input", REQ), ("target", REQ), *LIGER_CE[2:]],
    "liger_fused_linear_cross_entropy": [("input", REQ), ("weight", REQ), ("target", REQ), *LIGER_FLCE[3:],
                                         ("chunk_mem_const", 1)],
    "liger_fused_linear_jsd": [("student_input", REQ), ("student_weight", REQ), ("teacher_input", REQ),
                               ("teacher_weight", REQ), ("shift_labels", None), ("jsd_beta", 0.5),
                               ("ignore_index", -100), ("temperature", 1.0), ("accum_dtype", None)],
    "liger_geglu": [("a", REQ), ("b", REQ)],
    "liger_group_norm": [("X", REQ), ("affine_scaling_weight", REQ), ("affine_shifting_bias", REQ),
                         ("num_channels", REQ), ("num_groups", REQ), ("eps", REQ)],
    "liger_jsd": [("input", REQ), ("target", REQ), ("shift_labels", None), ("beta", 0.5), ("ignore_index", -100)],
    "liger_kl_div": [("input", REQ), ("target", REQ), ("size_average", True), ("reduce", True), ("reduction", "mean"),
                     ("log_target", False), ("eps", 1e-10)],
    "liger_tvd": [("input", REQ), ("target", REQ), ("shift_labels", None), ("reduction", "mean"),
                  ("ignore_index", -100)],
    "liger_sparsemax": [("input", REQ), ("dim", -1)],
    "liger_layer_norm": [("X", REQ), ("W", REQ), ("B", REQ), ("eps", REQ)],
    "liger_qwen2vl_mrope": [("q", REQ), ("k", REQ), ("cos", REQ), ("sin", REQ), ("mrope_section", REQ),
                            ("unsqueeze_dim", 1)],
    "liger_relu_squared": [("x", REQ)],
    "liger_rms_norm": [("X", REQ), ("W", REQ), ("eps", REQ), ("offset", 0.0), ("casting_mode", "llama"),
                       ("in_place", True)],
    "liger_poly_norm": [("X", REQ), ("W", REQ), ("B", REQ), ("eps", 1e-6), ("in_place", True)],
    "liger_fused_add_rms_norm": [("X", REQ), ("R", REQ), ("W", REQ), ("eps", REQ), ("offset", 0.0),
                                 ("casting_mode", "llama"), ("in_place", True)],
    "liger_rope": [("q", REQ), ("k", REQ), ("cos", REQ), ("sin", REQ), ("position_ids", None), ("unsqueeze_dim", 1),
                   ("rotary_dim", None)],
    "liger_rotary_pos_emb": [("q", REQ), ("k", REQ), ("cos", REQ), ("sin", REQ), ("position_ids", None),
                             ("unsqueeze_dim", 1), ("rotary_dim", None)],
    "liger_swiglu": [("a", REQ), ("b", REQ)],
    "liger_softmax": [("x", REQ)],
    "liger_dyt": [("x", REQ), ("alpha", REQ), ("gamma", REQ), ("beta", REQ)],
    "LigerCrossEntropyLoss": LIGER_CE_MODULE,
    "LigerFusedLinearCrossEntropyLoss": LIGER_FLCE_MODULE,
    "LigerFusedLinearJSD": [("jsd_beta", 0.5), ("ignore_index", -100), ("temperature", 1.0), ("accum_dtype", None)],
    "LigerJSD": [("beta", 0.5), ("ignore_index", -100)],
    "LigerKLDIVLoss": [("eps", 1e-10)],
    "LigerTVDLoss": [("reduction", "batchmean"), ("ignore_index", -100)],
    "LigerDyT": [("hidden_size", REQ), ("beta", True), ("init_alpha", 0.5)],
    "LigerLayerNorm": [("hidden_size", REQ), ("eps", 1e-6), ("bias", False), ("init_fn", "ones"), ("impl", None),
                       ("mode", None), ("backend", None)],
    "LigerRMSNorm": [("hidden_size", REQ), ("eps", 1e-6), ("offset", 0.0), ("casting_mode", "llama"),
                     ("init_fn", "ones"), ("in_place", True), ("row_mode", None), ("elementwise_affine", True)],
    "LigerFusedAddRMSNorm": [("hidden_size", REQ), ("eps", 1e-6), ("offset", 0.0), ("casting_mode", "llama"),
                             ("init_fn", "ones"), ("in_place", False)],
    "LigerPolyNorm": [("eps", 1e-6), ("in_place", True)],
    "LigerReLUSquared": [],
    "LigerSoftmax": [],
    "LigerSparsemax": [("dim", -1)],
    "LigerGEGLUMLP": [("config", REQ)],
    "LigerSwiGLUMLP": [("config", REQ), ("intermediate_size", None)],
    "LigerMLP": [("config", REQ)],
    "LigerGroupNorm": [("num_channels", REQ), ("num_groups", REQ), ("eps", 1e-6), ("bias", False), ("init_fn", "ones")],
    "LigerTiledGEGLUMLP": [("config", REQ), ("num_shards", None)],
    "LigerTiledSwiGLUMLP": [("config", REQ), ("num_shards", None)],
    "LigerFusedLinearDPOLoss": [("ignore_index", -100), ("beta", 0.1), ("alpha", 1.0), ("compute_nll_loss", False),
                                ("compiled", True), ("use_ref_model", True), ("average_log_prob", False),
                                ("chunk_size", 1), ("loss_type", "sigmoid"), ("label_smoothing", 0.0),
                                ("discopop_tau", 0.05)],
    "LigerFusedLinearCPOLoss": [("ignore_index", -100), ("beta", 0.1), ("alpha", 1.0), ("label_smoothing", 0.0),
                                ("compute_nll_loss", True), ("compiled", True), ("average_log_prob", False),
                                ("chunk_size", 1)],
    "LigerFusedLinearORPOLoss": [("ignore_index", -100), ("beta", 0.1), ("compute_nll_loss", True), ("compiled", True),
                                 ("chunk_size", 1)],
    "LigerFusedLinearSimPOLoss": [("ignore_index", -100), ("beta", 0.1), ("alpha", 1.0), ("label_smoothing", 0.0),
                                  ("compute_nll_loss", True), ("compiled", True), ("gamma", 0.5), ("chunk_size", 1)],
    "LigerFusedLinearKTOLoss": [("ignore_index", -100), ("beta", 0.1), ("compiled", True), ("use_ref_model", False),
                                ("average_log_prob", False), ("chunk_size", 1)],
    "LigerFusedLinearGRPOLoss": [("beta", 0.04), ("compiled", True), ("use_ref_model", True), ("chunk_size", 1),
                                 ("epsilon_low", 0.2), ("epsilon_high", 0.2), ("loss_type", "dapo"),
                                 ("max_completion_length", None), ("importance_sampling_level", "token"),
                                 ("sapo_temperature_pos", 1.0), ("sapo_temperature_neg", 1.05), ("temperature", 1.0),
                                 ("delta", None), ("use_bias_correction_kl", False), ("vespo_k_pos", 2.0),
                                 ("vespo_lambda_pos", 3.0), ("vespo_k_neg", 3.0), ("vespo_lambda_neg", 2.0)],
    "LigerFusedLinearJSDLoss": [("weight_hard_loss", 0.5), ("weight_soft_loss", 0.5), ("beta", 0.5),
                                ("ignore_index", -100), ("temperature", 1.0), ("compiled", True), ("chunk_size", 1024),
                                ("return_soft_hard_loss", False)],
    "LigerVocabParallelCrossEntropy": [("ignore_index", -100), ("label_smoothing", 0.0), ("reduction", "none"),
                                       ("label_smoothing_formula", "pytorch"), ("label_smoothing_mode", "global")],
}
# Mapped names whose signatures are not compared, and why.
NOT_COMPARED = {
    "triton_grpo_loss": "a loss over the logits; F.fused_linear_grpo goes through the LM head, another op",
}
# Argument names Tigon spells otherwise (README "Liger-Kernel's ops by name"): the same position and default, so a
# positional call is the same; a keyword call takes Tigon's name.
RENAMED_ARGS = {
    "liger_cross_entropy": {"input": "logits"},
    "liger_fused_linear_cross_entropy": {"input": "hidden"},
    "liger_geglu": {"a": "gate", "b": "up"},
    "liger_swiglu": {"a": "gate", "b": "up"},
    "liger_layer_norm": {"X": "x", "W": "weight", "B": "bias"},
    "liger_rms_norm": {"X": "x", "W": "weight"},
    "liger_fused_add_rms_norm": {"X": "x", "R": "residual", "W": "weight"},
}
# Defaults Tigon sets otherwise, and why. (A default where Liger has none is compatible and not listed.)
OTHER_DEFAULTS = {
    # the in-place backward's CUDA tests did not pass on the H200 on 2026-12-04: opt-in until they do
    ("liger_poly_norm", "in_place"): False,
    ("liger_fused_add_rms_norm", "in_place"): False,
    ("LigerPolyNorm", "in_place"): False,
    # None: zeros when offset != 0 (HF GemmaRMSNorm's init, offset + w starting at 1), else ones (Liger's "ones");
    # the same as Liger's for offset 0 or an explicit init_fn
    ("LigerRMSNorm", "init_fn"): None,
    ("LigerFusedAddRMSNorm", "init_fn"): None,
}


def _mapped():
    """(Liger name, Tigon object) for every LIGER_OPS entry replaced by tigon.functional / tigon.nn."""
    from tigon.liger_coverage import LIGER_OPS

    out = {}
    for op in LIGER_OPS:
        if op.tigon is not None and op.tigon.startswith(("F.", "nn.")):
            out[op.liger] = getattr(F, op.tigon[2:]) if op.tigon.startswith("F.") else getattr(tnn, op.tigon[3:])
    return out


def _signature(obj):
    """(name, default) of the positional parameters of a function, or of a class's constructor without self."""
    fn, skip = (obj.__init__, 1) if isinstance(obj, type) else (obj, 0)
    params = [p for p in inspect.signature(fn).parameters.values()
              if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)][skip:]
    return [(p.name, p.default) for p in params]


def _check_against(name, tigon_obj, liger_params):
    tigon = _signature(tigon_obj)
    assert len(tigon) >= len(liger_params), (name, tigon, liger_params)
    renamed = RENAMED_ARGS.get(name, {})
    for (tname, tdefault), (lname, ldefault) in zip(tigon, liger_params):
        assert tname == renamed.get(lname, lname), f"{name}: Tigon's {tname!r} where Liger has {lname!r}"
        if ldefault is REQ:
            continue  # Liger requires it: any Tigon default is compatible
        want = OTHER_DEFAULTS.get((name, lname), ldefault)
        assert tdefault is not REQ and type(tdefault) is type(want) and tdefault == want, \
            f"{name}({lname}): Tigon's default {tdefault!r}, Liger's {ldefault!r}"
    # Tigon's own options come after Liger's; device / dtype are keyword-only wherever a module takes them
    if isinstance(tigon_obj, type):
        params = inspect.signature(tigon_obj.__init__).parameters
        for p in ("device", "dtype"):
            assert p not in params or params[p].kind == inspect.Parameter.KEYWORD_ONLY, (name, p)


def test_every_mapped_name_has_a_recorded_signature():
    mapped = set(_mapped())
    assert set(LIGER_085) | set(NOT_COMPARED) == mapped, mapped ^ (set(LIGER_085) | set(NOT_COMPARED))
    assert not set(LIGER_085) & set(NOT_COMPARED)
    for name, args in RENAMED_ARGS.items():
        assert set(args) <= {n for n, _ in LIGER_085[name]}, name
    for name, arg in OTHER_DEFAULTS:
        assert arg in {n for n, _ in LIGER_085[name]}, (name, arg)


@pytest.mark.parametrize("name", sorted(LIGER_085))
def test_signature_is_ligers_0_8_5(name):
    _check_against(name, _mapped()[name], LIGER_085[name])


def _installed_liger(name):
    import liger_kernel.chunked_loss as chunked
    import liger_kernel.transformers as lt
    from liger_kernel.transformers import functional as lf
    from liger_kernel.transformers import group_norm, rope, vocab_parallel_cross_entropy

    for mod in (lf, lt, chunked, group_norm, rope, vocab_parallel_cross_entropy):
        if hasattr(mod, name):
            return getattr(mod, name)
    raise AssertionError(f"{name} not found in the installed liger_kernel")


@pytest.mark.skipif(not LIGER, reason="liger_kernel is not installed")
@pytest.mark.parametrize("name", sorted(LIGER_085))
def test_signature_is_the_installed_ligers(name):
    liger = _signature(_installed_liger(name))
    if importlib.metadata.version("liger-kernel") == "0.8.5":  # the recorded copy is the wheel's
        assert liger == LIGER_085[name], name
    _check_against(name, _mapped()[name], liger)


# ---- Liger's keyword names ------------------------------------------------------------------------------------------
def _keyword_calls(device):
    """(op, Liger's keyword call, the same call by Tigon's names) for each function whose first arguments Liger names
    differently (liger_rms_norm(X, W), liger_layer_norm(X, W, B), liger_fused_add_rms_norm(X, R, W),
    liger_swiglu(a, b), liger_geglu(a, b), liger_cross_entropy(input), liger_fused_linear_cross_entropy(input))."""
    x, r = torch.randn(5, 24, device=device), torch.randn(5, 24, device=device)
    w, b = torch.rand(24, device=device) + 0.5, torch.randn(24, device=device)
    h, head, t = torch.randn(6, 16, device=device), torch.randn(40, 16, device=device) / 4, \
        torch.randint(0, 40, (6,), device=device)
    return [
        ("rms_norm", lambda: F.rms_norm(X=x, W=w, eps=1e-5), lambda: F.rms_norm(x, w, 1e-5)),
        ("rms_norm", lambda: F.rms_norm(x, W=None), lambda: F.rms_norm(x, None)),
        ("layer_norm", lambda: F.layer_norm(X=x, W=w, B=b, eps=1e-5), lambda: F.layer_norm(x, w, b, 1e-5)),
        ("layer_norm", lambda: F.layer_norm(x, w, B=None), lambda: F.layer_norm(x, w, None)),
        ("fused_add_rms_norm", lambda: F.fused_add_rms_norm(X=x, R=r, W=w, eps=1e-5),
         lambda: F.fused_add_rms_norm(x, r, w, 1e-5)),
        ("swiglu", lambda: F.swiglu(a=x, b=r), lambda: F.swiglu(x, r)),
        ("geglu", lambda: F.geglu(a=x, b=r), lambda: F.geglu(x, r)),
        ("cross_entropy", lambda: F.cross_entropy(input=h @ head.T, target=t, label_smoothing=0.1),
         lambda: F.cross_entropy(h @ head.T, t, label_smoothing=0.1)),
        ("fused_linear_cross_entropy", lambda: F.fused_linear_cross_entropy(input=h, weight=head, target=t),
         lambda: F.fused_linear_cross_entropy(h, head, t)),
    ]


def test_ligers_keyword_names_give_the_positional_result(device):
    for op, liger_call, tigon_call in _keyword_calls(device):
        for _ in range(2):  # the second call takes the ops' cache of validated calls
            got, want = liger_call(), tigon_call()
            got, want = (got, want) if isinstance(got, torch.Tensor) else (torch.cat(got), torch.cat(want))
            assert torch.equal(got, want), op


@pytest.mark.parametrize("call, match", [
    (lambda x, w: F.rms_norm(x, w, X=x), "got 'x' and 'X'"),
    (lambda x, w: F.rms_norm(x), "missing required argument 'weight' .or 'W'"),
    (lambda x, w: F.rms_norm(W=w), "missing required argument 'x' .or 'X'"),
    (lambda x, w: F.layer_norm(x, w), "missing required argument 'bias' .or 'B'"),
    (lambda x, w: F.fused_add_rms_norm(x, R=x, weight=w, W=w), "got 'weight' and 'W'"),
    (lambda x, w: F.swiglu(x, b=x, up=x), "got 'up' and 'b'"),
    (lambda x, w: F.geglu(a=x), "missing required argument 'up' .or 'b'"),
    (lambda x, w: F.cross_entropy(x, input=x), "got 'logits' and 'input'"),
    (lambda x, w: F.cross_entropy(input=x), "missing required argument 'target'$"),
    (lambda x, w: F.fused_linear_cross_entropy(input=x, target=w), "missing required argument 'weight'$"),
])
def test_keyword_names_missing_or_twice_raise_naming_them(call, match):
    with pytest.raises(TypeError, match=match):
        call(torch.randn(3, 8), torch.ones(8))


def test_positional_and_tigon_keyword_calls_never_resolve_names(monkeypatch, device):
    # the aliases cost a call by position (the patched modules' calls) a few identity tests, no Python call
    import tigon._checks as checks

    def refuse(*a, **k):
        raise AssertionError("liger_names called")

    x, w = torch.randn(4, 8, device=device), torch.ones(8, device=device)
    for module in ("rms_norm", "layer_norm", "fused_add_rms_norm", "glu", "cross_entropy",
                   "fused_linear_cross_entropy"):
        monkeypatch.setattr(f"tigon.ops.{module}.liger_names", refuse)
    assert checks.liger_names is not refuse
    F.rms_norm(x, w), F.rms_norm(x=x, weight=None), F.layer_norm(x, w, None), F.fused_add_rms_norm(x, x, w)
    F.swiglu(x, x), F.geglu(gate=x, up=x), F.cross_entropy(x, torch.zeros(4, dtype=torch.long, device=device))
    F.fused_linear_cross_entropy(x, torch.randn(5, 8, device=device), torch.zeros(4, dtype=torch.long, device=device))


@pytest.mark.skipif(not LIGER, reason="liger_kernel is not installed")
def test_every_ligers_keyword_name_binds():
    # each mapped liger_X's parameter names, all given by keyword, bind to tigon.functional.X's signature
    from liger_kernel.transformers import functional as LF

    from tigon.liger_coverage import LIGER_OPS

    checked = 0
    for op in LIGER_OPS:
        if not (op.tigon and op.tigon.startswith("F.") and hasattr(LF, op.liger)):
            continue
        theirs = inspect.signature(getattr(LF, op.liger)).parameters
        ours = inspect.signature(getattr(F, op.tigon[2:]))
        ours.bind(**{n: object() for n, p in theirs.items() if p.kind == p.POSITIONAL_OR_KEYWORD})
        checked += 1
    assert checked >= 15, checked


def test_module_forwards_take_ligers_keyword_names(device):
    # LigerCrossEntropyLoss.forward(_input, target), LigerFusedLinearCrossEntropyLoss.forward(lin_weight, _input,
    # target, bias), LigerLayerNorm.forward(hidden_states): keyword calls in Liger's names give the positional result
    h, w, b, t, _ = _case(device)
    x = h @ w.T
    ce = tnn.CrossEntropyLoss()
    assert torch.equal(ce(_input=x, target=t), ce(x, t))
    flce = tnn.FusedLinearCrossEntropyLoss()
    assert torch.equal(flce(lin_weight=w, _input=h, target=t, bias=b), flce(h, w, t, b))
    ln = tnn.LayerNorm(16).to(device)
    assert torch.equal(ln(hidden_states=h), ln(h))
    with pytest.raises(TypeError, match="got 'hidden' and '_input'"):
        flce(h, _input=h, lin_weight=w, target=t)
    with pytest.raises(TypeError, match="missing required argument 'target'"):
        ce(_input=x)
    with pytest.raises(TypeError, match="missing required argument 'input' .or 'hidden_states'"):
        ln()


def test_signatures_show_which_names_are_required():
    # help() / inspect.signature: Tigon's names required, Liger's optional beside them (both read "<required>" before)
    sig = str(inspect.signature(F.rms_norm))
    assert "x: 'torch.Tensor' = <required>" in sig and "X: 'torch.Tensor' = <Liger's name of it>" in sig, sig
