"""One switch for TRL's trainers: :func:`patch_trainer` makes a built TRL trainer compute its losses with Tigon's
fused LM-head kernels, without forking TRL; :func:`unpatch_trainer` undoes it.

>>> trainer = trl.DPOTrainer(model=model, ref_model=ref, args=args, train_dataset=ds, processing_class=tok)
>>> report = tigon.integrations.trl.patch_trainer(trainer)
>>> print(report)            # what was switched, what runs TRL's own path and why
>>> trainer.train()

What it switches (TRL 1.16; the trainer instance only, never TRL's classes or modules):

* ``SFTTrainer``, ``DPOTrainer``, ``GRPOTrainer``, ``RLOOTrainer``, ``KTOTrainer``: TRL installs its own chunked LM
  head on the policy and the reference model (``add_fused_lm_head``: ``model(..., fused_lm_head=True)`` returns
  per-token log-probabilities, entropies, ... and no logits), and every ``loss_type`` and metric of these trainers
  is computed from that call's per-token values. The switch replaces that instance-level forward on each model
  (policy and reference) by one that runs the backbone, then :func:`tigon.functional.fused_linear_logprobs` on the
  hidden states and the head (:func:`tigon.integrations.trl_heads.tigon_fused_outputs`): the trainer's loss code,
  ``num_items_in_batch`` handling and logged metrics stay TRL's, on Tigon's numbers, for every loss type TRL has.
  This is the preference / GRPO loss through the LM head: the formulas on top of the per-token log-probabilities are
  the same as in :class:`tigon.nn.FusedLinearDPOLoss` / :class:`tigon.nn.FusedLinearGRPOLoss` (TRL's, term for term).
* ``GKDTrainer`` (``trl.experimental.gkd``): ``compute_loss`` (the instance attribute) is replaced by the
  generalized JSD through both heads, :func:`tigon.functional.fused_linear_jsd`
  (:func:`tigon.integrations.trl_heads.gkd_loss`), instead of both models' full logits.

A final-logit soft-cap (Gemma 2's ``final_logit_softcapping``) is taken by both: the fused head's soft-cap (and its
``mean_logits``, which is not linear in the hidden state under one, from the row kernel's read of the logits), and
each GKD model's cap in the fused JSD (``student_softcap``, ``teacher_softcap``).

Everything else falls back to TRL's own path with one :class:`tigon.TigonFallbackWarning` naming the reason (and is
listed in the report), or raises :class:`tigon.UnsupportedError` with ``strict=True``: a TRL without
``add_fused_lm_head`` (older than 1.x), a model whose head cannot be found, per-token outputs the switch does not
compute, MoE router logits (load-balancing loss), FSDP2 DTensor heads, devices other than CPU / CUDA, GKD asked for
its outputs (``prediction_step`` of evaluation), run by several processes or given a PEFT prompt-learning model.
Trainers of other kinds raise TypeError (``DistillationTrainer`` is not switched: it already computes a chunked JSD of
its own and logs the student entropy from the same pass).
"""

from __future__ import annotations

import functools
import types
from dataclasses import asdict, dataclass, field

from . import persist, trl_heads

FUSED_HEAD_TRAINERS = ("SFTTrainer", "DPOTrainer", "GRPOTrainer", "RLOOTrainer", "KTOTrainer")
"""TRL trainers whose losses read TRL's fused LM head (``add_fused_lm_head``), by class name (subclasses too)."""

GKD_TRAINERS = ("GKDTrainer",)
"""TRL trainers whose ``compute_loss`` the switch replaces by the fused JSD."""

_STATE = "_tigon_trl_switch"
"""Attribute on a switched trainer: {"report", "models": [(model, TRL's forward)], "compute_loss": bool}."""


