"""The profiler side of ``tigon profile``: ``record_function`` ranges around a model's parts, and the
classification of the profiled events into the step's categories (see :mod:`tigon.workflows.profile`).

Device time is read from the kernels each op launched (``FunctionEvent.kernels``), never from a
``record_function`` range: on CUDA a range also gets a device-side copy (a ``gpu_user_annotation`` spanning the
kernels launched inside it) that the profiler links to it as if it were a kernel, so reading a range's "self
device time" counts its kernels a second time (nested ranges, e.g. ``tigon.cat/optimizer`` around
``Optimizer.step#AdamW.step``, a third). The device's busy time is the union of its kernels' intervals.
"""

from __future__ import annotations

import functools

import torch

from ..ops import CATEGORIES as OP_CATEGORIES

CATEGORIES = ("matmul", "attention", *OP_CATEGORIES, "optimizer", "other")
"""The step's categories: the ones Tigon's ops replace (:data:`tigon.ops.CATEGORIES`) and the rest."""

RANGE = "tigon.cat/"
_BWD = "autograd::engine::evaluate_function: "
_MATMUL_OPS = {"aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear", "aten::baddbmm",
               "aten::addmv", "aten::mv", "aten::_scaled_mm", "aten::addbmm"}
_MATMUL_NODES = ("MmBackward", "AddmmBackward", "BmmBackward", "LinearBackward", "MvBackward", "BaddbmmBackward",
                 "AddmvBackward", "MatmulBackward")
_ATTENTION_KEYS = ("scaled_dot_product", "scaleddotproduct", "flash_attention", "flashattention",
                   "efficient_attention", "efficientattention", "cudnn_attention", "cudnnattention")


class Annotator:
    """Forward hooks that open a ``tigon.cat/<category>`` range around the model's parts; ``remove()`` undoes."""

    def __init__(self, model: torch.nn.Module):
        self._stack: list = []
        self._handles = []
        self._rotary: tuple | None = None
        backbone = model.get_decoder() if hasattr(model, "get_decoder") else getattr(model, "model", None)
        head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
        for m in model.modules():
            if m is model:
                cat = "lm_head_loss"   # the LM's own forward minus the backbone: LM head, logits cast, loss
            elif m is backbone:
                cat = "model"
            elif m is head:
                cat = "lm_head_loss"
            else:
                cat = _module_category(m)
            if cat:
                self._hook(m, cat)
        self._wrap_rotary(model)

    def _hook(self, m: torch.nn.Module, cat: str) -> None:
        def pre(module, args, cat=cat):
            rf = torch.profiler.record_function(RANGE + cat)
            rf.__enter__()
            self._stack.append(rf)

        def post(module, args, output):
            if self._stack:
                self._stack.pop().__exit__(None, None, None)

        self._handles.append(m.register_forward_pre_hook(pre))
        try:
            self._handles.append(m.register_forward_hook(post, always_call=True))
        except TypeError:  # older torch: no always_call
            self._handles.append(m.register_forward_hook(post))

    def _wrap_rotary(self, model: torch.nn.Module) -> None:
        from ..integrations.families import rotary_function

        found = rotary_function(model)
        if found is None:
            return
        mod, name = found
        orig = getattr(mod, name, None)
        if callable(orig):
            @functools.wraps(orig)
            def rotary(*args, __orig=orig, **kwargs):
                with torch.profiler.record_function(RANGE + "rotary"):
                    return __orig(*args, **kwargs)

            setattr(mod, name, rotary)
            self._rotary = (mod, name, orig, rotary)

    def close_open_ranges(self) -> None:
        while self._stack:
            self._stack.pop().__exit__(None, None, None)

    def remove(self) -> None:
        self.close_open_ranges()
        for h in self._handles:
            h.remove()
        self._handles.clear()
        if self._rotary is not None:
            mod, name, orig, wrapper = self._rotary
            if getattr(mod, name) is wrapper:
                setattr(mod, name, orig)
            self._rotary = None


def _module_category(m: torch.nn.Module) -> str | None:
    name = type(m).__name__
    if name.endswith(("RMSNorm", "LayerNorm")) or isinstance(m, (torch.nn.LayerNorm, getattr(torch.nn, "RMSNorm",
                                                                                             torch.nn.LayerNorm))):
        return "norm"
    if name.endswith("Attention"):
        return "attention"
    if name.endswith("MLP"):
        return "mlp"
    return None


