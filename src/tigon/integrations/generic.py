"""The generic matcher: Tigon for a causal LM without a family spec, one numerical probe per module.

:func:`tigon.patch` uses it when no registered :class:`~tigon.integrations.families.FamilySpec` matches the model
(``report.family == "generic"``), or when called with ``family="generic"``. It recognises the standard parts of a
Llama-like decoder by structure, then checks each candidate by running the *original* module on a few random rows
and comparing with what Tigon would compute (the PyTorch reference ops, so probing runs no kernel):

RMSNorm-like
    a leaf module (not a ``torch.nn`` built-in) with a 1-D floating ``weight``, no ``bias``, and a numeric
    ``variance_epsilon`` / ``eps`` / ``epsilon``. Probe in fp32 (4 rows): ``rms_norm`` with offset 0 (Llama) or 1
    (Gemma's ``1 + w``), relative L2 error <= 1e-5. The casting mode (``llama`` / ``gemma`` / ``none``) is then
    chosen by a second probe in bf16 (fp16 for fp16 weights): the mode whose output has the module's dtype and
    equals it (or, failing exact equality, is closest within bf16 tolerance). Both probes substitute a random
    weight, so a fresh all-ones / all-zeros weight cannot make two modes look alike.
gated MLP
    ``gate_proj`` / ``up_proj`` / ``down_proj`` child modules (or a fused ``gate_up_proj`` and ``down_proj``). The
    activation is identified by probing the module's activation attribute(s) alone in fp32 against silu,
    gelu-tanh and exact gelu (1e-5); the whole module is then probed as ``down(op(gate(x), up(x)))`` on 4 random
    rows in its weights' dtype (relative L2 1e-5 for fp32; 2e-2 / 4e-3 for bf16 / fp16 weights, where the
    activation must have been identified from its attribute), once at unit-variance inputs and once with gate and
    up driven to +-50 (:data:`MLP_PROBE_REACH`), so that a clamped MLP (DeepSeek-V4's ``swiglu_limit``) is refused.
rotary
    a module-global function ``apply_rotary_pos_emb`` in the modeling module of the model's classes, probed in fp32
    against rotate-half rope over the full head dimension (1e-5); an interleaved layout (GLM) fails the probe and is
    reported. The attention classes are those of that module whose ``forward`` refers to the function by name; the
    engine then checks per instance that the forward reaches the call (:mod:`tigon.integrations.rotary_calls`).
    Other rotary functions that attention classes call instead (Llama-4's complex-valued ``apply_rotary_emb``, a
    vision tower's ``apply_rotary_pos_emb_vision``) are reported as skipped. Scoping is the same as for families
    (see :mod:`tigon.integrations.engine`).
LM head + loss
    only when at least one of the parts above matched (the matcher targets Llama-like decoders): the outermost
    module with an ``lm_head``, a ``base_model_prefix`` backbone and a ``labels`` argument (an ``lm_head`` holder
    without the other two is reported). Probe: its class forward on 8 tokens, run on a stand-in whose backbone
    returns random hidden states and whose head is a narrow random Linear with the model's vocabulary (only what
    happens after the backbone decides), with the head's output scaled up by a hook (so a softcap or logit scale
    cannot hide behind small logits); the returned logits must equal the head's output and the loss HF's causal-LM
    cross-entropy of them. MoE outputs (``aux_loss``) are probed again with router logits: taken only with no router
    loss or the one the patched head adds, else skipped (:mod:`tigon.integrations.generic_moe`).
MoE experts
    v5 experts modules (``@use_experts_implementation``): ``_apply_gate`` probed, then a family's experts spec (same).

Models on the ``meta`` device (``tigon inspect`` builds them there, without weights) get the decisions a loaded model
gets: norms and MLPs are probed on CPU copies with random parameters, one per group of modules that differ only in
weight values, an MLP's copy shrunk to a few dozen features a dimension so that the probe costs milliseconds and
kilobytes at any model size (:mod:`tigon.integrations.generic_stand_in`), and the head probe never needs the model's
weights.

Everything else is left alone; every candidate that fails is reported with the reason. Probes use their own random
generator (the global RNG is not advanced) and restore the modules' training flags.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import math
import sys
import types
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..numerics import rel_l2
from ..reference import glu as ref_glu
from ..reference import rms_norm as ref_rms
from ..reference import rope as ref_rope
from . import generic_moe
from .families import CausalLMSpec, MLPSpec, NormSpec, RopeSpec
from .family_spec import Match
from .generic_stand_in import probe_meta
from .generic_stand_in import randn as _randn
from .marks import tigon_mark
from .rotary_calls import rotary_functions

PROBE_ROWS = 4
TOL = {torch.float32: 1e-5, torch.float64: 1e-5, torch.bfloat16: 2e-2, torch.float16: 4e-3}
EPS_ATTRS = ("variance_epsilon", "eps", "epsilon")
ROPE_FUNCTION = "apply_rotary_pos_emb"
PROBE_FAILED = "probe failed"  # how the reason of a probe whose module raised begins
# one ACTIVATIONS key per distinct function, with its fp32 definition
ACT_FUNCTIONS = {
    "silu": F.silu,
    "gelu_pytorch_tanh": lambda z: F.gelu(z, approximate="tanh"),
    "gelu": F.gelu,
}


@dataclass
class GenericResult:
    """What the generic matcher found: per-module matches and the function-level rope skips."""

    matches: list[tuple[str, torch.nn.Module, Match]]
    skipped: list[tuple[str, str, str]]  # (kind, target, reason) not tied to one module instance


# ---- helpers ----------------------------------------------------------------------------------------------------
@contextlib.contextmanager
def _probing(module: torch.nn.Module):
    """Eval mode (no dropout) and no grad for the probe; every submodule's training flag restored after."""
    modes = [(m, m.training) for m in module.modules()]
    module.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        for m, t in modes:
            m.training = t


