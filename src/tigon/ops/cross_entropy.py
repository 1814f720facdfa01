"""Cross-entropy on (N, V) logits with the extras LLM training uses: the public op and its record.

Kernels: :mod:`tigon.kernels.cross_entropy` (online log-sum-exp over vocabulary blocks). Specification:
:mod:`tigon.reference.cross_entropy` (torch's label smoothing and class weights, PaLM z-loss, Gemma 2 soft-cap).
"""

from __future__ import annotations

import warnings

import torch

from .. import _checks
from .._checks import ALIAS, UNSET, liger_names
from ..reference import cross_entropy as ref
from ..reference.cross_entropy import LossOutput
from ..support import TORCH_CODE, select_backend
from ._record import Case, OpSpec, liger, randn, sizes, targets


def cross_entropy(
    logits: torch.Tensor = UNSET,
    target: torch.Tensor = UNSET,
    weight: torch.Tensor | None = None,
    size_average: bool | None = None,
    ignore_index: int = -100,
    reduce: bool | None = None,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    lse_square_scale: float = 0.0,
    softcap: float | None = None,
    return_z_loss: bool = False,
    return_token_accuracy: bool = False,
    return_predicted_tokens: bool = False,
    *,
    num_items_in_batch: int | torch.Tensor | None = None,
    return_accuracy: bool = False,
    inplace_backward: bool = False,
    grad_in_forward: bool | None = None,
    input: torch.Tensor = ALIAS,  # noqa: A002 (Liger-Kernel's and torch's name of logits)
):
    """Cross-entropy on (N, V) logits: torch.nn.functional.cross_entropy semantics plus LLM-training extras.

    Positional order: Liger-Kernel's ``liger_cross_entropy(input, target, weight, size_average, ignore_index,
    reduce, reduction, label_smoothing, lse_square_scale, softcap, return_z_loss, return_token_accuracy,
    return_predicted_tokens)`` (its first eight are torch's); Tigon's own options are keyword-only. ``input``, the
    name Liger and torch give logits, is accepted as a keyword.

    Per non-ignored token: ``loss_i = (1-eps) * w_t * (lse - x_t) + eps/V * sum_c w_c * (lse - x_c) + z_i`` with
    ``x = softcap * tanh(logits / softcap)`` (Gemma 2) or the logits, ``lse = logsumexp(x)`` and the PaLM z-loss
    ``z_i = lse_square_scale * lse**2``; full definition in :mod:`tigon.reference.cross_entropy`. Math in fp32;
    the vocabulary is walked in blocks (online log-sum-exp), so any V works (tested to 262,144).

    Args:
        logits: (N, V) float32 / bfloat16 / float16 (other float dtypes run the reference); any strides.
        target: (N,) integer class indices in [0, V), or ``ignore_index``.
        weight: optional (V,) class weights, torch's ``weight`` (treated as constants: no gradient).
        size_average, reduce: torch's deprecated options, None or a bool: when either is given, ``reduction`` is
            what torch makes of them (``reduce=False``: "none"; else ``size_average=False``: "sum"; else "mean"),
            with torch's deprecation warning. (Liger-Kernel accepts and ignores them; torch's meaning is taken
            here so that a call asking for per-token losses gets them.)
        ignore_index: target value of tokens that are skipped (loss 0, gradient 0). The kernels never read an
            ignored token's row of logits, so NaN / inf there gives gradient 0 (torch's gives NaN for NaN rows).
        reduction: ``"mean"`` (the cross-entropy divided by the sum of the target weights of the non-ignored
            tokens, as torch; the z-loss averaged over the non-ignored tokens, unweighted, as Liger-Kernel; 0 for
            an all-ignored batch, not NaN), ``"sum"`` or ``"none"`` ((N,), 0 at ignored tokens; its backward
            applies the per-token upstream gradient).
        label_smoothing: eps in [0, 1], torch's definition (class weights applied as torch does).
        lse_square_scale: z-loss coefficient (PaLM: 1e-4); the z term ``lse_square_scale * lse**2`` per
            non-ignored token is included in the returned loss (never class-weighted).
        softcap: final-logit soft-cap (Gemma 2: 30.0), or None.
        num_items_in_batch: int or 0-d tensor; loss = summed loss / num_items_in_batch (Hugging Face
            gradient-accumulation convention; overrides "mean"/"sum", not allowed with "none").
        return_z_loss: also return the z part alone, reduced like the loss (detached, for logging).
        return_accuracy: also return the fraction of non-ignored tokens whose argmax equals the target (0-d fp32);
            with ``reduction="none"`` each token's hit instead, (N,) fp32 1.0 / 0.0, 0 where ignored (Liger-Kernel's
            per-token ``token_accuracy``).
        return_predicted_tokens: also return each token's argmax class, (N,) int64 with -1 for ignored tokens, in
            ``LossOutput.predicted_tokens`` (Liger-Kernel's option of the same name; from the loss's own pass).
        inplace_backward: if True the backward writes the gradient into the logits buffer instead of a new
            (N, V) tensor (saves that memory), as Liger-Kernel does. Only safe when nothing else needs those
            logits afterwards (no other op saved them for its backward, the caller does not read them); a second
            backward through the same graph then raises. Default False: the caller's logits are never written.
        grad_in_forward: None (default), True or False: when the gradient of the logits is formed.
            None: when the logits need a gradient and the loss is a scalar (outside checkpointed regions and
            torch.compile), the forward forms ``d loss / d logits`` for an upstream of 1 into a new (N, V) buffer
            of the logits' dtype, right after each row's loss while the row may still be in L2 (one read of the
            logits from memory less than the lazy path: H200, 8192 x 128256 bf16, fwd + bwd kernel time 1.474 ms,
            Liger's kernels 1.412 in the same run (session 22); lazily 1.611 in session 8's: see
            benchmarks/results/h200/README.md). The
            backward hands that buffer on when the upstream is 1 (``loss.backward()``) and otherwise recomputes it
            from the logits for that upstream, so the gradient equals the lazy path's bit for bit and the logits are
            never written. Cost: a loss scaled after the call (``(loss / accumulation_steps).backward()``, a
            weighted sum of losses) pays the forward's write and the lazy backward; pass ``num_items_in_batch``
            instead of dividing, or False. Memory: the buffer lives from the forward to the backward, where the
            lazy path allocates it; the peak is the same when the backward follows the loss, higher when several
            losses are formed before one backward (pass False there). A forward whose backward never runs
            (evaluation with grad enabled) pays for the write.
            False: lazy: the backward reads the logits again and writes the gradient.
            True: formed in the forward as with None, but written over the logits (Liger-Kernel's scheme: no
            buffer of its own), and the backward only multiplies it by the upstream gradient (for ``loss.backward()``,
            where that is 1, a kernel reads it and writes nothing). The logits hold the gradient from the moment the
            forward returns: only for logits that nothing reads afterwards (an op that saved them for its backward
            raises there; logits without unit column stride or whose rows share memory are copied first and left as
            they were). With an upstream other than 1 the gradient is rounded to the logits' dtype twice (in the
            forward, then after the scaling): in bf16 up to about twice the error of the unfused computation;
            float16 is refused (its gradient would underflow before a loss scale is applied), as is
            reduction="none", whatever the grad mode. Needs a scalar reduction ("mean", "sum", or
            num_items_in_batch); a second backward raises; one call per logits tensor (a second call on another
            slice of the same logits bumps their shared version, and the first call's backward then raises).
            Ignored (the lazy path runs) under torch.compile (as inplace_backward), on the reference backend and
            while saved-tensor hooks are set, e.g. inside non-reentrant activation checkpointing, whose
            recomputation would otherwise overwrite logits another op of the region saved.

    Returns:
        The loss, float32 (float64 for float64 logits): 0-d, or (N,) for ``reduction="none"``. With
        ``return_z_loss``, ``return_accuracy`` or ``return_predicted_tokens``: ``LossOutput(loss, z_loss, accuracy,
        predicted_tokens)`` (unrequested fields None). ``return_token_accuracy`` is Liger-Kernel's name of
        ``return_accuracy`` (give one of the two).

    Raises:
        TypeError: logits or target missing, logits given as both logits and input, logits / weight not floating,
            target not an integer tensor, num_items_in_batch of a wrong type,
            ignore_index not an int, inplace_backward not a bool, grad_in_forward not None / a bool,
            size_average or reduce neither None nor a bool (the hint names the positional order that changed).
        ValueError: shapes (logits (N, V), target (N,), weight (V,)), devices, reduction, label_smoothing not in
            [0, 1], lse_square_scale < 0 or inf, softcap <= 0 (a bool for these three), num_items_in_batch <= 0
            (an int, or a CPU tensor: a CUDA one is not read) or with reduction="none", grad_in_forward with
            reduction="none", float16 logits or (with grad enabled) leaf logits that require grad, and targets
            outside [0, V) other than ignore_index. CPU targets are checked before the call. On CUDA that check
            would cost a device sync per call: instead the kernel records a bad target (its loss is NaN, nothing is
            read out of bounds) and the next launch of a loss kernel raises, naming it, usually this call's backward
            (:mod:`tigon.kernels.target_check`).
    """
    if logits is UNSET or target is UNSET or input is not ALIAS:  # (Liger's and torch's keyword name)
        logits, target = liger_names("cross_entropy", ("logits", logits, "input", input),
                                     ("target", target, None, ALIAS))
    if size_average is not None or reduce is not None:
        reduction = legacy_reduction(size_average, reduce)
    if return_token_accuracy is not False:
        _, return_accuracy = liger_aliases(None, None, return_accuracy, return_token_accuracy)
    ref.check_inputs(logits, target, weight, reduction=reduction, label_smoothing=label_smoothing,
                     lse_square_scale=lse_square_scale, softcap=softcap, num_items_in_batch=num_items_in_batch)
    ignore_index = _checks.integer("ignore_index", ignore_index)
    if not isinstance(inplace_backward, bool):
        raise TypeError(f"inplace_backward must be a bool, got {inplace_backward!r}")
    if grad_in_forward is not None and not isinstance(grad_in_forward, bool):
        raise TypeError(f"grad_in_forward must be None, True or False, got {grad_in_forward!r} (True writes the "
                        "gradient over the logits)")
    if grad_in_forward and reduction == "none":
        raise ValueError('grad_in_forward=True needs a scalar loss: reduction "mean" or "sum" (or '
                         'num_items_in_batch), got reduction="none"')
    if grad_in_forward and logits.is_leaf and logits.requires_grad and torch.is_grad_enabled():
        raise ValueError("grad_in_forward=True writes the gradient over the logits during the forward, but logits "
                         "is a leaf tensor that requires grad (a Parameter, or made with requires_grad=True), whose "
                         "values must be kept; pass logits computed by an op (e.g. the LM head's output), or use "
                         "grad_in_forward=False")
    if grad_in_forward and logits.dtype == torch.float16:
        raise ValueError("grad_in_forward=True does not take float16 logits: the gradient, rounded to float16 "
                         "before a loss scale multiplies it, would underflow; use bfloat16 / float32 logits or "
                         "inplace_backward=True")
    if select_backend("cross_entropy", logits) in TORCH_CODE:
        return ref.cross_entropy(
            logits, target, weight, ignore_index=ignore_index, reduction=reduction, label_smoothing=label_smoothing,
            lse_square_scale=lse_square_scale, softcap=softcap, num_items_in_batch=num_items_in_batch,
            return_z_loss=return_z_loss, return_accuracy=return_accuracy, inplace_backward=inplace_backward,
            grad_in_forward=bool(grad_in_forward), return_predicted_tokens=return_predicted_tokens)
    if target.is_cpu:  # CUDA: recorded by the kernel, raised at the next launch (no sync)
        ref.check_target_range(target, logits.shape[1], ignore_index)
    from ..kernels import cross_entropy as k

    opts = k.LossOptions(ignore_index, float(label_smoothing), float(lse_square_scale),
                           None if softcap is None else float(softcap), 1.0)
    run = k.compiled_cross_entropy if torch.compiler.is_compiling() else k.CrossEntropyFunction.apply
    loss, z_loss, accuracy, pred = run(
        logits, target, weight, opts, reduction, num_items_in_batch, bool(return_accuracy),
        _gradient_mode(logits, reduction, inplace_backward, grad_in_forward), return_predicted_tokens)
    if not (return_z_loss or return_accuracy or return_predicted_tokens):
        return loss
    return LossOutput(loss, z_loss if return_z_loss else None, accuracy if return_accuracy else None,
                      pred if return_predicted_tokens else None)


