"""Distillation losses between a student's and a teacher's distributions over the vocabulary: the public ops
:func:`jsd`, :func:`kl_div`, :func:`tvd` and their records.

Liger-Kernel's ``liger_jsd``, ``liger_kl_div`` and ``liger_tvd`` (0.8.5) under Tigon's names: the same arguments,
order, defaults and values. Kernels: :mod:`tigon.kernels.divergence` (one row-loop kernel for the family, the
gradient formed in the forward). Specification: :mod:`tigon.reference.divergence`.

Where Tigon differs from Liger (all deliberate): the loss is float32 (float64 for float64 inputs) where Liger's jsd
returns the input's dtype; the target gets a gradient when it requires one (Liger returns None); -inf
log-probabilities give finite results where the divergence is finite (Liger gives NaN); an all-ignored batch gives 0;
no host synchronisation (Liger reads the count of kept rows with ``.item()`` and compares the upstream gradient with
1 on the host).
"""

from __future__ import annotations

import torch

from .. import _checks
from ..reference import divergence as ref
from ..support import TORCH_CODE, select_backend
from ._record import Case, OpSpec, liger, randn, sizes, targets


def _kernel(input, target, labels, opts, reduction, grad_in_forward=False):
    from ..kernels import divergence as k

    run = k.compiled_divergence if torch.compiler.is_compiling() else k.DivergenceFunction.apply
    return run(input, target, labels, k.Divergence(*opts), reduction, grad_in_forward)


def jsd(input: torch.Tensor, target: torch.Tensor, shift_labels: torch.Tensor | None = None, beta: float = 0.5,
        ignore_index: int = -100) -> torch.Tensor:
    """Generalised Jensen-Shannon divergence between a student and a teacher, for knowledge distillation.

    ``sum_v [beta * P (log P - log M) + (1 - beta) * Q (log Q - log M)]`` per row, with ``P = exp(target)``,
    ``Q = exp(input)`` and ``M = beta * P + (1 - beta) * Q`` (Agarwal et al. 2024, GKD, eq. 1; beta = 0.5 is the
    Jensen-Shannon divergence of Lin 1991), averaged over the rows not ignored. ``beta = 0`` is the forward KL(P || Q)
    and ``beta = 1`` the reverse KL(Q || P) (GKD's, TRL's and Liger's convention). Full definition:
    :mod:`tigon.reference.divergence`. Math in fp32; the vocabulary is walked in blocks (any V).

    Args:
        input: (N, V) student log-probabilities (log_softmax of the logits), float32 / bfloat16 / float16 (other
            float dtypes run the reference); any strides. Gets a gradient, formed in the forward pass in the input's
            dtype and scaled by the backward: for an upstream gradient other than 1 (``(loss * 3).backward()``) it is
            rounded twice, in bfloat16 1.2-2.2x the error of torch's formula on fp32-upcast inputs, still inside that
            of the formula evaluated in bfloat16 (:mod:`tigon.kernels.divergence`; Liger rounds the same way).
        target: (N, V) teacher log-probabilities, any float dtype; gets a gradient too if it requires one (Liger:
            none).
        shift_labels: optional (N,) integer labels; rows whose label equals ``ignore_index`` are skipped (never
            read: loss and gradients 0) and not counted in the average.
        beta: in [0, 1], the weight of the teacher in the mixture M.
        ignore_index: the label of skipped rows.

    Returns:
        0-d float32 loss (float64 for float64 inputs); 0 when every row is skipped or N = 0.

    Raises:
        TypeError: input / target not floating, shift_labels not an integer tensor, beta not a number,
            ignore_index not an int.
        ValueError: input not (N, V), target of another shape, shift_labels not (N,), devices differ, beta outside
            [0, 1].
    """
    ref.check_pair(input, target, shift_labels)
    b = ref.check_beta(beta)
    ignore_index = _checks.integer("ignore_index", ignore_index)
    if select_backend("jsd", input) in TORCH_CODE:
        return ref.jsd(input, target, shift_labels, beta, ignore_index)
    from ..kernels.divergence import JSD, KL_LOG, KL_LOG_REVERSE

    kind = KL_LOG if b == 0.0 else KL_LOG_REVERSE if b == 1.0 else JSD
    return _kernel(input, target, shift_labels, (kind, b, 0.0, ignore_index), "batchmean", True)