def _is_builtin(module) -> bool:
    return type(module).__module__.split(".")[0] == "torch"


def _float_weight(module) -> torch.Tensor | None:
    w = getattr(module, "weight", None)
    if isinstance(w, torch.Tensor) and w.is_floating_point():
        return w
    base = getattr(module, "base_layer", None)  # PEFT LoRA layer
    return _float_weight(base) if base is not None else None


def _probe_failed(result) -> bool:
    """Whether a probe's ``result`` says that the module raised (rather than computing something else)."""
    return isinstance(result, str) and result.startswith(PROBE_FAILED)


def _class_forward(module):
    return type(module).forward.__get__(module)


# ---- RMSNorm ----------------------------------------------------------------------------------------------------
def _norm_eps_attr(m) -> str | None:
    if _is_builtin(m) or any(True for _ in m.children()):
        return None
    w = getattr(m, "weight", None)
    if not isinstance(w, torch.Tensor) or not w.is_floating_point() or w.dim() != 1:
        return None
    if getattr(m, "bias", None) is not None:
        return None
    for attr in EPS_ATTRS:
        v = getattr(m, attr, None)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return attr
    return None


def probe_norm(m: torch.nn.Module, eps_attr: str) -> NormSpec | str:
    """A NormSpec reproducing ``m`` (rms_norm offset and casting mode), or why not.

    The module runs with a random weight of its weight's dtype substituted (``torch.func.functional_call``), so
    freshly initialised weights (all ones, or Gemma's zeros) cannot make different modes look alike.
    """
    w0, eps = m.weight, float(getattr(m, eps_attr))
    w = (1.0 + 0.5 * _randn(w0.shape, w0.device, seed=5)).to(w0.dtype)

    def fwd(x):
        return torch.func.functional_call(m, {"weight": w}, (x,))

    x = _randn((PROBE_ROWS, w.shape[0]), w.device)
    try:
        with _probing(m):
            y = fwd(x)
            errs = {off: rel_l2(ref_rms.rms_norm(x, w, eps, off, "gemma"), y) for off in (0.0, 1.0)}  # fp32 math
            offset = min(errs, key=errs.get)
            if errs[offset] > TOL[torch.float32]:
                return ("output differs from rms_norm in the fp32 probe (relative error "
                        + ", ".join(f"{e:.1e} with offset {o:g}" for o, e in errs.items()) + ")")
            low = torch.float16 if w.dtype == torch.float16 else torch.bfloat16
            xl = x.to(low)
            yl = fwd(xl)
            mode = None
            best = (float("inf"), None)
            for cm in ("llama", "gemma", "none"):
                r = ref_rms.rms_norm(xl, w, eps, offset, cm)
                if r.dtype != yl.dtype:
                    continue
                if torch.equal(r, yl):
                    mode = cm
                    break
                best = min(best, (rel_l2(r, yl), cm), key=lambda t: t[0])
            if mode is None:
                if best[1] is None or best[0] > TOL[low]:
                    return f"no rms_norm casting mode reproduces the {low} probe (output dtype {yl.dtype})"
                mode = best[1]
    except Exception as e:  # a forward that does not take one tensor, wrong device, ...
        return f"{PROBE_FAILED}: {type(e).__name__}: {e}"
    return NormSpec(type(m).__qualname__, casting_mode=mode, offset=offset, eps_attr=eps_attr)