def _gradient_mode(logits: torch.Tensor, reduction: str, inplace_backward: bool, grad_in_forward: bool | None):
    """:class:`tigon.kernels.cross_entropy.CrossEntropyFunction`'s ``inplace``: "forward" (grad_in_forward=True),
    "formed" (the default: into a new buffer, where the logits need a gradient, the loss is a scalar and the
    backward is not asked to write over the logits), else the lazy path (in place with inplace_backward)."""
    needs_grad = logits.requires_grad and torch.is_grad_enabled()
    if grad_in_forward and needs_grad:
        return "forward"
    if grad_in_forward is None and needs_grad and reduction != "none" and not inplace_backward:
        return "formed"
    return bool(inplace_backward)


def legacy_reduction(size_average: bool | None, reduce: bool | None) -> str:
    """The ``reduction`` torch makes of its deprecated ``size_average`` / ``reduce`` (None counts as True):
    ``reduce=False`` -> "none", else ``size_average=False`` -> "sum", else "mean"; warns as torch does.

    Raises:
        TypeError: either is neither None nor a bool. Tigon's cross_entropy took ignore_index and reduction as its
            4th and 5th positional arguments before it took Liger-Kernel's (torch's) order; the message says so.
    """
    for name, value, moved in (("size_average", size_average, "ignore_index is the 5th"),
                               ("reduce", reduce, "reduction is the 7th")):
        if value is not None and not isinstance(value, bool):
            raise TypeError(f"{name} must be None or a bool (torch's deprecated option, positional in torch's and "
                            f"Liger-Kernel's order), got {type(value).__name__} {value!r}: {moved} positional "
                            "argument in that order; pass ignore_index / reduction by keyword")
    reduction = "none" if reduce is False else ("sum" if size_average is False else "mean")
    warnings.warn(f"size_average and reduce are deprecated (as in torch); use reduction={reduction!r} instead",
                  UserWarning, stacklevel=3)
    return reduction


