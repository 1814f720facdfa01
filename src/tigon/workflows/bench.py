"""Speed and peak memory of each op, per provider, on a model's shapes (library code behind ``tigon bench``).

Providers: ``eager`` (the original PyTorch code, as Hugging Face writes it), ``compile`` (torch.compile of
eager), ``tigon``, ``tigon_inplace`` (cross_entropy, swiglu, geglu, glu_linear: ``inplace_backward=True``, the
gradients written into the inputs' memory, as Liger always does), ``tigon_fwdgrad`` (cross_entropy with
``grad_in_forward=True``: the gradient formed in the forward, over the logits, Liger's scheme), ``tigon_lean``
(fused linear cross-entropy with ``accum_dtype`` = the weight's dtype: Liger's memory, grad_weight rounded per
chunk), and the peers ``liger`` (Liger-Kernel) and ``cce`` (Apple's Cut Cross-Entropy, fused linear cross-entropy
only) when installed; missing ones are skipped with a note. A provider that fails on a shape (out of memory,
unsupported dtype, a signature change) is recorded as a row with ``note="failed: ..."`` and the run goes on.

Timing: on CUDA, ``triton.testing.do_bench`` (CUDA events; median with 20/80 percentiles) on fresh random
inputs for every (op, provider, shape), rotating among enough input sets that consecutive calls do not find their
inputs in the L2 cache (:func:`rotation_sets`); on CPU a wall-clock median of a few calls (the numbers then only show
that the path runs: Tigon's kernels are executed by Triton's interpreter). Modes: ``fwd`` (training forward,
inputs require grad), ``bwd`` (the backward alone: a fresh, untimed forward before every sample, so backward
passes that can run only once per forward, such as Tigon's fused linear cross-entropy or an in-place backward,
are timed like the others; providers that do their gradient work in the forward show a small ``bwd``) and
``fwd_bwd``. Peak extra memory: ``torch.cuda.max_memory_allocated`` during one forward+backward minus the
memory held before it (inputs and upstream gradient), in bytes; the gradients produced count as extra. Not
measured on CPU (``None``).

Ceilings measured in the same run (see :func:`measure_ceilings`): device-to-device copy bandwidth (bytes read
+ written / time) and the matmul rate (bf16 8192^3 on CUDA). Memory-bound ops report GB/s over their *minimal*
bytes (per op below; bf16 = 2 bytes per element) and % of the copy bandwidth; the fused linear cross-entropy
reports TFLOP/s over its matmul FLOPs and % of the matmul rate.

Minimal bytes (M tokens, N hidden, I intermediate, V vocab, e bytes per element):

=====================  ======================  ===============================
op                     fwd                     fwd+bwd
=====================  ======================  ===============================
rms_norm, layer_norm   2 M N e (x, y)          5 M N e (+ x, dy, dx)
rope                   2 (q+k) e               4 (q+k) e
swiglu, geglu          3 M I e (gate, up, out) 8 M I e (+ gate, up, dout, 2 grads)
cross_entropy          M V e (logits)          2 M V e (+ dlogits)
=====================  ======================  ===============================

Fused linear cross-entropy FLOPs: fwd ``2 M N V``, fwd+bwd ``6 M N V`` (three matmuls). No TFLOP/s is reported
for its ``bwd`` row: fused implementations form the gradients during the forward.
"""

from __future__ import annotations

import csv
import gc
import importlib.util
import itertools
import json
import os
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Callable

import torch

from .. import functional as F
from ..reference import glu as ref_glu
from ..reference import rms_norm as ref_rms
from ..reference import rope as ref_rope

PROVIDERS = ("eager", "compile", "tigon", "tigon_inplace", "tigon_fwdgrad", "tigon_lean", "liger", "cce")
MODES = ("fwd", "bwd", "fwd_bwd")
SWEEPS = ("tokens", "hidden")
NORM_OPS = ("rms_norm", "layer_norm")
_PROVIDER_MODULES = {"liger": "liger_kernel", "cce": "cut_cross_entropy"}

# Sizes per device: the default token count of a single-shape run and the points of each sweep.
SIZES = {
    "cuda": {"tokens": 16384, "sweep_tokens": [1024 << i for i in range(7)],      # 1k .. 64k
             "sweep_hidden": [1024 << i for i in range(5)]},                         # 1024 .. 16384
    "cpu": {"tokens": 64, "sweep_tokens": [16, 32, 64, 128], "sweep_hidden": [64, 128, 256, 512]},
}
CPU_NOTE = ("CPU timings are not meaningful: Tigon's kernels run in Triton's interpreter (Python) and the sizes "
            "are tiny; they only show that every path runs. Benchmark on a CUDA GPU.")


@dataclass
class BenchRow:
    """One measurement of one (op, provider, shape, mode).

    ms, ms_p20, ms_p80: median and 20th / 80th percentile time in milliseconds (``bwd`` measured as described in
        the module docstring; ``None`` for a failed provider).
    gbps, pct_copy_bw: achieved bandwidth over the op's minimal bytes in GB/s (1e9 bytes/s) and its % of the
        measured copy bandwidth (memory-bound ops).
    tflops, pct_matmul: achieved TFLOP/s over the op's matmul FLOPs and % of the measured matmul rate (fused
        linear cross-entropy).
    peak_extra_bytes: peak memory of one forward+backward above what was held before it, bytes (``fwd_bwd`` rows
        on CUDA; None elsewhere).
    note: how ``bwd`` was measured, or ``failed: <error>``.
    """

    op: str
    provider: str
    shape: dict
    dtype: str
    mode: str
    ms: float | None = None
    ms_p20: float | None = None
    ms_p80: float | None = None
    gbps: float | None = None
    pct_copy_bw: float | None = None
    tflops: float | None = None
    pct_matmul: float | None = None
    peak_extra_bytes: int | None = None
    note: str = ""


