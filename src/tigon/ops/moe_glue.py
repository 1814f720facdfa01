"""The glue of a mixture-of-experts layer around its two grouped matmuls (transformers v5 ``integrations/moe.py``,
``grouped_mm_experts_forward``): the gather of the routed tokens into rows sorted by expert (:func:`moe_gather`), the
per-expert bias and the gate between the matmuls (:func:`moe_expert_gate`), and the weighted sum of each token's k
expert outputs (:func:`moe_combine`). The public ops and their records.

HF runs each as several full passes over (S, hidden) or (S, 2 intermediate) tensors (S = tokens x top_k): the
gather and its scatter-add backward, a materialised (S, 2I) bias gather and its add, the gate, another bias gather
and add, the routing-weight product, the inverse-permutation gather and the (T, k, H) sum, each with its backward.
These ops are one pass each way (:mod:`tigon.kernels.moe_glue`, where the formulas and bytes are).

Kernels: :mod:`tigon.kernels.moe_glue` (custom ops: :mod:`tigon.kernels.moe_glue_compiled`). Specification:
:mod:`tigon.reference.moe_glue`. Under ``torch.compile`` each op runs as :func:`tigon.support.compiled_choice` says: its
kernels as the ``tigon::moe_gather`` / ``tigon::moe_expert_gate`` / ``tigon::moe_combine`` custom ops (and their
``_backward`` ops) in compile mode ``"kernels"``, or its reference traced by Inductor (compile mode ``"inductor"``, and
``"auto"``: the records' ``under_compile`` "inductor").
"""

from __future__ import annotations

import torch

from .. import _checks
from ..reference import moe_glue as ref
from ..support import TORCH_CODE, select_backend
from ._record import Case, OpSpec, rand, randn, sizes


_INDEX_DTYPES = (torch.int32, torch.int64)


def _index_dtype(name: str, t) -> None:
    """int32 / int64 only: the dtypes grouped_mm's offsets and the sort's indices have (an int16 or uint8 index is
    another thing to PyTorch's indexing: uint8 is a mask)."""
    if t.dtype not in _INDEX_DTYPES:
        raise TypeError(f"{name} must be an int32 or int64 tensor, got dtype {t.dtype}")


def _positions(positions, tokens: int, name: str = "positions") -> tuple[int, int]:
    _checks.tensor(name, positions, integer=True, ndim=2)
    _index_dtype(name, positions)
    if positions.shape[0] != tokens:
        raise ValueError(f"{name} must have one row per token ({tokens}), got shape {tuple(positions.shape)}")
    return positions.shape


def _offsets(offsets) -> int:
    _checks.tensor("offsets", offsets, integer=True, ndim=1)
    _index_dtype("offsets", offsets)
    if offsets.shape[0] == 0:
        raise ValueError("offsets must have one entry per expert (E >= 1), got shape (0,)")
    return offsets.shape[0]


def _bias(bias, experts: int, width: int) -> None:
    _checks.tensor("bias", bias, floating=True, ndim=2)
    if tuple(bias.shape) != (experts, width):
        raise ValueError(f"bias must have shape ({experts}, {width}) (experts, columns), got {tuple(bias.shape)}")


def _torch_code(op: str, t: torch.Tensor) -> bool:
    """Whether ``op`` runs its reference for ``t``: no kernels for its device / dtype, or (under torch.compile) the
    compile mode leaves it to Inductor (:func:`tigon.support.select_backend`, which counts the choice once per
    trace)."""
    return select_backend(op, t) in TORCH_CODE