def liger_aliases(class_weight, ce_weight, return_accuracy, return_token_accuracy):
    """(class_weight, return_accuracy) from Tigon's or Liger-Kernel's names (``ce_weight``,
    ``return_token_accuracy``).

    Raises:
        TypeError: both names of one option given.
    """
    if ce_weight is not None:
        if class_weight is not None:
            raise TypeError("give class_weight or ce_weight (Liger-Kernel's name for it), not both")
        class_weight = ce_weight
    if return_token_accuracy is not False:
        if return_accuracy is not False:
            raise TypeError("give return_accuracy or return_token_accuracy (Liger-Kernel's name for it), not both")
        return_accuracy = return_token_accuracy
    return class_weight, return_accuracy


# ---- the record ----------------------------------------------------------------------------------------------------
def _inputs(s: dict, dtype, device, gen, ignore_every: int = 0, class_weights: bool = False) -> dict:
    """logits (tokens, vocab) with std 3, targets (every ``ignore_every``-th -100), with ``class_weights`` a
    ``weight`` (vocab,) float32 in [0.5, 1.5)."""
    extra = {}
    if class_weights:
        extra["weight"] = (torch.rand(s["vocab"], generator=gen, device=gen.device) + 0.5).to(device)
    return dict(logits=randn(gen, (s["tokens"], s["vocab"]), dtype, device, 3.0),
                target=targets(gen, s["tokens"], s["vocab"], device, ignore_every), **extra)


