"""The loss-side pieces of the TRL switch (:mod:`tigon.integrations.trl`): Tigon's fused LM head in place of TRL's,
and the GKD loss through both LM heads.

TRL 1.16 computes every per-token quantity its SFT, DPO, GRPO, RLOO and KTO trainers need from one call,
``model(..., labels=labels, fused_lm_head=True)``, after ``trl.trainer.utils.add_fused_lm_head`` replaced the model's
``forward`` (instance attribute). That call returns a ``FusedCausalLMOutput``: per-token ``log_probs`` (and, when
the trainer asked for them, ``entropy``, ``mean_logits``, ``is_top1``, ``log_sum_sq_probs``), ``label_mask`` and the
mean negative log-likelihood ``loss``; the trainers' losses (every DPO / GRPO ``loss_type``) and their metrics are
formulas on those per-token values. :func:`tigon_fused_outputs` computes the same fields with
:func:`tigon.functional.fused_linear_logprobs` (no (tokens, vocab) logits), so the trainer's own loss code and
metrics run unchanged on Tigon's numbers:

* ``log_probs``, ``entropy``: ``fused_linear_logprobs(..., return_entropy=True)``, differentiable.
* ``mean_logits`` (no gradient; DPO's and KTO's ``logits/*`` metrics: TRL detaches it): ``fused_linear_logprobs(...,
  return_mean_logits=True)``, the vocabulary mean of the transformed logits ``softcap(z) / T``, summed by the row
  kernel in the same read of the logits as the log-probabilities: no extra head work, and under a final-logit
  soft-cap (Gemma 2) too, where it is not linear in the hidden state (``h . mean_v W_v`` is only the mean without
  one).
* ``is_top1`` (no gradient): ``fused_linear_logprobs(..., return_is_top1=True)``, from the same pass as the
  log-probabilities (the row kernel keeps each row's first argmax beside its max): no extra head work.
  ``torch.argmax``'s tie rule, as TRL's (a target tied with an earlier column is not top-1).
* ``log_sum_sq_probs`` (no gradient; DPO's WPO weights): ``fused_linear_logprobs(...,
  return_log_sum_sq_probs=True)``, ``log sum_v p_v^2 = lse(2 z) - 2 lse(z)`` with ``z`` the temperature-scaled logits,
  from the same pass as the log-probabilities (the row kernel sums ``exp(2 (z - m))`` beside ``exp(z - m)``): no
  second head matmul.

TRL's transform of the logits is ``z = softcap(logit_scale * (h W^T + b)) / T``; ``logit_scale`` is applied here to
``h`` and ``b`` (the same product), the soft-cap and temperature by the op.
"""

from __future__ import annotations

import warnings
from contextlib import nullcontext

import torch

from .. import functional as F
from .. import support

KNOWN_OUTPUTS = ("log_probs", "entropy", "mean_logits", "is_top1", "log_sum_sq_probs")
"""The per-token fields of TRL 1.16's ``FusedCausalLMOutput`` that :func:`tigon_fused_outputs` computes."""

TRL_HEAD_FIELDS = ("original_forward", "backbone_attr", "temperature", "cast_lm_head_to_fp32", "outputs",
                   "final_logit_softcapping", "logit_scale")
"""The settings of TRL's ``add_fused_lm_head`` read from its forward's closure (TRL 1.16's variable names)."""


def trl_head_settings(model) -> dict | None:
    """The settings TRL's ``add_fused_lm_head`` gave ``model`` (temperature, outputs, soft-cap, ...), or None when
    ``model.forward`` is not TRL 1.16's fused forward (another TRL version, or a forward replaced since). A forward
    that accelerate's mixed precision wrapped after TRL's (``prepare_model`` of a reference model under bf16 / fp16:
    autocast and fp32 outputs around it, the original kept as ``model._original_forward``) is read through
    ``_original_forward``: :func:`amp_wrapped` says which."""
    settings = _settings_of(model.__dict__.get("forward"))
    if settings is None and amp_wrapped(model):
        settings = _settings_of(model.__dict__.get("_original_forward"))
    return settings