def kl_div(input: torch.Tensor, target: torch.Tensor, size_average: bool = True, reduce: bool = True,
           reduction: str = "mean", log_target: bool = False, eps: float = 1e-10) -> torch.Tensor:
    """KL divergence KL(target || input) of input log-probabilities: torch.nn.functional.kl_div's loss.

    Pointwise ``t * (log max(t, eps) - x)`` (``exp(t) * (t - x)`` with ``log_target``), x = input, t = target, then
    reduced. Full definition: :mod:`tigon.reference.divergence`.

    Args:
        input: (N, V) log-probabilities, float32 / bfloat16 / float16 (other float dtypes run the reference); any
            strides. Gets a gradient (``-target`` or ``-exp(target)`` times the reduction's factor), formed in the
            forward pass for a scalar reduction: the backward then writes nothing for an upstream gradient of 1
            (``loss.backward()``) and rewrites it from the target otherwise, rounded once either way.
        target: (N, V) probabilities (log-probabilities with ``log_target``), any float dtype; gets a gradient too if
            it requires one (Liger: none), formed the same way (it depends on the input too: rewritten from both).
        size_average, reduce: ignored (torch's deprecated arguments; Liger-Kernel ignores them too).
        reduction: ``"mean"`` (the sum over all N * V elements divided by N * V, torch's), ``"batchmean"`` (divided
            by N: the KL divergence per row), ``"sum"``, or ``"none"`` ((N, V) pointwise losses).
        log_target: target holds log-probabilities.
        eps: lower clamp of the target inside the log (probability targets), Liger's; >= 0.

    Returns:
        float32 loss (float64 for float64 inputs): 0-d, or (N, V) for ``"none"``; 0 for N = 0.

    Raises:
        TypeError: input / target not floating, eps not a number, log_target not a bool.
        ValueError: input not (N, V), target of another shape, devices differ, unknown reduction, eps < 0.
    """
    ref.check_pair(input, target)
    _checks.choice("reduction", reduction, ref.REDUCTIONS)
    e = _checks.number("eps", eps, minimum=0.0)
    _checks.flag("log_target", log_target)
    if select_backend("kl_div", input) in TORCH_CODE:
        return ref.kl_div(input, target, size_average, reduce, reduction, log_target, eps)
    from ..kernels.divergence import KL_LOG, KL_PROB

    return _kernel(input, target, None, (KL_LOG if log_target else KL_PROB, 0.5, e, -100), reduction, True)


def tvd(input: torch.Tensor, target: torch.Tensor, shift_labels: torch.Tensor | None = None, reduction: str = "mean",
        ignore_index: int = -100) -> torch.Tensor:
    """Total variation distance ``sum_v |p - q| / 2`` between two (N, V) probability tables, reduced.

    Args:
        input: (N, V) probabilities p, float32 / bfloat16 / float16 (other float dtypes run the reference); any
            strides. Gets a gradient (``sign(p - q) / 2``, 0 where p = q, times the reduction's factor), formed in
            the forward pass for a scalar reduction (Liger-Kernel's scheme: the backward then writes nothing for an
            upstream gradient of 1, and rescales it otherwise, still with one rounding); a second backward through
            the same loss then raises.
        target: (N, V) probabilities q, any float dtype; gets a gradient too if it requires one (Liger: none).
        shift_labels: optional (N,) integer labels; rows whose label equals ``ignore_index`` are skipped (loss and
            gradients 0) and not counted by "mean" / "batchmean".
        reduction: ``"mean"`` (sum over the kept rows / (kept rows * V)), ``"batchmean"`` (/ kept rows), ``"sum"``
            or ``"none"`` ((N, V), skipped rows 0). Liger's functional default "mean" (its module's is "batchmean",
            as :class:`tigon.nn.TVDLoss`'s).
        ignore_index: the label of skipped rows.

    Returns:
        float32 loss (float64 for float64 inputs): 0-d, or (N, V) for ``"none"``; 0 when every row is skipped.

    Raises:
        TypeError: input / target not floating, shift_labels not an integer tensor, ignore_index not an int.
        ValueError: input not (N, V), target of another shape, shift_labels not (N,), devices differ, unknown
            reduction.
    """
    ref.check_pair(input, target, shift_labels)
    _checks.choice("reduction", reduction, ref.REDUCTIONS)
    ignore_index = _checks.integer("ignore_index", ignore_index)
    if select_backend("tvd", input) in TORCH_CODE:
        return ref.tvd(input, target, shift_labels, reduction, ignore_index)
    from ..kernels.divergence import TVD

    return _kernel(input, target, shift_labels, (TVD, 0.5, 0.0, ignore_index), reduction, True)


# ---- the records ---------------------------------------------------------------------------------------------------
def _distributions(s: dict, dtype, device, gen, log: bool) -> torch.Tensor:
    """(tokens, vocab) log-probabilities (``log``) or probabilities of logits with std 2, rounded to ``dtype``."""
    logits = randn(gen, (s["tokens"], s["vocab"]), torch.float32, device, 2.0)
    return (torch.log_softmax(logits, -1) if log else torch.softmax(logits, -1)).to(dtype)


def _labels(s: dict, device, gen, ignore_every: int, labels: bool) -> dict:
    return {"shift_labels": targets(gen, s["tokens"], s["vocab"], device, ignore_every)} if labels else {}


def _jsd_inputs(s: dict, dtype, device, gen, ignore_every: int = 0, labels: bool = True) -> dict:
    """Student and teacher log-probabilities (tokens, vocab), with ``labels`` shift_labels (every ``ignore_every``-th
    -100)."""
    return dict(input=_distributions(s, dtype, device, gen, True), target=_distributions(s, dtype, device, gen, True),
                **_labels(s, device, gen, ignore_every, labels))