def eager_cross_entropy(logits, target, **_):
    """Hugging Face's loss: torch's cross-entropy on fp32-upcast logits."""
    return torch.nn.functional.cross_entropy(logits.float(), target)


def with_flag(flag: str):
    """:func:`cross_entropy` with ``flag`` (inplace_backward / grad_in_forward) set, on a view of the logits: as the
    LM head's output would be, a non-leaf whose gradient flows back (grad_in_forward refuses leaves)."""

    def run(logits, target, **kw):
        return cross_entropy(logits.view_as(logits), target, **kw, **{flag: True})

    run.__qualname__ = f"cross_entropy({flag}=True)"
    return run


LOSS_CASES = (
    Case("ignore_index=-100", inputs={"ignore_every": 4}, variants=("model",)),
    Case("label_smoothing=0.1", options={"label_smoothing": 0.1}, variants=("model",)),
    Case("z_loss=1e-4", options={"lse_square_scale": 1e-4}, variants=("model",)),
    Case("softcap=5.0", options={"softcap": 5.0}, variants=("model",)),
    Case("reduction=none", options={"reduction": "none"}, inputs={"ignore_every": 4}, variants=("model",)),
)
"""The option rows shared by the two cross-entropy ops (run on the model shapes; the ``ignore_index`` rows ignore
every 4th target, ``reduction=none`` has ignored targets too)."""

