"""The host's and the device's time of whole parts of a model, original and patched: one decoder layer's forward +
backward, and the rest of the model (embedding, rotary tables, masks, final norm, LM head + loss), at the model's
shapes. ``tigon profile`` predicts the patched step's host time from them (:class:`tigon.workflows.predict.HostModel`):

    H' = H + sum over layer groups (layers x (patched layer - original layer)) + (patched rest - original rest)

**Why whole layers.** A replaced op timed alone (:func:`tigon.workflows.timing.call_cost`) misses what it costs
inside the model: autograd's bookkeeping of the custom ``autograd.Function`` s (their Python backward runs on the
autograd thread and holds the GIL, their saved tensors), the integration layer's own Python around the kernels,
the host time of the code between replaced modules. On the H200 (Qwen2.5-0.5B, 24 layers, 4 x 1024, bf16, a
host-bound step) the isolated calls predicted the patched step 13.6% short. A whole layer holds all of it, and a
step is little more than its layers and the rest.

**Method.**

* Layer groups: decoder layers alike (class, ``attention_type`` / ``layer_type``, their children's classes: a
  sliding-window layer of Gemma-2 is not a global one, a dense layer of a MoE model not a sparse one) form a group;
  its first layer is measured and counts for all (:func:`layer_groups`, at most :data:`MAX_LAYER_GROUPS` groups,
  the rest join the largest).
* Inputs: one forward of the model without gradients on a step's batch; a forward pre-hook on each measured layer
  keeps its arguments (hidden states, position embeddings, masks), detached (:func:`capture_layer_inputs`).
* A layer call: the hidden states as a leaf that requires grad, the layer called with the arguments as the model
  called it, the backward of its output with a fixed random upstream gradient into the layer's parameters (their
  gradients cleared before each call, as ``zero_grad(set_to_none=True)`` does).
* The rest: the model's forward with labels and its backward with its decoder layers swapped for an empty
  ``ModuleList`` (:func:`without_layers`).
* Timing: :func:`tigon.workflows.timing.call_cost`, the way the step's ``H`` and ``D`` are measured: groups of
  back-to-back calls, each group issued behind a ``torch.cuda._sleep`` so the host never waits for the device;
  host time ``time.perf_counter``, device time CUDA events. Also the host time with the device not held
  (:func:`unheld_ms`: behind a sleep every launch of a group is pending at once, in a host-bound step almost none
  is; the report holds the prediction from it beside the default's, :data:`HOST_SIDE`). On a CPU: wall time, no
  device time. The same code runs on both.
* Variants (:func:`measure_variants`): the original model, the model under ``tigon.patch(model)``, and for each
  patch keyword ``tigon.patch(model, keyword=False)`` (the per-op advice: what leaving that kind out gives), each
  patched in place and unpatched after; a variant re-measures only the parts where its kind has targets.

**Cost.** One part's measurement is at most ``3 + calls x groups x (2 + rounds + retries)`` forward + backward calls
of it (:func:`tigon.workflows.timing.call_cost` with :data:`LAYER_CALLS` calls x :data:`LAYER_GROUPS` groups, 2
rounds, 2 retries, then :func:`unheld_ms`'s groups: 63 calls; on a CPU 13). Parts measured: ``(groups + 1) x 2`` for
the original and the patched model, plus, per patch keyword, the groups when its kind has targets in the layers and
the rest when it has any outside them: for a Llama-like model (one group; rms_norm, rope, mlp, fused_add_rms_norm,
the LM head + loss) 4 + 6 = 10 parts, about 600 layer-sized calls, ~2 s at Qwen2.5-0.5B's 4 x 1024 and ~15 s at
Llama-3-8B's 4 x 2048 on an H200 (the training step itself runs ~50 and ~900 ms).
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from ._train import param_dtype, step_inputs
from .profile_events import decoder_layers, layers_holder
from .timing import call_cost

MAX_LAYER_GROUPS = 4
"""At most this many distinct decoder layers are measured per variant; further groups join the largest."""
LAYER_CALLS, LAYER_GROUPS, LAYER_ROUNDS = 2, 5, 2
""":func:`tigon.workflows.timing.call_cost`'s calls per group, groups and rounds for one part: 2 layer calls
launch a few hundred kernels, well inside the launch queue."""
ORIGINAL, PATCHED = "original", "patched"
HOST_BASIS = "per_op"
"""Which host change ``tigon profile``'s prediction takes: ``"per_op"`` (the replaced calls' host changes, measured
inside the step where the modules ran: :mod:`tigon.workflows.profile_attrib`) or ``"layers"`` (the whole parts of
this module). The report holds the other beside it. Per op is the default since the H100 measured the whole layers
far from the step on a host-bound model (Qwen2.5-0.5B, 24 layers, 4 x 1024: the original layer alone issued in
6.46 ms against about 4.1 ms a layer inside the step, the patched one in 3.87 against about 4.5: predicted
-69.9% against the measured patched step, per op +13.9%; ``benchmarks/results/h100/README.md``, eighteenth run)."""
HOST_SIDE = "host_ms"
"""Which host time of the parts the prediction uses: ``"host_ms"``, issued behind a sleep kernel as the step's
``H`` is (the default), or ``"unheld_ms"``, issued with the device running along (:func:`unheld_ms`); the report
holds the prediction from the other beside it."""


@dataclass
class LayerGroup:
    """Decoder layers alike: ``key`` (what makes them alike, for the report), ``index`` (the measured layer's
    index), ``count`` (the layers it stands for)."""

    key: str
    index: int
    count: int


def _signature(layer: torch.nn.Module) -> str:
    """The class, the attention / layer type (the layer's own ``attention_type`` / ``layer_type``, else its
    children's: Gemma-2 keeps it on the attention module) and the children's classes of ``layer``."""
    kind = next((str(t) for m in (layer, *layer.children()) for a in ("attention_type", "layer_type")
                 if isinstance(t := getattr(m, a, None), str)), None)
    children = ",".join(type(c).__name__ for c in layer.children())
    return f"{type(layer).__name__}" + (f"[{kind}]" if kind else "") + f"({children})"


def layer_groups(layers: list[torch.nn.Module], max_groups: int = MAX_LAYER_GROUPS) -> list[LayerGroup]:
    """Group ``layers`` by :func:`_signature` (class, attention / layer type, children's classes), in order of first
    appearance; past ``max_groups`` groups, the later groups' layers count with the largest group."""
    groups: dict[str, LayerGroup] = {}
    for i, layer in enumerate(layers):
        sig = _signature(layer)
        if sig in groups:
            groups[sig].count += 1
        else:
            groups[sig] = LayerGroup(sig, i, 1)
    out = list(groups.values())
    if len(out) > max_groups:
        kept, extra = out[:max_groups], sum(g.count for g in out[max_groups:])
        max(kept, key=lambda g: g.count).count += extra
        out = kept
    return out


def _detach(obj):
    if isinstance(obj, torch.Tensor):
        return obj.detach()
    if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
        return tuple(_detach(v) for v in obj)
    if isinstance(obj, list):
        return [_detach(v) for v in obj]
    if isinstance(obj, dict):
        return {k: _detach(v) for k, v in obj.items()}
    return obj


class _Captured(Exception):
    """Raised by :func:`capture_layer_inputs`' hook to end the forward once every layer's inputs are kept."""


def capture_layer_inputs(model: torch.nn.Module, batch, indices: list[int]) -> dict[int, tuple[tuple, dict]]:
    """The arguments the model passes to its decoder layers ``indices`` in a forward on ``batch`` (token ids or
    :func:`tigon.workflows._train.step_inputs`' dict), detached: layer index -> (args, kwargs). The forward runs
    without gradients and stops once every layer of ``indices`` was reached (no LM head, no loss)."""
    layers, held, handles = decoder_layers(model), {}, []
    for i in indices:
        def keep(module, args, kwargs, i=i):
            held.setdefault(i, (_detach(args), _detach(dict(kwargs))))
            if len(held) == len(indices):
                raise _Captured
        handles.append(layers[i].register_forward_pre_hook(keep, with_kwargs=True))
    device = next(model.parameters()).device
    try:
        with torch.no_grad():
            model(**step_inputs(batch, device, param_dtype(model)), use_cache=False)
    except _Captured:
        pass
    finally:
        for h in handles:
            h.remove()
    missing = [i for i in indices if i not in held]
    if missing:
        raise RuntimeError(f"capture_layer_inputs: decoder layers {missing} were not called in the forward")
    return held


def _first_grad_tensor(out) -> torch.Tensor:
    if isinstance(out, torch.Tensor):
        return out
    for t in (out if isinstance(out, (tuple, list)) else getattr(out, "values", lambda: ())()):
        if isinstance(t, torch.Tensor) and t.requires_grad:
            return t
    raise RuntimeError(f"a decoder layer returned no tensor that requires grad ({type(out).__name__})")


def layer_call(layer: torch.nn.Module, args: tuple, kwargs: dict) -> tuple[Callable[[], None], list[torch.Tensor]]:
    """``(fn, leaves)``: ``fn()`` runs one forward + backward of ``layer`` on the captured ``args`` / ``kwargs``
    (:func:`capture_layer_inputs`), its hidden states (``args[0]``, else ``kwargs["hidden_states"]``) a leaf that
    requires grad, the backward of its first output with a fixed random upstream gradient; ``leaves``: the
    tensors whose gradients it forms (the layer's trainable parameters and the hidden states), to clear between
    calls."""
    args, kwargs = tuple(args), dict(kwargs)
    if args:
        x = args[0].detach().clone().requires_grad_(True)
        args = (x, *args[1:])
    else:
        x = kwargs["hidden_states"].detach().clone().requires_grad_(True)
        kwargs["hidden_states"] = x
    dout = torch.randn_like(x)  # a decoder layer's output has its input's shape

    def fn() -> None:
        _first_grad_tensor(layer(*args, **kwargs)).backward(dout)

    return fn, [p for p in layer.parameters() if p.requires_grad] + [x]


@contextlib.contextmanager
def without_layers(model: torch.nn.Module):
    """The model with its backbone's decoder layers (:func:`tigon.workflows.profile_events.layers_holder`) swapped for
    an empty ``ModuleList`` inside the block (put back after). Raises RuntimeError when the backbone has no ``layers``
    ``ModuleList``."""
    backbone = layers_holder(model)
    if backbone is None:
        raise RuntimeError("without_layers: the model's backbone has no `layers` ModuleList")
    layers = backbone.layers
    backbone.layers = torch.nn.ModuleList()
    try:
        yield model
    finally:
        backbone.layers = layers


def rest_call(model: torch.nn.Module, batch) -> tuple[Callable[[], None], list[torch.Tensor]]:
    """``(fn, leaves)``: ``fn()`` runs the forward with labels and the backward of ``model`` on ``batch`` with its
    decoder layers left out (:func:`without_layers`): the embedding, rotary tables, masks, final norm, LM head and
    loss; ``leaves``: the trainable parameters. With a frozen embedding (LoRA: PEFT freezes all but the adapters)
    its output is made to require grad, as in the step the layers' adapters do: the backward then runs through the
    LM head and final norm as there (HF's ``enable_input_require_grads`` does the same)."""
    inputs = step_inputs(batch, next(model.parameters()).device, param_dtype(model))
    emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    frozen = emb is not None and not any(p.requires_grad for p in emb.parameters())
    config = getattr(model, "config", None)
    text = config.get_text_config() if callable(getattr(config, "get_text_config", None)) else config
    # no layers, no routers: a router loss over none (HF's load_balancing_loss_func) raises IndexError
    no_router = {"output_router_logits": False} if getattr(text, "output_router_logits", False) else {}

    def fn() -> None:
        hook = emb.register_forward_hook(lambda m, args, out: out.requires_grad_(True)) if frozen else None
        try:
            with without_layers(model):
                model(**inputs, **no_router, use_cache=False).loss.backward()
        finally:
            if hook is not None:
                hook.remove()

    return fn, [p for p in model.parameters() if p.requires_grad]


def unheld_ms(fn: Callable[[], None], leaves, device: torch.device, calls: int = LAYER_CALLS,
              groups: int = LAYER_GROUPS) -> float:
    """The host's time per call of ``fn()`` with the device *not* held, ms: ``groups`` groups of ``calls``
    back-to-back calls, each group started on an idle device (synchronised before, untimed) and timed until its
    last call returns, without waiting for the device; the median over the groups. The device runs along, so the
    launch queue stays as short as the device keeps it (in a host-bound part, nearly empty, as in the step);
    behind a sleep (``host_ms``) every launch of a group is pending at once. Gradients of ``leaves`` are cleared
    before every call, as :func:`tigon.workflows.timing.call_cost` does."""
    import statistics
    import time

    samples = []
    for _ in range(groups):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        for _ in range(calls):
            for t in leaves:
                t.grad = None
            fn()
        samples.append((time.perf_counter() - t0) * 1e3 / calls)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return statistics.median(samples)


def _cost(fn, leaves, device: torch.device) -> dict:
    """:func:`tigon.workflows.timing.call_cost`'s dict of one part, with ``unheld_ms`` (:func:`unheld_ms`)."""
    try:
        out = call_cost(fn, device, grad_to_none=leaves, calls=LAYER_CALLS, groups=LAYER_GROUPS,
                        rounds=LAYER_ROUNDS)
        out["unheld_ms"] = unheld_ms(fn, leaves, device)
        return out
    finally:
        for t in leaves:
            t.grad = None


@dataclass
class PartsCost:
    """What one variant's parts cost: ``layers`` (group index -> :func:`tigon.workflows.timing.call_cost`'s dict
    for one forward + backward of its layer: ``host_ms``, ``device_ms``, ``natural_ms``, ``waited``, ...) and
    ``rest`` (the same for the rest of the model, or None when not measured)."""

    layers: dict[int, dict] = field(default_factory=dict)
    rest: dict | None = None


def measure_parts(model: torch.nn.Module, batch, groups: list[LayerGroup], inputs: Mapping[int, tuple],
                  device: torch.device, *, layers: bool = True, rest: bool = True) -> PartsCost:
    """The cost of one forward + backward of each group's layer (``layers``) and of the rest (``rest``) of
    ``model`` as it is now (patched or not)."""
    out, blocks = PartsCost(), decoder_layers(model)
    if layers:
        for g in groups:
            fn, leaves = layer_call(blocks[g.index], *inputs[g.index])
            out.layers[g.index] = _cost(fn, leaves, device)
            del fn, leaves
    if rest:
        fn, leaves = rest_call(model, batch)
        out.rest = _cost(fn, leaves, device)
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return out


@dataclass
class LayerCosts:
    """What :func:`measure_variants` measured: ``groups`` (:class:`LayerGroup` per measured layer), ``variants``
    (name -> :class:`PartsCost`: ``"original"``, ``"patched"`` and ``"without <keyword>"``; a part a variant did
    not re-measure is the patched one's), ``notes``."""

    groups: list[LayerGroup]
    variants: dict[str, PartsCost]
    notes: list[str] = field(default_factory=list)

    def delta_ms(self, variant: str, side: str = "host_ms") -> float | None:
        """What ``variant`` changes in the step against the original, ms per step: the layer groups' change
        times their layers plus the rest's change, on ``side`` (a cost's key: ``"host_ms"``, ``"unheld_ms"`` or
        ``"device_ms"``); None when a part is missing."""
        o, v = self.variants.get(ORIGINAL), self.variants.get(variant)
        if o is None or v is None or o.rest is None:
            return None
        p = self.variants.get(PATCHED, v)
        total = 0.0
        for g in self.groups:
            a, b = o.layers.get(g.index), v.layers.get(g.index, p.layers.get(g.index))
            if a is None or b is None:
                return None
            total += g.count * (b[side] - a[side])
        r = v.rest if v.rest is not None else p.rest
        return None if r is None else total + r[side] - o.rest[side]

    def as_dict(self) -> dict[str, Any]:
        """The JSON: ``{"groups": [{"key", "index", "count"}], "variants": {name: {"layers": {index: cost},
        "rest": cost}}, "host_delta_ms" / "unheld_delta_ms" / "device_delta_ms": {variant: ms per step}, "notes"}``
        (host behind a sleep, host with the device not held, device)."""
        names = [n for n in self.variants if n != ORIGINAL]
        return {"groups": [vars(g) for g in self.groups],
                "variants": {n: {"layers": {str(k): c for k, c in v.layers.items()}, "rest": v.rest}
                             for n, v in self.variants.items()},
                "host_delta_ms": {n: self.delta_ms(n) for n in names},
                "unheld_delta_ms": {n: self.delta_ms(n, "unheld_ms") for n in names},
                "device_delta_ms": {n: self.delta_ms(n, "device_ms") for n in names},
                "notes": list(self.notes)}


def _inside(path: str, prefixes: list[str]) -> bool:
    return any(path == p or path.startswith(p + ".") for p in prefixes)


def measure_variants(model: torch.nn.Module, batch, device: torch.device, *, targets: Mapping[str, str] = {},
                     keywords: Mapping[str, str] = {}, patch: Callable[..., Any] | None = None,
                     unpatch: Callable[[torch.nn.Module], Any] | None = None) -> LayerCosts:
    """Measure ``model``'s parts (the module docstring) unpatched, under ``patch(model)`` and under
    ``patch(model, **{keyword: False})`` per keyword; ``model`` is left unpatched.

    Args:
        model: an unpatched causal LM (trained or not), on ``device``.
        batch: a step's batch (token ids or a dict), for the captured layer inputs and the rest's call.
        targets: module path -> patch kind of what ``tigon.patch`` replaces (the dry run's report; a path in
            parentheses is the model itself): which parts a keyword's variant must re-measure.
        keywords: patch kind -> its ``tigon.patch`` keyword; one variant per distinct keyword ({}: none).
        patch / unpatch: :func:`tigon.patch` / :func:`tigon.unpatch` (by default).

    Returns:
        a :class:`LayerCosts`; a variant whose patch fails is left out with a note.

    Raises:
        RuntimeError: the model has no decoder layers, or they were not called.
    """
    if patch is None or unpatch is None:
        import tigon

        patch, unpatch = patch or tigon.patch, unpatch or tigon.unpatch
    blocks = decoder_layers(model)
    if not blocks:
        raise RuntimeError("measure_variants: the model has no decoder layers")
    groups = layer_groups(blocks)
    inputs = capture_layer_inputs(model, batch, [g.index for g in groups])
    prefixes = [n for n, m in model.named_modules() if any(m is b for b in blocks)]
    out = LayerCosts(groups, {ORIGINAL: measure_parts(model, batch, groups, inputs, device)})
    variants = [(PATCHED, {}, True, True)]
    for kw in dict.fromkeys(keywords.values()):
        paths = [p for p, k in targets.items() if keywords.get(k) == kw]
        inside = [p for p in paths if not p.startswith("(") and _inside(p, prefixes)]
        variants.append((f"without {kw}", {kw: False}, bool(inside), len(inside) < len(paths)))
    for name, kwargs, layers, rest in variants:
        try:
            patch(model, **kwargs)
            out.variants[name] = measure_parts(model, batch, groups, inputs, device, layers=layers, rest=rest)
        except Exception as e:  # the advice falls back on the isolated calls for this kind
            out.notes.append(f"measuring the layers {name} failed: {type(e).__name__}: "
                             f"{' '.join(str(e).split())[:200]}")
            if name == PATCHED:
                break
        finally:
            unpatch(model)
    return out


def host_model(costs: LayerCosts, keywords: Mapping[str, str], side: str = HOST_SIDE):
    """The :class:`tigon.workflows.predict.HostModel` of ``costs``: ``delta_ms`` the patched variant's host change,
    ``without_ms`` per kind (``keywords``: kind -> its patch keyword) the ``"without <keyword>"`` variant's, for
    the kinds whose keyword is theirs alone; None when the patched variant's change is missing. ``side``: which
    host time of the parts (``"host_ms"``, behind a sleep; ``"unheld_ms"``, the device not held)."""
    from .predict import HostModel

    delta = costs.delta_ms(PATCHED, side)
    if delta is None:
        return None
    shared = {kw for kw in keywords.values() if list(keywords.values()).count(kw) > 1}
    without = {}
    for kind, kw in keywords.items():
        w = costs.delta_ms(f"without {kw}", side) if f"without {kw}" in costs.variants and kw not in shared \
            else None
        if w is not None:
            without[kind] = w
    return HostModel(delta, without)


def device_model(costs: LayerCosts, changes: list):
    """The whole parts' device change as a :class:`tigon.workflows.predict.HostModel` of device times (the patched
    variant's, and per kind the ``"without <keyword>"`` one's): ``D'`` from it holds the kernels between the
    replaced ops too (on the recorded rows within 0.4% of the patched step's measured ``D'``, the isolated calls'
    within 4%). None when the patched variant's device change is missing."""
    return host_model(costs, {c.kind: c.keyword for c in changes}, "device_ms")


def prediction(step, changes: list, costs: LayerCosts | None) -> tuple[Any, dict[str, Any]]:
    """``(host, extra)`` for ``tigon profile``'s prediction of ``step`` (a :class:`tigon.workflows.predict.
    StepCost`) under ``changes`` (:class:`~tigon.workflows.predict.OpChange` s): ``host`` the
    :class:`~tigon.workflows.predict.HostModel` of ``costs`` on :data:`HOST_SIDE` when :data:`HOST_BASIS` is
    ``"layers"`` (None otherwise, or without ``costs`` or their patched variant: the per-op host changes then);
    ``extra`` the keys of its report beside the predicted step: ``host_basis`` (``"layers"`` or ``"per_op"``),
    ``host_side``, ``host_ms_per_op`` / ``step_ms_per_op`` (the per-op prediction), ``layers`` (``{"host_ms",
    "step_ms"}``: the whole parts' prediction, whichever is the default), ``alternative`` (``{"host_side",
    "host_ms", "step_ms"}``: from the parts' other host time) and ``device_ms_layers`` (D + the parts' device
    change)."""
    from . import predict as PR

    kws = {c.kind: c.keyword for c in changes}
    host = host_model(costs, kws) if costs is not None else None
    per_op = PR.predict(step, changes)
    extra: dict[str, Any] = {"host_basis": "layers" if host and HOST_BASIS == "layers" else "per_op",
                             "host_side": HOST_SIDE if host else None,
                             "host_ms_per_op": per_op.host_ms, "step_ms_per_op": per_op.step_ms}
    if host is not None:
        by_layers = PR.predict(step, changes, host=host)
        extra["layers"] = {"host_ms": by_layers.host_ms, "step_ms": by_layers.step_ms}
        other = "unheld_ms" if HOST_SIDE == "host_ms" else "host_ms"
        alt = host_model(costs, kws, other)
        if alt is not None:
            a = PR.predict(step, changes, host=alt)
            extra["alternative"] = {"host_side": other, "host_ms": a.host_ms, "step_ms": a.step_ms}
        d = costs.delta_ms(PATCHED, "device_ms")
        if d is not None:
            extra["device_ms_layers"] = step.device_ms + d
    return (host if HOST_BASIS == "layers" else None), extra
