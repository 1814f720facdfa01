"""Helpers of the elementwise kernels (the GLU products; any op that maps rows of one shape to rows of that shape):
a program's [BLOCK_M, BLOCK_N] tile with int64 offsets, the (M, N) row views, and the tile size and grid.

Inputs are viewed as rows (M, N) with unit column stride and any row stride, so a slice of a fused projection
(``gate_up[..., :I]``) is read in place; when every operand is contiguous the whole tensor is one long row, which
avoids padding waste for odd N.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from ._common import as_rows, cdiv, compiled_cuda, next_pow2, warps_for


@triton.jit
def tile(M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Row and column offsets (int64) and the mask of this program's [BLOCK_M, BLOCK_N] tile."""
    pid = tl.program_id(0)
    n_col_blocks = tl.cdiv(N, BLOCK_N)
    rows = (pid // n_col_blocks).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = (pid % n_col_blocks).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows < M)[:, None] & (cols < N)[None, :]
    return rows, cols, mask


def as_2d(**tensors: torch.Tensor) -> tuple[int, int, list[torch.Tensor], list[int]]:
    """(M, N, operands, row strides) of same-shape tensors read as (M, N) rows with unit column stride.

    All contiguous: one long row (M = 1, N = numel) and the tensors themselves (a kernel reads a pointer and a row
    stride: no (1, numel) view is made, ~1.5 us of host time each). Otherwise their row views (:func:`as_rows`,
    copying only a tensor whose last dimension is strided).
    """
    ts = list(tensors.values())
    for t in ts:  # (a loop, not all() of a generator: one Python frame less per tensor)
        if not t.is_contiguous():
            break
    else:
        n = ts[0].numel()
        return 1, n, ts, [n] * len(ts)
    views = [as_rows(t, name) for name, t in tensors.items()]
    M, N = views[0].shape
    return M, N, views, [v.stride(0) for v in views]


def tile_elems(device: torch.device) -> int:
    """Elements of a tile: 4096 on CUDA, 16x that under the interpreter (each program costs Python time there)."""
    return TILE_ELEMS[compiled_cuda(device)]


TILE_ELEMS = {True: 4096, False: 1 << 16}
""":func:`tile_elems` by ``compiled_cuda(device)`` (a launch site that has :func:`~tigon.kernels._common.launch_mode`'s
answer reads it here)."""


def launch_shape(M: int, N: int, device: torch.device) -> tuple[int, int, int, tuple[int]]:
    """(BLOCK_M, BLOCK_N, num_warps, grid) for an elementwise pass over (M, N).

    A memory-bound elementwise kernel wants enough bytes in flight per program and enough programs to fill
    the GPU: a 4096-element tile (8 warps, 16 elements per thread, 128-bit accesses) does both for every
    realistic size. Rows shorter than the tile are stacked (BLOCK_M > 1). Under the interpreter each program
    costs Python overhead, so tiles are 16x larger there.
    """
    return _launch_shape(M, N, tile_elems(device))


@functools.lru_cache(maxsize=1024)
def _launch_shape(M: int, N: int, target: int) -> tuple[int, int, int, tuple[int]]:
    """:func:`launch_shape` for tiles of ``target`` elements, cached per (M, N, target)."""
    block_n = min(next_pow2(N), target)
    block_m = min(next_pow2(M), max(1, target // block_n))
    grid = (cdiv(M, block_m) * cdiv(N, block_n),)
    return block_m, block_n, warps_for(block_m * block_n), grid
