"""Speed and peak memory of each op, per provider, on a model's shapes (library code behind ``tigon bench``).

Providers: ``eager`` (the original PyTorch code, as Hugging Face writes it), ``compile`` (torch.compile of
eager), ``tigon``, and the peers ``liger`` (Liger-Kernel) and ``cce`` (Apple's Cut Cross-Entropy, fused linear
cross-entropy only) when installed; missing ones are skipped with a note.

Timing: on CUDA, ``triton.testing.do_bench`` (CUDA events; median with 20/80 percentiles) on fresh random
inputs for every (op, provider, shape); on CPU a wall-clock median (the numbers then only show that the path
runs). Modes: ``fwd`` (training forward, inputs require grad) and ``fwd_bwd``; ``bwd`` is reported as their
difference. Peak extra memory: ``torch.cuda.max_memory_allocated`` during one forward+backward minus the
memory held before it (inputs and upstream gradient), in bytes; the gradients produced count as extra.

Ceilings measured in the same run (see :func:`measure_ceilings`): device-to-device copy bandwidth (bytes read
+ written / time) and the bf16 matmul rate (8192^3). Memory-bound ops report GB/s over their *minimal* bytes
(below, per op; bf16 = 2 bytes) and % of the copy bandwidth; the fused linear cross-entropy reports TFLOP/s
over its matmul FLOPs and % of the matmul rate.
"""

from __future__ import annotations

import importlib.util
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Callable

import torch

from .. import functional as F
from ..reference import glu as ref_glu
from ..reference import rms_norm as ref_rms
from ..reference import rope as ref_rope

PROVIDERS = ("eager", "compile", "tigon", "liger", "cce")


@dataclass
class BenchRow:
    """One measurement. Times in ms; bandwidth in GB/s (1e9 bytes/s); peak_extra_bytes in bytes."""

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
    """Everything one ``tigon bench`` run measured; ``as_dict()`` is the JSON written by the CLI."""

    device: str
    ceilings: dict
    rows: list[BenchRow] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {"device": self.device, "ceilings": self.ceilings, "skipped": self.skipped,
                "rows": [asdict(r) for r in self.rows]}


# ----------------------------------------------------------------------------------------------- timing
def _time(fn: Callable[[], object], device: torch.device, grad_to_none=None) -> tuple[float, float, float]:
    """(median, p20, p80) in ms."""
    if device.type == "cuda":
        import triton.testing

        q = triton.testing.do_bench(fn, warmup=25, rep=100, grad_to_none=grad_to_none, quantiles=[0.5, 0.2, 0.8])
        return float(q[0]), float(q[1]), float(q[2])
    fn()
    samples = []
    for _ in range(3):
        if grad_to_none:
            for t in grad_to_none:
                t.grad = None
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e3)
    samples.sort()
    return statistics.median(samples), samples[0], samples[-1]


