"""Rotary position embedding, HF rotate-half convention (RoFormer, Su et al. 2021): the public op and its record.

Kernels: :mod:`tigon.kernels.rope`. Specification: :mod:`tigon.reference.rope` (HF ``apply_rotary_pos_emb``).
"""

from __future__ import annotations

import torch

from .. import _checks
from ..reference import rope as ref
from ..support import TORCH_CODE, USAGE, remember_call, select_backend, switches, unwrap_dead
from ._dtensor import DTensorRule, accepts_dtensor, dtensor_call
from ._record import Case, OpSpec, liger, randn


def rope_mixed_dims(args, ndim: int) -> tuple[int, ...]:
    """The dimensions of q / k that RoPE mixes, which a DTensor must not shard there (see tigon.ops._dtensor): the
    rotated head dimension, the positions (cos / sin are per position) and, when cos has a batch dimension other
    than 1, the batch. Sharding the heads (tensor parallelism) runs locally."""
    positions = 2 if args.get("unsqueeze_dim", 1) == 1 else 1
    batch = (0,) if args["cos"].dim() == 3 and args["cos"].shape[0] != 1 else ()
    return (ndim - 1, positions, *batch)


def _checked(q, k, cos, sin, unsqueeze_dim: int, tables: int = 0, position_ids=None):
    """The argument checks shared by the rotary ops; returns cos and sin as (1 or B, T, R) (``tables=3``: mRoPE's
    (3, 1 or B, T, R), returned as given). ``position_ids`` (:func:`rope`'s, Liger's argument): with a 2-D table of
    every position, its rows at the ids are returned."""
    _checks.tensor("q", q, floating=True, ndim=4)
    _checks.tensor("k", k, floating=True, ndim=4)
    _checks.tensor("cos", cos, floating=True, ndim=4 if tables else (2, 3))
    _checks.tensor("sin", sin, floating=True, ndim=4 if tables else (2, 3))
    _checks.same_device(q=q, k=k, cos=cos, sin=sin)
    if isinstance(unsqueeze_dim, bool):  # (True == 1: the kernels took it, the reference's unsqueeze raised)
        raise TypeError(f"unsqueeze_dim must be the int 1 or 2, got bool {unsqueeze_dim!r}")
    _checks.choice("unsqueeze_dim", unsqueeze_dim, (1, 2))
    if position_ids is not None and not isinstance(position_ids, torch.Tensor):
        raise TypeError(f"position_ids must be an integer tensor or None, got {type(position_ids).__name__} "
                        f"{position_ids!r} (rope takes Liger's order (q, k, cos, sin, position_ids, unsqueeze_dim, "
                        "rotary_dim): "
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
        if cos.dim() == 2 and not tables:  # the table of every position: its rows at the ids
            if sin.shape != cos.shape:
                raise ValueError(f"sin must have cos's shape {tuple(cos.shape)} (the table of every position), got "
                                 f"{tuple(sin.shape)}")
            cos, sin = ref.gather_positions(cos, sin, position_ids)
    for name, t in (("cos", cos), ("sin", sin)):
        lead = t.shape[1:-2] if tables else t.shape[:-2]
        if (tables and t.shape[0] != tables) or lead not in ((), (1,), (B,)) or t.shape[-2] != T \
                or t.shape[-1] != R:
            want = f"({tables}, 1 or {B}, {T}, {R})" if tables else f"(1 or {B}, {T}, {R}) or ({T}, {R})"
            raise ValueError(f"{name} must have shape {want} (cos's rotated dims), got {tuple(t.shape)}")
    if tables:
        return cos, sin
    return (cos.unsqueeze(0) if cos.dim() == 2 else cos), (sin.unsqueeze(0) if sin.dim() == 2 else sin)


def _rotary_dim_tables(q, cos, sin, rotary_dim):
    """:func:`rope`'s ``rotary_dim`` (Liger-Kernel 0.8.5's, its ``_resolve_rotary_dim`` checks): checked, then the
    (..., rotary_dim) tables that rotate the first rotary_dim dims of each head
    (:func:`tigon.reference.rope.rotary_dim_tables`)."""
    if isinstance(rotary_dim, bool) or not isinstance(rotary_dim, int):
        raise TypeError(f"rotary_dim must be None or an int, got {type(rotary_dim).__name__} {rotary_dim!r}")
    _checks.tensor("q", q, floating=True, ndim=4)
    _checks.tensor("cos", cos, floating=True, ndim=(2, 3))
    _checks.tensor("sin", sin, floating=True, ndim=(2, 3))
    d = q.shape[-1]
    if rotary_dim <= 0 or rotary_dim % 2 or rotary_dim > d:
        raise ValueError(f"rotary_dim must be even and in (0, head_dim={d}], got {rotary_dim} (rotate-half pairs dim "
                         "i with i + rotary_dim/2)")
    if min(cos.shape[-1], sin.shape[-1]) < rotary_dim // 2:
        raise ValueError(f"cos / sin need at least rotary_dim / 2 = {rotary_dim // 2} columns (the pairs' angles), "
                         f"got cos {tuple(cos.shape)} and sin {tuple(sin.shape)}")
    return ref.rotary_dim_tables(cos, sin, rotary_dim)


@accepts_dtensor(DTensorRule(rows=("q", "k"), outputs=("q", "k"), constants=("cos", "sin"),
                             mixed_dims=rope_mixed_dims), asked_inside=True)
def rope(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, position_ids: torch.Tensor | None = None,
    unsqueeze_dim: int = 1, rotary_dim: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary position embedding, HF rotate-half convention (RoFormer, Su et al. 2021; HF ``apply_rotary_pos_emb``).

    ``q_embed = q * cos + rotate_half(q) * sin`` (and the same for k), where ``rotate_half(x) = cat(-x2, x1)``
    of the two halves of the head dimension and cos/sin get a head axis inserted at ``unsqueeze_dim``. Partial
    rotary (GPT-NeoX / Pythia's ``apply_rotary_pos_emb``): cos / sin of R < D columns rotate the first R dims of
    each head (rotary_dim = R) and pass the other D - R through unchanged, in the same launch. Math in
    fp32; one launch rotates the rows (batch, position, head) of q and k in tiles, each row gathering its
    position's cos/sin (read from memory once, then from cache by the position's other heads).

    Drop-in for Liger-Kernel 0.8.5's ``liger_rope(q, k, cos, sin, position_ids=None, unsqueeze_dim=1,
    rotary_dim=None)`` (and ``liger_rotary_pos_emb``, the same signature): the same arguments in the same order.

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
            which is the same only for ``position_ids = arange(T)``). An id outside [0, P) raises ValueError on
            the CPU; on CUDA it is not checked (a host read would synchronise every call): the indexing's
            device-side assert, as HF's.
        unsqueeze_dim: 1 or 2, where the head axis of q and k is (keyword or sixth positional argument, as Liger's).
        rotary_dim: None (default): the rotated dims are cos's width R, and every column of cos / sin is read (any
            values rotated exactly, as above). An int (Liger's ``rotary_dim``, seventh positional argument): the
            first rotary_dim dims of each head are rotated and the other D - rotary_dim passed through, the pair
            ``(i, i + rotary_dim/2)`` by the angle of column i of cos / sin (i < rotary_dim/2; later columns are not
            read), as Liger's kernel reads them: HF's duplicated tables of any width >= rotary_dim, or GPT-OSS's
            non-duplicated ``freqs`` of width rotary_dim / 2 (``rotary_dim=D`` rotates the whole head by them). The
            same kernel as partial rotary, on ``cat(c, c)`` tables with ``c = cos[..., :rotary_dim // 2]``
            (:func:`tigon.reference.rope.rotary_dim_tables`). Even, 0 < rotary_dim <= D, and cos / sin at least
            rotary_dim / 2 wide.

    Returns:
        (q_embed, k_embed): shapes and dtypes of q and k; strides of q and k when those are dense, else
        contiguous.

    Raises:
        TypeError: a non-floating tensor, q and k of different dtypes, position_ids neither None nor an integer
            tensor (an int there is refused with a hint: the fifth positional argument was ``unsqueeze_dim`` before
            Liger's order was taken), unsqueeze_dim a bool, or rotary_dim neither None nor an int.
        ValueError: wrong ranks, mismatched B / T / D between q and k, cos / sin not (1 or B, T, R) or (T, R) (with
            position_ids: (P, R)) with R even and 0 < R <= D, position_ids not (1 or B, T) or (T,) or (CPU, with
            a (P, R) table) outside [0, P), devices differ, unsqueeze_dim not in (1, 2), or rotary_dim odd, not in
            (0, D], or wider than twice cos / sin.
    """
    if rotary_dim is not None:  # Liger's rotary_dim: the (..., rotary_dim) tables of the same rotation
        cos, sin = _rotary_dim_tables(q, cos, sin, rotary_dim)
    state = switches()
    try:  # (arguments that are not tensors or not hashable: no key, the checks below say what is wrong)
        key = None if state is None or position_ids is not None else (
            type(q), q.dtype, q.device, q.shape, type(k), k.dtype, k.device, k.shape, type(cos), cos.dtype, cos.device,
            cos.shape, type(sin), sin.dtype, sin.device, sin.shape, type(unsqueeze_dim), unsqueeze_dim, state)
        hit = None if state is None else _CALLS.get(key)  # (a lookup under torch.compile: a guard on the size)
    except (AttributeError, TypeError):
        key = hit = None
    if hit is not None:  # a call like one validated before: its checks passed and it runs the kernels (_CALLS)
        USAGE[hit[1]] += 1
        if cos.dim() == 2:  # (T, R) tables, as _checked returns them
            cos, sin = cos.unsqueeze(0), sin.unsqueeze(0)
        # (hit[0]: cached_apply's C-level apply, its tensors through unwrap_dead)
        return hit[0](unwrap_dead(q), unwrap_dead(k), unwrap_dead(cos), unwrap_dead(sin), unsqueeze_dim)
    out = dtensor_call(rope, q, k, cos, sin, position_ids, unsqueeze_dim)
    if out is not None:  # DTensor arguments: run on the local shards (tigon.ops._dtensor)
        return out
    cos, sin = _checked(q, k, cos, sin, unsqueeze_dim, position_ids=position_ids)
    backend = select_backend("rope", q)
    if backend in TORCH_CODE:
        return ref.rope(q, k, cos, sin, None, unsqueeze_dim)
    from ..kernels import rope as kr
    from ..kernels._common import cached_apply, fast_apply

    run = kr.compiled_rope if torch.compiler.is_compiling() else fast_apply(kr.RoPEFunction)
    if key is not None:  # (not under torch.compile: cached_apply is not traced)
        remember_call(_CALLS, key, "rope", backend, cached_apply(kr.RoPEFunction))
    return run(q, k, cos, sin, unsqueeze_dim)


_CALLS: dict = {}
"""Validated calls of :func:`rope` without position_ids (:func:`tigon.support.remember_call`): everything
:func:`_checked` reads (the tensors' types, dtypes, devices and shapes; unsqueeze_dim and its type) and the backend's
switches -> the autograd.Function's apply."""


@accepts_dtensor(DTensorRule(rows=("q", "k"), outputs=("q", "k"), constants=("cos", "sin"),
                             mixed_dims=rope_mixed_dims))
def rope_interleaved(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, unsqueeze_dim: int = 1,
    deinterleave: bool = False, expanded_tables: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary position embedding on interleaved pairs ``(x[2i], x[2i + 1])``, one angle per pair (RoFormer, Su et al.
    2021, eq. 34): GLM / GLM-4's ``apply_rotary_pos_emb`` (``modeling_glm4.py``), DeepSeek-V3's
    ``apply_rotary_pos_emb_interleave`` (``deinterleave=True``, ``modeling_deepseek_v3.py``) and, with
    ``cos = cat(freqs_cis.real, freqs_cis.real)``, the complex form (Llama 4, DeepSeek-V2 ``apply_rotary_emb``).

    ``y[2i] = x[2i] c_i - x[2i+1] s_i``, ``y[2i+1] = x[2i+1] c_i + x[2i] s_i`` with c / s the first R/2 columns of
    cos / sin (HF's ``cat(freqs, freqs)`` tables); dims R..D of each head pass through (GLM's partial rotary).
    ``deinterleave=True`` writes the rotated pairs as halves, ``cat(y[0::2], y[1::2])``, as DeepSeek-V3 does. The
    same kernel as :func:`rope` (its pair-layout switches), math in fp32, one launch for q and k.

    Args:
        q: (B, Hq, T, D) for ``unsqueeze_dim=1`` or (B, T, Hq, D) for ``unsqueeze_dim=2``; float32 / bfloat16 /
            float16 (other float dtypes run the reference); any strides.
        k: the same layout and dtype as q with Hkv heads.
        cos, sin: (1 or B, T, R) or (T, R), R even and 0 < R <= D, any float dtype; only the first R/2 columns are
            read. Constants: no gradient.
        unsqueeze_dim: 1 or 2, where the head axis of q and k is.
        deinterleave: output the rotated dims as halves (evens, then odds) instead of pairs.
        expanded_tables: cos / sin hold one column per rotated dim, dims 2i and 2i+1 reading columns 2i and 2i+1
            (GLM-4V's repeat-interleaved tables in transformers 5.2x, its ``apply_rotary_pos_emb``); all R columns
            are read. Not with ``deinterleave``.

    Returns:
        (q_embed, k_embed): shapes and dtypes of q and k.

    Raises:
        TypeError: a non-floating tensor, q and k of different dtypes, or deinterleave / expanded_tables not a bool.
        ValueError: as :func:`rope` (ranks, mismatched sizes, cos / sin shapes, devices, unsqueeze_dim), or both
            deinterleave and expanded_tables.
    """
    cos, sin = _checked(q, k, cos, sin, unsqueeze_dim)
    _checks.flag("deinterleave", deinterleave), _checks.flag("expanded_tables", expanded_tables)
    if deinterleave and expanded_tables:
        raise ValueError("deinterleave and expanded_tables cannot both be set (no Hugging Face function does both)")
    if select_backend("rope_interleaved", q) in TORCH_CODE:
        return ref.rope_interleaved(q, k, cos, sin, unsqueeze_dim, deinterleave, expanded_tables)
    from ..kernels import rope as kr

    pairs = kr.PAIRS_DEINTERLEAVE if deinterleave else kr.PAIRS_EXPANDED if expanded_tables else kr.PAIRS_INTERLEAVED
    run = kr.compiled_rope if torch.compiler.is_compiling() else kr.RoPEFunction.apply
    return run(q, k, cos, sin, unsqueeze_dim, pairs)


def mrope(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mrope_section,
    unsqueeze_dim: int = 1, interleaved: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Multimodal rotary position embedding (mRoPE, Qwen2-VL: Wang et al. 2024, section 2.1; HF
    ``apply_multimodal_rotary_pos_emb`` of ``modeling_qwen2_vl.py`` / ``modeling_qwen2_5_vl.py`` in transformers
    before 5.2x): rotate-half rope where column i of each half of cos / sin comes from the table of its section
    (temporal, height, width: ``mrope_section``), gathered in the kernel instead of assembling the tables first.

    Args:
        q, k: as :func:`rope`.
        cos, sin: (3, 1 or B, T, R), one HF table per position axis, R = 2 * sum(mrope_section) <= D (R < D: the
            rest of each head passes through). Constants: no gradient.
        mrope_section: three non-negative ints (t, h, w) summing to R / 2 (a list or tuple, as the config holds it).
        unsqueeze_dim: 1 or 2, where the head axis of q and k is.
        interleaved: rotate interleaved pairs (:func:`rope_interleaved`'s layout) with the assembled tables, as
            GLM-4V's ``apply_multimodal_rotary_pos_emb`` before transformers 5.2x does.

    Returns:
        (q_embed, k_embed): shapes and dtypes of q and k.

    Raises:
        TypeError: a non-floating tensor, q and k of different dtypes, interleaved not a bool.
        ValueError: as :func:`rope`, cos / sin not (3, 1 or B, T, R), or mrope_section not three non-negative ints
            summing to R / 2.
    """
    cos, sin = _checked(q, k, cos, sin, unsqueeze_dim, tables=3)
    section = tuple(mrope_section) if isinstance(mrope_section, (list, tuple)) else None
    if section is None or len(section) != 3 or not all(isinstance(v, int) and v >= 0 for v in section) \
            or 2 * sum(section) != cos.shape[-1]:
        raise ValueError(f"mrope_section must be three non-negative ints summing to cos.shape[-1] / 2 = "
                         f"{cos.shape[-1] // 2}, got {mrope_section!r}")
    _checks.flag("interleaved", interleaved)
    if select_backend("mrope", q) in TORCH_CODE:
        return ref.mrope(q, k, cos, sin, section, unsqueeze_dim, interleaved)
    from ..kernels import rope as kr

    run = kr.compiled_rope if torch.compiler.is_compiling() else kr.RoPEFunction.apply
    return run(q, k, cos, sin, unsqueeze_dim, kr.PAIRS_INTERLEAVED if interleaved else kr.PAIRS_HALVES, section)


# ---- the record ----------------------------------------------------------------------------------------------------
def _shape(m) -> dict:
    return {"tokens": m.batch * m.seq, "batch": m.batch, "seq": m.seq, "heads": m.heads, "kv_heads": m.kv_heads,
            "head_dim": m.head_dim, "rotary_dim": m.rotary_dim or m.head_dim, "theta": m.rope_theta}


def rotary_tables(positions: int, dim: int, theta: float, dtype, device) -> tuple[torch.Tensor, torch.Tensor]:
    """HF's rotary tables of positions 0 .. ``positions`` - 1: cos / sin (positions, dim) of ``cat(freqs, freqs)``
    with ``freqs = t / theta ** (2i / dim)``, in ``dtype`` on ``device``."""
    inv_freq = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    emb = torch.cat((torch.arange(positions, dtype=torch.float32)[:, None] * inv_freq,) * 2, dim=-1)
    return emb.cos().to(device, dtype), emb.sin().to(device, dtype)


def _inputs(s: dict, dtype, device, gen, position_table: bool = False) -> dict:
    """q (B, heads, T, head_dim) and k (B, kv_heads, T, head_dim) as HF attention makes them (transposed views of
    the (B, T, H * D) projections), cos / sin (1, T, rotary_dim) HF tables for the model's theta (rotary_dim: the
    head dim, or fewer for partial rotary), in the input dtype. ``position_table``: instead cos / sin (T + 5,
    rotary_dim) of every position and position_ids (B, T), each batch row's positions restarting once (packed
    sequences)."""
    b, t, d = s["batch"], s["seq"], s["head_dim"]
    q = randn(gen, (b, t, s["heads"] * d), dtype, device).view(b, t, s["heads"], d).transpose(1, 2)
    k = randn(gen, (b, t, s["kv_heads"] * d), dtype, device).view(b, t, s["kv_heads"], d).transpose(1, 2)
    cos, sin = rotary_tables(t + 5 if position_table else t, s.get("rotary_dim", d), s.get("theta", 10000.0), dtype,
                             device)
    out = dict(q=q, k=k, cos=cos, sin=sin)
    if not position_table:
        return {**out, "cos": out["cos"][None], "sin": out["sin"][None]}
    pos = torch.arange(t)[None, :].repeat(b, 1)
    pos[:, t // 2:] -= t // 2 - torch.arange(b)[:, None] % 3  # a second sequence from position 0, 1 or 2
    return {**out, "position_ids": pos.to(device)}


def _mrope_inputs(s: dict, dtype, device, gen) -> dict:
    """:func:`_inputs`' q and k, cos / sin (3, 1, T, rotary_dim): the three position axes of an image patch grid
    (t constant, h and w over a square grid, as Qwen2-VL's ``get_rope_index``), and mrope_section splitting the
    rotary_dim / 2 columns about 1/4, 3/8, 3/8 (Qwen2-VL's [16, 24, 24] of 64)."""
    out = _inputs(s, dtype, device, gen)
    t, d = s["seq"], s.get("rotary_dim", s["head_dim"])
    side = max(1, round(t ** 0.5))
    pos = torch.stack((torch.zeros(t), torch.arange(t) // side, torch.arange(t) % side)).float()  # (3, T)
    inv_freq = 1.0 / s.get("theta", 10000.0) ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
    emb = torch.cat((pos[..., None] * inv_freq,) * 2, dim=-1)[:, None]  # (3, 1, T, d)
    h = d // 2
    t_sec = h // 4
    section = [t_sec, (h - t_sec) // 2, h - t_sec - (h - t_sec) // 2]
    return dict(out, cos=emb.cos().to(device, dtype), sin=emb.sin().to(device, dtype), mrope_section=section)


_COMMON = dict(
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
)

RECORDS = (
    OpSpec(
        name="rope",
        summary="rotary position embedding of q and k (HF rotate-half layout)",
        fn=rope,
        reference=ref.rope,
        original=ref.rope,
        original_name="HF apply_rotary_pos_emb (tigon.reference.rope)",
        peers={"liger": liger("liger_rope", "q", "k", "cos", "sin")},
        bench_notes={"liger": "rotates q and k in place when their layout allows"},
        # Liger's position_ids (accepted there, never read) over HF's old table of every position: rows gathered
        cases=(Case(), Case("position_ids, (P, R) table", inputs={"position_table": True})),
        **_COMMON,
    ),
    OpSpec(
        name="rope_interleaved",
        summary="rotary position embedding on interleaved pairs (GLM; DeepSeek-V3 with deinterleave=True)",
        fn=rope_interleaved,
        reference=ref.rope_interleaved,
        original=ref.rope_interleaved,
        original_name="HF GLM apply_rotary_pos_emb / DeepSeek-V3 apply_rotary_pos_emb_interleave "
                      "(tigon.reference.rope.rope_interleaved)",
        cases=(Case(), Case("deinterleave=True", options={"deinterleave": True}),
               Case("expanded_tables=True", options={"expanded_tables": True})),
        **_COMMON,
    ),
    OpSpec(
        name="mrope",
        summary="multimodal rotary position embedding (Qwen2-VL mRoPE sections, rotate-half)",
        fn=mrope,
        reference=ref.mrope,
        original=ref.mrope,
        original_name="HF Qwen2-VL / GLM-4V apply_multimodal_rotary_pos_emb (tigon.reference.rope.mrope)",
        cases=(Case(), Case("interleaved=True", options={"interleaved": True})),
        **{**_COMMON, "make_inputs": _mrope_inputs},
    ),
)
