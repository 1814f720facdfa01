"""The instrumentation of ``tigon profile``'s training step: ``record_function`` ranges around a model's parts and
the classification of the profiled events into the step's categories; and the step split into parts
(:class:`StepParts`) for the host's issue time (:func:`step_issue`). See :mod:`tigon.workflows.profile`.

Device time is read from the kernels each op launched (``FunctionEvent.kernels``), never from a
``record_function`` range: on CUDA a range also gets a device-side copy (a ``gpu_user_annotation`` spanning the
kernels launched inside it) that the profiler links to it as if it were a kernel, so reading a range's "self
device time" counts its kernels a second time (nested ranges, e.g. ``tigon.cat/optimizer`` around
``Optimizer.step#AdamW.step``, a third). The device's busy time is the union of its kernels' intervals.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
from collections.abc import Callable
from typing import Any

import torch

from ..ops import CATEGORIES as OP_CATEGORIES
from ._train import param_dtype, step_inputs
from .timing import DeviceHold, IssueTime, issue_time, sync_points

HOST_ROUNDS = 3
"""Clean rounds of the instrumented steps that measure the host's issue time (:func:`step_issue`)."""

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

        pre.tigon_observer = post.tigon_observer = True  # ranges only: the fused LM-head loss may skip the head
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


def layers_holder(model: torch.nn.Module) -> torch.nn.Module | None:
    """The module of a causal LM that holds its decoder layers as a ``layers`` ``nn.ModuleList``: its backbone
    (``get_decoder()``, else its ``model``), or the backbone's ``model`` where a vision-language model's decoder is a
    causal LM of its own (Llama 4's ``language_model``, whose ``get_decoder()`` is itself); None when neither has
    one."""
    backbone = model.get_decoder() if hasattr(model, "get_decoder") else getattr(model, "model", None)
    for m in (backbone, getattr(backbone, "model", None)):
        if isinstance(getattr(m, "layers", None), torch.nn.ModuleList):
            return m
    return None


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The decoder layers of a causal LM: the ``layers`` of :func:`layers_holder`, else its largest
    ``nn.ModuleList`` ([] when it has none)."""
    holder = layers_holder(model)
    if holder is not None:
        return list(holder.layers)
    lists = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList)]
    return list(max(lists, key=len)) if lists else []


class StepParts:
    """Splits a training step into parts for :class:`tigon.workflows.timing.IssueTimer`, so that no part
    launches more kernels than the launch queue holds: while ``timer`` is set, each decoder layer's forward
    begins a part (``"forward: layer i"``, a forward pre-hook) and so does its backward (``"backward: layer i"``,
    a hook on the gradient of the layer's output, which autograd runs right before the layer's backward). The
    step marks its own first part and the optimizer's. ``remove()`` undoes the hooks."""

    def __init__(self, model: torch.nn.Module):
        self.timer = None
        self.layers = decoder_layers(model)
        self._handles = []
        for i, layer in enumerate(self.layers):
            self._handles.append(layer.register_forward_pre_hook(functools.partial(self._forward, i)))
            self._handles.append(layer.register_forward_hook(functools.partial(self._output, i)))

    def _mark(self, label: str) -> None:
        if self.timer is not None:
            self.timer.mark(label)

    def _forward(self, i, module, args) -> None:
        self._mark(f"forward: layer {i}")

    def _output(self, i, module, args, output) -> None:
        if self.timer is None:
            return
        out = output if isinstance(output, torch.Tensor) else next(
            (t for t in (output if isinstance(output, (tuple, list)) else ()) if isinstance(t, torch.Tensor)), None)
        if out is not None and out.requires_grad:
            out.register_hook(lambda grad: self._mark(f"backward: layer {i}"))

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()


def _module_category(m: torch.nn.Module) -> str | None:
    name = type(m).__name__
    if type(m).__module__.startswith("peft.tuners.lora") and hasattr(m, "lora_A"):
        # PEFT's own LoRA layer: a range around it (base matmul and adapter). A layer tigon.patch fused gets none
        # (hooks would make its MLP call it on its own): its node's ops are named after it (_is_lora)
        from ..integrations.marks import tigon_mark

        return "lora" if tigon_mark(m.__dict__.get("forward")) is None else None
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


def _is_lora(names: list[str]) -> bool:
    """Whether an op runs inside one of Tigon's LoRA nodes (``LoRALinearFunction``, ``LoRAGLUMLPFunction``, ...,
    forward or ``...Backward``)."""
    return any(n.startswith("LoRA") and "Function" in n for n in names)


def _is_tigon_rope(names: list[str]) -> bool:
    """Whether an op runs inside Tigon's rotary node (``RoPEFunction``, its backward, the ``tigon::rope`` custom op):
    a patched attention calls it directly, outside the wrapped ``apply_rotary_pos_emb`` that marks the original."""
    return any(n.startswith(("RoPEFunction", "tigon::rope")) for n in names)


