"""Helpers shared by the Triton ops: launch heuristics, row views, dtype maps.

Kept deliberately small; every op file imports from here instead of re-deriving block sizes.
"""

from __future__ import annotations

import functools
import math

import torch

from .. import support
from ..support import _env, interpreter_enabled

# Largest row a single program holds in registers (elements). Rows longer than this are rejected by the
# row-wise ops with a clear error rather than spilling catastrophically.
MAX_FUSED_ROW = 65536


def _fix_interpreter_bf16_rounding() -> None:
    """Make Triton's CPU interpreter round fp32 -> bf16 to nearest-even, as the GPU does.

    The interpreter (triton.runtime.interpreter._convert_float) truncates by default, which doubles the
    rounding error of every bf16 store and would make interpreted results disagree with compiled ones. We wrap
    that private helper once, only when the interpreter is on, and only for the fp32 -> bf16 case.
    """
    try:
        import numpy as np
        import triton.language as tl
        from triton.runtime import interpreter as interp
    except Exception:  # pragma: no cover - interpreter layout changed
        return
    original = getattr(interp, "_convert_float", None)
    if original is None or getattr(original, "_tigon_rtne", False):
        return

    def convert(data, src, dst, rounding_mode):
        if src == tl.float32 and dst == tl.bfloat16:
            a = np.ascontiguousarray(data, dtype=np.float32)
            bits = a.view(np.uint32)
            out = ((bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))) >> 16).astype(np.uint16)
            out[np.isnan(a)] = 0x7FC0
            return out
        return original(data, src, dst, rounding_mode)

    convert._tigon_rtne = True
    interp._convert_float = convert


if interpreter_enabled():
    _fix_interpreter_bf16_rounding()


def interpreter_quiet():
    """Context for an interpreted launch whose kernel computes values it then discards with ``tl.where`` (``-inf -
    -inf`` on zero-probability lanes, products that overflow in a branch not taken): the interpreter evaluates both
    branches in numpy, which warns ("invalid value encountered in subtract"); a compiled kernel does not. Silences
    numpy's floating-point warnings for the launch only (``numpy.errstate``); the results are unchanged."""
    import numpy as np

    return np.errstate(invalid="ignore", over="ignore")


def next_pow2(n: int) -> int:
    """Smallest power of two >= n (>= 1). Plain Python: ``triton.next_power_of_2`` is a ConstexprFunction
    whose call costs ~2 us of host time, paid on every launch."""
    return 1 << (max(int(n), 1) - 1).bit_length()


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for non-negative ints (plain Python, for the same reason as :func:`next_pow2`)."""
    return -(-int(a) // int(b))


@functools.lru_cache(maxsize=None)
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


_IS_CUDA: dict[torch.device, bool] = {}
"""``device.type == "cuda"`` by device: reading ``torch.device.type`` builds a new string each time (~0.5 us, and the
launch heuristics asked it several times per call). A device's type never changes; one entry per device seen."""


def compiled_cuda(device: torch.device) -> bool:
    """Whether kernels on ``device`` run compiled on a CUDA GPU: a CUDA device and Triton's interpreter off (read
    per call: tests and tools switch ``TRITON_INTERPRET`` at run time)."""
    cuda = _IS_CUDA.get(device)
    if cuda is None:
        cuda = _IS_CUDA[device] = device.type == "cuda"
    if not cuda:
        return False
    data = support._ENV_DATA
    if interpreter_enabled is not _INTERPRETER_ENABLED or data is None or support.os.environ is not support._ENVIRON:
        return not interpreter_enabled()
    return data.get(support._K_INTERPRET) != support._ONE  # (interpreter_enabled(), inline)


_INTERPRETER_ENABLED = interpreter_enabled
"""support.interpreter_enabled, which :func:`compiled_cuda` and :func:`launcher` read inline unless this module's
name for it was replaced (a test's monkeypatch): then they call the replacement."""


