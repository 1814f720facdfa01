"""The generic matcher's MoE parts (:mod:`tigon.integrations.generic`): transformers v5 experts modules and the router
load-balancing loss of an MoE LM head, for families without data.

experts
    a module with 3-D ``gate_up_proj`` / ``down_proj`` tensors (:func:`experts_candidate`). It is taken when its class
    ``forward`` is transformers' experts dispatcher (``@use_experts_implementation``, read from its code as
    :func:`tigon.integrations.moe_experts.glue_problem` reads it), it has the dispatcher's ``has_gate`` / ``has_bias`` /
    ``is_transposed`` flags and a gate, its ``_apply_gate`` is transformers' default hook (``act_fn(gate) * up`` on
    the chunked halves), and that hook passes a probe in fp32: the hook alone on random (4, 32) gate-up rows, at unit
    variance and driven to +-50 (a clamp shows), against swiglu, gelu-tanh geglu and exact geglu (relative L2 1e-5);
    exactly one must pass, and names the activation (:func:`probe_experts`). The result is the spec a family with
    data declares (``MLPSpec(experts=True)`` with the probed activation), so the engine gives the module the same
    treatment: the ``_apply_gate`` hook, and the glue forward where
    :func:`~tigon.integrations.moe_experts.glue_problem` is None (both checked per call as for families with data).
    The probe reads no weight, so a weightless (meta) model gets the same decision.
router loss
    an LM head whose output has an ``aux_loss`` field (:func:`probe_router_loss`, called by
    :func:`tigon.integrations.generic.probe_head` on its stand-in): its forward is run with random router logits from
    the stand-in backbone and a padding mask. Either it adds no router loss (``aux_loss`` None: the head passes the
    router logits through, as GLM-4-MoE's and EXAONE-MoE's do), or its ``aux_loss`` and loss must be the family module's
    ``load_balancing_loss_func(router_logits, head.num_experts, head.num_experts_per_tok, attention_mask)`` and the
    cross-entropy plus ``head.router_aux_loss_coef`` times it (the coefficient set to 1 on the stand-in, so that the
    aux term is not lost in the tolerance), which is what the patched head then computes
    (:class:`~tigon.integrations.family_spec.CausalLMSpec` ``router_aux_loss``). Anything else: the head is skipped
    with the reason, never patched without its router loss.
"""

from __future__ import annotations

import inspect
import sys

import torch

from ..numerics import rel_l2
from ..reference import glu as ref_glu
from .families import MLPSpec
from .generic_stand_in import randn
from .marks import tigon_mark

EXPERTS_PROBE_REACH = 50.0
"""The largest |gate| / |up| of the experts hook's second probe (as the gated MLP probe's ``MLP_PROBE_REACH``)."""
_FLAGS = ("has_gate", "has_bias", "is_transposed")
ROUTER_LOSS = "load_balancing_loss_func"


def experts_candidate(m) -> bool:
    """Whether ``m`` holds experts weights as v5 experts modules do: 3-D ``gate_up_proj`` and ``down_proj`` tensors."""
    gate_up, down = getattr(m, "gate_up_proj", None), getattr(m, "down_proj", None)
    return (isinstance(gate_up, torch.Tensor) and isinstance(down, torch.Tensor)
            and gate_up.dim() == 3 and down.dim() == 3)


def probe_experts(m) -> MLPSpec | str:
    """The experts spec of ``m`` (see the module docstring), or why it is left alone."""
    from . import moe_experts
    from .generic import ACT_FUNCTIONS, TOL, _probing
    from .mlp_forwards import default_experts_gate

    name = type(m).__name__
    forward = getattr(type(m), "forward", None)
    if tigon_mark(forward) is None and not moe_experts._dispatcher(forward):
        return (f"{name}.forward is not transformers' experts dispatcher (@use_experts_implementation) as its code "
                "reads: experts computed in a forward of their own; an experts forward of this layout is needed")
    if not all(isinstance(getattr(m, f, None), bool) for f in _FLAGS):
        return "no has_gate / has_bias / is_transposed flags (not a @use_experts_implementation module)"
    if not m.has_gate:
        return "experts without a gate (has_gate False): no gated activation to replace"
    hook, default = getattr(type(m), "_apply_gate", None), default_experts_gate()
    if hook is None or default is None:
        return "no _apply_gate hook in this transformers (experts implementation interface missing)"
    if hook is not default and tigon_mark(hook) is None:
        return f"{name} defines its own _apply_gate (a custom gating function); left alone"
    x = randn((4, 32), "cpu", seed=7)
    errs = dict.fromkeys(ACT_FUNCTIONS, 0.0)
    try:
        with _probing(m):
            for probe_x in (x, x * (EXPERTS_PROBE_REACH / float(x.abs().amax()))):
                y = default(m, probe_x)
                gate, up = probe_x.chunk(2, dim=-1)
                for act in errs:
                    want = ref_glu.swiglu(gate, up) if act == "silu" else ref_glu.geglu(
                        gate, up, "tanh" if act == "gelu_pytorch_tanh" else "none")
                    errs[act] = max(errs[act], rel_l2(want, y.float()))
    except Exception as e:  # an activation on another device, a hook that takes other arguments, ...
        return f"probe of _apply_gate failed: {type(e).__name__}: {e}"
    passing = [a for a, e in errs.items() if e <= TOL[torch.float32]]
    if len(passing) != 1:
        detail = ", ".join(f"{a}: {e:.1e}" for a, e in errs.items())
        return (f"_apply_gate (act_fn(gate) * up) is not swiglu / geglu for a supported activation, or ambiguous "
                f"(relative error {detail})")
    return MLPSpec(type(m).__qualname__, activation=passing[0], experts=True)