def _category(range_cat: str | None, names: list[str]) -> str:
    if range_cat in ("lm_head_loss", "optimizer", "norm", "rotary"):
        return range_cat
    if range_cat == "lora" or _is_lora(names):
        return "lora"
    if _is_tigon_rope(names):
        return "rotary"
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


def _device_spans(events) -> list[tuple[float, float]]:
    """The (start, end) intervals of the device's kernels, copies and sets in ``events``, sorted (ranges'
    device-side copies left out)."""
    ranges = {e.name for e in events if not _is_device(e) and is_annotation(e)}
    return sorted((e.time_range.start, e.time_range.end) for e in events
                  if _is_device(e) and not getattr(e, "is_user_annotation", False) and e.name not in ranges
                  and not e.name.startswith(ANNOTATION_PREFIXES))


def device_busy_us(events) -> float:
    """The device's busy time in ``events`` (``prof.events()``), µs: the union of the intervals of its kernels,
    copies and sets (ranges' device-side copies left out), so work on overlapping streams counts once."""
    busy, end = 0.0, float("-inf")
    for s, t in _device_spans(events):
        if t <= end:
            continue
        busy += t - max(s, end)
        end = t
    return busy


def device_op_count(events) -> int:
    """How many kernels, copies and sets the device ran in ``events``: each took a slot of the launch queue."""
    return len(_device_spans(events))


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


# ----------------------------------------------------------------------------------------------------------------
# the training step, as the workflows run it, and its issue time


def make_step(model: torch.nn.Module, lr: float, optimizer_range: Callable[[], Any] | None = None):
    """``step(batch, timer=None)``: one training step of ``model`` as :func:`tigon.workflows._train.train` runs it
    (forward with labels, backward, AdamW step, zero_grad with ``set_to_none``) on a batch already on the model's
    device (token ids, or :func:`tigon.workflows._train.step_inputs`' dict), on a new AdamW; the optimizer runs
    inside ``optimizer_range()`` when given (a context manager); ``timer`` (an
    :class:`~tigon.workflows.timing.IssueTimer`) gets the parts ``"forward: embedding"`` (first) and
    ``"optimizer"`` (last, stopped)."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr)

    def step(batch, timer=None) -> None:
        if timer is not None:
            timer.start("forward: embedding")
        loss = model(**step_inputs(batch), use_cache=False).loss
        loss.backward()
        if timer is not None:
            timer.mark("optimizer")
        with optimizer_range() if optimizer_range is not None else contextlib.nullcontext():
            opt.step()
            opt.zero_grad(set_to_none=True)
        if timer is not None:
            timer.stop()

    return step


def step_issue(model: torch.nn.Module, batches: list[torch.Tensor], *, device: torch.device, lr: float,
               warmup: int = 2, rounds: int = HOST_ROUNDS) -> tuple[IssueTime, list[str]]:
    """The host's time to issue a training step of ``model`` at full size, and the device's time to run it.

    Method (:func:`tigon.workflows.timing.issue_time`): the step (as :func:`tigon.workflows._train.train` runs it,
    on a new AdamW, after ``warmup`` untimed steps) is split into parts that each launch fewer kernels than the
    launch queue holds (:class:`tigon.workflows.profile_events.StepParts`: each decoder layer's forward and
    backward, the embedding, the optimizer); before each part the device is synchronised and held busy by a
    ``torch.cuda._sleep`` that outlasts the part's issue (calibrated from a run without it, grown when the host
    catches up). A part's host time is the wall time (``time.perf_counter``) until the next part begins, with no
    synchronisation inside; its device time the CUDA events' time after the sleep. A part where the host catches
    up with the device whatever the sleep waits for it (a sync inside the step, a full launch queue): it is
    reported (``IssueTime.waited``) and counted with its wall time without the sleep. The step's syncs are also
    named by ``torch.cuda.set_sync_debug_mode("warn")`` during one untimed step (the second value). On a CPU
    nothing is held: the parts' wall time, no device time, no syncs.

    Returns:
        (:class:`~tigon.workflows.timing.IssueTime` in ms, the sync warnings as ``"file:line: message"``).
    """
    step, hold = make_step(model, lr), DeviceHold(device)
    turn = itertools.cycle([step_inputs(b, device, param_dtype(model)) for b in batches])
    for _ in range(warmup):
        step(next(turn))
    hold.sync()
    syncs = sync_points(lambda: step(next(turn)), device)
    parts = StepParts(model)

    def run(timer) -> None:
        parts.timer = timer
        try:
            step(next(turn), timer)
        finally:
            parts.timer = None

    try:
        return issue_time(run, hold, rounds=rounds), syncs
    finally:
        parts.remove()