def amp_wrapped(model) -> bool:
    """Whether ``model.forward`` is accelerate's mixed-precision wrapper around TRL's fused forward."""
    return (_settings_of(model.__dict__.get("forward")) is None
            and _settings_of(model.__dict__.get("_original_forward")) is not None
            and hasattr(getattr(model.__dict__.get("forward"), "__func__", None), "__wrapped__"))


def _settings_of(fwd) -> dict | None:
    fn = getattr(fwd, "__func__", None)
    code = getattr(fn, "__code__", None)
    if code is None or code.co_name != "_fused_forward" or "trl" not in code.co_filename:
        return None
    cells = dict(zip(fn.__code__.co_freevars, (c.cell_contents for c in fn.__closure__ or ())))
    if any(k not in cells for k in TRL_HEAD_FIELDS):
        return None
    return {k: cells[k] for k in TRL_HEAD_FIELDS}


def unsupported_outputs(settings: dict) -> str | None:
    """Why Tigon cannot compute what this TRL head was asked for (None: it can)."""
    unknown = [o for o in settings["outputs"] if o not in KNOWN_OUTPUTS]
    if unknown:
        return f"TRL asks its fused LM head for {unknown}, which the switch does not compute"
    if not isinstance(settings["logit_scale"], (int, float)):
        return f"logit_scale of type {type(settings['logit_scale']).__name__}"
    return None


ROUTER_LOGITS = "MoE router logits requested (the load-balancing loss of TRL's fused forward is not reproduced)"
"""Why a call asking for router logits runs TRL's head (also reported at patch time for a trainer with
``aux_loss_enabled``, whose policy calls all ask for them)."""


def call_unsupported(weight, kwargs) -> str | None:
    """Why one ``fused_lm_head=True`` call must run TRL's own head (None: Tigon's can)."""
    if kwargs.get("output_router_logits"):
        return ROUTER_LOGITS
    if type(weight) is not torch.Tensor and not isinstance(weight, torch.nn.Parameter):
        return f"LM-head weight of type {type(weight).__name__} (e.g. an FSDP2 DTensor)"
    if weight.device.type not in ("cpu", "cuda"):
        return f"device {weight.device.type}"
    if weight.dim() != 2:
        return f"LM-head weight of shape {tuple(weight.shape)}"
    return None


def tigon_fused_outputs(model, settings: dict, args, kwargs, labels, shift_labels, num_items_in_batch,
                        memory="auto"):
    """What TRL's fused forward returns (its ``FusedCausalLMOutput``), computed with Tigon's fused head.

    Args:
        model: the causal LM TRL patched (its backbone is ``getattr(model, settings["backbone_attr"])``, its head
            ``model.get_output_embeddings()``, both looked up per call, as TRL does, since PEFT / FSDP replace them).
        settings: :func:`trl_head_settings` of the model.
        args, kwargs: the backbone's arguments (input ids, attention mask, ...).
        labels: (B, T) next-token labels before the shift, ``-100`` where ignored; or None with ``shift_labels``
            (B, T) already shifted.
        num_items_in_batch: the loss's denominator (default: the count of labels not ignored).
        memory: :func:`tigon.functional.fused_linear_logprobs`'s ``memory``.

    Returns:
        ``trl.trainer.utils.FusedCausalLMOutput``: ``loss`` (0-d), per-token (B, T - 1) (or (B, T) with
        ``shift_labels``) ``log_probs`` / ``entropy`` / ``mean_logits`` / ``log_sum_sq_probs`` float32 (0 where
        ignored), ``is_top1`` bool, ``label_mask`` bool; the fields TRL did not ask for are None.
    """
    from trl.trainer.utils import FusedCausalLMOutput

    outputs, temperature = settings["outputs"], float(settings["temperature"])
    softcap, scale = settings["final_logit_softcapping"], float(settings["logit_scale"])
    kwargs["use_cache"] = False
    backbone_out = getattr(model, settings["backbone_attr"])(*args, **kwargs)
    if shift_labels is None:
        hidden, labels = backbone_out.last_hidden_state[:, :-1], labels[:, 1:]
    else:
        hidden, labels = backbone_out.last_hidden_state, shift_labels
    head = model.get_output_embeddings()
    weight, bias = head.weight, head.bias
    hidden, labels = hidden.to(weight.device), labels.to(weight.device)
    mask = labels != -100
    ctx = nullcontext()
    if settings["cast_lm_head_to_fp32"]:
        hidden, weight = hidden.float(), weight.float()
        bias = None if bias is None else bias.float()
        ctx = torch.autocast(hidden.device.type, enabled=False)
    if scale != 1.0:
        hidden = hidden * scale
        bias = None if bias is None else bias * scale
    h, t = hidden[mask], labels[mask]  # only the scored positions go through the head
    with ctx:
        res = F.fused_linear_logprobs(h, weight, t, bias, temperature=temperature, softcap=softcap,
                                      return_entropy="entropy" in outputs, return_lse=True,
                                      return_is_top1="is_top1" in outputs,
                                      return_log_sum_sq_probs="log_sum_sq_probs" in outputs,
                                      return_mean_logits="mean_logits" in outputs, memory=memory)

    def scatter(x):
        return None if x is None else x.new_zeros(mask.shape).masked_scatter(mask, x)

    log_probs = scatter(res.logprobs)
    denom = mask.sum().clamp(min=1) if num_items_in_batch is None else num_items_in_batch
    return FusedCausalLMOutput(
        loss=-log_probs.sum() / denom, log_probs=log_probs, entropy=scatter(res.entropy),
        log_sum_sq_probs=scatter(res.log_sum_sq_probs), mean_logits=scatter(res.mean_logits),
        is_top1=scatter(res.is_top1), label_mask=mask, aux_loss=None)