@dataclass
class BenchResult:
    """Everything one ``tigon bench`` run measured; ``as_dict()`` is the JSON written by the CLI.

    device: "cpu" or the GPU's name. ceilings: ``{"copy_gbps", "matmul_tflops", ...}`` (see
    :func:`measure_ceilings`). rows: one :class:`BenchRow` per (op, provider, shape, mode). skipped: notes about
    providers that were not run. model: where the shapes came from. sweep: None, "tokens" or "hidden".
    config: the resolved request. notes: caveats for reading the numbers.
    """

    device: str
    ceilings: dict
    rows: list[BenchRow] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    model: dict = field(default_factory=dict)
    sweep: str | None = None
    config: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        """A JSON-serialisable dict of every field (rows as dicts)."""
        return {"device": self.device, "ceilings": self.ceilings, "skipped": self.skipped, "model": self.model,
                "sweep": self.sweep, "config": self.config, "notes": self.notes,
                "rows": [asdict(r) for r in self.rows]}

    def write_json(self, path: str) -> None:
        """Write :meth:`as_dict` to ``path`` (indented JSON)."""
        with open(path, "w") as f:
            json.dump(self.as_dict(), f, indent=1)
            f.write("\n")

    def write_csv(self, path: str) -> None:
        """Write one CSV line per row: op, provider, mode, dtype, tokens, the shape as JSON, then the numbers."""
        cols = ["op", "provider", "mode", "dtype", "tokens", "shape", "ms", "ms_p20", "ms_p80", "gbps",
                "pct_copy_bw", "tflops", "pct_matmul", "peak_extra_bytes", "note"]
        with open(path, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(cols)
            for r in self.rows:
                d = asdict(r)
                d["tokens"] = r.shape.get("tokens")
                d["shape"] = json.dumps(r.shape, sort_keys=True)
                w.writerow(["" if d[c] is None else d[c] for c in cols])


# ----------------------------------------------------------------------------------------------- timing
def _time(fn: Callable[[], object], device: torch.device, grad_to_none=None, cpu_reps: int = 3,
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


def _kernel_time(fn: Callable[[], object], grad_to_none=None, reps: int = 20) -> tuple[float, float, float]:
    """(median, p20, p80) in ms over ``reps`` calls of the GPU time of one call of ``fn()``: the durations of the
    kernels and memory operations it runs, summed (``torch.profiler``, one profile per call). For code that waits
    on the host and so cannot be captured in a CUDA graph: like a graph replay, it leaves out the host's time
    between launches (and, unlike one, the gaps between kernels: it can only flatter the code it times)."""
    from torch.profiler import ProfilerActivity, profile

    def call():
        for t in grad_to_none or ():
            t.grad = None
        fn()

    for _ in range(3):
        call()
    torch.cuda.synchronize()
    samples = []
    for _ in range(reps):
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            call()
            torch.cuda.synchronize()
        samples.append(sum(e.time_range.elapsed_us() for e in prof.events()
                           if e.device_type == torch.autograd.DeviceType.CUDA) * 1e-3)
    q = statistics.quantiles(samples, n=5, method="inclusive")  # the 20th, 40th, 60th and 80th percentiles
    return statistics.median(samples), q[0], q[3]


KERNEL_TIME_NOTE = "kernel time (torch.profiler): waits on the host, so no CUDA graph"
BWD_NOTE = "backward alone: a fresh forward before each sample, untimed"


def _time_bwd(fwd: Callable[[], object], douts: list[torch.Tensor], device: torch.device, leaves,
              fwd_bwd_ms: float) -> tuple[float, float, float]:
    """(median, p20, p80) in ms of the backward alone of ``fwd()``'s outputs with upstream gradients ``douts``.

    Every sample runs a fresh forward (untimed), so backward passes that can run only once per forward (gradients
    formed in the forward, gradients written in place) are timed like the others. On CUDA: CUDA events around the
    backward, the L2 cache flushed before it (as ``triton.testing.do_bench`` does), about 100 ms of samples.
    """
    def sample_once():
        for t in leaves:
            t.grad = None
        return _outputs(fwd())

    if device.type != "cuda":
        _backward(sample_once(), douts)
        samples = []
        for _ in range(3):
            out = sample_once()
            t0 = time.perf_counter()
            _backward(out, douts)
            samples.append((time.perf_counter() - t0) * 1e3)
        samples.sort()
        return statistics.median(samples), samples[0], samples[-1]
    cache = torch.empty(256 * 2**20, dtype=torch.int8, device=device)
    n = int(min(1000, max(5, 100.0 / max(fwd_bwd_ms, 1e-3))))
    for _ in range(min(n, 10)):  # warm-up
        _backward(sample_once(), douts)
    samples = []
    for _ in range(n):
        out = sample_once()
        cache.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        _backward(out, douts)
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
    return _time(lambda: dst.copy_(src), device)[0]


def _matmul_ms(m: int, dtype: torch.dtype, device: torch.device) -> float:
    a = torch.randn(m, m, device=device, dtype=dtype)
    b = torch.randn(m, m, device=device, dtype=dtype)
    return _time(lambda: a @ b, device)[0]


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


# ----------------------------------------------------------------------------------------------- cases
@dataclass
class OpCase:
    """How to benchmark one op.

    make(shape, dtype, device) -> keyword inputs; providers: name -> callable(**inputs) returning the output (or
    a tuple whose first element is differentiated); grads: the inputs that require grad; min_bytes(shape,
    element_bytes, mode) -> minimal bytes moved; flops(shape, mode) -> FLOPs (mode "fwd" or "fwd_bwd");
    grads_in_forward: providers whose forward writes the gradient (their ``bwd`` row gets no GB/s);
    host_syncs: providers that wait on the host during a call (``.item()``, a host-side check of the upstream
    gradient), which a CUDA graph cannot capture: with ``cuda_graph`` their time is their kernels' summed durations
    (:func:`_kernel_time`).
    """

    name: str
    make: Callable[[dict, torch.dtype, torch.device], dict]
    providers: dict[str, Callable[..., object]]
    grads: tuple[str, ...]
    min_bytes: Callable[[dict, int, str], int] | None = None
    flops: Callable[[dict, str], float] | None = None
    grads_in_forward: tuple[str, ...] = ()  # providers whose forward forms the gradient: no GB/s for their bwd
    host_syncs: tuple[str, ...] = ()  # providers a CUDA graph cannot capture: kernel time from the profiler


def _rand(shape, dtype, device, grad=False, scale=1.0):
    return (torch.randn(shape, device=device, dtype=dtype) * scale).requires_grad_(grad)


def _liger(attr: str):
    """Liger-Kernel's ``liger_kernel.transformers.functional.<attr>``, imported on first call."""

    def call(*args, **kwargs):
        from liger_kernel.transformers import functional as LF

        return getattr(LF, attr)(*args, **kwargs)

    return call


def _norm_inputs(s, dtype, device):
    return {"x": _rand((s["tokens"], s["hidden"]), dtype, device, True),
            "w": (torch.rand(s["hidden"], device=device, dtype=dtype) + 0.5).requires_grad_(True)}


def _ln_inputs(s, dtype, device):
    d = _norm_inputs(s, dtype, device)
    d["b"] = _rand((s["hidden"],), dtype, device, True)
    return d


def _rope_inputs(s, dtype, device):
    B, T, Hq, Hkv, D = s["batch"], s["seq"], s["heads"], s["kv_heads"], s["head_dim"]
    # HF layout: (B, T, H*D) projections viewed as (B, H, T, D) through a transpose.
    q = _rand((B, T, Hq, D), dtype, device).transpose(1, 2).detach().requires_grad_(True)
    k = _rand((B, T, Hkv, D), dtype, device).transpose(1, 2).detach().requires_grad_(True)
    pos = torch.arange(T, device=device, dtype=torch.float32)
    inv = 1.0 / (500000.0 ** (torch.arange(0, D, 2, device=device, dtype=torch.float32) / D))
    emb = torch.cat([pos[:, None] * inv[None], pos[:, None] * inv[None]], -1)[None]
    return {"q": q, "k": k, "cos": emb.cos().to(dtype), "sin": emb.sin().to(dtype)}


def _glu_inputs(s, dtype, device):
    return {"gate": _rand((s["tokens"], s["intermediate"]), dtype, device, True),
            "up": _rand((s["tokens"], s["intermediate"]), dtype, device, True)}


def _glu_linear_inputs(s, dtype, device):
    d = _glu_inputs(s, dtype, device)
    d["weight"] = _rand((s["hidden"], s["intermediate"]), dtype, device, True, scale=s["intermediate"] ** -0.5)
    return d


def _targets(s, device):
    t = torch.randint(0, s["vocab"], (s["tokens"],), device=device)
    t[torch.rand(s["tokens"], device=device) < 0.1] = -100
    return t


def _ce_inputs(s, dtype, device):
    return {"logits": _rand((s["tokens"], s["vocab"]), dtype, device, True, 2.0), "target": _targets(s, device)}


def _flce_inputs(s, dtype, device):
    return {"hidden": _rand((s["tokens"], s["hidden"]), dtype, device, True),
            "weight": _rand((s["vocab"], s["hidden"]), dtype, device, True, s["hidden"] ** -0.5),
            "target": _targets(s, device), "softcap": s.get("softcap")}


def _eager_flce(hidden, weight, target, softcap=None):
    logits = (hidden @ weight.T).float()
    if softcap:
        logits = softcap * torch.tanh(logits / softcap)
    return torch.nn.functional.cross_entropy(logits, target, ignore_index=-100)


def _cce(hidden, weight, target, softcap=None):
    from cut_cross_entropy import linear_cross_entropy

    return linear_cross_entropy(hidden, weight, target, softcap=softcap)


def _liger_flce(hidden, weight, target, softcap=None):
    # liger_fused_linear_cross_entropy(input, weight, target, bias=None, ...): positional, softcap by keyword.
    from liger_kernel.transformers import functional as LF

    if softcap is None:
        return LF.liger_fused_linear_cross_entropy(hidden, weight, target)
    return LF.liger_fused_linear_cross_entropy(hidden, weight, target, softcap=softcap)


def _eager_rms(x, w):
    return ref_rms.rms_norm(x, w, _EPS)  # HF LlamaRMSNorm: normalise in fp32, cast, multiply by the weight


_EPS = 1e-6
CASES: dict[str, OpCase] = {
    "rms_norm": OpCase(
        "rms_norm", _norm_inputs,
        {"eager": _eager_rms, "tigon": lambda x, w: F.rms_norm(x, w, _EPS),
         "liger": lambda x, w: _liger("liger_rms_norm")(x, w, _EPS)},             # liger_rms_norm(X, W, eps)
        ("x", "w"),
        min_bytes=lambda s, e, m: (2 if m == "fwd" else 5) * s["tokens"] * s["hidden"] * e),
    "layer_norm": OpCase(
        "layer_norm", _ln_inputs,
        {"eager": lambda x, w, b: torch.nn.functional.layer_norm(x, (x.shape[-1],), w, b, 1e-5),
         "tigon": lambda x, w, b: F.layer_norm(x, w, b, 1e-5),
         "liger": lambda x, w, b: _liger("liger_layer_norm")(x, w, b, 1e-5)},      # liger_layer_norm(X, W, B, eps)
        ("x", "w", "b"),
        min_bytes=lambda s, e, m: (2 if m == "fwd" else 5) * s["tokens"] * s["hidden"] * e),
    "rope": OpCase(
        "rope", _rope_inputs,
        {"eager": lambda q, k, cos, sin: ref_rope.rope(q, k, cos, sin),
         "tigon": lambda q, k, cos, sin: F.rope(q, k, cos, sin),
         "liger": lambda q, k, cos, sin: _liger("liger_rope")(q, k, cos, sin)},    # liger_rope(q, k, cos, sin)
        ("q", "k"),
        min_bytes=lambda s, e, m: (2 if m == "fwd" else 4) * s["batch"] * s["seq"] * s["head_dim"]
        * (s["heads"] + s["kv_heads"]) * e),
    "swiglu": OpCase(
        "swiglu", _glu_inputs,
        {"eager": lambda gate, up: ref_glu.swiglu(gate, up), "tigon": lambda gate, up: F.swiglu(gate, up),
         "tigon_inplace": lambda gate, up: F.swiglu(gate, up, inplace_backward=True),
         "liger": lambda gate, up: _liger("liger_swiglu")(gate, up)},              # liger_swiglu(a, b)
        ("gate", "up"),
        min_bytes=lambda s, e, m: (3 if m == "fwd" else 8) * s["tokens"] * s["intermediate"] * e),
    "geglu": OpCase(
        "geglu", _glu_inputs,
        {"eager": lambda gate, up: ref_glu.geglu(gate, up, "tanh"),
         "tigon": lambda gate, up: F.geglu(gate, up, "tanh"),
         "tigon_inplace": lambda gate, up: F.geglu(gate, up, "tanh", inplace_backward=True),
         "liger": lambda gate, up: _liger("liger_geglu")(gate, up)},               # liger_geglu(a, b), tanh gelu
        ("gate", "up"),
        min_bytes=lambda s, e, m: (3 if m == "fwd" else 8) * s["tokens"] * s["intermediate"] * e),
    # The patched MLP's down projection with the product (tigon.functional.glu_linear): matmul-bound; eager / Liger
    # store the (tokens, intermediate) product for the backward, Tigon recomputes it (peak memory shows it).
    "glu_linear": OpCase(
        "glu_linear", _glu_linear_inputs,
        {"eager": lambda gate, up, weight: torch.nn.functional.linear(ref_glu.swiglu(gate, up), weight),
         "tigon": lambda gate, up, weight: F.glu_linear(gate, up, weight),
         "tigon_inplace": lambda gate, up, weight: F.glu_linear(gate, up, weight, inplace_backward=True),
         "liger": lambda gate, up, weight: torch.nn.functional.linear(_liger("liger_swiglu")(gate, up), weight)},
        ("gate", "up", "weight"),
        flops=lambda s, m: (2 if m == "fwd" else 6) * s["tokens"] * s["intermediate"] * s["hidden"]),
    "cross_entropy": OpCase(
        "cross_entropy", _ce_inputs,
        {"eager": lambda logits, target: torch.nn.functional.cross_entropy(logits.float(), target),
         "tigon": lambda logits, target: F.cross_entropy(logits, target),
         "tigon_inplace": lambda logits, target: F.cross_entropy(logits, target, inplace_backward=True),
         # grad_in_forward refuses leaf logits: a view stands for the LM head's output (its gradient flows back)
         "tigon_fwdgrad": lambda logits, target: F.cross_entropy(logits.view_as(logits), target,
                                                                 grad_in_forward=True),
         "liger": lambda logits, target: _liger("liger_cross_entropy")(logits, target)},  # (input, target)
        ("logits",),
        min_bytes=lambda s, e, m: (1 if m == "fwd" else 2) * s["tokens"] * s["vocab"] * e,
        # Liger reads the count of non-ignored tokens with .item() and compares the upstream gradient with 1 on the host
        grads_in_forward=("tigon_fwdgrad", "liger"), host_syncs=("liger",)),
    "fused_linear_cross_entropy": OpCase(
        "fused_linear_cross_entropy", _flce_inputs,
        {"eager": _eager_flce,
         "tigon": lambda hidden, weight, target, softcap=None: F.fused_linear_cross_entropy(
             hidden, weight, target, softcap=softcap),
         "tigon_lean": lambda hidden, weight, target, softcap=None: F.fused_linear_cross_entropy(
             hidden, weight, target, softcap=softcap, accum_dtype=weight.dtype),
         "liger": _liger_flce, "cce": _cce},
        ("hidden", "weight"),
        flops=lambda s, m: (2 if m == "fwd" else 6) * s["tokens"] * s["hidden"] * s["vocab"],
        host_syncs=("liger",)),
}
for _case in CASES.values():  # torch.compile of the eager code is always a provider
    _case.providers["compile"] = _case.providers["eager"]


def _op_bytes(case: OpCase, shape: dict, elem: int, mode: str) -> int | None:
    if case.min_bytes is None:
        return None
    if mode == "bwd":
        return case.min_bytes(shape, elem, "fwd_bwd") - case.min_bytes(shape, elem, "fwd")
    return case.min_bytes(shape, elem, mode)


def _op_flops(case: OpCase, shape: dict, mode: str) -> float | None:
    if case.flops is None or mode == "bwd":  # fused implementations do the backward's matmuls in the forward
        return None
    return case.flops(shape, mode)


# ----------------------------------------------------------------------------------------------- shapes
def shapes_from_config(cfg: dict, tokens: int = 16384, batch: int = 4) -> dict[str, dict]:
    """Representative shapes per op from an HF config dict, for ``tokens`` tokens (batch * sequence).

    Uses ``hidden_size``, ``intermediate_size``, ``num_attention_heads``, ``num_key_value_heads`` (default: the
    heads), ``head_dim`` (default hidden / heads), ``vocab_size`` and ``final_logit_softcapping``. Every shape has
    a ``tokens`` entry; rope's is ``batch * seq`` with ``seq = tokens // batch``.

    Raises:
        KeyError: a required config key is missing.
    """
    H = cfg["hidden_size"]
    heads = cfg["num_attention_heads"]
    D = cfg.get("head_dim") or H // heads
    batch = max(1, min(batch, tokens))
    seq = max(1, tokens // batch)
    return {
        "rms_norm": {"tokens": tokens, "hidden": H},
        "layer_norm": {"tokens": tokens, "hidden": H},
        "rope": {"tokens": batch * seq, "batch": batch, "seq": seq, "heads": heads,
                 "kv_heads": cfg.get("num_key_value_heads") or heads, "head_dim": D},
        "swiglu": {"tokens": tokens, "intermediate": cfg["intermediate_size"]},
        "geglu": {"tokens": tokens, "intermediate": cfg["intermediate_size"]},
        "glu_linear": {"tokens": tokens, "intermediate": cfg["intermediate_size"], "hidden": H},
        "cross_entropy": {"tokens": tokens, "vocab": cfg["vocab_size"]},
        "fused_linear_cross_entropy": {"tokens": tokens, "hidden": H, "vocab": cfg["vocab_size"],
                                       "softcap": cfg.get("final_logit_softcapping")},
    }


def model_ops(cfg: dict) -> list[str]:
    """The ops a model of this config calls, in :data:`CASES` order (all ops for an unknown family).

    Norm kind and gated activation come from the family spec (:mod:`tigon.integrations.families`) and the
    config's activation; cross_entropy and fused_linear_cross_entropy are always included.
    """
    from ..integrations.families import ACTIVATIONS, FAMILIES

    spec = next((s for s in FAMILIES.values() if cfg.get("model_type") in (s.name, *s.aliases)), None)
    if spec is None:
        return list(CASES)
    ops = {n.kind for n in spec.norms}
    for m in spec.mlps:
        act = getattr(m, "activation", None) or cfg.get(m.act_config_attr) or _default_config_attr(
            cfg.get("model_type"), m.act_config_attr)
        if act in ACTIVATIONS:
            ops.add(ACTIVATIONS[act][0])
    if spec.rope is not None:
        ops.add("rope")
    if "swiglu" in ops and any(getattr(m, "down", None) and not getattr(m, "experts", False) for m in spec.mlps):
        ops.add("glu_linear")  # what the patched MLP runs (down projection folded in), timed with silu
    ops |= {"cross_entropy", "fused_linear_cross_entropy"}
    return [op for op in CASES if op in ops]


def _default_config_attr(model_type: str | None, attr: str):
    """The default of ``attr`` in the ``transformers`` config class of ``model_type`` (None if unknown)."""
    try:
        from transformers import AutoConfig

        return getattr(AutoConfig.for_model(model_type), attr, None)
    except Exception:
        return None


def config_dict(model: str) -> tuple[dict, dict]:
    """(HF config dict, description) of ``model``: a preset name, a ``config.json`` file or a checkpoint dir.

    Raises:
        ConfigError: not a preset, file or directory with a readable config.json.
    """
    from .. import presets
    from .compare import ConfigError

    if model in presets.PRESETS:
        p = presets.get_preset(model)
        return dict(p["config"], model_type=p["model_type"]), {"source": f"preset:{model}"}
    path = os.path.join(model, "config.json") if os.path.isdir(model) else model
    if not os.path.isfile(path):
        raise ConfigError(f"--model {model}: not a preset ({', '.join(presets.PRESETS)}), a config.json or a "
                          "checkpoint directory")
    try:
        with open(path) as f:
            cfg = json.load(f)
    except (OSError, ValueError) as e:
        raise ConfigError(f"--model {model}: cannot read {path}: {e}") from e
    if not isinstance(cfg, dict):
        raise ConfigError(f"--model {model}: {path} is not a JSON object")
    if "hidden_size" not in cfg and isinstance(cfg.get("text_config"), dict):  # multimodal: the text decoder's
        cfg = cfg["text_config"]
    return cfg, {"source": os.path.abspath(path)}


# ----------------------------------------------------------------------------------------------- providers
def available_providers(requested) -> tuple[list[str], list[str]]:
    """Split ``requested`` into (available, notes about the missing ones).

    Raises:
        ValueError: an unknown provider name.
    """
    ok, notes = [], []
    for p in requested:
        if p not in PROVIDERS:
            raise ValueError(f"unknown provider {p!r}; choose from {', '.join(PROVIDERS)}")
        mod = _PROVIDER_MODULES.get(p)
        if mod and importlib.util.find_spec(mod) is None:
            notes.append(f"{p}: not installed ({mod}), skipped")
            continue
        ok.append(p)
    return ok, notes


def _raise_recompile_limit() -> None:
    """A sweep recompiles the compiled provider per shape; keep dynamo from silently falling back to eager."""
    try:
        import torch._dynamo.config as dc
    except Exception:  # pragma: no cover
        return
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(dc, name) and getattr(dc, name) < 64:
            setattr(dc, name, 64)


def _fn_for(case: OpCase, provider: str, compiled: dict):
    fn = case.providers[provider]
    if provider == "compile":
        if case.name not in compiled:
            _raise_recompile_limit()
            compiled[case.name] = torch.compile(fn, dynamic=False)
        fn = compiled[case.name]
    return fn


def _outputs(o) -> list[torch.Tensor]:
    """The differentiable outputs of a provider call (rope returns (q, k); the others one tensor)."""
    outs = list(o) if isinstance(o, (tuple, list)) else [o]
    return [t for t in outs if isinstance(t, torch.Tensor) and t.requires_grad]


ROTATE_L2_MULTIPLE = 4


def _set_bytes(inputs: dict, douts: list[torch.Tensor]) -> int:
    tensors = [t for t in inputs.values() if isinstance(t, torch.Tensor)] + list(douts)
    return sum(t.numel() * t.element_size() for t in tensors)


def rotation_sets(set_bytes: int, device: torch.device) -> int:
    """How many input sets :func:`bench_one` rotates through: enough that ``ROTATE_L2_MULTIPLE`` x the L2 cache
    is touched between two uses of one set (CUDA; at most 64 sets), 1 on CPU or for sets that large.

    Why: a CUDA-graph replay does not flush the cache between calls, so small inputs timed over one buffer
    measure the L2 cache (METHOD: rotate among several input sets), and an op that overwrites its inputs in place
    touches half the bytes of one that writes new outputs, so only it stays in the cache.
    """
    if device.type != "cuda" or set_bytes <= 0:
        return 1
    l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or 50 * 2**20
    return int(max(1, min(64, -(-ROTATE_L2_MULTIPLE * l2 // set_bytes))))


def _backward(outs: list[torch.Tensor], douts: list[torch.Tensor]) -> None:
    torch.autograd.backward(outs, douts)


def bench_one(case: OpCase, provider: str, shape: dict, dtype: torch.dtype, device: torch.device,
              ceilings: dict, compiled: dict, modes=MODES, cuda_graph: bool = False) -> list[BenchRow]:
    """Time one (op, provider, shape) in each of ``modes`` and measure its peak extra memory.

    Returns one :class:`BenchRow` per mode (ms, GB/s or TFLOP/s against ``ceilings``; the ``fwd_bwd`` row holds
    the peak extra bytes on CUDA). Exceptions of the provider propagate (:func:`run_bench` records them).
    """
    fn = _fn_for(case, provider, compiled)
    inputs = case.make(shape, dtype, device)
    leaves = [inputs[k] for k in case.grads]
    # Upstream gradients: random for tensors; 1 for a scalar loss, as loss.backward() gives it (Liger's
    # cross-entropy and Tigon's grad_in_forward skip their scaling pass then).
    douts = [torch.ones_like(t) if t.dim() == 0 else torch.randn_like(t) for t in _outputs(fn(**inputs))]
    # Input sets rotated call after call, so that repeated calls do not find their inputs in the L2 cache.
    sets = [(inputs, douts)]
    for _ in range(rotation_sets(_set_bytes(inputs, douts), device) - 1):
        more = case.make(shape, dtype, device)
        sets.append((more, [d.clone() if d.dim() == 0 else torch.randn_like(d) for d in douts]))
    all_leaves = [s[0][k] for s in sets for k in case.grads]
    for t in all_leaves:
        t.grad = None
    turn = itertools.cycle(sets)

    def fwd():
        return fn(**next(turn)[0])

    def fwd_bwd():
        ins, ds = next(turn)
        _backward(_outputs(fn(**ins)), ds)

    results: dict[str, tuple[float, float, float]] = {}
    by_kernels = cuda_graph and device.type == "cuda" and provider in case.host_syncs

    def timed(f):
        if by_kernels:
            return _kernel_time(f, grad_to_none=all_leaves)
        return _time(f, device, grad_to_none=all_leaves, cuda_graph=cuda_graph)

    if "fwd" in modes:
        results["fwd"] = timed(fwd)
    if "fwd_bwd" in modes or "bwd" in modes:
        results["fwd_bwd"] = timed(fwd_bwd)
    if "bwd" in modes:
        results["bwd"] = _time_bwd(lambda: fn(**inputs), douts, device, leaves, results["fwd_bwd"][0])
    peak = None
    if device.type == "cuda":
        for t in leaves:
            t.grad = None
        gc.collect()
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        fwd_bwd()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated(device) - base
    elem = torch.finfo(dtype).bits // 8
    rows = []
    for mode in modes:
        ms, p20, p80 = results[mode]
        row = BenchRow(case.name, provider, dict(shape), str(dtype).replace("torch.", ""), mode, ms, p20, p80,
                       peak_extra_bytes=peak if mode == "fwd_bwd" else None,
                       note=BWD_NOTE if mode == "bwd" else KERNEL_TIME_NOTE if by_kernels else "")
        nbytes, flops = _op_bytes(case, shape, elem, mode), _op_flops(case, shape, mode)
        if mode == "bwd" and provider in case.grads_in_forward:
            nbytes = None  # its backward only scales (or keeps) a gradient the forward wrote: no op bytes to rate
        if nbytes and ms and ms > 0:
            row.gbps = nbytes / (ms * 1e-3) / 1e9
            if ceilings.get("copy_gbps"):
                row.pct_copy_bw = 100.0 * row.gbps / ceilings["copy_gbps"]
        if flops and ms and ms > 0:
            row.tflops = flops / (ms * 1e-3) / 1e12
            if ceilings.get("matmul_tflops"):
                row.pct_matmul = 100.0 * row.tflops / ceilings["matmul_tflops"]
        rows.append(row)
    return rows


def plan(ops, shapes: dict[str, list[dict]], providers) -> list[tuple[str, str, dict]]:
    """The (op, provider, shape) triples :func:`run_bench` will measure, in order (for progress bars)."""
    return [(op, p, s) for op in ops for s in shapes[op] for p in providers if p in CASES[op].providers]


def run_bench(ops, shapes: dict[str, list[dict]], providers, dtype=torch.bfloat16, device=None,
              progress: Callable[[str], None] | None = None, ceilings: dict | None = None,
              modes=MODES, cuda_graph: bool = False) -> BenchResult:
    """Benchmark ``ops`` x ``providers`` x shapes. ``shapes[op]`` is a list of shape dicts (a sweep).

    Args:
        ops: names from :data:`CASES`.
        shapes: op -> list of shape dicts (see :func:`shapes_from_config`).
        providers: names from :data:`PROVIDERS`; those not installed are skipped (``result.skipped``), those
            without an implementation of an op are not run for it.
        dtype, device: inputs' dtype and device (default CUDA when available).
        progress: called with a label before each (op, provider, shape).
        ceilings: reuse these instead of measuring (:func:`measure_ceilings`); ``{}`` skips the % columns.
        modes: subset of :data:`MODES`.
        cuda_graph: time fwd and fwd_bwd as CUDA-graph replays (kernel time without host overhead; CUDA only).

    Returns:
        a :class:`BenchResult`; a provider that raises on a shape gets one ``fwd_bwd`` row with ``ms=None`` and
        ``note="failed: ..."``.

    Raises:
        ValueError: an unknown op or provider.
    """
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    for op in ops:
        if op not in CASES:
            raise ValueError(f"unknown op {op!r}; choose from {', '.join(CASES)}")
    avail, notes = available_providers(providers)
    result = BenchResult(str(torch.cuda.get_device_name(device)) if device.type == "cuda" else "cpu",
                         measure_ceilings(device, dtype) if ceilings is None else dict(ceilings), skipped=notes)
    compiled: dict = {}
    for op, p, shape in plan(ops, shapes, avail):
        if progress:
            progress(f"{op} {p} {_shape_label(shape)}")
        try:
            result.rows.extend(bench_one(CASES[op], p, shape, dtype, device, result.ceilings, compiled, modes,
                                         cuda_graph))
        except Exception as e:  # a provider failing must not stop the run: record it
            from .compare import error_text

            result.rows.append(BenchRow(op, p, dict(shape), str(dtype).replace("torch.", ""), "fwd_bwd",
                                        note=f"failed: {type(e).__name__}: {error_text(e)}"))
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return result


def _shape_label(shape: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in shape.items() if v is not None)


# ----------------------------------------------------------------------------------------------- the workflow
@dataclass
class BenchConfig:
    """What ``tigon bench`` measures. ``None`` fields take defaults.

    ops: names from :data:`CASES`, or ``["all"]``; default: the ops the model calls (:func:`model_ops`; the
        norms for ``sweep="hidden"``).
    model: preset name, config.json or checkpoint directory (shapes only; no weights are read); default
        "tiny" on CPU, "llama3-8b" on CUDA.
    providers: names from :data:`PROVIDERS`; default all (without ``compile`` on CPU, where inductor compiles
        for minutes).
    sweep: None (one shape), "tokens" (:data:`SIZES`: 1k..64k tokens on CUDA) or "hidden" (norms only, hidden
        1024..16384 on CUDA at ``tokens`` tokens).
    dtype: "bfloat16", "float16" or "float32". tokens: tokens of a single-shape run (16384 CUDA, 64 CPU).
    device: "auto", "cpu" or "cuda".
    cuda_graph: time CUDA-graph replays (the kernels' own time, without host launch / autograd overhead).
    """

    ops: list[str] | None = None
    model: str | None = None
    providers: list[str] | None = None
    sweep: str | None = None
    dtype: str = "bfloat16"
    tokens: int | None = None
    device: str = "auto"
    cuda_graph: bool = False


DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def resolve_bench(config: BenchConfig) -> tuple[BenchConfig, dict[str, list[dict]], dict, list[str]]:
    """Validate ``config`` and fill defaults: (resolved config, shapes per op, model description, notes).

    Cheap (reads a config file at most). Raises:
        ConfigError: unknown op / provider / sweep / dtype / device, a sweep "hidden" with non-norm ops, tokens < 1,
            an unreadable model config.
    """
    from .compare import ConfigError, _resolve_device

    device = _resolve_device(config.device)
    sizes = SIZES[device.type]
    if config.sweep not in (None, *SWEEPS):
        raise ConfigError(f"unknown sweep {config.sweep!r} (choose from {', '.join(SWEEPS)})")
    if config.dtype not in DTYPES:
        raise ConfigError(f"unknown dtype {config.dtype!r} (choose from {', '.join(DTYPES)})")
    if config.tokens is not None and (not isinstance(config.tokens, int) or config.tokens < 1):
        raise ConfigError(f"--tokens must be an integer >= 1, got {config.tokens!r}")
    if config.cuda_graph and device.type != "cuda":
        raise ConfigError("--cuda-graph needs a CUDA device")
    model = config.model or ("llama3-8b" if device.type == "cuda" else "tiny")
    cfg, desc = config_dict(model)
    notes = []
    ops = [o for item in (config.ops or []) for o in item.split(",") if o]
    if not ops:
        ops = list(NORM_OPS) if config.sweep == "hidden" else model_ops(cfg)
    elif "all" in ops:
        ops = list(NORM_OPS) if config.sweep == "hidden" else list(CASES)
    for op in ops:
        if op not in CASES:
            raise ConfigError(f"unknown op {op!r} (choose from {', '.join(CASES)}, or all)")
    ops = list(dict.fromkeys(ops))
    if config.sweep == "hidden" and any(op not in NORM_OPS for op in ops):
        raise ConfigError(f"--sweep hidden applies to the norms only ({', '.join(NORM_OPS)}), got "
                          f"{', '.join(op for op in ops if op not in NORM_OPS)}")
    if config.providers:
        providers = [p for item in config.providers for p in item.split(",") if p]
    else:
        providers = [p for p in PROVIDERS if not (device.type == "cpu" and p == "compile")]
        if device.type == "cpu":
            notes.append("compile: not run by default on CPU (inductor compile time); ask with --providers")
    for p in providers:
        if p not in PROVIDERS:
            raise ConfigError(f"unknown provider {p!r} (choose from {', '.join(PROVIDERS)})")
    providers = list(dict.fromkeys(providers))
    tokens = config.tokens or sizes["tokens"]
    try:
        if config.sweep == "tokens":
            shapes = {op: [] for op in ops}
            for n in sizes["sweep_tokens"]:
                per = shapes_from_config(cfg, tokens=n)
                for op in ops:
                    shapes[op].append(per[op])
        elif config.sweep == "hidden":
            shapes = {op: [dict(shapes_from_config(cfg, tokens=tokens)[op], hidden=h) for h in sizes["sweep_hidden"]]
                      for op in ops}
        else:
            per = shapes_from_config(cfg, tokens=tokens)
            shapes = {op: [per[op]] for op in ops}
    except KeyError as e:
        raise ConfigError(f"--model {model}: the config has no {e.args[0]!r}") from e
    desc.update(name=model, model_type=cfg.get("model_type"), hidden_size=cfg.get("hidden_size"),
                intermediate_size=cfg.get("intermediate_size"), vocab_size=cfg.get("vocab_size"),
                num_attention_heads=cfg.get("num_attention_heads"),
                num_key_value_heads=cfg.get("num_key_value_heads"))
    for p in providers:
        applies = [op for op in ops if p in CASES[op].providers]
        if not applies:
            notes.append(f"{p}: implements none of the requested ops ({', '.join(ops)})")
    if device.type == "cpu":
        notes.append(CPU_NOTE)
    resolved = BenchConfig(ops=ops, model=model, providers=providers, sweep=config.sweep, dtype=config.dtype,
                           tokens=tokens, device=device.type, cuda_graph=config.cuda_graph)
    return resolved, shapes, desc, notes


def run_op_bench(config: BenchConfig, progress: Callable[[str], None] | None = None) -> BenchResult:
    """``tigon bench``: resolve ``config`` (:func:`resolve_bench`) and run :func:`run_bench` on the model's shapes.

    Returns:
        a :class:`BenchResult` with ``model``, ``sweep``, ``config`` and ``notes`` filled in.

    Raises:
        ConfigError: see :func:`resolve_bench`; also when no requested provider is installed and implements one of
            the ops.
    """
    cfg, shapes, desc, notes = resolve_bench(config)
    avail, missing = available_providers(cfg.providers)
    if not any(p in CASES[op].providers for op in cfg.ops for p in avail):
        from .compare import ConfigError

        raise ConfigError("none of the requested providers can run " + ", ".join(cfg.ops) + ": "
                          + ("; ".join(missing) if missing else f"{', '.join(cfg.providers)} implement none of them"))
    result = run_bench(cfg.ops, shapes, cfg.providers, DTYPES[cfg.dtype], torch.device(cfg.device), progress,
                       cuda_graph=cfg.cuda_graph)
    result.model, result.sweep, result.config = desc, cfg.sweep, asdict(cfg)
    result.notes = notes + result.notes
    if any(r.provider == "tigon_inplace" for r in result.rows):
        result.notes.append("tigon_inplace: inplace_backward=True (cross_entropy, swiglu, geglu, glu_linear): the "
                            "gradients are written into the inputs' memory and become their .grad without a copy, as "
                            "inside a model they replace the activations they were computed from; repeated calls "
                            "therefore run on overwritten inputs (same work, other values).")
    if cfg.cuda_graph:
        result.notes.append("cuda_graph: fwd and fwd_bwd are CUDA-graph replays (triton.testing.do_bench_cudagraph): "
                            "kernel time without the host's launch and autograd cost; bwd rows are still timed "
                            "with events around an eager backward. Small inputs rotate among several sets "
                            f"(together >= {ROTATE_L2_MULTIPLE} x the L2 cache), since replays do not flush it. "
                            "Providers that wait on the host during a call (Liger's cross-entropy: .item()) cannot "
                            "be captured: their fwd and fwd_bwd are their kernels' summed durations per call "
                            "(torch.profiler; the gaps between kernels left out).")
    if any(r.provider == "liger" for r in result.rows):
        result.notes.append("liger writes the cross-entropy gradient into the logits (compare with tigon_inplace) "
                            "and rotates q/k of rope in place when their layout allows.")
    return result


def speedups(result: BenchResult | dict, mode: str = "fwd_bwd", baseline: str = "eager") -> dict:
    """``{(op, shape_json, provider): baseline_ms / provider_ms}`` for the rows of ``mode`` (None if not timed)."""
    rows = result["rows"] if isinstance(result, dict) else [asdict(r) for r in result.rows]
    base = {(r["op"], json.dumps(r["shape"], sort_keys=True)): r["ms"] for r in rows
            if r["provider"] == baseline and r["mode"] == mode}
    out = {}
    for r in rows:
        if r["mode"] != mode:
            continue
        key = (r["op"], json.dumps(r["shape"], sort_keys=True))
        b = base.get(key)
        out[key + (r["provider"],)] = b / r["ms"] if b and r["ms"] else None
    return out