# ---- gated MLP --------------------------------------------------------------------------------------------------
def _mlp_layout(m) -> tuple[str, ...] | None:
    if _is_builtin(m):
        return None
    mods = {n: getattr(m, n, None) for n in ("gate_proj", "up_proj", "down_proj", "gate_up_proj")}
    is_mod = {n: isinstance(v, torch.nn.Module) for n, v in mods.items()}
    if is_mod["gate_proj"] and is_mod["up_proj"] and is_mod["down_proj"]:
        return ("gate_proj", "up_proj", "down_proj")
    if is_mod["gate_up_proj"] and is_mod["down_proj"]:
        return ("gate_up_proj", "down_proj")
    return None


def _identify_activation(m, projections) -> list[str]:
    """ACTIVATIONS keys matched by the module's activation attribute(s), probed alone in fp32."""
    device = next((p.device for p in m.parameters()), torch.device("cpu"))
    z = torch.linspace(-6.0, 6.0, 97, device=device)
    found = []
    candidates = [c for n, c in m.named_children() if n not in projections and not any(True for _ in c.parameters())]
    candidates += [v for k, v in vars(m).items() if not k.startswith("_") and k != "forward" and callable(v)
                   and not isinstance(v, (torch.nn.Module, torch.Tensor, type, types.MethodType))]
    for act in candidates:
        try:
            with torch.no_grad():
                out = act(z)
        except Exception:
            continue
        if not isinstance(out, torch.Tensor):
            continue
        for name, fn in ACT_FUNCTIONS.items():
            if rel_l2(out.float(), fn(z)) <= TOL[torch.float32] and name not in found:
                found.append(name)
    return found


MLP_PROBE_REACH = 50.0
"""The largest |gate| / |up| value of :func:`probe_mlp`'s second probe: past every clamp limit in transformers
(DeepSeek-V4's 10, GPT-OSS's 7), and small enough that an fp16 module's output stays finite."""


def _glu_projections(m, layout: tuple[str, ...], fused: bool):
    """x -> (gate(x), up(x)) of a gated MLP of ``layout`` (a fused gate_up projection split in two halves)."""
    if fused:
        return lambda x: getattr(m, layout[0])(x).chunk(2, dim=-1)
    return lambda x: (getattr(m, layout[0])(x), getattr(m, layout[1])(x))