def fallback(reason: str, where: str, strict: bool, seen: set, log: list) -> None:
    """One fallback to TRL's own path: raise in strict mode, else warn once per (where, reason) and record it."""
    msg = f"tigon.integrations.trl: {where} runs TRL's own path: {reason}"
    if strict:
        raise support.UnsupportedError(msg)
    if (where, reason) not in seen:
        seen.add((where, reason))
        log.append(f"{where}: {reason}")
        warnings.warn(msg, support.TigonFallbackWarning, stacklevel=3)


# ---- GKD ---------------------------------------------------------------------------------------------------------


def _logit_scale(config) -> float:
    """The factor TRL 1.16 multiplies a model's logits by (its ``logit_scale`` rule in ``add_fused_lm_head``)."""
    c = config.get_text_config()
    s = getattr(c, "logit_scale", None)
    if s is None:
        s = getattr(c, "output_multiplier", None)
    if s is None:
        s = getattr(c, "lm_head_multiplier", None)
    if s is None and getattr(c, "logits_scaling", None) is not None:
        s = c.logits_scaling if c.model_type == "hyperclovax" else 1 / c.logits_scaling
    return 1.0 if s is None else float(s)


def causal_lm_parts(model):
    """(backbone, LM head, logit scale, final-logit soft-cap or None) of an unwrapped causal LM (a PEFT model's base
    model), or a reason string. The logit scale is TRL's rule (:func:`_logit_scale`); the soft-cap the text config's
    ``final_logit_softcapping`` (Gemma 2), which the model's forward applies to its (scaled) logits. A PEFT
    prompt-learning model (prompt / prefix / P-tuning) is a reason: its virtual tokens are added by the PEFT model's
    forward, which a call of the backbone skips (the soft prompt would get no gradient)."""
    peft_config = getattr(model, "active_peft_config", None) if hasattr(model, "get_base_model") else None
    if getattr(peft_config, "is_prompt_learning", False):
        return (f"PEFT prompt learning ({type(peft_config).__name__}): its virtual tokens come from the PEFT model's "
                f"forward, which the fused loss's backbone call would skip")
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    head = base.get_output_embeddings() if hasattr(base, "get_output_embeddings") else None
    if head is None or getattr(head, "weight", None) is None or head.weight.dim() != 2:
        return f"no LM head found on {type(base).__name__} (get_output_embeddings)"
    backbone = getattr(base, "base_model", None)
    if backbone is None or backbone is base:
        return f"no backbone found on {type(base).__name__} (base_model_prefix)"
    softcap = getattr(base.config.get_text_config(), "final_logit_softcapping", None)
    return backbone, head, _logit_scale(base.config), None if softcap is None else float(softcap)