def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of CUDA ``device`` (the current device when it has no index)."""
    return _sm_count(device.index if device.index is not None else torch.cuda.current_device())


def num_programs_hint(device: torch.device) -> int:
    """How many resident programs make a persistent grid: 2 x SMs on CUDA, 4 under the interpreter.

    The interpreter runs programs one after another in Python, so fewer, larger programs are faster there.
    """
    return 2 * sm_count(device) if compiled_cuda(device) else 4


def warps_for(block_elems: int) -> int:
    """num_warps for a program that touches ``block_elems`` elements per step (4 .. 16)."""
    if block_elems >= 16384:
        return 16
    if block_elems >= 4096:
        return 8
    return 4


def rows_per_program(n_cols_pow2: int, device: torch.device, target_elems: int = 4096) -> int:
    """Rows one program handles per step so that a [rows, cols] tile holds about ``target_elems`` elements.

    Small hidden sizes get several rows per program (fewer, fuller programs); under the interpreter we go
    wider still because each program costs Python overhead.
    """
    if not compiled_cuda(device):
        target_elems = 1 << 16
    return max(1, min(64, target_elems // n_cols_pow2))


# ---- launching a Triton kernel -------------------------------------------------------------------------------
# ``kernel[grid](*args)`` costs ~22 us of host time per launch on the H200 with triton 3.6 (benchmarks/host_issue.py
# --launch-probe), the compiled kernel's own launcher ~10 us: the rest is JITFunction.run's per-call Python (knob and
# environment reads, the cache key's str(options), the launch-hook metadata). :func:`launch` (what
# ``launcher(kernel)[grid](...)`` calls at the launch sites when it is on) can skip it: it binds
# and specializes the arguments with the kernel's own binder (the function JITFunction.run calls, so the
# specialization is Triton's exactly: dtypes, 16-byte alignment, ints equal to 1 or divisible by 16), looks the
# compiled kernel up by that specialization and the launch options, and calls its launcher as JITFunction.run does,
# without launch hooks. The first launch of each specialization, and every launch while a launch hook (a profiler
# such as proton) or a pre-run hook is registered, goes through ``kernel[grid]`` itself. Triton's debug and
# instrumentation knobs must then not change while the process runs (they are part of Triton's key, not of this
# one). The objects it relies on are private (``JITFunction.device_caches``, the binder, ``CompiledKernel.run``;
# their shape is the same in triton 3.6 and 3.9): any difference found on the first launch turns the direct path off
# for the process, with a warning, and ``kernel[grid]`` runs. On by default for compiled kernels (under the interpreter
# there is no compiled launcher); ``TIGON_DIRECT_LAUNCH=0`` turns it off. Checked with triton 3.6: opt-in on the H200
# (sessions 13-14: the norm and GLU test files, host timings) and as the default on an H100 (session 17: the kernel
# test files that ran, end-to-end and profile runs; benchmarks/results/h100/README.md).
_DIRECT_ATTR = "_tigon_direct_launchers"
"""The attribute of a JITFunction holding its direct launchers: {(device, specialization, options): (launcher,
function, packed metadata)} (on the kernel: a JITFunction's own hash hashes its source)."""
_direct_broken: list[str] = []
"""Why the direct path was turned off for this process (empty while it is usable)."""


def direct_launch_enabled() -> bool:
    """Whether :func:`launch` calls compiled kernels' launchers directly (unless ``TIGON_DIRECT_LAUNCH=0``; Triton's
    interpreter off, and no incompatibility found in this Triton)."""
    return not _direct_broken and not _direct_off() and not interpreter_enabled()


def _direct_off() -> bool:
    """Whether ``TIGON_DIRECT_LAUNCH=0`` (read per call, without decoding the value)."""
    data = support._ENV_DATA
    if data is None or support.os.environ is not support._ENVIRON:
        return _env("TIGON_DIRECT_LAUNCH", "1") == "0"
    return data.get(support._K_DIRECT) == support._ZERO


# _current_device / _current_stream: torch's C functions themselves where the build has them (no Python frame per
# launch); module globals, read by _launch_direct at each launch (a test replaces them).
_current_device = getattr(torch._C, "_cuda_getDevice", None)
"""torch.cuda.current_device() without its _lazy_init call: launches run on CUDA tensors, so CUDA is initialised."""
if _current_device is None:  # a CPU build (no launch ever reaches it)
    _current_device = torch.cuda.current_device
_current_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
"""``_current_stream(device)``: the raw CUDA stream handle the launcher takes."""


_knobs_runtime: list = []


def _launch_hooks_active() -> bool:
    """Whether a Triton launch hook is registered (a profiler): those launches go through ``kernel[grid]``. Hooks are
    ``HookChain`` objects in triton 3.6 and 3.9 (registered: a non-empty ``calls``), None or a function before.
    :func:`_launch_direct` asks :data:`_HOOK_CHAINS` first."""
    if not _knobs_runtime:
        from triton import knobs

        _knobs_runtime.append(knobs.runtime)
    rt = _knobs_runtime[0]
    enter, leave = rt.launch_enter_hook, rt.launch_exit_hook
    if not _HOOK_CHAINS and type(getattr(enter, "calls", None)) is list and type(getattr(leave, "calls", None)) is list:
        _HOOK_CHAINS.extend((rt, enter, leave))
    return bool(getattr(enter, "calls", enter is not None) or getattr(leave, "calls", leave is not None))


_HOOK_CHAINS: list = []
"""(triton.knobs.runtime, its launch_enter_hook, its launch_exit_hook) once :func:`_launch_hooks_active` has seen
HookChains there: :func:`_launch_direct` then reads their ``calls`` lists inline (one Python frame less per launch)
while the runtime still holds those two objects, and asks :func:`_launch_hooks_active` otherwise."""


def launcher(kernel):
    """What a launch site indexes and calls, ``launcher(kernel)[grid](*args, **kwargs)``: ``kernel`` itself, or with
    direct launching on (:func:`direct_launch_enabled`) a stand-in launched the same way through :func:`launch`.
    Off, this costs one call and two dictionary reads of the environment (:func:`direct_launch_enabled`, inline; a
    wrapper taking the arguments would repack them: ~1.5 us of host time per launch)."""
    data = support._ENV_DATA
    if interpreter_enabled is not _INTERPRETER_ENABLED or data is None or support.os.environ is not support._ENVIRON:
        if not direct_launch_enabled():
            return kernel
    elif (_direct_broken or data.get(support._K_DIRECT) == support._ZERO
          or data.get(support._K_INTERPRET) == support._ONE):
        return kernel
    via = kernel.__dict__.get(_VIA_ATTR)  # (_stand_in's lookup, inline: no frame once made)
    return via if via is not None else _stand_in(kernel)


def _stand_in(kernel) -> "_DirectLauncher":
    """``kernel``'s direct stand-in (made once; kept on the kernel under :data:`_VIA_ATTR`)."""
    via = kernel.__dict__.get(_VIA_ATTR)
    if via is None:
        via = kernel.__dict__[_VIA_ATTR] = _DirectLauncher(kernel)
    return via


_VIA_ATTR = "_tigon_direct_via"
"""The attribute of a kernel holding its stand-in (made once; on the kernel, as :data:`_DIRECT_ATTR`)."""


class LaunchMode(dict):
    """What :func:`launch_mode` answers for a device: ``compiled`` (:func:`compiled_cuda` of the device) and, indexed
    by a kernel, what :func:`launcher` returns for it (``mode[kernel][grid](*args, **kwargs)`` launches it). One of
    four shared objects, by (compiled, direct launching on); a dict of the kernels seen, so that indexing one seen
    before is a C lookup, not a Python frame per launch (``__missing__`` runs on a new kernel only; emptied past
    :data:`MAX_KERNELS`: a test's fake kernels must not grow it without bound)."""

    __slots__ = ("compiled", "direct")

    def __init__(self, compiled: bool, direct: bool):
        super().__init__()
        self.compiled, self.direct = compiled, direct

    def __missing__(self, kernel):
        via = _stand_in(kernel) if self.direct else kernel
        if len(self) >= MAX_KERNELS:
            self.clear()
        self[kernel] = via
        return via


MAX_KERNELS = 256
"""Kernels remembered per :class:`LaunchMode`."""

_MODES = {(compiled, direct): LaunchMode(compiled, direct) for compiled in (False, True) for direct in (False, True)}


def launch_mode(device: torch.device) -> LaunchMode:
    """:func:`compiled_cuda` of ``device`` and :func:`launcher` of every kernel in one call, for launch sites that ask
    both (the hot ops' forwards and backwards: one Python frame per launch site instead of one per question and
    kernel)::

        mode = launch_mode(x.device)
        ... mode.compiled ...  # compiled_cuda(x.device)
        mode[kernel][grid](*args, **kwargs)  # launcher(kernel)[grid](*args, **kwargs)

    The same answers: read per call, inline as those two read them (the device's type from :data:`_IS_CUDA` once
    seen, ``TRITON_INTERPRET`` / ``TIGON_DIRECT_LAUNCH`` from the environment's encoded mapping, and whether the
    direct path was turned off); where those do not read inline (a replaced ``os.environ`` or
    ``interpreter_enabled``, a device not seen yet) it asks them."""
    data = support._ENV_DATA
    cuda = _IS_CUDA.get(device)
    if (cuda is None or interpreter_enabled is not _INTERPRETER_ENABLED or data is None
            or support.os.environ is not support._ENVIRON):
        return _MODES[compiled_cuda(device), direct_launch_enabled()]
    interpreted = data.get(support._K_INTERPRET) == support._ONE
    return _MODES[cuda and not interpreted,
                  not (interpreted or _direct_broken or data.get(support._K_DIRECT) == support._ZERO)]


class _DirectLauncher(dict):
    """``kernel[grid](*args, **kwargs)`` through :func:`launch`: indexed by a grid, the launch function of that grid,
    ``functools.partial(_launch_direct, kernel, grid)`` (:func:`launcher` checked that direct launching is on: not
    asked again per launch). A dict of the grids seen, so that indexing one seen before is a C lookup, not a Python
    ``__getitem__`` frame per launch (``__missing__`` runs on a new grid only); emptied past :data:`MAX_GRIDS` (grids
    follow the token count: a run of many sequence lengths must not grow it without bound)."""

    __slots__ = ("kernel",)

    def __init__(self, kernel):
        super().__init__()
        self.kernel = kernel

    def __missing__(self, grid):
        run = functools.partial(_launch_direct, self.kernel, grid)  # (a partial: no Python frame of its own)
        if type(grid) is tuple:  # (a callable grid is not kept: it may be a new closure per launch)
            if len(self) >= MAX_GRIDS:
                self.clear()
            self[grid] = run
        return run


MAX_GRIDS = 64
"""Grids remembered per kernel by :class:`_DirectLauncher`."""


def launch(kernel, grid: tuple, *args, **kwargs):
    """``kernel[grid](*args, **kwargs)``: a Triton kernel launch, through its compiled launcher directly when
    :func:`direct_launch_enabled` (see the comment above; the same kernel, arguments and grid either way).

    ``grid``: a tuple of one to three ints. Returns what ``kernel[grid]`` returns, or None from the direct path.
    """
    if not direct_launch_enabled():
        return kernel[grid](*args, **kwargs)
    return _launch_direct(kernel, grid, *args, **kwargs)


def _launch_direct(kernel, grid, *args, **kwargs):
    """:func:`launch` with direct launching on."""
    if type(grid) is not tuple or getattr(kernel, "pre_run_hooks", True):
        return kernel[grid](*args, **kwargs)
    try:
        device = _current_device()
        bound, spec, options = kernel.device_caches[device][-1](*args, **kwargs)
        key = (device, tuple(spec), tuple(options.items()))
        cache = kernel.__dict__.get(_DIRECT_ATTR)
        entry = cache.get(key) if cache is not None else None
    except Exception as e:  # noqa: BLE001 - any difference in Triton's private objects: the public path from now on
        _turn_off_direct(f"binding the arguments failed ({type(e).__name__}: {e})")
        return kernel[grid](*args, **kwargs)
    # (_launch_hooks_active(), its HookChains' lists read inline once seen: one Python frame less per launch)
    hooks = _HOOK_CHAINS
    if (entry is None or not hooks or hooks[0].launch_enter_hook is not hooks[1]
            or hooks[0].launch_exit_hook is not hooks[2] or hooks[1].calls or hooks[2].calls):
        if entry is None or _launch_hooks_active():
            compiled = kernel[grid](*args, **kwargs)
            if entry is None:
                _remember(kernel, key, compiled)
            return compiled
    run, function, metadata = entry
    n = len(grid)
    run(grid[0], grid[1] if n > 1 else 1, grid[2] if n > 2 else 1, _current_stream(device), function, metadata,
        None, None, None, *bound.values())
    return None


def _remember(kernel, key, compiled) -> None:
    """Cache the launcher of ``compiled`` (what ``kernel[grid]`` returned on a first launch) under ``key``."""
    try:
        if hasattr(compiled, "result"):  # (an asynchronous compilation's future, triton 3.6)
            compiled = compiled.result()
        entry = (compiled.run, compiled.function, compiled.packed_metadata)
        if not callable(entry[0]) or entry[1] is None:
            raise TypeError("no loaded launcher / function on the compiled kernel")
        hash(key)
    except Exception as e:  # noqa: BLE001
        _turn_off_direct(f"the compiled kernel has no usable launcher ({type(e).__name__}: {e})")
        return
    kernel.__dict__.setdefault(_DIRECT_ATTR, {})[key] = entry


def _turn_off_direct(reason: str) -> None:
    import warnings

    if not _direct_broken:
        _direct_broken.append(reason)
        warnings.warn(f"TIGON_DIRECT_LAUNCH: {reason}; Triton kernels are launched through kernel[grid] from now on",
                      RuntimeWarning, stacklevel=3)


@functools.lru_cache(maxsize=None)
def fast_apply(function: type) -> "callable":
    """``function.apply`` (a ``torch.autograd.Function`` without ``setup_context``, called with positional
    arguments) without the Python layers of ``Function.apply`` around torch's C++ ``apply``: the setup-context
    check, and the generator that unwraps dead functorch wrappers (one Python frame per argument: 10 of the 15 Python
    calls of an apply of 6 arguments). Here the same unwrapping (``torch._C._functorch.unwrap_if_dead`` of each
    tensor argument) runs in a plain loop, and while a functorch transform (vmap, grad...) is active the call goes
    through ``function.apply`` itself. Same results and autograd graph as ``function.apply``."""
    if getattr(function, "setup_context", None) is not torch.autograd.Function.setup_context:
        return function.apply
    base = super(torch.autograd.Function, function).apply  # torch._C._FunctionBase.apply, bound to the class
    active = torch._C._are_functorch_transforms_active
    unwrap = getattr(torch._C._functorch, "unwrap_if_dead", None)
    slow = function.apply
    tensor = torch.Tensor
    if unwrap is None:  # pragma: no cover - another torch layout
        return slow
    direct_backward(function)

    def apply(*args):
        if active():
            return slow(*args)
        for a in args:
            if isinstance(a, tensor) and unwrap(a) is not a:  # a dead wrapper (rare): unwrap them all
                return base(*[unwrap(b) if isinstance(b, tensor) else b for b in args])
        return base(*args)

    return apply


@functools.lru_cache(maxsize=None)
def cached_apply(function: type) -> "callable":
    """What an op's cache of validated calls keeps to run ``function`` on a hit: torch's C-level
    ``_FunctionBase.apply`` bound to the class where :func:`fast_apply` takes it, else ``function.apply``. A hit
    happens only while no functorch transform is active (:func:`tigon.support.switches` is None then), so the op calls
    it directly with its tensor arguments passed through :data:`tigon.support.unwrap_dead`: what :func:`fast_apply`'s
    closure does, without the closure's Python frame (and its isinstance per argument)."""
    if fast_apply(function) is function.apply:
        return function.apply
    return super(torch.autograd.Function, function).apply


_BACKWARD_APPLY = torch.autograd.function.BackwardCFunction.__dict__.get("apply")
"""torch's ``BackwardCFunction.apply`` (what autograd's engine calls on a custom Function's node in the backward), whose
form :func:`direct_backward` relies on: ``self._get_user_fn()(self, *args)`` unless ``boxed_grads_call``."""


def direct_backward(function: type) -> type:
    """Let autograd's engine call ``function.backward(ctx, *grads)`` directly: the engine calls ``ctx.apply(*grads)``
    on the node (an instance of ``function._backward_cls``), which torch's ``BackwardCFunction.apply`` answers in two
    Python frames (``apply`` and ``_get_user_fn``, which picks ``backward`` or ``vjp``) before the backward's own. Here
    the node's class gets ``apply = function.backward`` (a plain function: bound to the node, the ctx), which is what
    ``_get_user_fn`` picks for a Function that overrides ``backward`` and not ``vjp`` and does not ask for boxed
    gradients: two Python frames less per backward. Otherwise (another torch layout, ``vjp``, ``boxed_grads_call``)
    the node keeps torch's apply. Called once per Function by :func:`fast_apply`, and as a class decorator on the
    Functions whose backward asks :func:`tigon.kernels.grad_ownership.owns_grad` (and on its probe, whose call path
    they must share: the reference counts it compares are that path's); ``function.backward`` is read then (a backward
    replaced on the class later is not seen). Returns ``function``."""
    Function = torch.autograd.Function
    if (_BACKWARD_APPLY is None or getattr(torch.autograd.function.BackwardCFunction, "_get_user_fn", None) is None
            or getattr(function, "boxed_grads_call", False) or function.vjp is not Function.vjp
            or function.backward is Function.backward or "apply" in function._backward_cls.__dict__):
        return function
    function._backward_cls.apply = function.backward
    return function


def as_rows(x: torch.Tensor, name: str) -> torch.Tensor:
    """View ``x`` (..., N) as (M, N) with unit stride along N (copying only if it must).

    Raises:
        ValueError: ``x`` has no dimensions or a zero-sized last dimension.
    """
    shape = x.shape
    if len(shape) == 2 and shape[1] != 0 and x.stride()[1] == 1:
        return x  # already rows (saves a view: ~1.5 us of host time)
    if len(shape) == 0 or shape[-1] == 0:
        raise ValueError(f"{name} must have a non-empty last dimension, got shape {tuple(x.shape)}")
    x2 = x.reshape(-1, shape[-1])
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    return x2


def rows(x: torch.Tensor, name: str) -> tuple[torch.Tensor, int, int]:
    """(t, M, row stride): ``x`` (..., N) read as M rows of N elements with unit column stride by a kernel that takes
    a pointer and a row stride.

    ``t`` is x itself when x already is such rows: 2-D with unit column stride, or contiguous (rows of N elements),
    which saves the (M, N) view object (~1.3 us of host time each); otherwise :func:`as_rows`'s view (or copy, for a
    strided last dimension).

    Raises:
        ValueError: ``x`` has no dimensions or a zero-sized last dimension.
    """
    shape = x.shape
    if len(shape) == 2:
        if shape[1] != 0 and x.stride()[1] == 1:
            return x, shape[0], x.stride()[0]
    elif shape and shape[-1] != 0 and x.is_contiguous():
        return x, x.numel() // shape[-1], shape[-1]
    x2 = as_rows(x, name)
    return x2, x2.shape[0], x2.stride()[0]


def check_row_width(n: int, name: str) -> None:
    """Raise ValueError when a row of ``n`` elements is too long for a one-pass row kernel."""
    if n > MAX_FUSED_ROW:
        raise ValueError(f"{name}: last dimension {n} exceeds the fused-row limit {MAX_FUSED_ROW}")


# ---- torch.library custom ops (the torch.compile path of every op; see tigon.kernels) -------------------------
# Inductor hands a custom op exactly the input strides it was traced with (torch 2.13's default for custom ops,
# stated here for releases with another default), so outputs whose strides follow the inputs' (the rotary op's
# empty_like) get the strides the fake implementation gave them.
CUSTOM_OP_TAGS = tuple(t for t in (getattr(torch.Tag, "needs_exact_strides", None),) if t is not None)


def if_wanted(t: torch.Tensor, wanted: bool) -> torch.Tensor | None:
    """A gradient output of a backward op for autograd: None where it was not computed (a (0,) placeholder)."""
    return t if wanted else None


def or_empty(t: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    """``t``, or the (0,) placeholder of an output that was not computed (custom ops cannot return None)."""
    return t if t is not None else like.new_empty((0,))


def rows_of(x: torch.Tensor) -> int:
    """M of the (M, N) row view of x (..., N); symbolic-shape friendly."""
    return math.prod(x.shape[:-1])


def num_items_tensor(num_items, device: torch.device) -> torch.Tensor | None:
    """``num_items_in_batch`` as the optional 0-d fp32 tensor the loss ops' schemas carry."""
    if num_items is None or isinstance(num_items, torch.Tensor):
        return num_items
    return torch.tensor(float(num_items), dtype=torch.float32, device=device)