def probe_mlp(m: torch.nn.Module, layout: tuple[str, ...]) -> MLPSpec | str:
    """An MLPSpec (fixed activation) reproducing ``m`` as ``down(op(gate(x), up(x)))``, or why not."""
    first = getattr(m, layout[0])
    w = _float_weight(first)
    if w is None:
        return f"{layout[0]} has no floating weight (quantised?)"
    in_features = getattr(first, "in_features", None) or w.shape[-1]
    identified = _identify_activation(m, layout)
    tol = TOL.get(w.dtype, TOL[torch.bfloat16])
    if len(identified) > 1:
        return f"ambiguous activation attributes ({', '.join(identified)})"
    if not identified and w.dtype not in (torch.float32, torch.float64):
        return f"no activation attribute recognised, and a {w.dtype} probe cannot tell gelu from gelu-tanh"
    names = identified or list(ACT_FUNCTIONS)
    x = _randn((PROBE_ROWS, in_features), w.device, w.dtype, seed=1)
    fused = len(layout) == 2
    errs = dict.fromkeys(names, 0.0)
    try:
        with _probing(m):
            projections = _glu_projections(m, layout, fused)
            # twice: at unit-variance inputs, then with the projections driven to MLP_PROBE_REACH, where a clamp of
            # gate / up (DeepSeek-V4's swiglu_limit 10, GPT-OSS's 7) or any saturation shows (random inputs of
            # unit variance never reach it)
            reach = max(float(t.abs().amax()) for t in projections(x))
            for probe_x in (x, x * (MLP_PROBE_REACH / max(reach, 1e-6))):
                y = _class_forward(m)(probe_x)
                gate, up = projections(probe_x)
                down = getattr(m, layout[-1])
                for name in names:
                    h = ref_glu.swiglu(gate, up) if name == "silu" else ref_glu.geglu(
                        gate, up, "tanh" if name == "gelu_pytorch_tanh" else "none")
                    err = rel_l2(down(h), y)
                    errs[name] = max(errs[name], err if math.isfinite(err) else math.inf)
    except Exception as e:
        return f"{PROBE_FAILED}: {type(e).__name__}: {e}"
    passing = [n for n in names if errs[n] <= tol]
    if len(passing) != 1:
        detail = ", ".join(f"{n}: {e:.1e}" for n, e in errs.items())
        what = "is not down(act(gate(x)) * up(x)) for a supported activation" if not passing else "is ambiguous"
        return f"output {what} (relative error {detail}; tolerance {tol:g})"
    if fused:
        return MLPSpec(type(m).__qualname__, activation=passing[0], gate_up=layout[0], down=layout[1])
    return MLPSpec(type(m).__qualname__, activation=passing[0])


# ---- rotary -----------------------------------------------------------------------------------------------------
def probe_rope(fn) -> str | None:
    """None when ``fn(q, k, cos, sin)`` is rotate-half rope over the full head dim (fp32, 1e-5), else why not."""
    B, T, D = 1, 5, 8
    q, k = _randn((B, 2, T, D), "cpu", seed=2), _randn((B, 1, T, D), "cpu", seed=3)
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, D, 2, dtype=torch.float32) / D))
    freqs = torch.arange(T, dtype=torch.float32)[:, None] * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)[None]
    cos, sin = emb.cos(), emb.sin()
    try:
        with torch.no_grad():
            qo, ko = fn(q, k, cos, sin)
    except Exception as e:
        return f"probe call fn(q, k, cos, sin) failed: {type(e).__name__}: {e}"
    qr, kr = ref_rope.rope(q, k, cos, sin)
    err = max(rel_l2(qo, qr), rel_l2(ko, kr))
    if err > TOL[torch.float32]:
        return (f"not rotate-half rotary over the full head dim (probe relative error {err:.1e}; e.g. an "
                "interleaved layout); tigon.functional.rope would be wrong, left alone")
    return None


