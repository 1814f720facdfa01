"""The LM-head losses' chunk matmuls and gradient accumulators, shared by the fused linear cross-entropy
(:mod:`tigon.kernels.fused_linear_cross_entropy`), log-probs, JSD and the vocabulary-parallel loss.

Matmul precision: chunks run in the compute dtype (the inputs' dtype, or the autocast dtype). Products that are
accumulated or scaled later (grad_weight, grad_bias, and grad_hidden on the scalar path) go to fp32 buffers: on CUDA
through ``torch.mm/addmm(..., out_dtype=torch.float32)`` when this torch supports it, on CPU through fp32 copies of
the operands (one small allocation per chunk), otherwise through a low-precision temporary added into the fp32
buffer (one extra rounding per chunk). An fp32 grad_weight for a 2-byte weight in eager calls is a
:class:`RowHalves`, cast in its own memory at the end (one launch), unless the loss's chunk buffer already held more
memory than a plain cast adds (:func:`cast_in_place_pays`: small heads, where the plain accumulator costs fewer host
ops).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..support import interpreter_enabled
from ._common import compiled_cuda, launcher

_FP32_OUT: dict[tuple, bool] = {}


def _fp32_out_supported(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether ``torch.mm/addmm(..., out_dtype=torch.float32, out=...)`` works for ``dtype`` inputs here.

    Probed once per (device, dtype) on a 16x16 product (one host sync), since the dtype overloads of mm/addmm
    exist on CUDA only and only in recent torch releases.
    """
    key = (device, dtype)  # (not a formatted string: this runs at every call of the losses)
    if key not in _FP32_OUT:
        ok = False
        if compiled_cuda(device):
            try:
                a = torch.ones(16, 16, device=device, dtype=dtype)
                acc = torch.ones(16, 16, device=device, dtype=torch.float32)
                torch.addmm(acc, a, a, out_dtype=torch.float32, out=acc)
                res = torch.empty(16, 16, device=device, dtype=torch.float32)
                torch.mm(a, a, out_dtype=torch.float32, out=res)
                ok = bool((acc == 17).all()) and bool((res == 16).all())
            except (RuntimeError, TypeError, NotImplementedError):
                ok = False
        _FP32_OUT[key] = ok
    return _FP32_OUT[key]


def no_autocast(device: torch.device):
    """``torch.autocast(device.type, enabled=False)`` while autocast is on for ``device``, else a context that does
    nothing (torch.autocast's Python ``__init__`` / ``__enter__`` / ``__exit__`` cost host time at every call): the
    chunk loops' matmuls run in the compute dtype they were given either way."""
    if torch.is_autocast_enabled(device.type):
        return torch.autocast(device.type, enabled=False)
    return _NOTHING


class _Nothing:
    __slots__ = ()

    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


_NOTHING = _Nothing()


