"""torch.compile: Tigon's kernels are custom ops (tigon.kernels), so a patched model compiles without graph breaks.

Checked three ways: ``torch.library.opcheck`` on every custom op (schema, fake implementation against the real one,
autograd registration); each functional op compiled with ``fullgraph=True`` (any graph break raises) against eager
mode, forward and backward; and the ``tiny`` preset model patched by ``tigon.patch``: ``torch._dynamo.explain``
finds as many graph breaks as in the unpatched model (none), and a compiled training step gives eager's loss and
gradients. Compiled with ``backend="aot_eager"`` (dynamo + AOTAutograd, no inductor codegen) to stay fast on CPU:
graph breaks and the fake implementations are decided before the backend runs.
"""

from __future__ import annotations

import warnings

import pytest
import torch

import tigon.functional as TF
from tigon import support

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # as in conftest: kernels compiled or interpreted


@pytest.fixture(autouse=True)
def _fresh_dynamo(monkeypatch):
    # The kernels as custom ops inside the graph (compile mode "kernels"), unless a test sets another mode: these
    # tests check the custom ops; the "auto" mode's own tests are at the end.
    monkeypatch.setenv("TIGON_COMPILE_OPS", "kernels")
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _compiled(fn, seen: set | None = None):
    """fn compiled with ``fullgraph=True`` (aot_eager); ``seen``: a set that collects the Tigon custom ops of its
    graph (``"tigon.rms_norm.default"``...)."""
    if seen is None:
        return torch.compile(fn, backend="aot_eager", fullgraph=True)
    aot_eager = torch._dynamo.lookup_backend("aot_eager")

    def backend(gm, example_inputs):
        seen.update(str(n.target) for n in gm.graph.nodes if str(n.target).startswith("tigon."))
        return aot_eager(gm, example_inputs)

    return torch.compile(fn, backend=backend, fullgraph=True)


def _leaves(*tensors):
    return [t.detach().clone().requires_grad_(t.is_floating_point()) for t in tensors]


def _check_same(fn, inputs, *, atol=1e-5, rtol=1e-5, seen: set | None = None):
    """fn eager vs compiled (fullgraph): outputs and the gradients of every floating input (``seen``: as
    :func:`_compiled`'s)."""
    eager_in, comp_in = _leaves(*inputs), _leaves(*inputs)
    eager_out, comp_out = fn(*eager_in), _compiled(fn, seen)(*comp_in)
    eager_out = [o for o in (eager_out if isinstance(eager_out, tuple) else (eager_out,)) if o is not None]
    comp_out = [o for o in (comp_out if isinstance(comp_out, tuple) else (comp_out,)) if o is not None]
    g = torch.Generator(device="cpu").manual_seed(0)
    seeds = [torch.randn(o.shape, generator=g).to(o) for o in eager_out]
    sum(((o.float() * s.float()).sum() for o, s in zip(eager_out, seeds) if o.requires_grad)).backward()
    sum(((o.float() * s.float()).sum() for o, s in zip(comp_out, seeds) if o.requires_grad)).backward()
    for e, c in zip(eager_out, comp_out):
        torch.testing.assert_close(c, e, atol=atol, rtol=rtol)
    for e, c in zip(eager_in, comp_in):
        if e.grad is not None or c.grad is not None:
            torch.testing.assert_close(c.grad, e.grad, atol=atol, rtol=rtol)