def _kl_inputs(s: dict, dtype, device, gen, log_target: bool = False) -> dict:
    """Input log-probabilities and target probabilities (log-probabilities with ``log_target``), (tokens, vocab), and
    the matching ``log_target`` option (the two go together: a log-probability read as a probability is negative)."""
    return dict(input=_distributions(s, dtype, device, gen, True),
                target=_distributions(s, dtype, device, gen, log_target), log_target=log_target)


def _tvd_inputs(s: dict, dtype, device, gen, ignore_every: int = 0, labels: bool = True) -> dict:
    """Two probability tables (tokens, vocab), with ``labels`` shift_labels (every ``ignore_every``-th -100)."""
    return dict(input=_distributions(s, dtype, device, gen, False),
                target=_distributions(s, dtype, device, gen, False), **_labels(s, device, gen, ignore_every, labels))


def _read2_write1(s: dict, e: int, mode: str) -> float:
    """Read input and target; forward + backward also writes the input's gradient (the floor, 3 N V e: jsd's, tvd's
    and kl_div's kernels move exactly that with upstream 1, forming the gradient in the forward; Liger's kl_div moves
    4 N V e, its backward reading the target again)."""
    return (2 if mode == "fwd" else 3) * s["tokens"] * s["vocab"] * e


_COMMON = dict(
    shape_of=lambda m: {"tokens": m.tokens, "vocab": m.vocab},
    **sizes("tokens", "vocab"),
    grad_inputs=("input",),  # distillation: the teacher is a constant (the target's gradient: tests/test_divergence.py)
    category="lm_head_loss",
    min_bytes=_read2_write1,
    # Liger reads the count of kept rows with .item() (given labels) and compares the upstream gradient with 1 on the
    # host
    host_syncs=("liger",),
)

RECORDS = (
    OpSpec(
        name="jsd",
        summary="generalised Jensen-Shannon divergence of student / teacher log-probs (knowledge distillation)",
        fn=jsd, reference=ref.jsd, original=ref.plain_jsd,
        original_name="the same formula in plain PyTorch at the input dtype, as TRL's GKD loss "
                      "(tigon.reference.divergence.plain_jsd)",
        make_inputs=_jsd_inputs,
        grads_in_forward=("tigon", "liger"),
        bench_inputs={"ignore_every": 10},  # 10% of the rows ignored, as prompt-masked batches
        peers={"liger": liger("liger_jsd", "input", "target", shift_labels="shift_labels")},
        cases=(
            Case(),
            Case("ignore_index=-100", inputs={"ignore_every": 3}),
            Case("no labels", inputs={"labels": False}, variants=("model",)),
            Case("beta=0 (forward KL)", options={"beta": 0.0}, inputs={"ignore_every": 4}, variants=("model",)),
            Case("beta=1 (reverse KL)", options={"beta": 1.0}, inputs={"ignore_every": 4}, variants=("model",)),
            Case("beta=0.1", options={"beta": 0.1}, variants=("model",)),
        ),
        **_COMMON,
    ),
    OpSpec(
        name="kl_div",
        summary="KL divergence of input log-probs from target probabilities (torch's kl_div, Liger's eps)",
        fn=kl_div, reference=ref.kl_div, original=ref.plain_kl_div,
        original_name="torch.nn.functional.kl_div at the input dtype",
        make_inputs=_kl_inputs,
        grads_in_forward=("tigon",),  # (Liger's kl_div forms it in its backward, from the target)
        peers={"liger": liger("liger_kl_div", "input", "target")},
        cases=(
            Case(),
            Case("reduction=batchmean", options={"reduction": "batchmean"}),
            Case("log_target=True", inputs={"log_target": True}),
            Case("reduction=sum", options={"reduction": "sum"}, variants=("model",)),
            Case("reduction=none", options={"reduction": "none"}, variants=("model",)),
        ),
        **_COMMON,
    ),
    OpSpec(
        name="tvd",
        summary="total variation distance of two probability tables (tokens, vocab)",
        fn=tvd, reference=ref.tvd, original=ref.plain_tvd,
        original_name="|p - q| / 2 in plain PyTorch at the input dtype (tigon.reference.divergence.plain_tvd)",
        make_inputs=_tvd_inputs,
        grads_in_forward=("tigon", "liger"),
        bench_inputs={"ignore_every": 10},
        peers={"liger": liger("liger_tvd", "input", "target", shift_labels="shift_labels")},
        cases=(
            Case(),
            Case("ignore_index=-100", inputs={"ignore_every": 3}),
            Case("reduction=batchmean", options={"reduction": "batchmean"}, inputs={"ignore_every": 4}),
            Case("reduction=sum", options={"reduction": "sum"}, variants=("model",)),
            Case("reduction=none", options={"reduction": "none"}, inputs={"ignore_every": 4}, variants=("model",)),
            Case("no labels", inputs={"labels": False}, variants=("model",)),
        ),
        **_COMMON,
    ),
)