def moe_gather(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """The routed tokens in rows sorted by expert: ``out[positions[t, j]] = x[t]`` (transformers ``integrations/moe.py``
    ``grouped_mm_experts_forward``'s ``hidden_states[perm // num_top_k]``, with ``positions`` its ``inv_perm`` viewed
    (T, k)).

    The kernel reads each token's row once and writes its k copies; the backward sums each token's k rows in fp32 in
    slot order (a deterministic gather through ``positions``, where autograd's scatter-add of an index runs atomics).

    Args:
        x: (T, H) float32 / bfloat16 / float16 (other float dtypes run the reference), any strides.
        positions: (T, k) int32 / int64, the sorted row of each (token, slot): a permutation of 0 .. T*k-1, checked
            for CPU tensors (a sort); CUDA ones are not read (a device sync per call): there a position outside
            [0, T*k) is skipped (nothing out of bounds), a repeated one leaves rows undefined.

    Returns:
        (T*k, H) contiguous in x's dtype; x's gradient in its dtype.

    Raises:
        TypeError: x not a floating tensor, positions not an int32 / int64 tensor.
        ValueError: wrong dimensions, positions' rows not x's, (CPU) positions not a permutation.
    """
    _checks.tensor("x", x, floating=True, ndim=2)
    _positions(positions, x.shape[0])
    _checks.same_device(x=x, positions=positions)
    if _torch_code("moe_gather", x):
        return ref.moe_gather(x, positions)
    ref.check_host(positions, None)
    from ..kernels import moe_glue as k, moe_glue_compiled as kc

    run = kc.compiled_moe_gather if torch.compiler.is_compiling() else k.MoEGatherFunction.apply
    return run(x, positions)


def moe_expert_gate(gate_up: torch.Tensor, offsets: torch.Tensor, bias: torch.Tensor | None = None,
                    activation: str = "silu", alpha: float = 1.702, limit: float | None = None) -> torch.Tensor:
    """The experts' gate on the up grouped matmul's output, with the per-expert bias: ``act(gate_up[s] + bias[e(s)])``,
    e(s) the expert of sorted row s from grouped_mm's ``offsets`` (transformers ``integrations/moe.py``:
    ``_grouped_linear``'s ``out.add_(gate_up_proj_bias[expert_ids_g])``, then ``self._apply_gate``).

    ``activation``: ``"silu"`` (SwiGLU), ``"gelu"``, ``"gelu_tanh"`` (GeGLU) on the concatenated halves [gate; up]
    (transformers' ``_default_apply_gate``, ``act_fn(gate) * up``), with ``limit`` DeepSeek-V4's clamps first
    (``silu`` only: ``DeepseekV4Experts._apply_gate``); ``"clamped_swiglu"``: GPT-OSS's on interleaved columns
    (``GptOssExperts._apply_gate``: ``(clamp(up, -limit, limit) + 1) * g * sigmoid(alpha g)``, g = min(gate, limit)).

    One pass: the bias is read per row from the (E, 2I) table (no (S, 2I) bias is formed), math in fp32. Backward:
    d_gate_up in one pass (the activation recomputed), d_bias the per-expert sums of d_gate_up's rows (one program per
    expert and column block, fp32, deterministic).

    Args:
        gate_up: (S, 2I) float32 / bfloat16 / float16, rows sorted by expert; unit column stride or a copy is made.
        offsets: (E,) int32 / int64, cumulative rows per expert (grouped_mm's ``offs``), nonnegative and
            nondecreasing (checked for CPU tensors; CUDA ones are not read, and are clamped to [0, S] where read);
            rows at or past ``offsets[-1]`` get no bias.
        bias: (E, 2I) float or None.
        activation: one of ``"silu"``, ``"gelu"``, ``"gelu_tanh"``, ``"clamped_swiglu"``.
        alpha: GPT-OSS's sigmoid slope (``"clamped_swiglu"`` only), finite.
        limit: the clamp, a positive finite number: required with ``"clamped_swiglu"``, optional with ``"silu"``,
            None otherwise.

    Returns:
        (S, I) contiguous in gate_up's dtype; gradients in gate_up's and the bias's dtypes.

    Raises:
        TypeError: a tensor of the wrong kind (offsets not int32 / int64), alpha / limit not a real number.
        ValueError: shapes (gate_up's width odd, bias not (E, 2I)), unknown activation, a limit missing or not allowed,
            not positive and finite, (CPU) offsets negative or decreasing.
    """
    _checks.tensor("gate_up", gate_up, floating=True, ndim=2)
    if gate_up.shape[1] % 2:
        raise ValueError(f"gate_up's last dimension must be even (gate and up), got {tuple(gate_up.shape)}")
    experts = _offsets(offsets)
    if bias is not None:
        _bias(bias, experts, gate_up.shape[1])
    _checks.same_device(gate_up=gate_up, offsets=offsets, bias=bias)
    _checks.choice("activation", activation, ref.GATE_ACTIVATIONS)
    alpha = _checks.number("alpha", alpha)
    if limit is not None:
        limit = _checks.number("limit", limit)
        if limit <= 0:
            raise ValueError(f"limit must be positive and finite, got {limit!r}")
        if activation in ("gelu", "gelu_tanh"):
            raise ValueError(f"limit (DeepSeek-V4's clamped SwiGLU) needs activation 'silu', got {activation!r}")
    elif activation == "clamped_swiglu":
        raise ValueError("activation='clamped_swiglu' (GPT-OSS) needs a limit (config.swiglu_limit)")
    if _torch_code("moe_expert_gate", gate_up):
        return ref.moe_expert_gate(gate_up, offsets, bias, activation, alpha, limit)
    ref.check_host(None, offsets)
    from ..kernels import moe_glue as k, moe_glue_compiled as kc

    run = kc.compiled_moe_expert_gate if torch.compiler.is_compiling() else k.MoEExpertGateFunction.apply
    return run(gate_up, offsets, bias, activation, alpha, limit)


def moe_combine(x: torch.Tensor, weights: torch.Tensor, positions: torch.Tensor, offsets: torch.Tensor | None = None,
                bias: torch.Tensor | None = None) -> torch.Tensor:
    """The experts' outputs weighted and summed per token: ``out[t] = sum_j (x[p] + bias[e(p)]) * weights[t, j]``,
    p = positions[t, j] (transformers ``integrations/moe.py``: the down ``_grouped_linear``'s bias add, ``proj_out *
    sample_weights_g``, ``weighted_out[inv_perm]`` and ``.view(T, k, H).sum(dim=1)``, which sums in fp32).

    One pass reads each sorted row once and writes each token once, the k slots summed in fp32 in slot order, without
    the bias's, the weighted rows' or the permuted rows' (S, H) tensors. Backward in one pass too: ``dx[p] =
    weights[t, j] dout[t]`` and ``dweights[t, j] = <x[p] + bias[e(p)], dout[t]>`` (fp32); d_bias the per-expert sums of
    dx's rows (fp32, deterministic).

    Args:
        x: (T*k, H) float32 / bfloat16 / float16, the down grouped matmul's output in sorted rows.
        weights: (T, k) float, the routing weights in token order (HF's ``top_k_weights``).
        positions: (T, k) int32 / int64, as :func:`moe_gather`'s (checked likewise).
        offsets: (E,) int32 / int64, as :func:`moe_expert_gate`'s; needed with a bias (else unused, not checked).
        bias: (E, H) float or None.

    Returns:
        (T, H) contiguous in x's dtype; gradients in x's, the weights' and the bias's dtypes.

    Raises:
        TypeError: a tensor of the wrong kind (positions / offsets not int32 / int64).
        ValueError: shapes (x's rows not T*k, weights not positions' shape, bias not (E, H)), a bias without offsets,
            (CPU) positions not a permutation, offsets (with a bias) negative or decreasing.
    """
    _checks.tensor("x", x, floating=True, ndim=2)
    _checks.tensor("weights", weights, floating=True, ndim=2)
    T, k = _positions(positions, weights.shape[0])
    if tuple(weights.shape) != (T, k):
        raise ValueError(f"weights must have positions' shape {(T, k)}, got {tuple(weights.shape)}")
    if x.shape[0] != T * k:
        raise ValueError(f"x must have T*k = {T * k} rows (one per routed pair), got shape {tuple(x.shape)}")
    if bias is not None:
        if offsets is None:
            raise ValueError("bias needs offsets (the sorted rows of each expert)")
        _bias(bias, _offsets(offsets), x.shape[1])
    elif offsets is not None:
        _offsets(offsets)
    _checks.same_device(x=x, weights=weights, positions=positions, offsets=offsets, bias=bias)
    if _torch_code("moe_combine", x):
        return ref.moe_combine(x, weights, positions, offsets, bias)
    ref.check_host(positions, offsets if bias is not None else None)
    from ..kernels import moe_glue as kk, moe_glue_compiled as kc

    run = kc.compiled_moe_combine if torch.compiler.is_compiling() else kk.MoECombineFunction.apply
    return run(x, weights, positions, offsets if bias is not None else None, bias)


# ---- the records ---------------------------------------------------------------------------------------------------
def routing(gen: torch.Generator, tokens: int, experts: int, top_k: int, device) -> dict:
    """A random routing of ``tokens`` tokens to ``top_k`` distinct experts each (of ``experts``), as
    ``grouped_mm_experts_forward`` sorts it: ``positions`` (T, k) int64 and ``offsets`` (E,) int32; the last expert
    gets none (an expert with no rows)."""
    k = min(top_k, max(1, experts - 1))
    scores = torch.rand((tokens, max(1, experts - 1)), generator=gen, device=gen.device)
    ids = scores.argsort(dim=1)[:, :k].reshape(-1)
    perm = torch.sort(ids, stable=True).indices
    positions = torch.empty_like(perm)
    positions[perm] = torch.arange(perm.numel(), device=perm.device)
    counts = torch.bincount(ids, minlength=experts)
    return dict(positions=positions.view(tokens, k).to(device),
                offsets=torch.cumsum(counts, 0).to(device=device, dtype=torch.int32))


def _moe_shape(m) -> dict:
    return {"tokens": m.tokens, "hidden": m.hidden, "intermediate": m.expert_intermediate or m.intermediate,
            "experts": m.experts, "top_k": m.top_k}


def _gather_inputs(s: dict, dtype, device, gen) -> dict:
    r = routing(gen, s["tokens"], s["experts"], s["top_k"], device)
    return dict(x=randn(gen, (s["tokens"], s["hidden"]), dtype, device), positions=r["positions"])


def _gate_inputs(s: dict, dtype, device, gen) -> dict:
    """gate_up (S, 2I) with std 3 (the activation's tails and GPT-OSS's clamps at 2 are reached), a bias (E, 2I)."""
    r = routing(gen, s["tokens"], s["experts"], s["top_k"], device)
    rows, width = r["positions"].numel(), 2 * s["intermediate"]
    return dict(gate_up=randn(gen, (rows, width), dtype, device, 3.0), offsets=r["offsets"],
                bias=randn(gen, (s["experts"], width), dtype, device, 0.5))


def _combine_inputs(s: dict, dtype, device, gen) -> dict:
    r = routing(gen, s["tokens"], s["experts"], s["top_k"], device)
    k = r["positions"].shape[1]
    return dict(x=randn(gen, (s["tokens"] * k, s["hidden"]), dtype, device),
                weights=rand(gen, (s["tokens"], k), dtype, device, 0.05, 1.0), positions=r["positions"],
                offsets=r["offsets"], bias=randn(gen, (s["experts"], s["hidden"]), dtype, device, 0.5))


RECORDS = (
    OpSpec(
        name="moe_gather",
        summary="the routed tokens gathered into rows sorted by expert (MoE), deterministic backward",
        fn=moe_gather, reference=ref.moe_gather, original=ref.moe_gather,
        original_name="hidden_states[perm // top_k] (HF grouped_mm_experts_forward)",
        make_inputs=_gather_inputs, shape_of=_moe_shape, **sizes("tokens", "top_k", "hidden"),
        grad_inputs=("x",), category="moe", under_compile="inductor",
        min_bytes=lambda s, e, mode: (s["tokens"] * (1 + s["top_k"]) * s["hidden"] * e * (1 if mode == "fwd" else 2)),
    ),
    OpSpec(
        name="moe_expert_gate",
        summary="the experts' per-expert bias and gate (SwiGLU / GeGLU / GPT-OSS's clamped SwiGLU) on sorted rows",
        fn=moe_expert_gate, reference=ref.moe_expert_gate, original=ref.moe_expert_gate,
        original_name="out.add_(bias[expert_ids_g]); self._apply_gate(out) (HF grouped_mm_experts_forward)",
        make_inputs=_gate_inputs, shape_of=_moe_shape, **sizes("tokens", "top_k", "intermediate"),
        grad_inputs=("gate_up", "bias"), category="moe", under_compile="inductor",
        # read gate_up (2n), write out (n); backward: read dout (n), gate_up (2n), write d_gate_up (2n), read it
        # again for d_bias (2n); n = S x I (the bias table is small)
        min_bytes=lambda s, e, mode: (3 if mode == "fwd" else 10) * s["tokens"] * s["top_k"] * s["intermediate"] * e,
        cases=(Case("activation=silu"), Case("activation=gelu_tanh", options={"activation": "gelu_tanh"}),
               Case("clamped_swiglu, limit=2.0", options={"activation": "clamped_swiglu", "limit": 2.0}),
               Case("silu, limit=2.0", options={"limit": 2.0})),
    ),
    OpSpec(
        name="moe_combine",
        summary="the experts' outputs (+ per-expert bias) weighted by the router and summed per token (MoE)",
        fn=moe_combine, reference=ref.moe_combine, original=ref.moe_combine,
        original_name="(out + bias[ids]) * w, [inv_perm], .view(T, k, H).sum(1) (HF grouped_mm_experts_forward)",
        make_inputs=_combine_inputs, shape_of=_moe_shape, **sizes("tokens", "top_k", "hidden"),
        grad_inputs=("x", "weights", "bias"), category="moe", under_compile="inductor",
        # forward: read x (S H), write out (T H); backward: read dout (T H), x (S H), write dx (S H), read dx for
        # d_bias (S H)
        min_bytes=lambda s, e, mode: (s["tokens"] * s["hidden"] * e
                                      * ((1 + s["top_k"]) if mode == "fwd" else (2 + 4 * s["top_k"]))),
    ),
)