# ---- each custom op: schema, fake vs real, autograd registration -------------------------------------------------
def _opcheck_cases():
    import importlib

    for name in ("rms_norm", "fused_add_rms_norm", "layer_norm", "rope", "glu", "cross_entropy",
                 "fused_linear_cross_entropy", "divergence", "relu_squared", "dyt", "softmax",
                 "poly_norm", "group_norm", "sparsemax", "rms_norm_gated", "moe_glue_compiled"):
        # registers the custom ops (after conftest set TRITON_INTERPRET)
        importlib.import_module(f"tigon.kernels.{name}")

    ops = torch.ops.tigon
    x, w, b = torch.randn(3, 5, 32), torch.randn(32), torch.randn(32)
    q = torch.randn(2, 8, 4, 16).transpose(1, 2)  # (B, H, T, D) view of a (B, T, H, D) projection
    k = torch.randn(2, 8, 2, 16).transpose(1, 2)
    cos, sin = torch.randn(1, 8, 16), torch.randn(1, 8, 16)
    gate_up = torch.randn(6, 2 * 24)
    logits, target = torch.randn(7, 50), torch.tensor([1, 4, -100, 49, 0, 7, 3])
    hidden, head, hb = torch.randn(7, 16), torch.randn(50, 16), torch.randn(50)
    ce = (-100, 0.1, 1e-4, 30.0)
    stats = torch.stack([torch.randn(7), torch.rand(7) + 1.0], 1)  # the rows' (max, log-sum) of a loss forward
    logq, logp = torch.randn(7, 50).log_softmax(-1), torch.randn(7, 50).log_softmax(-1)
    div = importlib.import_module("tigon.kernels.divergence")  # the loss kinds
    # the MoE glue: 5 tokens routed to 2 of 4 experts (int64 positions, int32 offsets; the last expert has no rows)
    route = importlib.import_module("tigon.ops.moe_glue").routing(torch.Generator().manual_seed(0), 5, 4, 2, "cpu")
    pos, offs = route["positions"], route["offsets"]
    rows, moe_w = torch.randn(10, 32), torch.rand(5, 2) + 0.1
    return {
        "rms_norm": (ops.rms_norm, (x, w, 1e-6, 0.0, "llama")),
        "rms_norm_gemma": (ops.rms_norm, (x.to(torch.bfloat16), w, 1e-6, 1.0, "gemma")),
        "rms_norm_backward": (ops.rms_norm_backward, (torch.randn(3, 5, 32), x, w, torch.rand(15) + 0.5, 0.0, True)),
        "fused_add_rms_norm": (ops.fused_add_rms_norm, (x, torch.randn(3, 5, 32), w, 1e-6, 0.0, "llama")),
        "fused_add_rms_norm_gemma": (ops.fused_add_rms_norm, (x.to(torch.bfloat16), torch.randn(3, 5, 32).to(
            torch.bfloat16), w, 1e-6, 1.0, "gemma")),
        "fused_add_rms_norm_backward": (ops.fused_add_rms_norm_backward,
                                        (torch.randn(3, 5, 32), torch.randn(3, 5, 32), x, w, torch.rand(15) + 0.5,
                                         0.0, True)),
        "fused_add_rms_norm_backward_no_ds": (ops.fused_add_rms_norm_backward,
                                              (torch.randn(3, 5, 32), None, x, w, torch.rand(15) + 0.5, 1.0, False)),
        "layer_norm": (ops.layer_norm, (x, w, b, 1e-5)),
        "layer_norm_no_affine": (ops.layer_norm, (x, None, None, 1e-5)),
        "rope": (ops.rope, (q, k, cos, sin, 1, False, True, True)),
        "rope_backward_k_only": (ops.rope, (q, k, cos, sin, 1, True, False, True)),
        "rope_partial": (ops.rope, (q, k, cos[..., :cos.shape[-1] // 2], sin[..., :sin.shape[-1] // 2], 1, False,
                                    True, True)),
        "rope_interleaved": (ops.rope, (q, k, cos, sin, 1, False, True, True, 1)),
        "rope_deinterleave_backward": (ops.rope, (q, k, cos, sin, 1, True, True, True, 2)),
        "mrope": (ops.rope, (q, k, torch.randn(3, 1, 8, 16), torch.randn(3, 1, 8, 16), 1, False, True, True, 0,
                             [2, 3, 3])),
        "rms_norm_gated": (ops.rms_norm_gated, (x, torch.randn(3, 5, 32), w, 1e-6, 0.0, "llama", 1, True)),
        "rms_norm_gated_backward": (ops.rms_norm_gated_backward, (torch.randn(3, 5, 32), x, torch.randn(3, 5, 32), w,
                                                                  torch.rand(15) + 0.5, 0.0, True, 1, True)),
        # 4 groups of 8 channels, the gate before the norm (Falcon-H1's / Mamba-2's norm)
        "rms_norm_gated_groups": (ops.rms_norm_gated, (x, torch.randn(3, 5, 32), w, 1e-6, 0.0, "gemma", 4, False)),
        "rms_norm_gated_backward_groups": (ops.rms_norm_gated_backward, (torch.randn(3, 5, 32), x,
                                                                         torch.randn(3, 5, 32), w,
                                                                         torch.rand(60) + 0.5, 0.0, True, 4, False)),
        "clamped_swiglu": (ops.clamped_swiglu, (gate_up * 4, 1.702, 7.0)),
        "clamped_swiglu_backward": (ops.clamped_swiglu_backward, (torch.randn(6, 24), gate_up * 4, 1.702, 7.0)),
        "glu": (ops.glu, (gate_up[:, :24], gate_up[:, 24:], "silu")),
        "glu_multipliers": (ops.glu, (gate_up[:, :24], gate_up[:, 24:], "silu", 1.5, 0.25)),  # Falcon-H1's
        "glu_limit": (ops.glu, (gate_up[:, :24] * 4, gate_up[:, 24:] * 4, "silu", 1.0, 1.0, 2.0)),  # DeepSeek-V4's
        "glu_backward_limit": (ops.glu_backward, (torch.randn(6, 24), gate_up[:, :24] * 4, gate_up[:, 24:] * 4, "silu",
                                                  1.0, 1.0, 2.0)),
        "glu_backward": (ops.glu_backward, (torch.randn(6, 24), gate_up[:, :24], gate_up[:, 24:], "gelu_tanh")),
        "cross_entropy": (ops.cross_entropy, (logits, target, None, None, *ce, "mean", True, True)),  # want_pred
        "cross_entropy_none": (ops.cross_entropy, (logits, target, torch.rand(50), None, *ce, "none", False)),
        "cross_entropy_backward": (ops.cross_entropy_backward,
                                   (torch.tensor(1.0), logits, target, None, torch.tensor(5.0),
                                    stats, *ce, "sum")),
        "flce_mean": (ops.fused_linear_cross_entropy,
                      (hidden, head, target, hb, None, None, *ce, 1.0, "mean", torch.float32, True, True, True,
                       True, False, -1, True)),  # the last: want_pred (the predicted tokens)
        "flce_none": (ops.fused_linear_cross_entropy,
                      (hidden, head, target, None, None, None, *ce, 0.5, "none", torch.float32, True, True, False,
                       False, False, 4096, False, True)),  # the last two: want_pred, token_scaling
        "divergence_jsd": (ops.divergence, (logq, logp, target, div.JSD, 0.3, 0.0, -100, "batchmean")),
        "divergence_kl_mean": (ops.divergence, (logq, logp.exp(), None, div.KL_PROB, 0.5, 1e-10, -100, "mean")),
        "divergence_tvd_none": (ops.divergence, (logq.exp(), logp.exp(), target, div.TVD, 0.5, 0.0, -100, "none")),
        "divergence_backward": (ops.divergence_backward, (torch.tensor(0.7), logq, logp, target, div.KL_LOG, 0.5,
                                                          0.0, -100, "sum", True, False)),
        "relu_squared": (ops.relu_squared, (x[..., 3:],)),
        "relu_squared_backward": (ops.relu_squared_backward, (torch.randn(3, 5, 32), x)),
        "dyt": (ops.dyt, (x, torch.tensor([0.7]), w, b)),
        "dyt_no_beta": (ops.dyt, (x.to(torch.bfloat16), torch.tensor([0.7]), w, None)),
        "dyt_backward": (ops.dyt_backward, (torch.randn(3, 5, 32), x, torch.tensor([0.7]), w, True)),
        "softmax": (ops.softmax, (x.transpose(0, 1),)),
        "softmax_backward": (ops.softmax_backward, (torch.randn(3, 5, 32), x.softmax(-1))),
        "poly_norm": (ops.poly_norm, (x, torch.rand(3), torch.tensor(0.5), 1e-6)),
        "poly_norm_backward": (ops.poly_norm_backward, (torch.randn(3, 5, 32), x, torch.rand(3), torch.tensor(0.5),
                                                        torch.rand(15, 3) + 0.5)),
        "flce_backward_rows": (ops.fused_linear_cross_entropy_backward_rows,
                               (torch.randn(7), hidden, head, target, hb, None, stats, *ce, 1.0,
                                torch.float32, True, False, True, False, 2048, True)),  # the last: token_scaling
        "rms_norm_no_weight": (ops.rms_norm, (x, None, 1e-6, 0.0, "llama")),
        "rms_norm_backward_no_weight": (ops.rms_norm_backward, (torch.randn(3, 5, 32), x, None,
                                                                torch.rand(15) + 0.5, 0.0, False)),
        "group_norm": (ops.group_norm, (x.transpose(1, 2), w, b, 8, 1e-6)),
        "group_norm_bias_only": (ops.group_norm, (torch.randn(4, 6), None, b[:6], 3, 1e-5)),
        "group_norm_backward": (ops.group_norm_backward, (torch.randn(3, 32, 5), x.transpose(1, 2), w, b,
                                                          torch.randn(24), torch.rand(24) + 0.5, 8, 1e-6, True,
                                                          False)),
        "sparsemax": (ops.sparsemax, (x.transpose(0, 1),)),
        "sparsemax_backward": (ops.sparsemax_backward, (torch.randn(3, 5, 32), torch.relu(x))),
        "moe_gather": (ops.moe_gather, (x[0], pos)),
        "moe_gather_backward": (ops.moe_gather_backward, (rows, pos.int())),
        "moe_expert_gate": (ops.moe_expert_gate, (gate_up[:10], offs, torch.randn(4, 48), "silu", 1.702, None)),
        "moe_expert_gate_no_bias_limit": (ops.moe_expert_gate, (gate_up[:10] * 4, offs.long(), None, "silu", 1.702,
                                                                2.0)),  # DeepSeek-V4's clamp
        "moe_expert_gate_clamped": (ops.moe_expert_gate, (gate_up[:10] * 4, offs, torch.randn(4, 48),
                                                          "clamped_swiglu", 1.702, 2.0)),  # GPT-OSS's
        "moe_expert_gate_backward": (ops.moe_expert_gate_backward, (torch.randn(10, 24), gate_up[:10], offs,
                                                                    torch.randn(4, 48), "gelu_tanh", 1.702, None,
                                                                    True)),
        "moe_combine": (ops.moe_combine, (rows, moe_w, pos, offs, torch.randn(4, 32))),
        "moe_combine_no_bias": (ops.moe_combine, (rows, moe_w, pos, None, None)),
        "moe_combine_backward": (ops.moe_combine_backward, (torch.randn(5, 32), rows, moe_w, pos, offs,
                                                            torch.randn(4, 32), True, True)),
        "moe_combine_backward_dx_only": (ops.moe_combine_backward, (torch.randn(5, 32), rows, moe_w, pos, None, None,
                                                                    False, False)),
    }


@pytest.mark.parametrize("case", list(_opcheck_cases()))
def test_custom_op_opcheck(case):
    op, args = _opcheck_cases()[case]
    args = tuple(a.to(DEVICE) if isinstance(a, torch.Tensor) else a for a in args)  # compiled kernels need CUDA
    # Inputs of the forward ops require grad, so that the autograd formula is checked too; the backward ops have
    # none (no double backward, except rope, which is its own transpose).
    differentiable = "backward" not in case
    grad_args = tuple(a.clone().requires_grad_(differentiable)
                      if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args)
    torch.library.opcheck(op, grad_args, test_utils=("test_schema", "test_autograd_registration",
                                                     "test_faketensor", "test_aot_dispatch_dynamic"))


# ---- each functional op under fullgraph compile ---------------------------------------------------------------
def test_rms_norm_and_layer_norm_compile(device):
    x = torch.randn(2, 9, 48, device=device)
    w, b = torch.randn(48, device=device), torch.randn(48, device=device)
    _check_same(lambda x, w: TF.rms_norm(x, w, 1e-6, 0.0, "llama"), (x, w))
    _check_same(lambda x, w: TF.rms_norm(x, w, 1e-6, 1.0, "gemma"), (x, w))
    _check_same(lambda x, w, b: TF.layer_norm(x, w, b, 1e-5), (x, w, b))


def test_fused_add_rms_norm_compile(device):
    x, r = torch.randn(2, 9, 48, device=device), torch.randn(2, 9, 48, device=device)
    w = torch.randn(48, device=device)
    _check_same(lambda x, r, w: TF.fused_add_rms_norm(x, r, w, 1e-6, 0.0, "llama"), (x, r, w))
    _check_same(lambda x, r, w: TF.fused_add_rms_norm(x, r, w, 1e-6, 1.0, "gemma", True), (x, r, w))
    # only y's gradient (s unused), as after a model's last norm
    _check_same(lambda x, r, w: TF.fused_add_rms_norm(x * 1.0, r, w)[0], (x, r, w))


@pytest.mark.parametrize("unsqueeze_dim, rotary_dim, liger_rotary_dim", [(1, 16, None), (2, 16, None), (1, 8, None),
                                                                      (1, 16, 6)])
def test_rope_compile(device, unsqueeze_dim, rotary_dim, liger_rotary_dim):
    q = torch.randn(2, 6, 4, 16, device=device)
    k = torch.randn(2, 6, 2, 16, device=device)
    if unsqueeze_dim == 1:
        q, k = q.transpose(1, 2), k.transpose(1, 2)
    cos, sin = torch.randn(1, 6, rotary_dim, device=device), torch.randn(1, 6, rotary_dim, device=device)

    def fn(q, k):  # q, k as non-leaf views in the HF layout; Liger's rotary_dim builds its tables in the graph
        return TF.rope(q * 1.0, k * 1.0, cos, sin, unsqueeze_dim=unsqueeze_dim, rotary_dim=liger_rotary_dim)

    _check_same(fn, (q, k))


def test_glu_compile(device):
    gate_up = torch.randn(3, 5, 2 * 40, device=device)
    _check_same(lambda gu: TF.swiglu(*gu.chunk(2, -1)), (gate_up,))
    _check_same(lambda gu: TF.geglu(*gu.chunk(2, -1), approximate="none", inplace_backward=True), (gate_up,))
    _check_same(lambda gu: TF.swiglu(*(gu * 4).chunk(2, -1), limit=2.0), (gate_up,))  # DeepSeek-V4's clamps


def test_liger_ops_compile(device):
    # the ops of Liger's list beyond the Llama ones: relu_squared (elementwise, on a strided slice), dyt (with and
    # without beta), softmax, poly_norm (in_place is ignored under compile), group_norm
    x = torch.randn(3, 7, 40, device=device)
    _check_same(lambda x: TF.relu_squared(x[..., 1:]), (x,))
    a, g, b = torch.tensor([0.6], device=device), torch.rand(40, device=device) + 0.5, torch.randn(40, device=device)
    _check_same(lambda x, a, g, b: TF.dyt(x, a, g, b), (x, a, g, b))
    _check_same(lambda x, a, g: TF.dyt(x.transpose(0, 1), a, g, None), (x, a, g))
    _check_same(lambda x: TF.softmax(x * 2.0), (x,))
    w, b0 = torch.rand(3, device=device), torch.tensor(0.5, device=device)
    _check_same(lambda x, w, b0: TF.poly_norm(x, w, b0, 1e-6, True), (x, w, b0))
    # group_norm without a bias (its constexpr flag) through the custom ops
    xg, wg = torch.randn(2, 8, 5, device=device), torch.rand(8, device=device) + 0.5
    _check_same(lambda x, w: TF.group_norm(x, w, None, 8, 4), (xg, wg))
    # the gated RMSNorm with 4 groups of 10 channels (Falcon-H1's n_groups) on a strided gate, the gate first
    gate = torch.randn(3, 7, 80, device=device)[..., 40:]
    _check_same(lambda x, gate, w: TF.rms_norm_gated(x, gate, w, 1e-6, 0.0, "gemma", 10, False), (x, gate, g))


@pytest.mark.parametrize("mode", ["kernels", "auto", "inductor"])
def test_moe_glue_compile(device, mode, monkeypatch):
    # each glue op as compiled_choice says: the tigon::moe_* custom op in "kernels" (and in "auto" where its record's
    # under_compile is "kernel"), else its reference traced; eager's outputs and gradients either way (fp32), the
    # integer positions (int64) and offsets (int32) graph inputs, the bias present or None
    from tigon.ops import registry
    from tigon.ops.moe_glue import routing

    monkeypatch.setenv("TIGON_COMPILE_OPS", mode)
    r = routing(torch.Generator().manual_seed(0), 7, 5, 2, device)  # 7 tokens to 2 of 5 experts, the last none
    pos, offs = r["positions"], r["offsets"]
    x, rows = torch.randn(7, 24, device=device), torch.randn(14, 24, device=device)
    gate_up, weights = 3 * torch.randn(14, 40, device=device), torch.rand(7, 2, device=device) + 0.05
    gate_bias, down_bias = 0.5 * torch.randn(5, 40, device=device), torch.randn(5, 24, device=device)
    cases = [
        ("moe_gather", lambda x, pos: TF.moe_gather(x * 1.0, pos), (x, pos)),
        ("moe_expert_gate", lambda gu, offs, b: TF.moe_expert_gate(gu, offs, b), (gate_up, offs, gate_bias)),
        ("moe_expert_gate", lambda gu, offs, b: TF.moe_expert_gate(gu, offs, b, "clamped_swiglu", 1.702, 2.0),
         (gate_up, offs, gate_bias)),
        ("moe_expert_gate", lambda gu, offs: TF.moe_expert_gate(gu, offs, None, "silu", limit=2.0), (gate_up, offs)),
        ("moe_combine", lambda y, w, pos, offs, b: TF.moe_combine(y, w, pos, offs, b),
         (rows, weights, pos, offs, down_bias)),
        ("moe_combine", lambda y, pos: TF.moe_combine(y, weights, pos), (rows, pos)),  # no weight gradient, no bias
    ]
    kernels = support.decide(torch.device(device), torch.float32).backend
    for op, fn, inputs in cases:
        torch._dynamo.reset()
        support.backend_usage(reset=True)
        seen = set()
        _check_same(fn, inputs, seen=seen)
        kernel = mode == "kernels" or (mode == "auto" and registry()[op].under_compile == "kernel")
        # the eager call's backend, then the one the trace chose
        assert support.backend_usage()[op] == ({kernels: 2} if kernel else {kernels: 1, "inductor": 1}), op
        assert seen == ({f"tigon.{op}.default"} if kernel else set()), op



def test_moe_glue_compiled_checks_cpu_values():
    # CPU positions / offsets are checked under torch.compile as in eager (inside the custom ops, on the real
    # tensors): not a permutation, a decreasing or negative offset raise the eager call's ValueError, not an
    # IndexError of the interpreted kernel or silent garbage; token counts that change between calls equal eager
    from tigon.ops.moe_glue import routing

    support.set_compile_mode("kernels")
    gather = torch.compile(lambda x, pos: TF.moe_gather(x, pos), backend="aot_eager", fullgraph=True)
    gate = torch.compile(lambda gu, offs: TF.moe_expert_gate(gu, offs), backend="aot_eager", fullgraph=True)
    combine = torch.compile(lambda y, w, pos, offs, b: TF.moe_combine(y, w, pos, offs, b), backend="aot_eager",
                            fullgraph=True)
    for tokens in (7, 9, 13):
        r = routing(torch.Generator().manual_seed(tokens), tokens, 5, 2, "cpu")
        x = torch.randn(tokens, 8)
        torch.testing.assert_close(gather(x, r["positions"]), TF.moe_gather(x, r["positions"]), rtol=0, atol=0)
    r = routing(torch.Generator().manual_seed(0), 7, 5, 2, "cpu")
    x, pos, offs = torch.randn(7, 8), r["positions"], r["offsets"]
    with pytest.raises(ValueError, match="positions must hold each sorted row"):
        gather(x, torch.zeros_like(pos))
    for bad in (torch.tensor([10, 4, 14, 14, 14], dtype=torch.int32), torch.tensor([-1, 4, 8, 14, 14])):
        with pytest.raises(ValueError, match="offsets must be nonnegative and nondecreasing"):
            gate(torch.randn(14, 40), bad)
        with pytest.raises(ValueError, match="offsets must be nonnegative and nondecreasing"):
            combine(torch.randn(14, 8), torch.rand(7, 2), pos, bad, torch.randn(5, 8))
    with pytest.raises(ValueError, match="positions must hold each sorted row"):
        combine(torch.randn(14, 8), torch.rand(7, 2), pos + 100, offs, torch.randn(5, 8))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_compile(device, reduction):
    logits = torch.randn(9, 70, device=device)
    target = torch.randint(0, 70, (9,), device=device)
    target[2] = -100
    _check_same(lambda lg: TF.cross_entropy(lg, target, reduction=reduction, label_smoothing=0.1,
                                            lse_square_scale=1e-4, softcap=20.0, return_accuracy=True), (logits,))


def test_cross_entropy_module_compiled_returns_its_output(device):
    # (B, T, V) logits: the module's per-token outputs reshaped to (B, T) in a new LossOutput (support.replaced, not
    # _replace: torch 2.11's Dynamo failed an assertion where such a tuple left the graph), eager's values and gradient
    import tigon.nn as tnn

    loss = tnn.CrossEntropyLoss(reduction="none", return_z_loss=True, return_predicted_tokens=True,
                                lse_square_scale=1e-4)
    logits = torch.randn(2, 5, 40, device=device)
    target = torch.randint(0, 40, (2, 5), device=device)
    (x, y) = _leaves(logits, logits)
    eager, got = loss(x, target), torch.compile(loss, backend="aot_eager")(y, target)
    assert type(got) is type(eager) is TF.LossOutput and got.loss.shape == got.predicted_tokens.shape == (2, 5)
    for a, b in zip(got, eager):
        if b is not None:
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    eager.loss.sum().backward()
    got.loss.sum().backward()
    torch.testing.assert_close(y.grad, x.grad, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="unexpected field"):
        support.replaced(eager, nope=1)


@pytest.mark.parametrize("op, options", [("jsd", {"beta": 0.3}), ("kl_div", {"reduction": "batchmean"}),
                                         ("kl_div", {"reduction": "sum", "log_target": True}),
                                         ("tvd", {"reduction": "none"})])
def test_divergence_compile(device, op, options):
    x, y = torch.randn(7, 90, device=device).log_softmax(-1), torch.randn(7, 90, device=device).log_softmax(-1)
    if op == "tvd":
        x, y = x.exp(), y.exp()
    labels = torch.tensor([1, -100, 3, 4, 5, -100, 89], device=device)
    extra = {} if op == "kl_div" else {"shift_labels": labels}
    _check_same(lambda a, b: getattr(TF, op)(a, b, **extra, **options), (x, y))


@pytest.mark.parametrize("reduction, num_items", [("mean", None), ("sum", 5), ("none", None), ("sum", "cpu_tensor")])
def test_fused_linear_cross_entropy_compile(device, reduction, num_items):
    # "cpu_tensor": the HF Trainer's count as a CPU tensor, captured by the graph (its value is not read while tracing)
    num_items = torch.tensor(7) if num_items == "cpu_tensor" else num_items
    hidden, weight, bias = (torch.randn(11, 24, device=device), torch.randn(90, 24, device=device),
                            torch.randn(90, device=device))
    target = torch.randint(0, 90, (11,), device=device)
    target[0] = -100

    def fn(hidden, weight, bias):
        return TF.fused_linear_cross_entropy(hidden, weight, target, bias, reduction=reduction, softcap=30.0,
                                             logit_scale=0.5, num_items_in_batch=num_items, return_z_loss=True,
                                             lse_square_scale=1e-4)

    _check_same(fn, (hidden, weight, bias))


def test_fused_linear_cross_entropy_lean_bf16_compile(device):
    hidden, weight = torch.randn(11, 24, device=device), torch.randn(90, 24, device=device)
    target = torch.randint(0, 90, (11,), device=device)

    def fn(hidden, weight):  # gradients accumulated in bf16 (accum_dtype = the weight's dtype)
        return TF.fused_linear_cross_entropy(hidden, weight, target, accum_dtype=torch.bfloat16)

    _check_same(fn, (hidden.to(torch.bfloat16), weight.to(torch.bfloat16)), atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("mode", ["kernels", "auto"])
def test_backend_choice_is_made_at_trace_time(device, mode, monkeypatch):
    monkeypatch.setenv("TIGON_COMPILE_OPS", mode)
    x, w = torch.randn(4, 32, device=device), torch.randn(32, device=device)
    support.backend_usage(reset=True)
    fn = _compiled(lambda x: TF.rms_norm(x, w))
    fn(x)
    fn(x)  # the cached graph: no new decision
    usage = support.backend_usage(reset=True)
    assert sum(usage["rms_norm"].values()) == 1
    expected = support.decide(torch.device(device), torch.float32).backend
    # auto: a row-wise op leaves its code to Inductor inside a compiled graph (its record's under_compile)
    assert list(usage["rms_norm"]) == [expected if mode == "kernels" else "inductor"]


# ---- the patched tiny preset: no graph breaks, eager's loss and gradients --------------------------------------
@pytest.fixture(scope="module")
def tiny_models():
    transformers = pytest.importorskip("transformers")
    import tigon
    from tigon.presets import build_config

    def build(patched: bool):
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(build_config("tiny")).float().to(DEVICE).train()
        if patched:
            tigon.patch(model)
        return model

    return build


def _batch():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 256, (2, 24), generator=g)
    labels = ids.clone()
    labels[0, :3] = -100
    return ids.to(DEVICE), labels.to(DEVICE)


def _explain(model):
    ids, labels = _batch()
    torch._dynamo.reset()
    ex = torch._dynamo.explain(model)(input_ids=ids, labels=labels)
    ops = {str(n.target) for gm in ex.graphs for n in gm.graph.nodes if str(n.target).startswith("tigon.")}
    return ex.graph_count, ex.graph_break_count, [r.reason.split("\n")[0] for r in ex.break_reasons], ops


@pytest.mark.slow
def test_patched_model_has_no_tigon_graph_breaks(tiny_models):
    graphs0, breaks0, reasons0, _ = _explain(tiny_models(False))
    graphs, breaks, reasons, ops = _explain(tiny_models(True))
    # Every kernel of the patched Llama is a node of the graph, not a break or a trace into its launcher.
    assert ops == {"tigon.rms_norm.default", "tigon.fused_add_rms_norm.default", "tigon.rope.default",
                   "tigon.glu.default", "tigon.fused_linear_cross_entropy.default"}
    assert (graphs, breaks) == (graphs0, breaks0), reasons
    # explain does not count a break after the last tensor op (no graph follows it); its reasons still list it.
    assert len(reasons) == len(reasons0), reasons
    if breaks0 == 0:
        assert (graphs, breaks, reasons) == (1, 0, [])


@pytest.mark.slow
def test_patched_model_under_auto_compile_mode_keeps_only_the_loss_kernel(tiny_models, monkeypatch):
    monkeypatch.setenv("TIGON_COMPILE_OPS", "auto")
    graphs0, breaks0, _, _ = _explain(tiny_models(False))
    graphs, breaks, reasons, ops = _explain(tiny_models(True))
    assert ops == {"tigon.fused_linear_cross_entropy.default"}
    assert (graphs, breaks) == (graphs0, breaks0), reasons


def test_compile_mode_is_checked(monkeypatch):
    with pytest.raises(ValueError, match="compile mode must be one of"):
        support.set_compile_mode("fast")
    # a typo in the environment reads as "auto", with one warning naming it
    monkeypatch.setenv("TIGON_COMPILE_OPS", "kernel-typo")
    with pytest.warns(UserWarning, match="TIGON_COMPILE_OPS='kernel-typo' is not one of"):
        assert support.compile_mode() == "auto"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert support.compile_mode() == "auto"


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["kernels", "auto"])
def test_patched_model_compiled_train_step_matches_eager(tiny_models, mode, monkeypatch):
    monkeypatch.setenv("TIGON_COMPILE_OPS", mode)
    eager, compiled_model = tiny_models(True), tiny_models(True)
    compiled = torch.compile(compiled_model, backend="aot_eager", fullgraph=True)
    ids, labels = _batch()
    for _ in range(2):  # the second call reuses the compiled graph
        for model in (eager, compiled_model):
            model.zero_grad(set_to_none=True)
        loss_e = eager(input_ids=ids, labels=labels).loss
        loss_c = compiled(input_ids=ids, labels=labels).loss
        loss_e.backward()
        loss_c.backward()
        torch.testing.assert_close(loss_c, loss_e, atol=1e-5, rtol=1e-5)
        for (name, pe), pc in zip(eager.named_parameters(), compiled_model.parameters()):
            torch.testing.assert_close(pc.grad, pe.grad, atol=1e-5, rtol=1e-5, msg=name)