class RouterLogits:
    """What the head probe's stand-in backbone returns as ``router_logits`` when asked for them: one random
    (tokens, experts) tensor per layer (two layers)."""

    def __init__(self, experts: int, tokens: int, dtype: torch.dtype):
        self.logits = tuple(randn((tokens, experts), "cpu", dtype, seed=20 + i) for i in range(2))


def _head_int(m, attr: str):
    v = getattr(m, attr, None)
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


def router_probe_inputs(m, ids: torch.Tensor) -> tuple[dict, RouterLogits] | str:
    """Extra forward arguments (``output_router_logits=True`` where the head's forward takes it, and a padding mask
    with the first token masked) and the router logits the stand-in backbone returns, for the MoE head ``m``."""
    try:
        params = inspect.signature(type(m).forward).parameters
    except (TypeError, ValueError):
        params = {}
    experts = _head_int(m, "num_experts") or 4
    top_k = min(_head_int(m, "num_experts_per_tok") or 2, experts)
    if top_k < 1:
        return "no usable num_experts_per_tok"
    mask = torch.ones_like(ids)
    mask[:, 0] = 0
    extra = {"attention_mask": mask}
    if "output_router_logits" in params:
        extra["output_router_logits"] = True
    return extra, RouterLogits(experts, ids.numel(), torch.float32)


def probe_router_loss(m, out, ce: torch.Tensor, router: RouterLogits, mask: torch.Tensor, tol: float):
    """``router_aux_loss`` for the MoE head ``m`` (the function name, or None when it adds no router loss), given its
    stand-in forward's output ``out`` (coefficient 1) and the cross-entropy ``ce`` of its logits; or why not, as
    ``("why", reason)``."""
    aux = getattr(out, "aux_loss", None)
    if aux is None:
        err = rel_l2(out.loss.float(), ce)
        if err > tol:
            return "why", f"MoE head without aux_loss whose loss is not the causal-LM cross-entropy ({err:.1e})"
        return None
    fn = getattr(sys.modules.get(type(m).__module__), ROUTER_LOSS, None)
    missing = [a for a in ("num_experts", "num_experts_per_tok") if _head_int(m, a) is None]
    if not callable(fn) or missing or not isinstance(getattr(m, "router_aux_loss_coef", None), (int, float)):
        return "why", (f"the MoE head adds a router loss (aux_loss) but its modeling module has no {ROUTER_LOSS} or "
                       f"the head no {', '.join(missing) or 'router_aux_loss_coef'}: the generic matcher cannot "
                       "keep it; a family spec is needed")
    try:
        with torch.no_grad():
            want = fn(router.logits, m.num_experts, m.num_experts_per_tok, mask)
    except Exception as e:
        return "why", f"{ROUTER_LOSS} failed on the probe's router logits: {type(e).__name__}: {e}"
    if not isinstance(aux, torch.Tensor) or rel_l2(aux.float(), want.float()) > 1e-5:
        return "why", (f"the MoE head's aux_loss is not {ROUTER_LOSS}(router_logits, num_experts, "
                       "num_experts_per_tok, attention_mask): the generic matcher cannot keep it; a family spec "
                       "is needed")
    err = rel_l2(out.loss.float(), ce + want.float())
    if err > tol:
        return "why", (f"the MoE head's loss is not the cross-entropy + router_aux_loss_coef x aux_loss (relative "
                       f"error {err:.1e}): the generic matcher cannot keep the router loss; a family spec is needed")
    return ROUTER_LOSS