# ---- LM head ----------------------------------------------------------------------------------------------------
def _head_candidate(model) -> tuple[str, torch.nn.Module, str | None] | None:
    """``(path, module, problem)`` of the LM-head module: the outermost module with a direct ``lm_head`` child (not
    PEFT's forwarding getattr), a ``base_model_prefix`` child (the backbone) and a ``labels`` argument, with
    ``problem`` None; else the outermost module with an ``lm_head`` child and why it does not qualify; else None."""
    rejected = None
    for path, m in model.named_modules():  # outermost first
        if "lm_head" not in m._modules:
            continue
        prefix = getattr(type(m), "base_model_prefix", None)
        try:
            params = inspect.signature(type(m).forward).parameters
        except (TypeError, ValueError):
            params = {}
        if not isinstance(prefix, str) or prefix not in m._modules:
            problem = (f"{type(m).__name__}.base_model_prefix {prefix!r} names no child module (the backbone the "
                       "fused loss would call); a family spec is needed")
        elif "labels" not in params:
            problem = f"{type(m).__name__}.forward takes no labels argument"
        else:
            return path, m, None
        rejected = rejected or (path, m, problem)
    return rejected


class _BackboneStandIn(torch.nn.Module):
    """What :func:`probe_head` puts in place of the backbone: random hidden states of ``width`` features for the
    input ids it is called with (the head probe checks what the causal-LM forward does with them)."""

    def __init__(self, width: int, dtype: torch.dtype):
        super().__init__()
        self.width, self.dtype, self.calls, self.router_logits = width, dtype, 0, None

    def forward(self, input_ids=None, *args, **kwargs):
        self.calls += 1
        return _HiddenStates(_randn((*input_ids.shape, self.width), "cpu", self.dtype, seed=6), self.router_logits)


class _HiddenStates:
    """A backbone output holding only ``last_hidden_state`` (also ``[0]``) and ``router_logits`` (the MoE probe's, else
    None); every other field reads None."""

    def __init__(self, hidden: torch.Tensor, router_logits=None):
        self.last_hidden_state, self.router_logits = hidden, router_logits

    def __getattr__(self, name):
        return None

    def __getitem__(self, index):
        return (self.last_hidden_state,)[index]


def _head_stand_in(m: torch.nn.Module, w: torch.Tensor) -> tuple[torch.nn.Module, _BackboneStandIn]:
    """A shallow copy of the causal-LM module ``m`` on the CPU whose backbone is a :class:`_BackboneStandIn` and whose
    ``lm_head`` is a narrow random ``nn.Linear`` with the head's output size and dtype: its forward is ``m``'s class
    forward from the backbone output on, whatever device (meta included) and size ``m`` has."""
    head = m.lm_head
    vocab = getattr(head, "out_features", None) or w.shape[0]
    width = 16
    linear = torch.nn.Linear(width, vocab, bias=getattr(head, "bias", None) is not None, dtype=w.dtype)
    with torch.no_grad():
        for i, p in enumerate(linear.parameters()):
            p.copy_(_randn(p.shape, "cpu", seed=12 + i) * width ** -0.5)
    backbone = _BackboneStandIn(width, w.dtype)
    stand_in = copy.copy(m)
    object.__setattr__(stand_in, "_modules", {**m._modules, m.base_model_prefix: backbone, "lm_head": linear})
    return stand_in, backbone