_ORIGINAL = "torch cross-entropy on fp32-upcast logits, as HF's loss (tigon.reference.cross_entropy)"


def quack_cross_entropy(logits, target, ignore_index=-100, **_):
    """QuACK's CuTe DSL cross-entropy (``quack.cross_entropy.cross_entropy``): logits (N, V) bf16 / fp16 / fp32 on
    CUDA, target (N,) int64; returns the 0-d fp32 mean over the non-ignored tokens (no class weights, label smoothing,
    z-loss or softcap: the bench's default case only). A bench peer; raises ImportError without the CuTe DSL."""
    from quack.cross_entropy import cross_entropy as quack_ce

    return quack_ce(logits, target, ignore_index=ignore_index, reduction="mean")

RECORDS = (OpSpec(
    name="cross_entropy",
    summary="cross-entropy on (tokens, vocab) logits (label smoothing, z-loss, softcap, class weights)",
    fn=cross_entropy,
    reference=ref.cross_entropy,
    original=ref.cross_entropy,
    original_name=_ORIGINAL,
    eager=eager_cross_entropy,
    make_inputs=_inputs,
    shape_of=lambda m: {"tokens": m.tokens, "vocab": m.vocab},
    **sizes("tokens", "vocab"),
    grad_inputs=("logits",),
    category="lm_head_loss",
    min_bytes=lambda s, e, mode: (1 if mode == "fwd" else 2) * s["tokens"] * s["vocab"] * e,  # read; + write grad
    bench_inputs={"ignore_every": 10},  # 10% of the tokens ignored, as in padded / prompt-masked batches
    peers={"liger": liger("liger_cross_entropy", "logits", "target"), "quack": quack_cross_entropy},
    # Liger reads the count of non-ignored tokens with .item() and compares the upstream gradient with 1 on the host
    grads_in_forward=("tigon", "tigon_fwdgrad", "liger"), host_syncs=("liger",),
    bench_notes={"tigon": "the default: the forward forms the gradient into a buffer of its own, the backward hands "
                          "it on (upstream 1)",
                 "tigon_inplace": "inplace_backward=True: the backward writes the gradient into the logits' memory",
                 "tigon_fwdgrad": "grad_in_forward=True: the forward writes the gradient over the logits (Liger's "
                                  "scheme), the backward only scales it",
                 "quack": "QuACK's CuTe DSL kernels: the loss forward, the gradient in the backward",
                 "liger": "writes the gradient into the logits in its forward (compare with tigon_fwdgrad)"},
    cases=(
        Case(),
        *LOSS_CASES,
        Case("weight", inputs={"ignore_every": 4, "class_weights": True}, variants=("model",)),
        Case("inplace_backward=True", options={"lse_square_scale": 1e-4}, inputs={"ignore_every": 4},
             fn=with_flag("inplace_backward"), variants=("model",)),
        # grad_in_forward rounds the gradient in the forward and again when the backward scales it by an upstream
        # other than 1 (up to 2x the original's bf16 error, as its docstring says); verified for what it is for,
        # loss.backward(), where the upstream is 1 and the gradient is rounded once.
        Case("grad_in_forward=True (upstream 1)", options={"lse_square_scale": 1e-4}, inputs={"ignore_every": 4},
             fn=with_flag("grad_in_forward"), variants=("model",), unit_upstream=True),
        # the default's main path: the gradient formed in the forward and handed on for loss.backward() (other
        # upstreams, as in the rows above, recompute it lazily)
        Case("default, upstream 1", options={"lse_square_scale": 1e-4}, inputs={"ignore_every": 4},
             variants=("model",), unit_upstream=True),
        Case("bench: inplace_backward", options={"inplace_backward": True}, tags=frozenset({"bench"}),
             provider="tigon_inplace"),
        Case("bench: grad_in_forward", fn=with_flag("grad_in_forward"), tags=frozenset({"bench"}),
             provider="tigon_fwdgrad"),
    ),
),)
