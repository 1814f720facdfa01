"""Rotary position embedding, HF rotate-half convention (RoFormer, Su et al. 2021): the public op and its record.

Kernels: :mod:`tigon.kernels.rope`. Specification: :mod:`tigon.reference.rope` (HF ``apply_rotary_pos_emb``).
"""

from __future__ import annotations

import torch

from .. import _checks
from ..reference import rope as ref
from ..support import TORCH_CODE, select_backend
from ._dtensor import DTensorRule, accepts_dtensor
from ._record import Case, OpSpec, liger, randn


def rope_mixed_dims(args, ndim: int) -> tuple[int, ...]:
    """The dimensions of q / k that RoPE mixes, which a DTensor must not shard there (see tigon.ops._dtensor): the
    rotated head dimension, the positions (cos / sin are per position) and, when cos has a batch dimension other
    than 1, the batch. Sharding the heads (tensor parallelism) runs locally."""
    positions = 2 if args.get("unsqueeze_dim", 1) == 1 else 1
    batch = (0,) if args["cos"].dim() == 3 and args["cos"].shape[0] != 1 else ()
    return (ndim - 1, positions, *batch)


@accepts_dtensor(DTensorRule(rows=("q", "k"), outputs=("q", "k"), constants=("cos", "sin"),
                             mixed_dims=rope_mixed_dims))
