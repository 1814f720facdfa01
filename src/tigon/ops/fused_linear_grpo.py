"""Fused LM head + the GRPO family's loss (TRL's GRPOTrainer, Liger-Kernel's ``LigerFusedLinearGRPOLoss``): the public
op and its record.

The heavy part, the policy's per-token log-probabilities (and entropies) and the reference model's, runs on the kernels
of :func:`tigon.functional.fused_linear_logprobs` without the (tokens, vocab) logits; the per-token loss on them is
:mod:`tigon.reference.grpo` in plain PyTorch. When gradients are wanted, the loss's gradient w.r.t. each chunk's
log-probabilities is taken as soon as they are known and the head's gradients are formed in the same pass
(:func:`formed_policy_loss`: 3 head matmuls); otherwise (and where that is not possible) autograd carries the loss's
gradient back into the log-probabilities' backward, which recomputes the logits (4).
Specification: :mod:`tigon.reference.fused_linear_grpo`.
"""

from __future__ import annotations

import functools
import inspect
import math

import torch

from ..reference import fused_linear_grpo as ref
from ..reference import fused_linear_logprobs as ref_lp
from ..reference.fused_linear_grpo import OPTION_NAMES
from ..reference.grpo import GRPOOptions, couples_tokens, grpo_loss, per_row_inputs, reduce_loss, token_losses
from ..support import TORCH_CODE, select_backend
from ._record import Case, OpSpec, randn
from .formed_grads import family, run_formed
from .fused_linear_logprobs import fused_linear_logprobs, logprob_plan, trl_linear_logprobs