@dataclass
class TrainerSwitchReport:
    """What :func:`patch_trainer` switched on one trainer.

    Attributes:
        trainer: the trainer's class name (``"DPOTrainer"``).
        trl_version: the installed TRL's version.
        switched: ``"target: what runs now"`` lines (``"model: TRL's fused LM head -> ..."``).
        fallbacks: ``"target: reason"`` lines for what runs TRL's own path; at patch time, and appended at run time
            (once per target and reason) when a call cannot take Tigon's path (e.g. MoE router logits).
        notes: remarks (extra passes a metric costs, what is left alone).
    """

    trainer: str
    trl_version: str
    switched: list[str] = field(default_factory=list)
    fallbacks: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when something was switched and nothing fell back (so far)."""
        return bool(self.switched) and not self.fallbacks

    def as_dict(self) -> dict:
        """The report as plain data (JSON-able)."""
        return {**asdict(self), "ok": self.ok}

    def __str__(self) -> str:
        lines = [f"tigon TRL switch on {self.trainer} (trl {self.trl_version}): "
                 f"{len(self.switched)} switched, {len(self.fallbacks)} on TRL's own path"]
        lines += [f"  switched  {s}" for s in self.switched]
        lines += [f"  fallback  {s}" for s in self.fallbacks]
        lines += [f"  note      {s}" for s in self.notes]
        return "\n".join(lines)


def _class_names(obj) -> set[str]:
    return {c.__name__ for c in type(obj).__mro__}


def _unwrap_peft(model):
    return model.get_base_model() if hasattr(model, "get_base_model") and hasattr(model, "peft_config") else model


def _head_detail(settings: dict) -> str:
    # mean_logits, is_top1, log_sum_sq_probs: from the same pass, no grad
    got = ", ".join(o for o in settings["outputs"] if o in trl_heads.KNOWN_OUTPUTS)
    cap = settings["final_logit_softcapping"]
    return (f"TRL's fused LM head -> tigon.functional.fused_linear_logprobs ({got}; temperature "
            f"{settings['temperature']}" + ("" if cap is None else f", soft-cap {cap:g}") + ")")


def _switch_head(model, where: str, report: TrainerSwitchReport, strict: bool, memory, seen: set, models: list,
                 accelerator=None):
    """Replace TRL's fused forward on ``model`` (instance attribute) by Tigon's; or record why not. ``accelerator``
    (the trainer's): where accelerate's mixed precision wrapped TRL's forward (a prepared reference model), Tigon's
    forward is wrapped the same way (autocast, fp32 outputs) and becomes ``model._original_forward``."""
    trl_forward = model.__dict__.get("forward")
    if getattr(getattr(trl_forward, "__func__", None), _STATE, False):
        report.notes.append(f"{where}: already switched")
        return
    settings = trl_heads.trl_head_settings(model)
    reason = None
    if settings is None:
        reason = "TRL's fused LM head (add_fused_lm_head) not found on it: another TRL version, or forward replaced"
    elif model.get_output_embeddings() is None:
        reason = f"no LM head found on {type(model).__name__} (get_output_embeddings)"
    else:
        reason = trl_heads.unsupported_outputs(settings)
    if reason:
        trl_heads.fallback(reason, where, strict, seen, report.fallbacks)
        return

    @functools.wraps(type(model).forward)  # keep the signature: generate() validates its kwargs against it
    def forward(self, *args, fused_lm_head=False, labels=None, shift_labels=None, num_items_in_batch=None, **kwargs):
        trl_kw = dict(labels=labels, shift_labels=shift_labels, num_items_in_batch=num_items_in_batch)
        if not fused_lm_head:
            return trl_forward(*args, **trl_kw, **kwargs)
        head = self.get_output_embeddings()
        why = trl_heads.call_unsupported(head.weight, kwargs)
        if why:
            trl_heads.fallback(why, where, strict, seen, report.fallbacks)
            return trl_forward(*args, fused_lm_head=True, **trl_kw, **kwargs)
        return trl_heads.tigon_fused_outputs(self, settings, args, kwargs, labels, shift_labels, num_items_in_batch,
                                             memory)

    setattr(forward, _STATE, True)
    original = None
    if trl_heads.amp_wrapped(model) and accelerator is not None:
        # TRL's forward under accelerate's autocast + fp32 outputs (a reference model prepared under bf16 / fp16):
        # Tigon's forward wrapped the same way, as accelerate's prepare_model would have
        try:
            from accelerate.utils import convert_outputs_to_fp32
            from accelerate.utils.modeling import get_mixed_precision_context_manager

            amp = get_mixed_precision_context_manager(accelerator.native_amp, accelerator.autocast_handler)
        except (ImportError, AttributeError) as e:  # (another accelerate): say so, keep TRL's path
            trl_heads.fallback(f"accelerate's mixed-precision wrapper could not be rebuilt ({e})", where, strict, seen,
                               report.fallbacks)
            return
        original = model.__dict__["_original_forward"]
        model._original_forward = types.MethodType(forward, model)
        model.forward = types.MethodType(convert_outputs_to_fp32(amp(forward)), model)
    else:
        model.forward = types.MethodType(forward, model)
    persist.keep_on_replicas(model)  # (nn.DataParallel's replicas run the switched forward on themselves)
    models.append((model, trl_forward, original))
    report.switched.append(f"{where}: {_head_detail(settings)}")


def patch_trainer(trainer, *, strict: bool = False, memory: str | int = "auto") -> TrainerSwitchReport:
    """Make a built TRL trainer compute its losses with Tigon's fused LM-head kernels (this instance only).

    Call it after building the trainer and before ``trainer.train()``. See the module docstring for what is switched
    per trainer; the losses, gradients and every logged metric are TRL's formulas on Tigon's per-token values
    (``tests/test_trl_switch.py``: ten steps with and without the switch agree within 1e-5 in fp32).

    Args:
        trainer: a ``trl.SFTTrainer``, ``DPOTrainer``, ``GRPOTrainer``, ``RLOOTrainer``, ``KTOTrainer`` or
            ``trl.experimental.gkd.GKDTrainer`` (or a subclass), TRL 1.16.
        strict: raise :class:`tigon.UnsupportedError` instead of falling back to TRL's own path (at patch time, and
            at run time for calls Tigon's path cannot take).
        memory: the fused ops' ``memory`` option (``"auto"``, ``"low"`` or a budget in bytes; see
            :func:`tigon.functional.fused_linear_logprobs`).

    Returns:
        A :class:`TrainerSwitchReport` (print it); also kept as ``trainer._tigon_trl_switch["report"]``, where run-time
        fallbacks are appended.

    Raises:
        ImportError: TRL is not installed.
        TypeError: ``trainer`` is not a TRL trainer the switch knows (with ``strict=False`` too: nothing to fall
            back from).
        tigon.UnsupportedError: with ``strict=True``, whatever would fall back.
    """
    try:
        import trl
    except ImportError as e:
        raise ImportError("tigon.integrations.trl.patch_trainer needs TRL (pip install trl)") from e
    names = _class_names(trainer)
    kind = next((n for n in GKD_TRAINERS + FUSED_HEAD_TRAINERS if n in names), None)  # GKDTrainer is an SFTTrainer
    if kind is None:
        raise TypeError(f"patch_trainer: trainer must be one of {FUSED_HEAD_TRAINERS + GKD_TRAINERS} (or a subclass); "
                        f"got {type(trainer).__name__}")
    if memory != "auto" and memory != "low" and not (isinstance(memory, int) and memory > 0):
        raise ValueError(f"patch_trainer: memory must be 'auto', 'low' or a positive int (bytes), got {memory!r}")
    state = trainer.__dict__.get(_STATE)
    if state is not None:
        state["report"].notes.append("patch_trainer called again: already switched")
        return state["report"]
    report = TrainerSwitchReport(type(trainer).__name__, getattr(trl, "__version__", "?"))
    seen: set = set()
    models: list = []
    state = {"report": report, "models": models, "compute_loss": False}
    if kind in FUSED_HEAD_TRAINERS:
        _switch_head(_unwrap_peft(trainer.model), "model", report, strict, memory, seen, models)
        if getattr(trainer, "aux_loss_enabled", False) and models:
            # an MoE policy whose load-balancing loss TRL adds: every policy call asks for router logits, so it runs
            # TRL's head; said now (strict: raised now), not only at the first step (the same (where, reason) then)
            trl_heads.fallback(trl_heads.ROUTER_LOGITS, "model", strict, seen, report.fallbacks)
        ref = getattr(trainer, "ref_model", None)
        if ref is not None:
            _switch_head(_unwrap_peft(ref), "ref_model", report, strict, memory, seen, models,
                         getattr(trainer, "accelerator", None))
        elif kind in ("DPOTrainer", "GRPOTrainer", "RLOOTrainer", "KTOTrainer"):
            report.notes.append("ref_model: none (PEFT adapters disabled on the policy, precomputed reference "
                                "log-probabilities or beta = 0): the reference goes through the policy's head")
        if getattr(trainer, "precompute_ref_logps", False):
            # DPO / KTO with precompute_ref_log_probs=True: TRL scored the datasets it was given in __init__
            report.notes.append("precompute_ref_log_probs: TRL computed the reference log-probabilities of the "
                                "datasets given to the trainer while building it, on its own LM head, before this "
                                "switch; only datasets passed to evaluate() later are scored by the switched head")
    else:
        _switch_gkd(trainer, report, strict, memory, seen)
        state["compute_loss"] = "compute_loss" in trainer.__dict__
    trainer.__dict__[_STATE] = state
    return report


def _switch_gkd(trainer, report: TrainerSwitchReport, strict: bool, memory, seen: set) -> None:
    # what the models are does not change between calls: a model the loss cannot take (no LM head or backbone) is
    # reported now, as the fused-head trainers' are, not at the first training step
    unwrap = getattr(getattr(trainer, "accelerator", None), "unwrap_model", lambda m: m)
    caps = []
    for who, attr in (("student", "model"), ("teacher", "teacher_model")):
        model = getattr(trainer, attr, None)
        parts = trl_heads.causal_lm_parts(unwrap(model)) if model is not None else "no model"
        if isinstance(parts, str):
            trl_heads.fallback(f"{who}: {parts}", "compute_loss", strict, seen, report.fallbacks)
            return
        if parts[3] is not None:
            caps.append(f"{who} soft-cap {parts[3]:g}")
    original = trainer.compute_loss

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        def trl_path(reason):
            trl_heads.fallback(reason, "compute_loss", strict, seen, report.fallbacks)
            return original(model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch)

        if return_outputs:
            return trl_path("the student's outputs (logits) were asked for (return_outputs=True)")
        if self.accelerator.num_processes > 1 or getattr(self, "is_deepspeed_enabled", False):
            return trl_path("several processes or DeepSpeed (the backbones would be called past the DDP / FSDP / "
                            "DeepSpeed wrapper's forward)")
        student = trl_heads.causal_lm_parts(self.accelerator.unwrap_model(model))
        teacher = trl_heads.causal_lm_parts(self.accelerator.unwrap_model(self.teacher_model))
        for who, parts in (("student", student), ("teacher", teacher)):
            if isinstance(parts, str):
                return trl_path(f"{who}: {parts}")
        if student[1].weight.device.type not in ("cpu", "cuda"):
            return trl_path(f"device {student[1].weight.device.type}")
        return trl_heads.gkd_loss(self, model, inputs, num_items_in_batch, student, teacher, memory)

    setattr(compute_loss, _STATE, True)
    trainer.compute_loss = types.MethodType(compute_loss, trainer)
    report.switched.append("compute_loss: GKD's generalized JSD on both models' logits -> "
                           "tigon.functional.fused_linear_jsd on their hidden states and LM heads (temperature 1.0 "
                           "and beta as TRL's compute_loss" + "".join(f", {c}" for c in caps) + ")")
    report.notes.append("GKD: on-policy generation (lmbda) and seq_kd stay TRL's; only the loss is switched")


def unpatch_trainer(trainer) -> bool:
    """Undo :func:`patch_trainer` on ``trainer``: TRL's own forwards and ``compute_loss`` again.

    Returns:
        True if the trainer was switched (and is restored now), False if there was nothing to undo.
    """
    state = trainer.__dict__.pop(_STATE, None)
    if state is None:
        return False
    for model, trl_forward, original in state["models"]:
        model.forward = trl_forward
        if original is not None:
            model._original_forward = original
        persist.forget_replicas(model)
    if state["compute_loss"]:
        del trainer.__dict__["compute_loss"]
    return True


def is_switched(trainer) -> bool:
    """Whether :func:`patch_trainer` switched this trainer (and it was not undone)."""
    return _STATE in trainer.__dict__


__all__ = ["patch_trainer", "unpatch_trainer", "is_switched", "TrainerSwitchReport", "FUSED_HEAD_TRAINERS",
           "GKD_TRAINERS"]