def test_import_does_not_load_triton():
    """The CLI sets TRITON_INTERPRET=1 after ``import tigon`` on machines without CUDA; Triton's own jitted helpers
    (tl.sum...) only work interpreted when triton.language is first imported after that, so importing Tigon (and
    the CLI's modules) must not import triton or torch._dynamo (which imports triton)."""
    import subprocess
    import sys

    code = ("import sys, tigon, tigon.cli, tigon.functional, tigon.workflows.bench, tigon.workflows.e2e; "
            "print(sorted(m for m in ('triton', 'torch._dynamo') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out


def test_patch_report_says_what_runs_under_compile(tiny_models, monkeypatch):
    import tigon

    monkeypatch.setenv("TIGON_COMPILE_OPS", "auto")
    model = tiny_models(False)
    note = next(n for n in tigon.patch(model).notes if n.startswith("under torch.compile"))
    assert "rms_norm, rope leave their code to Inductor" in note and "fused_linear_cross_entropy runs" in note
    tigon.unpatch(model)


def test_patch_report_says_a_compiled_instance_forward_was_compiled_first(tiny_models):
    # model.forward = torch.compile(model.forward) before tigon.patch: the LM head is skipped, and the reason names
    # torch.compile and the order that works (it blamed "another library (e.g. accelerate hooks)")
    import tigon

    model = tiny_models(False)
    model.forward = torch.compile(model.forward, backend="aot_eager")
    report = tigon.patch(model)
    (head,) = [e for e in report.skipped if e.kind == "lm_head_loss"]
    assert "torch.compile" in head.detail and "patch first" in head.detail, head.detail
    tigon.unpatch(model)


def test_no_locals_call_in_the_library():
    """torch 2.11's Dynamo (the GPU image's) cannot trace ``locals()`` ("Failed to trace builtin operator"): a public
    function that gathers its arguments with it breaks every compiled caller there (found by the post-training losses
    under torch.compile on an H100). Arguments are gathered explicitly instead."""
    import pathlib
    import re

    root = pathlib.Path(__file__).resolve().parents[1] / "src" / "tigon"
    found = [f"{p.relative_to(root)}:{i}" for p in root.rglob("*.py")
             for i, line in enumerate(p.read_text().splitlines(), 1) if re.search(r"\blocals\(\)", line)]
    assert not found, f"locals() breaks torch 2.11's Dynamo: {found}"