# ----------------------------------------------------------------------------------------------------------------
# classification of profiler events


def _is_matmul(names: list[str]) -> bool:
    return any(n in _MATMUL_OPS or n.startswith(_MATMUL_NODES) for n in names)


def _is_attention(names: list[str]) -> bool:
    return any(k in n.lower() for n in names for k in _ATTENTION_KEYS)


def _category(range_cat: str | None, names: list[str]) -> str:
    if range_cat in ("lm_head_loss", "optimizer", "norm", "rotary"):
        return range_cat
    if _is_matmul(names):
        return "matmul"
    if _is_attention(names):
        return "attention"
    if range_cat == "mlp":
        return "activation"
    if range_cat == "attention":
        return "attention"
    return "other"


ANNOTATION_PREFIXES = (RANGE, "ProfilerStep#", "Optimizer.")
"""Names of ``record_function`` ranges in a profiled step: Tigon's, the profiler's step, torch.optim's."""


def _is_device(e) -> bool:
    return not str(getattr(e, "device_type", "DeviceType.CPU")).endswith("CPU")


def is_annotation(e) -> bool:
    """Whether profiler event ``e`` is a ``record_function`` range rather than an op (see the module docstring)."""
    return bool(getattr(e, "is_user_annotation", False)) or e.name.startswith(ANNOTATION_PREFIXES)


def own_time_us(e, cuda: bool) -> float:
    """The time op event ``e`` accounts for itself, µs: on CUDA the kernels it launched (not its children's; a
    range's device-side copy, a "kernel" named like the range, left out), on CPU its self CPU time. 0 for a range:
    its own CPU time is Python outside any op, which the step's table shows apart."""
    if is_annotation(e):
        return 0.0
    if not cuda:
        return float(e.self_cpu_time_total or 0)
    return float(sum(k.duration for k in getattr(e, "kernels", ()) or () if k.name != e.name))


def device_busy_us(events) -> float:
    """The device's busy time in ``events`` (``prof.events()``), µs: the union of the intervals of its kernels,
    copies and sets (ranges' device-side copies left out), so work on overlapping streams counts once."""
    ranges = {e.name for e in events if not _is_device(e) and is_annotation(e)}
    spans = sorted((e.time_range.start, e.time_range.end) for e in events
                   if _is_device(e) and not getattr(e, "is_user_annotation", False) and e.name not in ranges
                   and not e.name.startswith(ANNOTATION_PREFIXES))
    busy, end = 0.0, float("-inf")
    for s, t in spans:
        if t <= end:
            continue
        busy += t - max(s, end)
        end = t
    return busy


def categorize(events, cuda: bool) -> dict[str, float]:
    """Time (µs) per category of profiler ``events`` (``prof.events()``): each CPU-side event's :func:`own_time_us`
    (kernels on CUDA, self CPU time on CPU) goes to the category of its innermost range, refined by its name
    (:mod:`tigon.workflows.profile`); backward ops follow the forward op that created their autograd node.
    """
    cpu_events = [e for e in events if not _is_device(e)]
    cpu_events.sort(key=lambda e: e.time_range.start)

    def info(e):
        """(backward node event or None, innermost range category or None, names from e up to the range)."""
        names, node, rng = [], None, None
        p = e
        while p is not None:
            n = p.name
            if n.startswith(_BWD):
                node = p
                break
            if n.startswith(RANGE):
                rng = rng or n[len(RANGE):]
                if rng:
                    break
            names.append(n)
            p = p.cpu_parent
        return node, rng, names

    fwd_seq: dict[int, str | None] = {}
    infos = []
    for e in cpu_events:
        node, rng, names = info(e)
        infos.append((e, node, rng, names))
        if node is None and getattr(e, "sequence_nr", -1) is not None and e.sequence_nr >= 0 \
                and not e.name.startswith(RANGE):
            fwd_seq[e.sequence_nr] = rng  # the last op with this number is the one that created the node
    totals = {c: 0.0 for c in CATEGORIES}
    for e, node, rng, names in infos:
        t = own_time_us(e, cuda)
        if t <= 0:
            continue
        if node is not None:
            node_name = node.name[len(_BWD):]
            cat = _category(fwd_seq.get(node.sequence_nr), [node_name, *names])
        else:
            cat = _category(rng if rng != "model" else None, names)
        totals[cat] += t
    return totals