def gkd_loss(trainer, model, inputs, num_items_in_batch, student, teacher, memory="auto"):
    """TRL 1.16 ``GKDTrainer.compute_loss``'s loss through both LM heads, without either model's logits.

    GKD's ``generalized_jsd_loss`` (Agarwal et al. 2024, Eq. 1; TRL passes temperature 1.0 and ``beta``) of the
    student's and the teacher's next-token distributions (their logits as the models' forwards return them: scaled,
    then soft-capped where the config has a final-logit soft-cap, Gemma 2's) at the positions whose shifted label is
    not ``-100``, divided by their count, or by ``num_items_in_batch`` when given. Here the backbones run once each
    (the teacher without gradient) and :func:`tigon.functional.fused_linear_jsd` projects only the scored positions
    (each model's soft-cap its ``student_softcap`` / ``teacher_softcap``).

    Args:
        trainer: the GKD trainer (``beta``, ``teacher_model``).
        model: the student as the trainer passes it to ``compute_loss``.
        inputs: the batch (``input_ids``, ``attention_mask``, ``labels`` (B, T)).
        num_items_in_batch: the loss's denominator, or None.
        student, teacher: :func:`causal_lm_parts` of the unwrapped student and teacher.

    Mixed precision: accelerate applies autocast by wrapping each prepared model's ``forward`` (student and teacher),
    which this path bypasses by calling the backbones directly, so the trainer's ``accelerator.autocast()`` is entered
    here (nothing without bf16 / fp16 mixed precision); without it ``bf16=True`` ran both models in float32.

    Returns:
        The 0-d float32 loss.
    """
    accelerator = getattr(trainer, "accelerator", None)
    with accelerator.autocast() if accelerator is not None else nullcontext():
        return _gkd_loss(trainer, model, inputs, num_items_in_batch, student, teacher, memory)


def _gkd_loss(trainer, model, inputs, num_items_in_batch, student, teacher, memory="auto"):
    """The body of :func:`gkd_loss` (under the trainer's autocast)."""
    s_backbone, s_head, s_scale, s_cap = student
    t_backbone, t_head, t_scale, t_cap = teacher
    ids, attn = inputs["input_ids"], inputs["attention_mask"]
    h_s = s_backbone(input_ids=ids, attention_mask=attn).last_hidden_state[:, :-1]
    trainer.teacher_model.eval()
    with torch.no_grad():
        h_t = t_backbone(input_ids=ids, attention_mask=attn).last_hidden_state[:, :-1]
    labels = inputs["labels"][:, 1:].to(s_head.weight.device)
    mask = labels != -100
    h_s, h_t = h_s.to(s_head.weight.device)[mask], h_t.to(s_head.weight.device)[mask]
    s_bias, t_bias = s_head.bias, t_head.bias
    if s_scale != 1.0:
        h_s, s_bias = h_s * s_scale, None if s_bias is None else s_bias * s_scale
    if t_scale != 1.0:
        h_t, t_bias = h_t * t_scale, None if t_bias is None else t_bias * t_scale
    n = mask.sum()
    if h_s.shape[0] == 0:  # nothing scored: a differentiable zero, as TRL's 0 / 1
        return h_s.sum() * 0.0
    loss = F.fused_linear_jsd(h_s, s_head.weight, h_t, t_head.weight, None, jsd_beta=float(trainer.beta),
                              temperature=1.0, student_bias=s_bias, teacher_bias=t_bias, student_softcap=s_cap,
                              teacher_softcap=t_cap, memory=memory)
    if num_items_in_batch is not None:
        if isinstance(num_items_in_batch, torch.Tensor):
            num_items_in_batch = num_items_in_batch.to(loss.device)
        loss = loss * n / num_items_in_batch
    return loss