def probe_head(m: torch.nn.Module) -> CausalLMSpec | str:
    """A CausalLMSpec for ``m`` when its training loss is HF's causal-LM loss of ``lm_head(hidden)``, or why not.

    The probe runs ``m``'s forward on a stand-in (:func:`_head_stand_in`): random hidden states in place of the
    backbone, a narrow random head with ``m``'s vocabulary and head dtype. Only what happens after the backbone
    decides, so the answer is the same for a weightless (meta) model and for the loaded one.
    """
    from .causal_lm import uses_default_loss

    if not uses_default_loss(m):
        return "the model has a custom loss_function / loss_type (or none); its loss is kept"
    w = _float_weight(m.lm_head)
    if w is None:
        return "lm_head has no floating weight"
    stand_in, backbone = _head_stand_in(m, w)
    V = getattr(getattr(m, "config", None), "vocab_size", None) or w.shape[0]
    g = torch.Generator().manual_seed(4)
    ids = torch.randint(0, min(int(V), 256), (1, 8), generator=g)
    seen = []

    def hook(_mod, _inp, out):  # large logits: a softcap or a scale cannot hide behind tiny ones
        out = out * 100.0
        seen.append(out)
        return out

    stand_in.lm_head.register_forward_hook(hook)
    extra, router, moe = {}, None, generic_moe.router_probe_inputs(m, ids)
    backbone.router_logits = None if isinstance(moe, str) else moe[1].logits  # (read by MoE heads only)
    for attempt in range(2):  # once plainly; an MoE output again, asking for the router loss (generic_moe)
        try:
            with _probing(stand_in):
                out = _class_forward(stand_in)(input_ids=ids, labels=ids, **extra)
        except Exception as e:
            return f"probe forward failed: {type(e).__name__}: {e}"
        if attempt or "aux_loss" not in getattr(type(out), "__dataclass_fields__", {}):
            break
        if isinstance(moe, str):
            return moe
        (extra, router), backbone.calls = moe, 0
        seen.clear()
        if "router_aux_loss_coef" in vars(stand_in):  # 1: the aux term well above the tolerance
            stand_in.router_aux_loss_coef = 1.0
    if backbone.calls != 1:
        return f"the forward called its backbone ({m.base_model_prefix}) {backbone.calls} times (expected once)"
    if len(seen) != 1:
        return f"lm_head was called {len(seen)} times in one forward (expected once)"
    logits = getattr(out, "logits", None)
    if logits is None or getattr(out, "loss", None) is None:
        return "the forward returned no logits / loss"
    tol = TOL.get(w.dtype, TOL[torch.bfloat16])
    err = rel_l2(logits, seen[0])
    if err > tol:
        return (f"the logits are post-processed after lm_head (softcap / scaling?; relative error {err:.1e}); "
                "a family spec is needed")
    with torch.no_grad():
        ref_loss = causal_lm_loss_from_logits_ref(seen[0], ids)
    aux = None
    if router is not None:  # an MoE head: no router loss, or load_balancing_loss_func as the patched head adds it
        aux = generic_moe.probe_router_loss(m, out, ref_loss, router, extra["attention_mask"], tol)
        if isinstance(aux, tuple):
            return aux[1]
    elif (err := rel_l2(out.loss.float(), ref_loss)) > tol:
        return f"the loss is not HF's causal-LM cross-entropy of the logits (relative error {err:.1e})"
    return CausalLMSpec(type(m).__name__, backbone=m.base_model_prefix, output_class=type(out).__name__,
                        router_aux_loss=aux)


def causal_lm_loss_from_logits_ref(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """HF ``ForCausalLMLoss`` in plain torch (fp32 logits, labels shifted left, mean over non-ignored)."""
    target = F.pad(labels, (0, 1), value=-100)[..., 1:].reshape(-1)
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), target, ignore_index=-100)


