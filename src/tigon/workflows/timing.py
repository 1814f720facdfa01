"""Timing primitives of ``tigon bench`` and ``tigon profile``, as the device method says (METHOD.md): medians of
CUDA-event timings with the L2 cache flushed or inputs rotated, CUDA-graph replays for small launches, and the
copy-bandwidth and matmul ceilings measured in the same run.

All times are milliseconds; ``(median, p20, p80)`` triples.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable

import torch


def time_call(fn: Callable[[], object], device: torch.device, grad_to_none=None, cpu_reps: int = 3,
              cuda_graph: bool = False) -> tuple[float, float, float]:
    """(median, p20, p80) in ms of ``fn()``; gradients of ``grad_to_none`` are reset between calls.

    ``cuda_graph``: time replays of a CUDA graph of ``fn`` (``triton.testing.do_bench_cudagraph``), which removes
    the host's launch and autograd overhead and leaves the kernels' own time.
    """
    if device.type == "cuda":
        import triton.testing

        if cuda_graph:
            q = triton.testing.do_bench_cudagraph(fn, rep=100, grad_to_none=grad_to_none, quantiles=[0.5, 0.2, 0.8])
        else:
            q = triton.testing.do_bench(fn, warmup=25, rep=100, grad_to_none=grad_to_none,
                                        quantiles=[0.5, 0.2, 0.8])
        return float(q[0]), float(q[1]), float(q[2])
    fn()
    samples = []
    for _ in range(cpu_reps):
        if grad_to_none:
            for t in grad_to_none:
                t.grad = None
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e3)
    samples.sort()
    return statistics.median(samples), samples[0], samples[-1]


def _warmed(fn: Callable[[], object], grad_to_none) -> Callable[[], None]:
    """``fn`` with the gradients of ``grad_to_none`` cleared before each call, after three warm-up calls."""
    def call():
        for t in grad_to_none or ():
            t.grad = None
        fn()

    for _ in range(3):
        call()
    return call


def kernel_time(fn: Callable[[], object], grad_to_none=None, reps: int = 20) -> tuple[float, float, float]:
    """(median, p20, p80) in ms over ``reps`` calls of the GPU time of one call of ``fn()``: the durations of the
    kernels and memory operations it runs, summed (``torch.profiler``, one profile per call). For code that waits
    on the host and so cannot be captured in a CUDA graph: like a graph replay, it leaves out the host's time
    between launches (and, unlike one, the gaps between kernels: it can only flatter the code it times)."""
    from torch.profiler import ProfilerActivity, profile

    call = _warmed(fn, grad_to_none)
    torch.cuda.synchronize()
    samples = []
    for _ in range(reps):
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            call()
            torch.cuda.synchronize()
        samples.append(sum(e.time_range.elapsed_us() for e in prof.events()  # ranges' device copies left out
                           if e.device_type == torch.autograd.DeviceType.CUDA
                           and not getattr(e, "is_user_annotation", False)) * 1e-3)
    q = statistics.quantiles(samples, n=5, method="inclusive")  # the 20th, 40th, 60th and 80th percentiles
    return statistics.median(samples), q[0], q[3]


def host_time(fn: Callable[[], object], device: torch.device, grad_to_none=None, calls: int = 8,
              rounds: int = 7) -> tuple[float, float, float]:
    """(median, p20, p80) in ms over ``rounds`` of the host's time to issue one call of ``fn()``: the device is
    synchronised, then ``calls`` calls run back to back without waiting for it, and the wall time until the last
    returns is divided by ``calls``. So it is the Python, dispatch, autograd and launch cost of a call whatever
    its kernels take (while the launch queue has room: a few calls of a few dozen launches), the part of a call
    that a host-bound training step pays. On CPU, where nothing runs asynchronously, the call's wall time."""
    call = _warmed(fn, grad_to_none)
    samples = []
    for _ in range(rounds):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        for _ in range(calls):
            call()
        samples.append((time.perf_counter() - t0) * 1e3 / calls)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    q = statistics.quantiles(samples, n=5, method="inclusive")
    return statistics.median(samples), q[0], q[3]


KERNEL_TIME_NOTE = "kernel time (torch.profiler): waits on the host, so no CUDA graph"
BWD_NOTE = "backward alone: a fresh forward before each sample, untimed"


def time_backward(fwd: Callable[[], object], douts: list[torch.Tensor], device: torch.device, leaves,
                  fwd_bwd_ms: float) -> tuple[float, float, float]:
    """(median, p20, p80) in ms of the backward alone of ``fwd()``'s outputs with upstream gradients ``douts``.

    Every sample runs a fresh forward (untimed), so backward passes that can run only once per forward (gradients
    formed in the forward, gradients written in place) are timed like the others. On CUDA: CUDA events around the
    backward, the L2 cache flushed before it (as ``triton.testing.do_bench`` does), about 100 ms of samples.
    """
    def sample_once():
        for t in leaves:
            t.grad = None
        return differentiable_outputs(fwd())

    if device.type != "cuda":
        backward(sample_once(), douts, leaves)
        samples = []
        for _ in range(3):
            out = sample_once()
            t0 = time.perf_counter()
            backward(out, douts, leaves)
            samples.append((time.perf_counter() - t0) * 1e3)
        samples.sort()
        return statistics.median(samples), samples[0], samples[-1]
    cache = torch.empty(256 * 2**20, dtype=torch.int8, device=device)
    n = int(min(1000, max(5, 100.0 / max(fwd_bwd_ms, 1e-3))))
    for _ in range(min(n, 10)):  # warm-up
        backward(sample_once(), douts, leaves)
    samples = []
    for _ in range(n):
        out = sample_once()
        cache.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        backward(out, douts, leaves)
        end.record()
        samples.append((start, end))
        del out
    torch.cuda.synchronize(device)
    ms = sorted(s.elapsed_time(e) for s, e in samples)
    q = torch.tensor(ms).quantile(torch.tensor([0.5, 0.2, 0.8])).tolist()
    return float(q[0]), float(q[1]), float(q[2])