class _Matmuls:
    """The chunk matmuls, writing into preallocated buffers (see the module docstring for the precision)."""

    def __init__(self, device: torch.device, cd: torch.dtype):
        self.low = cd != torch.float32
        self.out_dtype = self.low and _fp32_out_supported(device, cd)
        self.upcast = self.low and not self.out_dtype and device.type != "cuda"
        self.tmp: dict[tuple, torch.Tensor] = {}

    def _scratch(self, shape, like):
        key = (tuple(shape), like.dtype)
        t = self.tmp.get(key)
        if t is None:
            t = self.tmp[key] = torch.empty(shape, dtype=like.dtype, device=like.device)
        return t

    def logits(self, out, h, w, b):
        if b is None:
            torch.mm(h, w.t(), out=out)
        else:
            torch.addmm(b, h, w.t(), out=out)

    def mm(self, out, a, b):
        """out = a @ b, where out may be fp32 while a, b are in the compute dtype."""
        if out.dtype == a.dtype:
            torch.mm(a, b, out=out)
        elif self.out_dtype:
            torch.mm(a, b, out_dtype=torch.float32, out=out)
        elif self.upcast:
            torch.mm(a.float(), b.float(), out=out)
        else:
            out.copy_(torch.mm(a, b, out=self._scratch(out.shape, a)))

    def addmm_(self, acc, a, b):
        """acc += a @ b, acc fp32 or (lean accumulation) in a's dtype."""
        if not self.low or acc.dtype == a.dtype:
            acc.addmm_(a, b)
        elif self.out_dtype:
            torch.addmm(acc, a, b, out_dtype=torch.float32, out=acc)
        elif self.upcast:
            acc.addmm_(a.float(), b.float())
        else:
            acc.add_(torch.mm(a, b, out=self._scratch(acc.shape, a)))

    def colsum_(self, acc, g):
        """acc (fp32, (V,)) += g.sum(0) in fp32."""
        acc.add_(torch.sum(g, dim=0, dtype=torch.float32, out=self._scratch(acc.shape, acc)))

    def chunk_grads(self, g, hs, w, gh_rows, gw, gb, first: bool):
        """One chunk's share of the gradients from its logits gradient ``g`` (rows, V) and hidden rows ``hs``:
        ``gh_rows = g @ w``, ``gw += g.T @ hs``, ``gb += g.sum(0)`` (each skipped when its buffer is None).
        ``first``: the first chunk, which writes gw instead of adding to it (gw starts uninitialised: no zero fill
        and no read of zeros, 2 x 4VH bytes; about 1 ms at Llama-3's head by bytes over copy bandwidth, not timed on
        its own)."""
        if gh_rows is not None:
            self.mm(gh_rows, g, w)
        if isinstance(gw, RowHalves):
            gw.addmm_(self, g, hs, first)
        elif gw is not None:
            (self.mm if first else self.addmm_)(gw, g.t(), hs)
        if gb is not None:
            self.colsum_(gb, g)