# ---- the matcher ------------------------------------------------------------------------------------------------
def generic_matches(model: torch.nn.Module, enabled: dict[str, bool]) -> GenericResult:
    """Probe every candidate module of ``model`` for the enabled kinds; see the module docstring.

    Modules already carrying a Tigon forward are matched without probing (the engine reports them as already
    patched). Returns the matches (including failed probes, with ``problem`` set) and function-level rope skips.
    """
    matches: list[tuple[str, torch.nn.Module, Match]] = []
    skipped: list[tuple[str, str, str]] = []
    cache: dict = {}
    for path, m in model.named_modules():
        mod_name = type(m).__module__
        if enabled.get("rms_norm"):
            eps_attr = _norm_eps_attr(m)
            if eps_attr is not None:
                already = tigon_mark(m.__dict__.get("forward"))
                spec = (NormSpec(type(m).__qualname__, eps_attr=eps_attr) if already
                        else probe_meta(cache, "norm", m, probe_norm, eps_attr))
                matches.append((path, m, _match("rms_norm", m, spec, mod_name)))
                continue
        if enabled.get("mlp") and not _is_builtin(m) and generic_moe.experts_candidate(m):  # v5 MoE experts
            already = tigon_mark(m.__dict__.get("_apply_gate"))
            spec = (MLPSpec(type(m).__qualname__, experts=True) if already
                    else generic_moe.probe_experts(m))  # (reads no weight: no stand-in for meta modules)
            matches.append((path, m, _match("mlp", m, spec, mod_name)))
            continue
        if enabled.get("mlp"):
            layout = _mlp_layout(m)
            if layout is not None:
                already = tigon_mark(m.__dict__.get("forward"))
                spec = MLPSpec(type(m).__qualname__) if already else probe_meta(
                    cache, "mlp", m, probe_mlp, layout, shrink=True, retry_full=_probe_failed)
                matches.append((path, m, _match("mlp", m, spec, mod_name)))
                continue

    if enabled.get("rope"):
        _rope_matches(model, matches, skipped)

    if enabled.get("lm_head_loss"):
        cand = _head_candidate(model)
        if cand is not None:
            path, m, problem = cand
            if problem is None and tigon_mark(m.__dict__.get("forward")):
                spec = CausalLMSpec(type(m).__name__)
            elif problem is None and not any(mt.problem is None for _, _, mt in matches):
                spec = ("not probed: the generic matcher patches an LM head only in a model where it recognised "
                        "a norm, a gated MLP, MoE experts or the rotary function")
            else:
                spec = problem or probe_head(m)
            matches.append((path, m, _match("lm_head_loss", m, spec, type(m).__module__)))
    return GenericResult(matches, skipped)


def _rope_matches(model, matches: list, skipped: list) -> None:
    """Append the attention modules that call a rotate-half ``apply_rotary_pos_emb`` to ``matches``, and to
    ``skipped`` the rotary functions left alone: one that fails the probe, and any other rotary function
    (:func:`tigon.integrations.rotary_calls.rotary_functions`) that attention classes call instead of it."""
    by_module: dict[str, list[type]] = {}
    for m in model.modules():
        if not _is_builtin(m) and type(m) not in by_module.setdefault(type(m).__module__, []):
            by_module[type(m).__module__].append(type(m))
    for mod_name, classes in by_module.items():
        called = {c: rotary_functions(c) for c in classes}
        others: dict[str, list[str]] = {}
        for c, names in called.items():
            if ROPE_FUNCTION not in names:
                for name in sorted(names):
                    others.setdefault(name, []).append(c.__name__)
        for name, users in others.items():
            skipped.append(("rope", f"{mod_name}.{name}", (
                f"called by {', '.join(users)} instead of {ROPE_FUNCTION}(q, k, cos, sin), the only rotary "
                "function the generic matcher probes and routes to tigon.functional.rope; left alone")))
        module = sys.modules.get(mod_name)
        fn = getattr(module, ROPE_FUNCTION, None) if module is not None else None
        if not callable(fn):
            continue
        attn = tuple(c for c in classes if ROPE_FUNCTION in called[c])
        if not attn:
            continue
        original = fn
        if tigon_mark(fn) is not None:  # a Tigon dispatcher is installed: probe what it wraps
            original = getattr(fn, "__wrapped__", fn)
        problem = probe_rope(original)
        if problem is not None:
            skipped.append(("rope", f"{mod_name}.{ROPE_FUNCTION}", problem))
            continue
        spec = RopeSpec(ROPE_FUNCTION, attention_classes=tuple(c.__name__ for c in attn))
        for path, m in model.named_modules():
            if type(m) in attn:
                matches.append((path, m, Match("rope", type(m), spec, mod_name)))


def _match(kind: str, m, spec_or_problem, mod_name: str) -> Match:
    if isinstance(spec_or_problem, str):
        return Match(kind, type(m), None, mod_name, problem=spec_or_problem)
    return Match(kind, type(m), spec_or_problem, mod_name)