def _copy_ms(n: int, dtype: torch.dtype, device: torch.device) -> float:
    src = torch.randn(n, device=device, dtype=dtype)
    dst = torch.empty_like(src)
    return time_call(lambda: dst.copy_(src), device)[0]


def _matmul_ms(m: int, dtype: torch.dtype, device: torch.device) -> float:
    a = torch.randn(m, m, device=device, dtype=dtype)
    b = torch.randn(m, m, device=device, dtype=dtype)
    return time_call(lambda: a @ b, device)[0]


def measure_ceilings(device: torch.device, dtype: torch.dtype = torch.bfloat16) -> dict:
    """Copy bandwidth and matmul rate, measured now on ``device``.

    Returns:
        ``{"copy_gbps": GB/s (bytes read + written per second, 1e9), "matmul_tflops": TFLOP/s of a square
        matmul, "copy_bytes": bytes copied, "matmul_size": n of the n^3 matmul, "matmul_dtype": str, "note"}``.
        On CUDA: a 1 GiB bf16 device-to-device copy and a bf16 8192^3 matmul. On CPU a 32 MiB copy and a 512^3
        matmul in ``dtype`` (the CPU numbers only make the % columns defined).
    """
    cuda = device.type == "cuda"
    n = (1 << 29) if cuda else (1 << 24)
    mm_dtype = torch.bfloat16 if cuda else dtype
    copy_dtype = torch.bfloat16 if cuda else torch.float16
    copy_bytes = 2 * n * torch.finfo(copy_dtype).bits // 8
    copy = copy_bytes / (_copy_ms(n, copy_dtype, device) * 1e-3) / 1e9
    m = 8192 if cuda else 512
    ms = _matmul_ms(m, mm_dtype, device)
    if cuda:
        torch.cuda.empty_cache()
    return {"copy_gbps": copy, "matmul_tflops": 2 * m**3 / (ms * 1e-3) / 1e12, "copy_bytes": copy_bytes,
            "matmul_size": m, "matmul_dtype": str(mm_dtype).replace("torch.", ""),
            "note": "measured on CUDA" if cuda else "measured on CPU (small sizes; not a GPU ceiling)"}


def differentiable_outputs(o) -> list[torch.Tensor]:
    """The differentiable outputs of a provider call (one tensor, or several: (q, k) of the rotary op)."""
    outs = list(o) if isinstance(o, (tuple, list)) else [o]
    return [t for t in outs if isinstance(t, torch.Tensor) and t.requires_grad]


ROTATE_L2_MULTIPLE = 4


def set_bytes(inputs: dict, douts: list[torch.Tensor]) -> int:
    """Bytes of the tensors among ``inputs`` and of the upstream gradients ``douts``."""
    tensors = [t for t in inputs.values() if isinstance(t, torch.Tensor)] + list(douts)
    return sum(t.numel() * t.element_size() for t in tensors)


def rotation_sets(set_bytes: int, device: torch.device) -> int:
    """How many input sets :func:`tigon.workflows.bench.bench_one` rotates through: enough that ``ROTATE_L2_MULTIPLE`` x the L2 cache
    is touched between two uses of one set (CUDA; at most 64 sets), 1 on CPU or for sets that large.

    Why: a CUDA-graph replay does not flush the cache between calls, so small inputs timed over one buffer
    measure the L2 cache (METHOD: rotate among several input sets), and an op that overwrites its inputs in place
    touches half the bytes of one that writes new outputs, so only it stays in the cache.
    """
    if device.type != "cuda" or set_bytes <= 0:
        return 1
    l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or 50 * 2**20
    return int(max(1, min(64, -(-ROTATE_L2_MULTIPLE * l2 // set_bytes))))


def backward(outs: list[torch.Tensor], douts: list[torch.Tensor], inputs: list[torch.Tensor]) -> None:
    """The gradients of ``inputs`` for upstream gradients ``douts`` of ``outs`` (``torch.autograd.grad``), dropped.

    Not ``.backward()``: accumulating into ``.grad`` copies a gradient that two inputs share (``x + residual`` gives
    both the same tensor, so autograd clones it for one leaf), which inside a model flows on to the producers
    uncopied; timing that copy would charge the op with autograd's leaf bookkeeping.
    """
    torch.autograd.grad(outs, inputs, douts, allow_unused=True)