def fused_linear_grpo(
    _input: torch.Tensor,
    weight: torch.Tensor,
    selected_token_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    advantages: torch.Tensor,
    bias: torch.Tensor | None = None,
    ref_per_token_logps: torch.Tensor | None = None,
    old_per_token_logps: torch.Tensor | None = None,
    ref_input: torch.Tensor | None = None,
    ref_weight: torch.Tensor | None = None,
    ref_bias: torch.Tensor | None = None,
    beta: float = 0.04,
    epsilon_low: float = 0.2,
    epsilon_high: float = 0.2,
    loss_type: str = "dapo",
    max_completion_length: int | None = None,
    importance_sampling_level: str = "token",
    sapo_temperature_pos: float = 1.0,
    sapo_temperature_neg: float = 1.05,
    temperature: float = 1.0,
    compiled: bool = True,
    use_ref_model: bool = True,
    chunk_size: int = 1,
    vllm_is_ratio: torch.Tensor | None = None,
    delta: float | None = None,
    use_bias_correction_kl: bool = False,
    vespo_k_pos: float = 2.0,
    vespo_lambda_pos: float = 3.0,
    vespo_k_neg: float = 3.0,
    vespo_lambda_neg: float = 2.0,
    num_items_in_batch=None,
    *,
    entropy_coef: float = 0.0,
    compute_entropy: bool = False,
    return_metrics: bool = False,
    memory: str | int = "auto",
):
    """The GRPO-family loss of completions, from the policy's final hidden states and LM head, without the logits.

    Liger-Kernel 0.8.5's ``liger_fused_linear_grpo`` arguments, in its order (``compiled`` and ``chunk_size`` are
    accepted and not read: the chunks follow ``memory``). The loss is TRL 1.16's ``GRPOTrainer._compute_loss`` on
    ``log_softmax((_input @ weight.T + bias) / temperature)`` at the sampled tokens: every ``loss_type`` of TRL
    (grpo, bnpo, dr_grpo, dapo, cispo, sapo, luspo, vespo), clipping ``epsilon_low`` / ``epsilon_high`` and
    INTELLECT-2's two-sided ``delta``, the k3 KL to a reference model (``beta``; its log-probabilities given, or
    computed here from ``ref_input`` / ``ref_weight`` without gradient), token- or sequence-level importance
    sampling, the vLLM importance-sampling correction, DeepSeek-V3.2's bias-corrected KL and the entropy bonus;
    formulas in :mod:`tigon.reference.grpo`. The per-token log-probabilities are those of
    :func:`tigon.functional.fused_linear_logprobs` (fp32, chunks of tokens); with gradients wanted they are formed
    in the forward, 3 head matmuls in all (:func:`formed_policy_loss`, eager and inside ``torch.compile``; a second
    backward through the loss then raises), except for sequence-coupled losses whose sequences do not fit a chunk,
    where the backward recomputes the logits (4). Masked tokens are never scored. Where Liger differs, this follows
    TRL: the clip-ratio metric of sequence-level sampling is a mean over sequences (Liger's over tokens); ``luspo``
    masks the per-token losses before weighting by the lengths (TRL 1.16; Liger weights unmasked ones); the dapo
    normalizer is clamped to 1 before the division by the processes; and ``use_ref_model`` only asks for a reference
    when ``beta != 0``.

    Args:
        _input: (B, T, H) (or (B * T, H)) policy hidden states at the completion positions, float32 / bfloat16 /
            float16. Gets a gradient.
        weight: (V, H) LM-head weight (gets a gradient); bias: optional (V,) LM-head bias (gets one).
        selected_token_ids: (B, T) integer sampled token ids (in [0, V) where ``attention_mask`` is set).
        attention_mask: (B, T) completion mask (any dtype): the tokens that count, each weighted by its value as
            TRL and Liger-Kernel multiply by it (0 / 1 as a rule).
        advantages: (B,) (or (B, T)) float advantages.
        ref_per_token_logps: (B, T) reference-model log-probabilities, or None.
        old_per_token_logps: (B, T) log-probabilities of the sampling policy, or None (this policy's, detached).
        ref_input, ref_weight, ref_bias: the reference model's hidden states (B, T, H') and LM head (V, H'), (V,),
            used when beta != 0 and ``ref_per_token_logps`` is None (no gradient).
        beta: KL coefficient (0: no reference model). epsilon_low, epsilon_high: the clip range of the importance
            weight (for cispo, epsilon_high is its cap). loss_type: see above (TRL's default "dapo").
        max_completion_length: the dr_grpo normalizer (required for it).
        importance_sampling_level: "token" or "sequence" (GSPO).
        sapo_temperature_pos, sapo_temperature_neg: SAPO's gate temperatures (> 0).
        temperature: divides the logits (the sampling temperature), finite and > 0.
        compiled, chunk_size: Liger's, ignored. use_ref_model: with beta != 0, require a reference.
        vllm_is_ratio: (B, T), (B, 1) or (B,) sampler importance-sampling ratio (TRL's ``importance_sampling_ratio``).
        delta: upper clamp of the importance weight in the clipped surrogate (None: off; > 0).
        use_bias_correction_kl: multiply the KL term by the importance weight.
        vespo_k_pos, vespo_lambda_pos, vespo_k_neg, vespo_lambda_neg: VESPO's gamma weights.
        num_items_in_batch: completion tokens of the whole generation batch, over all processes (dapo, cispo,
            vespo); None: the mask's tokens (summed over the processes when torch.distributed is initialised).
        entropy_coef: subtracts this times the masked mean entropy (TRL's entropy bonus; the entropy then has a
            gradient). compute_entropy: compute the entropies for the ``"entropy"`` metric (one more pass over each
            chunk's logits). return_metrics: return ``GRPOOutput(loss, metrics)``.
        memory: the log-probabilities' ``memory`` option (:func:`tigon.functional.fused_linear_logprobs`).

    Returns:
        The 0-d float32 loss (float64 for float64 inputs), or with ``return_metrics`` a
        :class:`~tigon.reference.fused_linear_grpo.GRPOOutput` ``(loss, metrics)``, metrics a dict of 0-d detached
        tensors under TRL's logging keys (``"kl"``, ``"entropy"``, ``"clip_ratio/low_mean"``, ...;
        :func:`tigon.reference.grpo.grpo_loss`). No host synchronisation (unless torch.distributed sums the mask).

    Raises:
        TypeError, ValueError: bad shapes, dtypes or devices (:func:`tigon.reference.fused_linear_grpo.check_inputs`,
            and the LM heads' checks of :func:`tigon.functional.fused_linear_logprobs`); bad options
            (:class:`tigon.reference.grpo.GRPOOptions`: unknown ``loss_type`` / ``importance_sampling_level``, dr_grpo
            without ``max_completion_length``, temperatures or delta not > 0); ``use_ref_model`` with beta != 0 and
            no reference; ``entropy_coef`` is validated likewise; ``compute_entropy``, ``use_ref_model``,
            ``use_bias_correction_kl`` and ``return_metrics`` must be bools; ``num_items_in_batch`` a finite count
            >= 0, a number or a one-element tensor (a CPU tensor's value is read), as
            :func:`tigon._checks.num_items` says (``zero``, ``real``).
    """
    args = dict(_input=_input, weight=weight, selected_token_ids=selected_token_ids,
        attention_mask=attention_mask, advantages=advantages, bias=bias, ref_per_token_logps=ref_per_token_logps,
        old_per_token_logps=old_per_token_logps, ref_input=ref_input, ref_weight=ref_weight, ref_bias=ref_bias,
        beta=beta, epsilon_low=epsilon_low, epsilon_high=epsilon_high, loss_type=loss_type,
        max_completion_length=max_completion_length, importance_sampling_level=importance_sampling_level,
        sapo_temperature_pos=sapo_temperature_pos, sapo_temperature_neg=sapo_temperature_neg, temperature=temperature,
        compiled=compiled, use_ref_model=use_ref_model, chunk_size=chunk_size, vllm_is_ratio=vllm_is_ratio,
        delta=delta, use_bias_correction_kl=use_bias_correction_kl, vespo_k_pos=vespo_k_pos,
        vespo_lambda_pos=vespo_lambda_pos, vespo_k_neg=vespo_k_neg, vespo_lambda_neg=vespo_lambda_neg,
        num_items_in_batch=num_items_in_batch, entropy_coef=entropy_coef, compute_entropy=compute_entropy,
        return_metrics=return_metrics, memory=memory)
    memory = args.pop("memory")
    if select_backend("fused_linear_grpo", _input) in TORCH_CODE:
        return ref.grpo_pipeline(ref_lp.fused_linear_logprobs, args)
    formed = functools.partial(formed_policy_loss, memory=memory)
    return ref.grpo_pipeline(fused_linear_logprobs, args, formed, memory=memory)