def rope(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, position_ids: torch.Tensor | None = None,
    unsqueeze_dim: int = 1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary position embedding, HF rotate-half convention (RoFormer, Su et al. 2021; HF ``apply_rotary_pos_emb``).

    ``q_embed = q * cos + rotate_half(q) * sin`` (and the same for k), where ``rotate_half(x) = cat(-x2, x1)``
    of the two halves of the head dimension and cos/sin get a head axis inserted at ``unsqueeze_dim``. Partial
    rotary (GPT-NeoX / Pythia's ``apply_rotary_pos_emb``): cos / sin of R < D columns rotate the first R dims of
    each head (rotary_dim = R) and pass the other D - R through unchanged, in the same launch. Math in
    fp32; one launch rotates the rows (batch, position, head) of q and k in tiles, each row gathering its
    position's cos/sin (read from memory once, then from cache by the position's other heads).

    Drop-in for Liger-Kernel's ``liger_rope(q, k, cos, sin, position_ids=None, unsqueeze_dim=1)`` (and
    ``liger_rotary_pos_emb``, the same signature): the same arguments in the same order.

    Args:
        q: (B, Hq, T, D) for ``unsqueeze_dim=1`` (HF's layout after ``.transpose(1, 2)``) or (B, T, Hq, D) for
            ``unsqueeze_dim=2``; float32 / bfloat16 / float16 (other float dtypes run the reference); any
            strides (the transposed view of a projection is read in place).
        k: the same layout and dtype as q with Hkv heads (any Hkv, e.g. GQA with Hq a multiple of Hkv).
        cos, sin: (1 or B, T, R) or (T, R) (one table for every batch row, as Liger-Kernel's ``liger_rope`` takes
            it) with R even and 0 < R <= D (R < D: partial rotary), any float dtype; the usual HF tables
            ``cat(freqs, freqs)``, but any values are rotated exactly. Treated as constants: they receive no
            gradient (HF builds them under ``torch.no_grad``). An odd head dim D is rotated only partially (an
            even R < D): rotate-half pairs dim i with dim i + R/2, so an odd R has a dim without a partner, and
            HF's ``rotate_half`` on it is no rotation (it does not preserve the norm); it is refused, where
            Liger-Kernel silently rotates the first R - 1 dims with the first (R - 1)/2 columns of cos / sin.
        position_ids: None, or an integer tensor (B or 1, T) or (T,) of each token's position. With per-position
            tables (cos / sin of 3 dims, HF's since transformers 4.38) it is not needed and not used, as in
            Liger-Kernel (which never reads it). With a 2-D cos / sin it selects their rows: cos / sin are then the
            table of every position, (P, R) with P > every position id (HF's ``apply_rotary_pos_emb`` before 4.38:
            ``cos[position_ids]``), gathered to (B or 1, T, R) before the rotation, so packed sequences whose
            positions restart are rotated right (Liger ignores position_ids there too and reads row t for token t,
            which is the same only for ``position_ids = arange(T)``). An id outside [0, P) is an indexing error
            (on CUDA a device-side assert, as HF's indexing).
        unsqueeze_dim: 1 or 2, where the head axis of q and k is (keyword or sixth positional argument, as Liger's).

    Returns:
        (q_embed, k_embed): shapes and dtypes of q and k; strides of q and k when those are dense, else
        contiguous.

    Raises:
        TypeError: a non-floating tensor, q and k of different dtypes, or position_ids neither None nor an integer
            tensor (an int there is refused with a hint: the fifth positional argument was ``unsqueeze_dim`` before
            Liger's order was taken).
        ValueError: wrong ranks, mismatched B / T / D between q and k, cos / sin not (1 or B, T, R) or (T, R) (with
            position_ids: (P, R)) with R even and 0 < R <= D, position_ids not (1 or B, T) or (T,), devices differ,
            or unsqueeze_dim not in (1, 2).
    """
    _checks.tensor("q", q, floating=True, ndim=4)
    _checks.tensor("k", k, floating=True, ndim=4)
    _checks.tensor("cos", cos, floating=True, ndim=(2, 3))
    _checks.tensor("sin", sin, floating=True, ndim=(2, 3))
    _checks.same_device(q=q, k=k, cos=cos, sin=sin)
    _checks.choice("unsqueeze_dim", unsqueeze_dim, (1, 2))
    if position_ids is not None and not isinstance(position_ids, torch.Tensor):
        raise TypeError(f"position_ids must be an integer tensor or None, got {type(position_ids).__name__} "
                        f"{position_ids!r} (rope takes Liger's order (q, k, cos, sin, position_ids, unsqueeze_dim): "
                        "pass unsqueeze_dim by keyword)")
    if k.dtype != q.dtype:
        raise TypeError(f"k must have q's dtype {q.dtype}, got {k.dtype}")
    t_axis = 2 if unsqueeze_dim == 1 else 1
    B, T, D = q.shape[0], q.shape[t_axis], q.shape[-1]
    R = cos.shape[-1]
    if R == 0 or R % 2 or R > D:
        raise ValueError(f"cos's last dimension (the rotated dims R) must be even, positive and at most q's head "
                         f"dimension {D}, got cos {tuple(cos.shape)} for q {tuple(q.shape)} (rotate-half pairs dim i "
                         "with i + R/2; an odd head dim can only be rotated partially, by an even R < D)")
    if k.shape[0] != B or k.shape[t_axis] != T or k.shape[-1] != D:
        raise ValueError(f"k must match q's batch, positions and head dim (unsqueeze_dim={unsqueeze_dim}), "
                         f"got q {tuple(q.shape)} and k {tuple(k.shape)}")
    if position_ids is not None:
        _checks.tensor("position_ids", position_ids, integer=True, ndim=(1, 2))
        _checks.same_device(q=q, position_ids=position_ids)
        if position_ids.shape[:-1] not in ((), (1,), (B,)) or position_ids.shape[-1] != T:
            raise ValueError(f"position_ids must have shape (1 or {B}, {T}) or ({T},), got {tuple(position_ids.shape)}")
        if cos.dim() == 2:  # the table of every position: its rows at the ids
            if sin.shape != cos.shape:
                raise ValueError(f"sin must have cos's shape {tuple(cos.shape)} (the table of every position), got "
                                 f"{tuple(sin.shape)}")
            cos, sin = ref.gather_positions(cos, sin, position_ids)
    for name, t in (("cos", cos), ("sin", sin)):
        if t.shape[:-2] not in ((), (1,), (B,)) or t.shape[-2] != T or t.shape[-1] != R:
            raise ValueError(f"{name} must have shape (1 or {B}, {T}, {R}) or ({T}, {R}) (cos's rotated dims), got "
                             f"{tuple(t.shape)}")
    if cos.dim() == 2:  # (T, R): one table for the whole batch
        cos = cos.unsqueeze(0)
    if sin.dim() == 2:
        sin = sin.unsqueeze(0)
    if select_backend("rope", q) in TORCH_CODE:
        return ref.rope(q, k, cos, sin, None, unsqueeze_dim)
    from ..kernels import rope as kr

    run = kr.compiled_rope if torch.compiler.is_compiling() else kr.RoPEFunction.apply
    return run(q, k, cos, sin, unsqueeze_dim)


# ---- the record ----------------------------------------------------------------------------------------------------
def _shape(m) -> dict:
    return {"tokens": m.batch * m.seq, "batch": m.batch, "seq": m.seq, "heads": m.heads, "kv_heads": m.kv_heads,
            "head_dim": m.head_dim, "rotary_dim": m.rotary_dim or m.head_dim, "theta": m.rope_theta}


def _inputs(s: dict, dtype, device, gen, position_table: bool = False) -> dict:
    """q (B, heads, T, head_dim) and k (B, kv_heads, T, head_dim) as HF attention makes them (transposed views of
    the (B, T, H * D) projections), cos / sin (1, T, rotary_dim) HF tables for the model's theta (rotary_dim: the
    head dim, or fewer for partial rotary), in the input dtype. ``position_table``: instead cos / sin (T + 5,
    rotary_dim) of every position and position_ids (B, T), each batch row's positions restarting once (packed
    sequences)."""
    b, t, d = s["batch"], s["seq"], s["head_dim"]
    q = randn(gen, (b, t, s["heads"] * d), dtype, device).view(b, t, s["heads"], d).transpose(1, 2)
    k = randn(gen, (b, t, s["kv_heads"] * d), dtype, device).view(b, t, s["kv_heads"], d).transpose(1, 2)
    d = s.get("rotary_dim", d)
    inv_freq = 1.0 / s.get("theta", 10000.0) ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
    n = t + 5 if position_table else t
    emb = torch.cat((torch.arange(n, dtype=torch.float32)[:, None] * inv_freq,) * 2, dim=-1)
    out = dict(q=q, k=k, cos=emb.cos().to(device, dtype), sin=emb.sin().to(device, dtype))
    if not position_table:
        return {**out, "cos": out["cos"][None], "sin": out["sin"][None]}
    pos = torch.arange(t)[None, :].repeat(b, 1)
    pos[:, t // 2:] -= t // 2 - torch.arange(b)[:, None] % 3  # a second sequence from position 0, 1 or 2
    return {**out, "position_ids": pos.to(device)}


RECORDS = (OpSpec(
    name="rope",
    summary="rotary position embedding of q and k (HF rotate-half layout)",
    fn=rope,
    reference=ref.rope,
    original=ref.rope,
    original_name="HF apply_rotary_pos_emb (tigon.reference.rope)",
    make_inputs=_inputs,
    shape_of=_shape,
    size_format="batch x seq x (q heads + kv heads) x head_dim",
    size_label=lambda s: f"{s['batch']}x{s['seq']}x({s['heads']}+{s['kv_heads']})x{s['head_dim']}"
    + (f" (rotary {s['rotary_dim']})" if s.get("rotary_dim", s["head_dim"]) != s["head_dim"] else ""),
    grad_inputs=("q", "k"),
    category="rotary",
    under_compile="inductor",  # under torch.compile Inductor fuses it with the q / k projections' layout ops
    # read q, k, write both; backward: read dq, dk, write both (cos / sin come from cache)
    min_bytes=lambda s, e, mode: (2 if mode == "fwd" else 4) * s["batch"] * s["seq"] * s["head_dim"]
    * (s["heads"] + s["kv_heads"]) * e,
    peers={"liger": liger("liger_rope", "q", "k", "cos", "sin")},
    # Liger's position_ids (accepted there, never read) over HF's old table of every position: rows gathered
    cases=(Case(), Case("position_ids, (P, R) table", inputs={"position_table": True})),
    bench_notes={"liger": "rotates q and k in place when their layout allows"},
),)
