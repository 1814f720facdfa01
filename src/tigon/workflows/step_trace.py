"""One training step's GPU kernels, summed by kernel name and by kind, from a ``torch.profiler`` trace: what a
``tigon bench --e2e --kernel-summary`` row carries to compare providers side by side (where a patched model spends
its device time, e.g. under gradient checkpointing).

Kinds are read from kernel names: ``matmul`` (cuBLAS / CUTLASS / nvjet GEMMs), ``attention`` (flash / memory-efficient
/ cuDNN attention), ``triton`` (Triton kernels: Tigon's, Liger's, Inductor's), ``copy_fill`` (memcpy / memset / fill
and copy kernels), ``other`` (the rest: ATen element-wise and reduction kernels, optimizer).
"""

from __future__ import annotations

import re
from collections import defaultdict
from typing import Any

KINDS = (
    ("matmul", re.compile(r"gemm|nvjet|cutlass|xmma|cublas|wgmma|matmul", re.I)),
    ("attention", re.compile(r"flash|fmha|attention|attn|sdpa|cudnn", re.I)),
    ("copy_fill", re.compile(r"memcpy|memset|fill|copy_kernel|CatArray|elementwise_kernel_with_index", re.I)),
)
"""(kind, pattern) in the order they are tried; a kernel of none of them is ``triton`` when it was launched through
Triton (its name has no ATen namespace) and ``other`` otherwise."""


def kind_of(name: str) -> str:
    """The kind (module docstring) of a kernel named ``name``."""
    for kind, pattern in KINDS:
        if pattern.search(name):
            return kind
    if "at::" in name or "void " in name or "::" in name:
        return "other"
    return "triton"


MATMUL_OPS = frozenset({"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_scaled_mm"})
"""The ATen ops whose kernels :func:`summarize` also sums per input shapes (``matmul_ops``)."""


def summarize(events, top: int = 25) -> dict[str, Any]:
    """``{"device_ms", "by_kind": {kind: ms}, "top": [{"name", "kind", "calls", "ms"}], "matmul_ops": [{"op",
    "shapes", "calls", "ms", "kernels"}]}`` of a profile's events (``prof.events()``): the CUDA kernels summed by
    name, the ``top`` longest first; and, when the profile recorded CPU ops with their shapes, the kernels each matmul
    op (:data:`MATMUL_OPS`) launched, summed per (op, input shapes), longest first. Times in ms."""
    per = defaultdict(lambda: [0, 0.0])
    mm = defaultdict(lambda: [0, 0.0, set()])
    for e in events:
        if getattr(e, "name", None) in MATMUL_OPS and getattr(e, "kernels", None):
            slot = mm[(e.name, str(getattr(e, "input_shapes", "")))]
            slot[0] += 1
            slot[1] += sum(k.duration for k in e.kernels) * 1e-3
            slot[2].update(k.name[:60] for k in e.kernels)
        if getattr(e, "device_type", None) is None or str(e.device_type).split(".")[-1] != "CUDA":
            continue
        if getattr(e, "is_user_annotation", False):
            continue
        slot = per[e.name]
        slot[0] += 1
        slot[1] += e.time_range.elapsed_us() * 1e-3
    by_kind: dict[str, float] = defaultdict(float)
    for name, (_, ms) in per.items():
        by_kind[kind_of(name)] += ms
    rows = sorted(({"name": n[:120], "kind": kind_of(n), "calls": c, "ms": round(ms, 3)}
                   for n, (c, ms) in per.items()), key=lambda r: -r["ms"])
    ops = sorted(({"op": op, "shapes": shapes, "calls": c, "ms": round(ms, 3), "kernels": sorted(names)}
                  for (op, shapes), (c, ms, names) in mm.items()), key=lambda r: -r["ms"])
    return {"device_ms": round(sum(by_kind.values()), 3), "by_kind": {k: round(v, 3) for k, v in by_kind.items()},
            "top": rows[:top], "matmul_ops": ops}


class StepTracer:
    """Profile one step of a training loop driven by a per-step callback: :meth:`after_step` with the number of the
    step just finished starts the profiler after step ``at - 1`` and stops it after step ``at``; :attr:`summary`
    then holds :func:`summarize` of that step (None before)."""

    def __init__(self, at: int):
        self.at = at
        self.summary: dict[str, Any] | None = None
        self._prof = None

    def after_step(self, step: int) -> None:
        from torch.profiler import ProfilerActivity, profile

        if step == self.at - 1 and self._prof is None:
            self._prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True)
            self._prof.start()
        elif step == self.at and self._prof is not None:
            import torch

            if torch.cuda.is_available():
                torch.cuda.synchronize()
            self._prof.stop()
            self.summary = summarize(self._prof.events())
            self._prof = None