def formed_policy_loss(hidden, ids, ref_logps, options: GRPOOptions, b: int, t: int, want_entropy: bool, args: dict,
                       memory="auto"):
    """The policy's part of :func:`fused_linear_grpo` with its gradients formed in the forward: ``(loss, metrics)``,
    or None where that is not possible here (then the log-probabilities' path runs: logits recomputed in the backward).

    Why it works: the loss is :func:`tigon.reference.grpo.reduce_loss` of :func:`~tigon.reference.grpo.token_losses`;
    the reduction is linear with coefficients that depend on the mask alone (taken once by autograd on zeros), and the
    per-token losses of a token depend on its own log-probability (token-level importance sampling, every loss type
    but vespo) or on its sequence's (sequence level, vespo: then each chunk holds whole sequences). So as soon as a
    chunk's log-probabilities are known, autograd through ``token_losses`` on that chunk gives the loss's gradient
    w.r.t. them, and :func:`tigon.kernels.fused_linear_logprobs.logprobs_grads_in_forward` turns it into the
    gradients of hidden, weight and bias in the same pass over the chunk: 3 matmuls per token instead of 4, no
    (tokens, vocab) tensor. The loss value and metrics then come from :func:`tigon.reference.grpo.grpo_loss` on the
    log-probabilities (no autograd), plus the zero that carries the gradients
    (:func:`tigon.ops.formed_grads.run_formed`: :class:`tigon.kernels.fused_linear_logprobs.FormedGradsFunction`
    eager, the ``tigon::formed_head_grads`` custom op inside ``torch.compile``, the chunk loop :func:`_policy_pass`
    either way).

    None when: no gradient is wanted (grad mode off, no input requires one), a PyTorch backend or a matmul dtype the
    kernels do not take, a coupled loss (:func:`tigon.reference.grpo.couples_tokens`) whose sequences are longer
    than a chunk, or advantages, given log-probabilities or the sampler's ratio that require a gradient themselves.
    """
    a = args
    weight, bias = a["weight"], a["bias"]
    others = (a["advantages"], ref_logps, a["old_per_token_logps"], a["vllm_is_ratio"])
    if torch.is_grad_enabled() and any(x is not None and x.requires_grad for x in others):
        return None  # autograd's path gives them their gradients too
    plan = logprob_plan(hidden, weight, ids, bias, temperature=a["temperature"], memory=memory)
    if plan is None or not any(plan.need):
        return None
    from ..kernels import fused_linear_cross_entropy as kflce

    if couples_tokens(options) and kflce.loop_rows(hidden, weight, plan.cd, plan.need, plan.lean, plan.budget,
                                                   align=t) == 0:
        return None
    mask, old, num_items = a["attention_mask"], a["old_per_token_logps"], a["num_items_in_batch"]
    spec = {k: getattr(options, k) for k in OPTION_NAMES}
    given = isinstance(num_items, torch.Tensor)
    spec.update(want_entropy=bool(want_entropy), num_items=None if given else num_items)
    tensors = [ids, mask, a["advantages"], ref_logps, old, a["vllm_is_ratio"], num_items if given else None]
    anchor, logp, ent, _ = run_formed("grpo", spec, hidden, weight, bias, tensors, plan, want_entropy)
    with torch.no_grad():
        loss, metrics = grpo_loss(logp.reshape(b, t), mask, a["advantages"], ref_logps, old,
                                  ent.reshape(b, t) if want_entropy else None, a["vllm_is_ratio"], num_items, options)
    return loss + anchor, metrics