def measure_ceilings(device: torch.device) -> dict:
    """Copy bandwidth (GB/s, bytes read + written) and bf16 matmul rate (TFLOP/s), measured now on ``device``."""
    if device.type != "cuda":
        return {"copy_gbps": None, "matmul_tflops": None, "note": "not measured on CPU"}
    n = 1 << 29  # 1 GiB of bf16
    src = torch.randn(n, device=device, dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    ms, _, _ = _time(lambda: dst.copy_(src), device)
    copy = 2 * n * 2 / (ms * 1e-3) / 1e9
    del src, dst
    m = 8192
    a = torch.randn(m, m, device=device, dtype=torch.bfloat16)
    b = torch.randn(m, m, device=device, dtype=torch.bfloat16)
    ms, _, _ = _time(lambda: a @ b, device)
    return {"copy_gbps": copy, "matmul_tflops": 2 * m**3 / (ms * 1e-3) / 1e12}


# ----------------------------------------------------------------------------------------------- cases
@dataclass
class OpCase:
    """How to benchmark one op: inputs from a shape, providers, and the minimal bytes / FLOPs of a mode."""

    name: str
    make: Callable[[dict, torch.dtype, torch.device], dict]
    providers: dict[str, Callable[..., object]]
    grads: tuple[str, ...]
    min_bytes: Callable[[dict, int, str], int] | None = None
    flops: Callable[[dict, str], float] | None = None


def _rand(shape, dtype, device, grad=False, scale=1.0):
    return (torch.randn(shape, device=device, dtype=dtype) * scale).requires_grad_(grad)


def _liger(attr: str):
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


def _ce_inputs(s, dtype, device):
    t = torch.randint(0, s["vocab"], (s["tokens"],), device=device)
    t[torch.rand(s["tokens"], device=device) < 0.1] = -100
    return {"logits": _rand((s["tokens"], s["vocab"]), dtype, device, True, 2.0), "target": t}


def _flce_inputs(s, dtype, device):
    t = torch.randint(0, s["vocab"], (s["tokens"],), device=device)
    t[torch.rand(s["tokens"], device=device) < 0.1] = -100
    return {"hidden": _rand((s["tokens"], s["hidden"]), dtype, device, True),
            "weight": _rand((s["vocab"], s["hidden"]), dtype, device, True, s["hidden"] ** -0.5),
            "target": t, "softcap": s.get("softcap")}


def _eager_flce(hidden, weight, target, softcap=None):
    logits = (hidden @ weight.T).float()
    if softcap:
        logits = softcap * torch.tanh(logits / softcap)
    return torch.nn.functional.cross_entropy(logits, target, ignore_index=-100)


def _cce(hidden, weight, target, softcap=None):
    from cut_cross_entropy import linear_cross_entropy

    return linear_cross_entropy(hidden, weight, target, softcap=softcap)


def _liger_flce(hidden, weight, target, softcap=None):
    from liger_kernel.transformers import functional as LF

    return LF.liger_fused_linear_cross_entropy(hidden, weight, target, softcap=softcap)


_EPS = 1e-6
CASES: dict[str, OpCase] = {
    # rms_norm: fwd reads x, writes y; bwd reads x, dy, writes dx  -> fwd+bwd 5*M*N elements.
    "rms_norm": OpCase(
        "rms_norm", _norm_inputs,
        {"eager": lambda x, w: ref_rms.rms_norm(x, w, _EPS), "tigon": lambda x, w: F.rms_norm(x, w, _EPS),
         "liger": lambda x, w: _liger("liger_rms_norm")(x, w, _EPS)},
        ("x", "w"),
        min_bytes=lambda s, e, m: (2 if m == "fwd" else 5) * s["tokens"] * s["hidden"] * e),
    # layer_norm: same byte count as rms_norm.
    "layer_norm": OpCase(
        "layer_norm", _ln_inputs,
        {"eager": lambda x, w, b: torch.nn.functional.layer_norm(x, (x.shape[-1],), w, b, 1e-5),
         "tigon": lambda x, w, b: F.layer_norm(x, w, b, 1e-5),
         "liger": lambda x, w, b: _liger("liger_layer_norm")(x, w, b, 1e-5)},
        ("x", "w", "b"),
        min_bytes=lambda s, e, m: (2 if m == "fwd" else 5) * s["tokens"] * s["hidden"] * e),
    # rope: fwd reads q, k and writes them rotated; bwd the same -> fwd+bwd 4*(q+k) elements (cos/sin ignored).
    "rope": OpCase(
        "rope", _rope_inputs,
        {"eager": lambda q, k, cos, sin: ref_rope.rope(q, k, cos, sin),
         "tigon": lambda q, k, cos, sin: F.rope(q, k, cos, sin),
         "liger": lambda q, k, cos, sin: _liger("liger_rope")(q, k, cos, sin)},
        ("q", "k"),
        min_bytes=lambda s, e, m: (2 if m == "fwd" else 4) * s["batch"] * s["seq"] * s["head_dim"]
        * (s["heads"] + s["kv_heads"]) * e),
    # swiglu / geglu: fwd reads gate, up, writes out; bwd reads gate, up, dout, writes dgate, dup -> 8*M*N.
    "swiglu": OpCase(
        "swiglu", _glu_inputs,
        {"eager": ref_glu.swiglu, "tigon": F.swiglu, "liger": lambda gate, up: _liger("liger_swiglu")(gate, up)},
        ("gate", "up"),
        min_bytes=lambda s, e, m: (3 if m == "fwd" else 8) * s["tokens"] * s["intermediate"] * e),
    "geglu": OpCase(
        "geglu", _glu_inputs,
        {"eager": lambda gate, up: ref_glu.geglu(gate, up, "tanh"), "tigon": lambda gate, up: F.geglu(gate, up, "tanh"),
         "liger": lambda gate, up: _liger("liger_geglu")(gate, up)},
        ("gate", "up"),
        min_bytes=lambda s, e, m: (3 if m == "fwd" else 8) * s["tokens"] * s["intermediate"] * e),
    # cross_entropy: fwd reads the logits; fwd+bwd reads them once and writes their gradient -> 2*N*V.
    "cross_entropy": OpCase(
        "cross_entropy", _ce_inputs,
        {"eager": lambda logits, target: torch.nn.functional.cross_entropy(logits.float(), target),
         "tigon": lambda logits, target: F.cross_entropy(logits, target),
         "liger": lambda logits, target: _liger("liger_cross_entropy")(logits, target)},
        ("logits",),
        min_bytes=lambda s, e, m: (1 if m == "fwd" else 2) * s["tokens"] * s["vocab"] * e),
    # fused linear cross-entropy: matmul-bound; fwd 2*N*H*V FLOPs, fwd+bwd three matmuls, 6*N*H*V.
    "fused_linear_cross_entropy": OpCase(
        "fused_linear_cross_entropy", _flce_inputs,
        {"eager": _eager_flce,
         "tigon": lambda hidden, weight, target, softcap=None: F.fused_linear_cross_entropy(
             hidden, weight, target, softcap=softcap),
         "liger": _liger_flce, "cce": _cce},
        ("hidden", "weight"),
        flops=lambda s, m: (2 if m == "fwd" else 6) * s["tokens"] * s["hidden"] * s["vocab"]),
}
for _case in CASES.values():  # torch.compile of the eager code is always a provider
    _case.providers["compile"] = _case.providers["eager"]


def shapes_from_config(cfg: dict, tokens: int = 16384, batch: int = 4) -> dict[str, dict]:
    """Representative shapes per op from an HF config dict (hidden_size, intermediate_size, heads, vocab...)."""
    H = cfg["hidden_size"]
    heads = cfg["num_attention_heads"]
    D = cfg.get("head_dim") or H // heads
    return {
        "rms_norm": {"tokens": tokens, "hidden": H},
        "layer_norm": {"tokens": tokens, "hidden": H},
        "rope": {"batch": batch, "seq": max(1, tokens // batch), "heads": heads,
                 "kv_heads": cfg.get("num_key_value_heads", heads), "head_dim": D},
        "swiglu": {"tokens": tokens, "intermediate": cfg["intermediate_size"]},
        "geglu": {"tokens": tokens, "intermediate": cfg["intermediate_size"]},
        "cross_entropy": {"tokens": max(1, tokens // 2), "vocab": cfg["vocab_size"]},
        "fused_linear_cross_entropy": {"tokens": max(1, tokens // 2), "hidden": H, "vocab": cfg["vocab_size"],
                                       "softcap": cfg.get("final_logit_softcapping")},
    }


def available_providers(requested) -> tuple[list[str], list[str]]:
    """Split ``requested`` into (available, notes about the missing ones)."""
    ok, notes = [], []
    for p in requested:
        if p not in PROVIDERS:
            raise ValueError(f"unknown provider {p!r}; choose from {PROVIDERS}")
        mod = {"liger": "liger_kernel", "cce": "cut_cross_entropy"}.get(p)
        if mod and importlib.util.find_spec(mod) is None:
            notes.append(f"{p}: not installed ({mod}), skipped")
            continue
        ok.append(p)
    return ok, notes


def _fn_for(case: OpCase, provider: str, compiled: dict):
    fn = case.providers[provider]
    if provider == "compile":
        if case.name not in compiled:
            compiled[case.name] = torch.compile(fn, dynamic=False)
        fn = compiled[case.name]
    return fn


def bench_one(case: OpCase, provider: str, shape: dict, dtype: torch.dtype, device: torch.device,
              ceilings: dict, compiled: dict, modes=("fwd", "fwd_bwd")) -> list[BenchRow]:
    """Time one (op, provider, shape) in each mode and measure its peak extra memory."""
    fn = _fn_for(case, provider, compiled)
    rows: list[BenchRow] = []
    inputs = case.make(shape, dtype, device)
    leaves = [inputs[k] for k in case.grads]
    out = fn(**inputs)
    out0 = out[0] if isinstance(out, (tuple, list)) else out
    dout = torch.randn_like(out0)

    def fwd():
        return fn(**inputs)

    def fwd_bwd():
        o = fn(**inputs)
        o = o[0] if isinstance(o, (tuple, list)) else o
        o.backward(dout)

    results = {}
    for mode in modes:
        results[mode] = _time(fwd if mode == "fwd" else fwd_bwd, device, grad_to_none=leaves)
    peak = None
    if device.type == "cuda":
        for t in leaves:
            t.grad = None
        del out, out0
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        fwd_bwd()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated(device) - base
    if "fwd" in results and "fwd_bwd" in results:
        results["bwd"] = tuple(max(0.0, a - b) for a, b in zip(results["fwd_bwd"], results["fwd"]))
    for mode, (ms, p20, p80) in results.items():
        row = BenchRow(case.name, provider, dict(shape), str(dtype).replace("torch.", ""), mode, ms, p20, p80,
                       peak_extra_bytes=peak if mode == "fwd_bwd" else None,
                       note="bwd = fwd_bwd - fwd" if mode == "bwd" else "")
        elem = torch.finfo(dtype).bits // 8
        if case.min_bytes and mode != "bwd":
            row.gbps = case.min_bytes(shape, elem, mode) / (ms * 1e-3) / 1e9
            if ceilings.get("copy_gbps"):
                row.pct_copy_bw = 100.0 * row.gbps / ceilings["copy_gbps"]
        if case.flops and mode != "bwd":
            row.tflops = case.flops(shape, mode) / (ms * 1e-3) / 1e12
            if ceilings.get("matmul_tflops"):
                row.pct_matmul = 100.0 * row.tflops / ceilings["matmul_tflops"]
        rows.append(row)
    return rows


def run_bench(ops, shapes: dict[str, list[dict]], providers, dtype=torch.bfloat16, device=None,
              progress: Callable[[str], None] | None = None) -> BenchResult:
    """Benchmark ``ops`` x ``providers`` x shapes. ``shapes[op]`` is a list of shape dicts (a sweep).

    Raises:
        ValueError: an unknown op or provider.
    """
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    avail, notes = available_providers(providers)
    result = BenchResult(str(torch.cuda.get_device_name(device)) if device.type == "cuda" else "cpu",
                         measure_ceilings(device), skipped=notes)
    compiled: dict = {}
    for op in ops:
        if op not in CASES:
            raise ValueError(f"unknown op {op!r}; choose from {tuple(CASES)}")
        case = CASES[op]
        for shape in shapes[op]:
            for p in avail:
                if p not in case.providers:
                    continue
                if progress:
                    progress(f"{op} {p} {shape}")
                try:
                    result.rows.extend(bench_one(case, p, shape, dtype, device, result.ceilings, compiled))
                except Exception as e:  # a provider failing must not stop the run: record it
                    result.rows.append(BenchRow(op, p, dict(shape), str(dtype), "fwd_bwd",
                                                note=f"failed: {type(e).__name__}: {str(e)[:200]}"))
                if device.type == "cuda":
                    torch.cuda.empty_cache()
    return result

