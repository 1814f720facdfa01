"""The launch shapes of the norm kernels (:mod:`tigon.kernels.norm`), cached per size and device: what
:func:`~tigon.kernels.norm.fwd_config` / :func:`~tigon.kernels.norm.bwd_config` and the grid arithmetic around them
give, computed once per (rows, width, device) instead of on every call (a few Python calls each: ~1 us of host
time per launch). The heuristics are passed in by the caller, so that replacing one of them (a test's monkeypatch of
``norm.bwd_config``, ``norm.rows_per_program``, ``norm.WIDE_ROW``...) is a new key, never a stale answer.
"""

from __future__ import annotations

import functools

import torch

from ._common import cdiv, next_pow2, warps_for


@functools.lru_cache(maxsize=1024)
def fwd_launch(M: int, N: int, device: torch.device, compiled: bool, fwd_config, *key) -> tuple[int, int, int, tuple]:
    """(BLOCK_N, rows per program, num_warps, grid) of the forward over M rows of N elements: ``fwd_config(block_n,
    device)``'s answer and its grid. ``compiled`` (``compiled_cuda(device)``) and ``key`` (the functions
    ``fwd_config`` calls) are part of the cache key only."""
    block_n = next_pow2(N)
    block_m, warps = fwd_config(block_n, device)
    return block_n, block_m, warps, (cdiv(M, block_m),)


@functools.lru_cache(maxsize=1024)
def bwd_launch(M: int, N: int, device: torch.device, compiled: bool, is_rms: bool, n_groups: int, bwd_config,
               wide_row: int, register_row: int, *key) -> tuple:
    """(block_n, wide, prefetch, block_m, progs, warps, db_by_columns, rows per program) of the backward over M rows
    of N elements (the kernel's rows: the groups, when grouped): ``bwd_config``'s answer, a tile of whole rows of
    groups, and the programs' share of the rows. Rows up to ``wide_row`` (rounded up to a power of two) prefetch,
    wider than ``register_row`` take the chunked kernel; ``key``: as :func:`fwd_launch`'s."""
    block_n = next_pow2(N)
    wide = block_n > register_row
    prefetch = block_n <= wide_row
    block_m, progs, warps, db_by_columns = bwd_config(M, block_n, device, is_rms)
    if n_groups != 1 and block_m < n_groups:  # a tile holds whole rows of groups (grouped_backward_fits)
        block_m, warps = n_groups, max(warps, warps_for(n_groups * block_n))
    per_prog = cdiv(cdiv(M, progs), block_m) * block_m
    return block_n, wide, prefetch, block_m, cdiv(M, per_prog), warps, db_by_columns, per_prog


@functools.lru_cache(maxsize=1024)
def sum_launch(n_full: int, n_parts: int) -> tuple[int, tuple[int], int]:
    """(BLOCK_N, grid, BLOCK_P) of the dW / dB partials' sum: many programs, N/32 of them, each summing a
    [parts, 32] slab."""
    block_cols = min(next_pow2(n_full), 32)
    return block_cols, (cdiv(n_full, block_cols),), min(next_pow2(n_parts), 128)