@family("grpo")
def _policy_pass(spec: dict, tensors: list, hidden, weight, bias, plan, halves: bool):
    """The policy's chunk loop of :func:`formed_policy_loss` (its ``spec``: the :class:`GRPOOptions` fields,
    ``want_entropy`` and a non-tensor ``num_items``; ``tensors``: ids (B * T,), mask (B, T), advantages, the given
    reference and old log-probabilities, the sampler's ratio, a tensor ``num_items_in_batch``, None where absent):
    ``((logp (B * T,), entropy or None, None), unscaled gradients)``, eager or inside the custom op
    (:func:`tigon.ops.formed_grads.run_formed`)."""
    from ..kernels import fused_linear_logprobs as klp

    options = GRPOOptions(**{k: spec[k] for k in OPTION_NAMES})
    want_entropy = spec["want_entropy"]
    ids, mask, advantages, ref_logps, old, vllm_ratio, num_items = tensors
    num_items = spec["num_items"] if num_items is None else num_items
    b, t = mask.shape
    coupled = couples_tokens(options)
    f32 = torch.float32
    weights = mask.to(f32)  # (TRL multiplies by the mask: a fractional value weighs its token)
    adv, ratio = per_row_inputs(advantages, vllm_ratio, f32)
    with torch.enable_grad():  # the reduction's coefficients: its gradient at zero per-token losses (it is linear)
        zeros = torch.zeros((b, t), dtype=f32, device=hidden.device, requires_grad=True)
        ent0 = torch.zeros((b, t), dtype=f32, device=hidden.device, requires_grad=True) if want_entropy else None
        wanted = [zeros] + ([ent0] if options.entropy_coef != 0.0 else [])
        coefs = torch.autograd.grad(reduce_loss(zeros, weights, ent0, num_items, options), wanted)
    w_tok = coefs[0].reshape(-1)
    w_ent = coefs[1].reshape(-1).contiguous() if len(coefs) > 1 else None

    def chunk(x, s, e):
        """The chunk [s, e) of a (B, T), (B, 1) or None per-token input: whole sequences (b', t) when coupled, else a
        (1, e - s) run of tokens."""
        if x is None:
            return None
        if coupled:
            return x[s // t: e // t]
        return x.expand(b, t).reshape(1, -1)[:, s:e]

    def token_grads(s, e, logp, ent):
        with torch.enable_grad():
            lp = logp.detach().reshape(-1, t) if coupled else logp.detach().reshape(1, -1)
            lp.requires_grad_()
            per_token = token_losses(lp, chunk(weights, s, e), chunk(adv, s, e), chunk(ref_logps, s, e),
                                     chunk(old, s, e), chunk(ratio, s, e), options)[0]
            # (a sequence-level loss without a per-token term is (b', 1): it broadcasts over the tokens, as in the
            # reduction)
            (g,) = torch.autograd.grad((per_token.expand_as(lp).reshape(-1) * w_tok[s:e]).sum(), lp)
        return g.reshape(-1).contiguous(), (w_ent[s:e] if w_ent is not None else None)

    logp, ent, grads = klp.logprobs_grads_in_forward(hidden, weight, ids.contiguous(), bias, plan.opts, plan.cd,
                                                     plan.need, want_entropy, token_grads, plan.lean, plan.budget,
                                                     t if coupled else 1, halves)
    return (logp, ent, None), grads


def trl_grpo(*args, **kwargs):
    """TRL's computation: the log-probabilities from a model's logits (:func:`trl_linear_logprobs`: the LM head in
    the input dtype, fp32 logits / temperature, log-softmax gathered), then the same per-token loss; the arguments
    of :func:`fused_linear_grpo` (without ``memory``)."""
    kwargs.pop("memory", None)  # (Tigon's option: a bench case's, which the original runs without)
    bound = inspect.signature(ref.fused_linear_grpo).bind(*args, **kwargs)
    bound.apply_defaults()
    return ref.grpo_pipeline(trl_linear_logprobs, dict(bound.arguments))


# ---- the record ----------------------------------------------------------------------------------------------------
RATIOS = (0.5, 0.7, 0.95, 1.0, 1.05, 1.4, 2.0)
"""Importance weights the builder gives the tokens (``old``): at least 0.05 from the clip range's ends (0.8, 1.2) and
from the cases' delta (1.7), so that rounding in bf16 does not move a token across a kink of the loss."""


def _true_logps(h, w, ids, rows: int = 1024):
    """fp32 log-probabilities of the builder's tokens (no gradient), ``rows`` tokens at a time (no (N, V) buffer)."""
    with torch.no_grad():
        w32 = w.float()
        return torch.cat([ref_lp.fused_linear_logprobs(h[s:s + rows].float(), w32, ids[s:s + rows])
                          for s in range(0, h.shape[0], rows)])


def _inputs(s: dict, dtype, device, gen, ref: str = "logps", old: bool = False, bias: bool = False) -> dict:
    """B = the model's batch (1 when it does not divide the tokens) sequences of T tokens: hidden (B, T, H), an LM
    head with logits of std ~2, sampled ids, a completion mask ending each sequence i in ``i % 3`` padding tokens,
    (B,) advantages; ``ref``: ``"logps"`` (ref_per_token_logps, the policy's plus noise of std 0.1) or ``"input"``
    (a reference model's hidden states and head, the policy's perturbed); ``old``: old_per_token_logps giving the
    tokens importance weights from :data:`RATIOS`; ``bias``: an LM-head bias."""
    b = s["batch"] if s["tokens"] % s["batch"] == 0 else 1
    t, hd, v = s["tokens"] // b, s["hidden"], s["vocab"]
    h = randn(gen, (b, t, hd), dtype, device)
    w = randn(gen, (v, hd), dtype, device, 2.0 / math.sqrt(hd))
    ids = torch.randint(0, v, (b, t), generator=gen, device=gen.device).to(device)
    mask = torch.ones(b, t, dtype=torch.int64, device=device)
    for i in range(b):
        mask[i, t - min(i % 3, t - 1):] = 0
    out = dict(_input=h, weight=w, selected_token_ids=ids, attention_mask=mask,
               advantages=randn(gen, (b,), torch.float32, device))
    if bias:
        out["bias"] = randn(gen, (v,), dtype, device, 0.5)
    logp = _true_logps(h.reshape(b * t, hd), w, ids.reshape(-1)).reshape(b, t)
    if ref == "logps":
        out["ref_per_token_logps"] = logp + randn(gen, (b, t), torch.float32, device, 0.1)
    elif ref == "input":
        out["ref_input"] = (h.float() + randn(gen, (b, t, hd), torch.float32, device, 0.1)).to(dtype)
        out["ref_weight"] = (w.float() + randn(gen, (v, hd), torch.float32, device, 0.1 / math.sqrt(hd))).to(dtype)
    if old:
        pick = torch.randint(0, len(RATIOS), (b, t), generator=gen, device=gen.device).to(device)
        out["old_per_token_logps"] = logp - torch.tensor(RATIOS, device=device).log()[pick]
    return out


def _liger(**inputs):
    from liger_kernel.chunked_loss.functional import liger_fused_linear_grpo

    names = list(inspect.signature(ref.fused_linear_grpo).parameters)[:11]
    return liger_fused_linear_grpo(*(inputs.get(k) for k in names))[0]


_liger.__qualname__ = "liger_kernel.chunked_loss.functional.liger_fused_linear_grpo"

PROPERTY_ONLY = frozenset()
"""Cases without a verify row or a quick test, drawn by the property tests only (they draw from every case): the loss
types are checked against TRL's own code in tests/test_fused_linear_grpo.py, and each row costs interpreted kernels
on the CPU suite."""

RECORDS = (OpSpec(
    name="fused_linear_grpo",
    summary="LM head + the GRPO family's loss (TRL's loss types, clipping, KL, importance sampling), no logits kept",
    fn=fused_linear_grpo,
    reference=ref.fused_linear_grpo,
    original=trl_grpo,
    original_name="TRL 1.16 GRPOTrainer._compute_loss on log-probs from HF logits (LM head in the input dtype, fp32 "
                  "log-softmax)",
    make_inputs=_inputs,
    shape_of=lambda m: {"tokens": m.tokens, "batch": m.batch, "hidden": m.hidden, "vocab": m.vocab},
    size_format="tokens x hidden x vocab",
    size_label=lambda s: f"{s['tokens']}x{s['hidden']}x{s['vocab']}",
    grad_inputs=("_input", "weight"),
    category="lm_head_loss",
    # the floor: the policy's logits (1 matmul), with the gradients 2 more (grad_hidden, grad_weight); Tigon forms
    # them in the forward (formed_policy_loss), so its forward does all 3 when the inputs need gradients
    flops=lambda s, mode: (2 if mode == "fwd" else 6) * s["tokens"] * s["hidden"] * s["vocab"],
    grads_in_forward=("tigon", "tigon_lean", "tigon_compile"),
    tigon_compile=True,  # a compiled training step: the gradients still formed in the forward (formed_grads)
    peers={"liger": _liger},
    host_syncs=("liger",),
    bench_notes={"tigon_lean": "memory='low': the log-probabilities' grad_weight accumulated in the weight's dtype, "
                               "chunks of about 64 MiB of logits"},
    cases=(
        Case(),
        Case("grpo, clipped", options={"loss_type": "grpo"}, inputs={"old": True}, variants=("model",)),
        Case("bnpo, ref_input, temperature=0.7", options={"loss_type": "bnpo", "temperature": 0.7},
             inputs={"ref": "input"}, variants=("model",)),
        Case("dr_grpo, sequence level", options={"loss_type": "dr_grpo", "max_completion_length": 8,
                                                 "importance_sampling_level": "sequence"}, inputs={"old": True},
             tags=PROPERTY_ONLY),
        Case("cispo", options={"loss_type": "cispo", "epsilon_high": 1.3}, inputs={"old": True},
             variants=("model",), tags=PROPERTY_ONLY),
        Case("sapo", options={"loss_type": "sapo", "beta": 0.0}, inputs={"old": True, "ref": "none"},
             variants=("model",), tags=PROPERTY_ONLY),
        Case("vespo", options={"loss_type": "vespo"}, inputs={"old": True}, variants=("model",), tags=PROPERTY_ONLY),
        Case("luspo, sequence level", options={"loss_type": "luspo", "importance_sampling_level": "sequence"},
             variants=("model",), tags=PROPERTY_ONLY),
        Case("delta=1.7, bias-corrected KL, bias", options={"delta": 1.7, "use_bias_correction_kl": True},
             inputs={"old": True, "bias": True}, variants=("model",), tags=PROPERTY_ONLY),
        Case("bench: memory=low", options={"memory": "low"}, tags=frozenset({"bench"}), provider="tigon_lean"),
    ),
),)