class RowHalves:
    """The fp32 (V, H) grad_weight accumulator held as two row blocks (rows [0, Va) and [Va, V), Va = ceil(V/2)
    rounded up to a multiple of 8), so that :meth:`finish` can write the 2-byte result into the first block's own
    memory (Va >= V/2 rows of fp32 hold V rows of bf16): the result then costs no allocation, where a plain cast
    holds the fp32 buffer and the new (V, H) tensor at once (4VH + 2VH bytes; 2VH saved, 1.7 GiB for Gemma-2's
    256k x 3584 head). Eager path only (the compiled graph plans its own buffers)."""

    FIRST = 1 << 20  # elements cast through a copy (the in-place kernel's base; tests lower it)

    def __init__(self, vocab: int, hidden: int, device: torch.device, zero: bool = True):
        """``zero=False``: uninitialised blocks (the first chunk writes them, see :meth:`_Matmuls.chunk_grads`)."""
        # ceil(V/2) rounded up to 8 rows: the second block's columns of a bf16 logits chunk start 16-byte aligned
        self.split = min(vocab, ((vocab + 1) // 2 + 7) // 8 * 8)
        self.shape = (vocab, hidden)
        new = torch.zeros if zero else torch.empty
        self.a = new((self.split, hidden), dtype=torch.float32, device=device)
        self.b = new((vocab - self.split, hidden), dtype=torch.float32, device=device)

    def addmm_(self, mm: "_Matmuls", g: torch.Tensor, hs: torch.Tensor, first: bool) -> None:
        """``+= g.T @ hs`` (``first``: ``=``) for a logits-gradient chunk ``g`` (rows, V) and its hidden rows ``hs``
        (rows, H)."""
        op = mm.mm if first else mm.addmm_
        op(self.a, g[:, : self.split].t(), hs)
        op(self.b, g[:, self.split:].t(), hs)

    def finish(self, scale: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
        """``(accumulator * scale).to(dtype)`` as a contiguous (V, H) tensor in block a's memory (2-byte ``dtype``);
        the accumulator is consumed. fp32 ``dtype``: a new tensor (the two blocks concatenated).

        Element i of the result occupies bytes [2i, 2i + 2) of a, whose fp32 element i sits at [4i, 4i + 4). On
        compiled CUDA and under the interpreter: a copy of the first ``FIRST`` elements and one launch whose programs
        each write only over elements they read themselves (:func:`_halves_cast_kernel`). Elsewhere, torch by
        ranges: [lo, 2 lo) written after every element below lo was read, reading bytes [4 lo, 8 lo) that the write
        [2 lo, 4 lo) does not touch; block b then to bytes [4 Va H / 2, ...) of a, all read already.
        """
        a, b = self.a.view(-1), self.b.view(-1)
        self.a = self.b = None
        if dtype.itemsize != 2:
            out = torch.cat((a, b)).view(self.shape)
            return (out.mul_(scale) if scale is not None else out).to(dtype)
        out = a.view(dtype)
        n = a.numel()
        if compiled_cuda(a.device) or interpreter_enabled():
            _halves_cast(a, b, out, scale, self.FIRST)
            del b
            return out[: self.shape[0] * self.shape[1]].view(self.shape)

        def put(dst, src):  # elsewhere torch, one range after the other
            scaled_cast_(dst, src, scale)

        lo = min(n, self.FIRST)
        put(out[:lo], a[:lo].clone())  # the first range overlaps itself: through a small copy
        while lo < n:
            hi = min(2 * lo, n)
            put(out[lo:hi], a[lo:hi])
            lo = hi
        put(out[n: n + b.numel()], b)
        del b
        return out[: self.shape[0] * self.shape[1]].view(self.shape)


@triton.jit
def _cast_part(SRC, DST, SCALE, n, blk, HAS_SCALE: tl.constexpr, BLOCK: tl.constexpr):
    offs = blk.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(SRC + offs, mask=mask, other=0.0)
    if HAS_SCALE:
        x = x * tl.load(SCALE).to(tl.float32)
    tl.store(DST + offs, x.to(DST.dtype.element_ty), mask=mask)


@triton.jit
def _scaled_casts_kernel(S0, D0, n0, S1, D1, n1, S2, D2, n2, SCALE, start1, start2, HAS_SCALE: tl.constexpr,
                         BLOCK: tl.constexpr):
    # up to three (source, destination) pairs in one grid: programs [0, start1) the first, [start1, start2) the
    # second, the rest the third
    pid = tl.program_id(0)
    if pid < start1:
        _cast_part(S0, D0, SCALE, n0, pid, HAS_SCALE, BLOCK)
    elif pid < start2:
        _cast_part(S1, D1, SCALE, n1, pid - start1, HAS_SCALE, BLOCK)
    else:
        _cast_part(S2, D2, SCALE, n2, pid - start2, HAS_SCALE, BLOCK)


CAST_BLOCK = 2048
"""Elements per program of :func:`scaled_casts_` on CUDA (16 per thread at 4 warps: 16-byte vector accesses)."""
CAST_BLOCK_INTERPRETED = 1 << 16
"""The same under Triton's interpreter, where each program costs Python time."""


def _triton_casts(device: torch.device) -> bool:
    """Whether :func:`scaled_casts_` launches its kernel for tensors on ``device``: compiled CUDA, or Triton's
    interpreter (the tests' CPU backend, so that they run the launch the GPU runs)."""
    return compiled_cuda(device) or interpreter_enabled()


def scaled_casts_(pairs, scale: torch.Tensor | None) -> None:
    """``dst[:] = src * scale`` rounded to ``dst``'s dtype (to nearest, ties to even: torch's cast; the product in
    fp32, as torch's ``mul`` computes a 2-byte one) for each ``(dst, src)`` of ``pairs``: contiguous tensors of one
    number of elements each, not overlapping one another unless ``dst`` is ``src`` (in place) or ``dst`` lies below
    ``src`` in one storage (:meth:`RowHalves.finish`: element i written after it was read). ``scale``: a
    one-element float tensor read on the device (no host sync; e.g. the upstream gradient of a scalar loss), or None
    for 1.

    On compiled CUDA and under Triton's interpreter: up to three pairs in ONE Triton launch with vector loads and
    stores (torch's mul into an output of another dtype takes its dynamic-casting loop, one launch a tensor: the
    formed losses' whole backward, mostly these casts, about 3.7 GB at Llama-3-8B's head, measured 2.2-2.6 ms on an
    H200, about 40% of copy bandwidth; this kernel not yet measured alone); more pairs, or other devices: torch, one
    op a pair."""
    if not pairs:
        return
    dev = pairs[0][0].device
    cuda = compiled_cuda(dev)
    if len(pairs) > 3 or not (cuda or interpreter_enabled()):
        for dst, src in pairs:
            if scale is None:
                dst.copy_(src)
            else:
                torch.mul(src, scale.to(torch.float32).reshape(()), out=dst)
        return
    block = CAST_BLOCK if cuda else CAST_BLOCK_INTERPRETED
    (d0, s0), n1, n2 = pairs[0], 0, 0
    d1, s1 = d2, s2 = d0, s0  # (unused pairs: no programs)
    if len(pairs) > 1:
        d1, s1 = pairs[1]
        n1 = d1.numel()
        if len(pairs) > 2:
            d2, s2 = pairs[2]
            n2 = d2.numel()
    n0 = d0.numel()
    start1 = -(-n0 // block)
    start2 = start1 - (-n1 // block)
    programs = start2 - (-n2 // block)
    if programs:
        launcher(_scaled_casts_kernel)[(programs,)](
            s0, d0, n0, s1, d1, n1, s2, d2, n2, scale if scale is not None else s0, start1, start2,
            HAS_SCALE=scale is not None, BLOCK=block, num_warps=4)


@triton.jit
def _scaled(x, SCALE, HAS_SCALE: tl.constexpr):
    if HAS_SCALE:
        x = x * tl.load(SCALE).to(tl.float32)
    return x


@triton.jit
def _halves_b_part(B, OUT, SCALE, a0, size, n_a, n_b, HAS_SCALE: tl.constexpr, BLOCK: tl.constexpr):
    # block b's elements m whose result lands on fp32 elements [a0, a0 + size) of block a: (n_a + m) // 2 in there
    r = tl.arange(0, BLOCK)
    lo = tl.maximum(2 * a0 - n_a, 0)
    hi = tl.minimum(2 * (a0 + size) - n_a, n_b)
    for off in range(0, hi - lo, BLOCK):
        m = lo + off + r
        mask = m < hi
        x = tl.load(B + m, mask=mask, other=0.0)
        tl.store(OUT + n_a + m, _scaled(x, SCALE, HAS_SCALE).to(OUT.dtype.element_ty), mask=mask)


@triton.jit
def _halves_cast_kernel(A, B, C, OUT, SCALE, n_a, n_b, n_c, levels, HAS_SCALE: tl.constexpr, BLOCK: tl.constexpr):
    # RowHalves.finish in one launch: OUT (2-byte) over A's own bytes. P programs, L0 = P * BLOCK. Program p owns the
    # fp32 elements [p BLOCK, (p + 1) BLOCK) of the base [0, L0) (read from their copy C, so any program may write
    # over them) and, at level k, [L0 2^k + p BLOCK 2^k, + BLOCK 2^k): result element i covers fp32 element i // 2,
    # so level k's results cover exactly this program's level k - 1 elements (level 0's: the base), read before the
    # barrier. Block b's results cover A's upper half: each written by the program that read the elements under it,
    # after all its levels. No program writes over an element another program has still to read.
    p = tl.program_id(0).to(tl.int64)
    l0 = tl.num_programs(0).to(tl.int64) * BLOCK
    r = tl.arange(0, BLOCK)
    idx = p * BLOCK + r
    mask = idx < n_c
    x = tl.load(C + idx, mask=mask, other=0.0)
    tl.store(OUT + idx, _scaled(x, SCALE, HAS_SCALE).to(OUT.dtype.element_ty), mask=mask)
    size = p * 0 + BLOCK
    start = l0
    for _k in range(0, levels):
        tl.debug_barrier()  # this program's earlier elements are read before their bytes are written
        lo = start + p * size
        hi = tl.minimum(lo + size, n_a)
        for off in range(0, hi - lo, BLOCK):
            idx = lo + off + r
            mask = idx < hi
            x = tl.load(A + idx, mask=mask, other=0.0)
            tl.store(OUT + idx, _scaled(x, SCALE, HAS_SCALE).to(OUT.dtype.element_ty), mask=mask)
        size = size * 2
        start = start * 2
    tl.debug_barrier()
    _halves_b_part(B, OUT, SCALE, p * BLOCK, p * 0 + BLOCK, n_a, n_b, HAS_SCALE, BLOCK)
    size = p * 0 + BLOCK
    start = l0
    for _k in range(0, levels):
        _halves_b_part(B, OUT, SCALE, start + p * size, size, n_a, n_b, HAS_SCALE, BLOCK)
        size = size * 2
        start = start * 2


def _halves_cast(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, scale: torch.Tensor | None,
                 first: int) -> None:
    """:meth:`RowHalves.finish`'s cast on compiled CUDA / under the interpreter: ``out`` (a 2-byte view of ``a``'s
    storage, len(a) + len(b) elements) = ``cat(a, b) * scale`` by a copy of ``a``'s first ``first`` elements and ONE
    launch (:func:`_halves_cast_kernel`; ``first`` // block programs), where the ranges of the torch path take one
    launch each (about log2(len(a) / first) + 2)."""
    n_a = a.numel()
    if compiled_cuda(a.device):
        block = CAST_BLOCK
    else:  # the interpreter (programs run one after another in Python): about 4 programs, blocks of >= 256
        block = 1 << max(8, (max(first, 4) // 4).bit_length() - 1)
    programs = max(1, first // block)
    l0 = programs * block
    n_c = min(l0, n_a)
    levels = 0
    while l0 << levels < n_a:
        levels += 1
    c = a[:n_c].clone()
    launcher(_halves_cast_kernel)[(programs,)](a, b, c, out, scale if scale is not None else a, n_a, b.numel(),
                                                n_c, levels, HAS_SCALE=scale is not None, BLOCK=block, num_warps=4)


def scaled_cast_(dst: torch.Tensor, src: torch.Tensor, scale: torch.Tensor | None) -> None:
    """``dst[:] = src * scale`` rounded to ``dst``'s dtype: :func:`scaled_casts_` for one pair (1-D contiguous
    ``dst``, ``src`` of one length that do not overlap; they may share a storage: :meth:`RowHalves.finish`)."""
    scaled_casts_(((dst, src),), scale)


def _operands(hidden, weight, bias, cd: torch.dtype, contiguous: bool = True):
    """hidden (contiguous unless ``contiguous`` is off: a caller that gathers its rows takes any strides), weight and
    bias in the matmul dtype ``cd`` (no copy when already so)."""
    h = hidden.to(cd)
    return (h if h.is_contiguous() or not contiguous else h.contiguous(), weight.to(cd),
            bias.to(cd) if bias is not None else None)


def scale_grads(grads, grad_loss: torch.Tensor, dtypes, inplace: bool):
    """The forward-formed gradients ``grads`` (gh, gw, gb; None where absent) times the upstream scalar
    ``grad_loss``, cast to ``dtypes`` (hidden's, weight's, bias's; a no-op cast where already so). ``inplace``
    (eager: the buffers are not needed afterwards): :func:`finish_grads`, one launch for all of them, the scalar read
    on the device; the compiled path may not mutate saved tensors and passes False (torch ops, one a gradient)."""
    if inplace:
        return finish_grads(grads, grad_loss, dtypes)
    g = grad_loss.to(torch.float32)
    g = g if g.dim() == 0 else g.reshape(())
    return tuple(finish_grad(t, g, dt, inplace) for t, dt in zip(grads, dtypes))


def finish_grads(grads, scale: torch.Tensor | None, dtypes) -> tuple:
    """Eager calls: accumulated gradients ``grads`` (each a tensor, a :class:`RowHalves` or None) times ``scale`` (a
    one-element float tensor read on the device, or None for no scaling), in ``dtypes`` (one per gradient). The
    tensors by ONE :func:`scaled_casts_` launch, each into a new tensor of its dtype, or in place where its dtype is
    already that (nothing at all then without a scale); a RowHalves by :meth:`RowHalves.finish`. The accumulators
    are consumed. Same values as :func:`finish_grad` (the product in fp32, rounded once)."""
    pairs, out = [], []
    for t, dt in zip(grads, dtypes):
        if t is None:
            out.append(None)
        elif isinstance(t, RowHalves):
            out.append(t.finish(scale, dt))
        elif t.dtype == dt and scale is None:
            out.append(t)
        else:
            dst = t if t.dtype == dt else torch.empty(t.shape, dtype=dt, device=t.device)
            if t.is_contiguous():
                pairs.append((dst, t))
            else:  # (not one of the accumulators: they are allocated contiguous)
                scaled_casts_(((dst, t.contiguous()),), scale)
            out.append(dst)
    scaled_casts_(pairs, scale)
    return tuple(out)


def finish_grad(t, scale: torch.Tensor | None, dtype: torch.dtype, inplace: bool = True):
    """An accumulated gradient (a tensor, a :class:`RowHalves` or None) times ``scale`` (0-d fp32, or None for no
    scaling), cast to ``dtype``; ``inplace`` (eager calls) scales the tensor itself, or, with a cast, writes the
    scaled product straight into the new tensor: one ``torch.mul(..., out=)``, rounded once to ``dtype`` as
    ``t.mul(scale).to(dtype)`` is (one kernel and one op instead of two). A RowHalves is always consumed."""
    if t is None or isinstance(t, RowHalves):
        return t if t is None else t.finish(scale, dtype)
    if scale is None:
        return t.to(dtype)
    if inplace and t.dtype != dtype:
        return torch.mul(t, scale, out=torch.empty(t.shape, dtype=dtype, device=t.device))
    t = t.mul_(scale) if inplace else t.mul(scale)
    return t.to(dtype)


def cast_in_place_pays(weight: torch.Tensor, chunk_bytes: int | None, grad_hidden_bytes: int = 0) -> bool:
    """Whether grad_weight's fp32 accumulator is worth holding as a :class:`RowHalves` (cast in its own memory at the
    end) for a 2-byte ``weight``. A plain cast adds a new (V, H) tensor (2VH bytes) at the end, when the (rows, V)
    chunk buffer of ``chunk_bytes`` that the loss held beside the same accumulator is free again; the end may also
    hold grad_hidden in its own dtype beside its fp32 accumulator (``grad_hidden_bytes``). When both fit in the
    chunk buffer's bytes, the plain cast cannot raise the op's peak, and the plain fp32 accumulator costs fewer ops
    per call (one matmul per chunk instead of two, and no copy of the first elements before the in-place cast;
    Qwen2.5-0.5B's head at 4096 tokens, a 1.2 GB chunk, takes the plain one; Llama-3-8B's and Gemma-2's heads keep
    the halves). ``chunk_bytes`` None: unknown, cast in place."""
    new_bytes = weight.numel() * weight.element_size() + grad_hidden_bytes
    return chunk_bytes is None or new_bytes > chunk_bytes


def grad_buffers(n, hidden, weight, cd, need, lean: bool, scalar: bool, halves: bool = False,
                 chunk_bytes: int | None = None, *, formed: bool = False, gh_rows: int | None = None):
    """(gh, gw, gb) accumulators (None where not needed).

    Default: fp32 (one rounding to the parameters' dtypes at the end; grad_hidden stays fp32 only on the scalar
    path, where it is scaled later). ``lean``: grad_hidden and grad_weight directly in the parameters' dtypes
    when those equal the compute dtype ``cd`` (no (V, H) fp32 buffer; one rounding per chunk for grad_weight);
    grad_bias, (V,), always fp32. ``halves`` (eager calls): an fp32 grad_weight for a 2-byte weight is a
    :class:`RowHalves`, cast in place at the end, unless :func:`cast_in_place_pays` says the chunk buffer of
    ``chunk_bytes`` already held as much memory. ``gh_rows``: grad_hidden's rows where not ``n`` (the rows a chunk
    loop runs, :func:`tigon.kernels.fused_linear_cross_entropy.backward_over_chunks`' ``formed``).

    ``formed`` (the scalar path of the gradients formed in a forward,
    :func:`tigon.kernels.fused_linear_logprobs.logprobs_grads_in_forward`): grad_hidden in bfloat16 where the hidden
    states and ``cd`` are, though it is scaled later. Each of its rows is written once (one chunk matmul a row,
    accumulated in fp32 inside the matmul and rounded once; the deferred sub-chunks of split units too; on CUDA,
    torch's default ``allow_bf16_reduced_precision_reduction`` lets cuBLAS reduce a split K in bf16, as it may in the
    plain PyTorch computation's own bf16 grad_hidden matmul and in the lean plan's), so the only extra rounding is the
    backward's scale by the upstream gradient: none for a power of two (1, ``loss.backward()``), half an ulp at most
    otherwise, small beside the error of the bfloat16 logits that both Tigon and the plain PyTorch computation hold
    (DPO at 64 x 1000 and 128 x 2000 heads, upstream gradients 0.3, 1/3, 0.7: grad_hidden's error against float64 8%
    more on average, 13% at most, and at most 1.63x the plain computation's (1.46x with the fp32 buffer), the policy's
    bound 2x; tests/test_preference.py's half-precision test runs a random upstream gradient too). bfloat16 has fp32's
    exponent range; float16 does not: unscaled, its small rows would underflow where PyTorch's float16 backward
    carries the GradScaler's scale, so float16 keeps the fp32 buffer. Half grad_hidden's bytes: 64 MiB at Llama-3-8B's
    8192 x 4096 hidden states.
    """
    need_h, need_w, need_b = need
    dev = hidden.device
    f32 = dict(dtype=torch.float32, device=dev)
    low_h = hidden.dtype == cd and (lean or not scalar or (formed and cd == torch.bfloat16))
    gh = torch.empty((n if gh_rows is None else gh_rows, hidden.shape[1]),
                     dtype=hidden.dtype if low_h else torch.float32, device=dev) if need_h else None
    gw = None
    if (need_w and halves and not (lean and weight.dtype == cd) and weight.element_size() == 2
            and cast_in_place_pays(weight, chunk_bytes, n * hidden.shape[1] * hidden.element_size())):
        gw = RowHalves(weight.shape[0], weight.shape[1], dev, zero=n == 0)
    elif need_w:
        # Uninitialised when a chunk will write it (see _Matmuls.chunk_grads); zeros for an empty batch.
        gw = (torch.zeros if n == 0 else torch.empty)(
            weight.shape, dtype=weight.dtype if lean and weight.dtype == cd else torch.float32, device=dev)
    gb = torch.zeros((weight.shape[0],), **f32) if need_b else None
    return gh, gw, gb
