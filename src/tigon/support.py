"""What this accelerator / dtype / library-version combination supports, and why not.

Every public op in :mod:`tigon.functional` asks :func:`select_backend` which path to take:

``"triton"``
    compiled Triton kernels on a CUDA device (compute capability >= 8.0 for bf16, >= 7.0 otherwise).
``"interpreter"``
    the same Triton kernels run by Triton's CPU interpreter. Enabled when the environment variable
    ``TRITON_INTERPRET=1`` was set *before* Tigon's kernels were first imported (the test-suite and the
    ``tigon`` CLI set it on machines without CUDA). Slow, but it runs the real kernels.
``"reference"``
    the plain-PyTorch definition in :mod:`tigon.reference` (any device, any dtype). Taken when neither of the
    above applies; one warning per reason is issued. In strict mode (:func:`set_strict` or ``TIGON_STRICT=1``)
    :class:`UnsupportedError` is raised instead.

:func:`force_reference` (a context manager: ``with force_reference():``, or ``TIGON_DISABLE=1``) turns the kernels
off on purpose, e.g. to check the fallback; that never warns. :func:`backend_usage` counts which path each op took,
so workflows can report what actually ran. Meta and fake tensors (shapes only: ``torch.device("meta")``,
FakeTensorMode) take the reference silently: it carries their shapes and dtypes.

The ops on a small model's hot path (rms_norm, fused_add_rms_norm, swiglu / geglu / glu_linear, rope) keep the calls
they validated and sent to the kernels (:func:`remember_call`), keyed by everything their checks read and by
:func:`switches`: a call like one seen before skips the checks and this choice (it is still counted), any other runs
them in full, so a bad argument raises as before and a change of ``TRITON_INTERPRET`` / ``TIGON_DISABLE`` /
:func:`force_reference` is seen on the next call.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import threading
import warnings
from collections import Counter
from dataclasses import dataclass

import sys

import torch

from ._checks import has_data

BACKENDS = ("triton", "interpreter", "reference", "inductor")
TORCH_CODE = ("reference", "inductor")
"""The backends that run the op's PyTorch reference code: eagerly, or traced and compiled by Inductor inside a
``torch.compile`` graph (compile mode, :func:`set_compile_mode`)."""
COMPILE_MODES = ("auto", "kernels", "inductor")
KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


class UnsupportedError(RuntimeError):
    """Raised in strict mode when an op would have to fall back to the PyTorch reference."""


class TigonFallbackWarning(UserWarning):
    """Warned (once per reason) when an op runs the PyTorch reference instead of a Triton kernel."""


@dataclass(frozen=True)
class Decision:
    """The path an op takes for one call: ``backend`` in :data:`BACKENDS` and a human-readable ``reason``."""

    backend: str
    reason: str


_state = threading.local()
_forced_contexts = 0  # force_reference contexts open in any thread: while 0, no thread-local is read per call
_forced_lock = threading.Lock()
_usage: Counter = Counter()
USAGE = _usage
_warned: set[str] = set()

# os.environ.get costs ~1 us per variable (str -> bytes of the key, a KeyError raised and caught for a variable that
# is not set), and every op call read three or four of them. CPython's os.environ keeps the encoded mapping it
# reads in ``_data``, updated by every assignment / deletion through os.environ (monkeypatch.setenv, set_strict...):
# looked up directly, the same value costs ~50 ns. Nothing is cached: each call reads the current value. Another
# os.environ object (one replaced by a test's mock) or a Python without ``_data`` takes os.environ.get.
_ENVIRON = os.environ
_ENV_DATA = getattr(os.environ, "_data", None) if hasattr(os.environ, "encodekey") else None
_ENV_KEYS: dict[str, object] = {}


def _env(name: str, default: str) -> str:
    """``os.environ.get(name, default)``, read through CPython's encoded mapping when there is one (same value)."""
    if _ENV_DATA is None or os.environ is not _ENVIRON:
        return os.environ.get(name, default)
    key = _ENV_KEYS.get(name)
    if key is None:
        key = _ENV_KEYS[name] = os.environ.encodekey(name)
    value = _ENV_DATA.get(key)
    return default if value is None else os.environ.decodevalue(value)


def _raw_key(name: str):
    """``name`` as CPython's encoded mapping stores it (None without one)."""
    return os.environ.encodekey(name) if _ENV_DATA is not None else None


_K_INTERPRET, _K_DISABLE = _raw_key("TRITON_INTERPRET"), _raw_key("TIGON_DISABLE")
_K_DIRECT = _raw_key("TIGON_DIRECT_LAUNCH")
_K_HOST_BOUND = _raw_key("TIGON_HOST_BOUND_ELEMENTS")
_ONE = _raw_key("1")  # (keys and values are encoded alike)
_ZERO = _raw_key("0")
"""The switches read on every op call, as stored in the encoded mapping: compared there without decoding the value
(a decode is a Python-level call, ~0.3 us), the same answers as :func:`_env`'s decoded strings."""

# ``torch.compiler.is_compiling()`` is two Python frames (it asks ``torch.jit.is_scripting()`` first, which matters
# only inside TorchScript, where Tigon's ops never run). The per-call paths (an op's cache of validated calls, the
# patched forwards, the backward's gradient-ownership check) ask ``dynamo_compiling() or COMPILER._is_compiling_flag``
# instead, one frame: dynamo folds ``is_dynamo_compiling()`` to True while it traces (so the flag, which dynamo would
# otherwise read as a guarded constant, is never read there), and the flag is the rest of is_compiling's answer
# (torch.export's non-strict tracing, dynamo's compilation). tests/test_call_cache.py checks the two agree.
dynamo_compiling = torch.compiler.is_dynamo_compiling
COMPILER = torch.compiler
_TRACING_TLS = torch._guards._TLS
"""The thread-local of torch's tracing context (``torch._guards.TracingContext.try_get()`` reads its
``tracing_context``: not None while dynamo traces a frame), read by :func:`switches` in its own frame."""


def host_bound_elements(default: int) -> int:
    """The host-bound threshold of a patched module (:attr:`tigon.ops.OpSpec.host_bound_elements`): ``default`` (the
    op record's), or ``TIGON_HOST_BOUND_ELEMENTS`` when set (read per call: a run can sweep it; 0 turns the
    choice off).

    Raises:
        ValueError: ``TIGON_HOST_BOUND_ELEMENTS`` is not an integer >= 0.
    """
    if _ENV_DATA is not None and os.environ is _ENVIRON and _ENV_DATA.get(_K_HOST_BOUND) is None:
        return default  # (unset, read inline: no _env frame on a patched MLP's call)
    value = _env("TIGON_HOST_BOUND_ELEMENTS", "")
    if not value:
        return default
    try:
        n = int(value)
    except ValueError:
        n = -1
    if n < 0:
        raise ValueError(f"TIGON_HOST_BOUND_ELEMENTS must be an integer >= 0 (elements), got {value!r}")
    return n


def _strict_default() -> bool:
    return _env("TIGON_STRICT", "0") not in ("", "0", "false", "False")


def set_strict(enabled: bool = True) -> None:
    """Raise :class:`UnsupportedError` instead of falling back to the reference (process-wide).

    Raises:
        TypeError: ``enabled`` is not True or False (a string such as ``"false"`` would read as true).
    """
    if not isinstance(enabled, bool):
        raise TypeError(f"enabled must be True or False, got {type(enabled).__name__} {enabled!r}")
    os.environ["TIGON_STRICT"] = "1" if enabled else "0"


def is_strict() -> bool:
    """Whether strict mode is on (``TIGON_STRICT=1`` or :func:`set_strict`)."""
    return _strict_default()


def set_compile_mode(mode: str) -> None:
    """What Tigon's ops run inside a ``torch.compile`` graph (process-wide; ``TIGON_COMPILE_OPS`` likewise).

    ``"auto"`` (default): each op as its record says (:attr:`tigon.ops._record.OpSpec.under_compile`): the
    row-wise ops (norms, RoPE, GLU activations) leave their code to Inductor, which fuses them with their
    neighbours (a custom op would be a fusion barrier), and the losses keep their kernels (Inductor would
    materialise the logits). ``"kernels"``: every op its Triton kernels (custom ops). ``"inductor"``: every op its
    reference, traced. Eager calls are unaffected. A graph compiled before the change keeps its choice until
    ``torch.compiler.reset()``.

    Raises:
        ValueError: ``mode`` is not one of :data:`COMPILE_MODES`.
    """
    if mode not in COMPILE_MODES:
        raise ValueError(f"compile mode must be one of {COMPILE_MODES}, got {mode!r}")
    os.environ["TIGON_COMPILE_OPS"] = mode


def compile_mode() -> str:
    """The compile mode (:func:`set_compile_mode`); an unknown ``TIGON_COMPILE_OPS`` value reads as ``"auto"``, with
    one warning naming it (a typo such as ``kernel`` would otherwise go unnoticed), given outside a traced graph."""
    mode = os.environ.get("TIGON_COMPILE_OPS", "auto")
    if mode in COMPILE_MODES:
        return mode
    if mode not in _UNKNOWN_MODES and not torch.compiler.is_compiling():
        _UNKNOWN_MODES.add(mode)
        warnings.warn(f"TIGON_COMPILE_OPS={mode!r} is not one of {COMPILE_MODES}: read as 'auto'", stacklevel=2)
    return "auto"


_UNKNOWN_MODES: set[str] = set()
"""The unknown ``TIGON_COMPILE_OPS`` values warned about (once each)."""


def compiled_choice(op: str) -> str:
    """``"kernel"`` or ``"inductor"``: what ``op`` runs inside a torch.compile graph in the current compile mode. An
    op without a record of its own (the preference losses beside DPO, :mod:`tigon.ops.preference`, which run DPO's
    kernels) takes the records' default, :attr:`tigon.ops.OpSpec.under_compile`'s: its kernels. An op whose kernels
    have no custom op (:attr:`tigon.ops.OpSpec.custom_op` False: ``act_linear``, the LoRA ops) traces
    its reference in every mode: ``"inductor"``."""
    from . import ops

    spec = ops.registry().get(op)
    if spec is not None and not spec.custom_op:
        return "inductor"
    mode = compile_mode()
    if mode != "auto":
        return "kernel" if mode == "kernels" else "inductor"
    return ops.OpSpec.under_compile if spec is None else spec.under_compile


def replaced(out, **fields):
    """``out._replace(**fields)`` for a NamedTuple ``out`` (an op's output), built by its class's constructor.

    ``_replace`` calls ``tuple.__new__(type(out), ...)``; where ``out`` was built in code that torch.compile traces,
    torch 2.11's Dynamo (the GPU image's) records that tuple without a source for its class, then fails its own
    assertion (``cls_source is not None`` in ``SideEffects.codegen_save_tempvars``) when the tuple leaves the graph:
    every compiled call that returned it failed there (the preference losses' outputs, tigon bench's
    ``tigon_compile`` of DPO; the cross-entropy module's per-token outputs). Fixed in later torch versions.

    Raises:
        ValueError: a name in ``fields`` that is not a field of ``out`` (``_replace`` raises ValueError up to Python
            3.12, TypeError from 3.13).
    """
    values = [fields.pop(name, value) for name, value in zip(out._fields, out)]
    if fields:
        raise ValueError(f"got unexpected field names: {list(fields)!r}")
    return type(out)(*values)


class force_reference:  # noqa: N801 (a function to its callers: ``with tigon.force_reference():``)
    """Context manager: every op inside runs the PyTorch reference, silently (used to check the fallback)::

        with tigon.force_reference():
            loss = model(**batch).loss

    Only the ``with`` block is affected: ``tigon.force_reference()`` called on its own changes nothing, and warns
    (``RuntimeWarning``) when the object it returned is dropped without being entered. ``TIGON_DISABLE=1`` turns
    the kernels off for the whole process.
    """

    __slots__ = ("_prev", "_entered")

    def __init__(self):
        self._entered = False

    def __enter__(self):
        global _forced_contexts
        self._entered = True
        self._prev = getattr(_state, "forced", False)
        _state.forced = True
        with _forced_lock:
            _forced_contexts += 1
        return None

    def __exit__(self, *exc) -> None:
        global _forced_contexts
        _state.forced = self._prev
        with _forced_lock:
            _forced_contexts -= 1

    def __del__(self):
        if not self._entered:
            warnings.warn("tigon.force_reference() was called without `with`: it is a context manager, and the "
                          "kernels stay on (use `with tigon.force_reference():`, or TIGON_DISABLE=1)",
                          RuntimeWarning, stacklevel=2)


def _forced() -> bool:
    """Whether this thread is inside :func:`force_reference` (the thread-local is read only while one is open)."""
    return _forced_contexts > 0 and getattr(_state, "forced", False)


def interpreter_enabled() -> bool:
    """True when Triton's interpreter is on (``TRITON_INTERPRET=1`` in the environment; read per call, without
    decoding the value)."""
    if _ENV_DATA is None or os.environ is not _ENVIRON:
        return os.environ.get("TRITON_INTERPRET", "0") == "1"
    return _ENV_DATA.get(_K_INTERPRET) == _ONE


def _assume_constant_result(fn):
    """``torch.compiler.assume_constant_result(fn)`` without importing torch._dynamo when Tigon is imported.

    Importing dynamo imports ``triton.language``; imported before ``TRITON_INTERPRET=1`` is set (the CLI sets it
    after ``import tigon``), Triton's own jitted helpers (``tl.sum``...) then fail under the interpreter. The
    decorator only flags the function (``_dynamo_marked_constant``), so that flag is set directly unless dynamo is
    already loaded; tests/test_compile.py checks that a compiled call still picks the backend once per trace.
    """
    if "torch._dynamo" in sys.modules:
        return torch.compiler.assume_constant_result(fn)
    fn._dynamo_marked_constant = True
    return fn


@_assume_constant_result
def switches():
    """Everything at run time that :func:`select_backend`'s answer for a tensor depends on besides its device and
    dtype, as one hashable value for an op's cache of validated calls (see :func:`remember_call`):
    ``(TRITON_INTERPRET, TIGON_DISABLE)`` as stored in the environment, read per call (so a change of either is a new
    key). None where a call must take its full path instead: under torch.compile (dynamo traces the op; the choice
    is made once per trace), while a :func:`force_reference` context is open in any thread, with ``os.environ``
    replaced (a test's mock), or while a functorch transform (vmap, grad...) is active (a hit calls the
    autograd.Function's C-level apply directly: :func:`tigon.kernels._common.cached_apply`).

    One Python frame per op call: dynamo does not trace this function (``assume_constant_result``: it calls it once
    per trace, and the answer is a constant of the graph), so the compile check reads what is true while dynamo
    compiles, in this frame, instead of calling ``torch.compiler.is_dynamo_compiling()`` (which answers True only
    inside a trace, from a frame of its own): torch's tracing context (``torch._guards.TracingContext``, set for
    every dynamo trace, strict ``torch.export`` included) or ``torch.compiler._is_compiling_flag`` (non-strict
    export; and dynamo's whole compilation from torch 2.13). Inside a trace the answer is therefore always None.
    tests/test_call_cache.py checks both."""
    if (getattr(_TRACING_TLS, "tracing_context", None) is not None or COMPILER._is_compiling_flag or _forced_contexts
            or _ENV_DATA is None or os.environ is not _ENVIRON or _functorch_active()):
        return None
    return _ENV_DATA.get(_K_INTERPRET), _ENV_DATA.get(_K_DISABLE)


_functorch_active = torch._C._are_functorch_transforms_active
unwrap_dead = getattr(torch._C._functorch, "unwrap_if_dead", None) or (lambda t: t)
"""``torch._C._functorch.unwrap_if_dead``: a tensor argument as ``Function.apply`` passes it on (a dead functorch
wrapper, one left over from a finished transform, unwrapped; any other tensor itself). The ops' cache hits call it on
their tensor arguments before the C-level apply they keep (:func:`tigon.kernels._common.cached_apply`)."""

MAX_CALLS = 512
"""Entries per op cache of validated calls before it is emptied (keys hold shapes: a run with many sequence lengths
must not grow it without bound)."""


def remember_call(cache: dict, key, op: str, backend: str, value) -> None:
    """Store ``value`` (what the op's checks returned: its normalised options) under ``key`` in ``cache`` (an op's
    validated calls, keyed by everything its checks read and :func:`switches`) when ``backend``, which
    :func:`select_backend` chose for this call (and counted), runs the kernels; a call that falls back to the
    reference is never cached (its warning, strict-mode error and count happen on every call, as before). A hit is
    ``(value, usage key)``: the op counts the call with ``USAGE[usage key] += 1``, as :func:`select_backend` does."""
    if key is None or backend in TORCH_CODE:
        return
    if len(cache) >= MAX_CALLS:
        cache.clear()
    cache[key] = (value, (op, backend))




def triton_version() -> str | None:
    """The installed Triton version, or None when Triton cannot be imported."""
    if importlib.util.find_spec("triton") is None:
        return None
    try:
        import triton

        return triton.__version__
    except Exception:  # pragma: no cover - broken installs
        return None


_decisions: dict[tuple, Decision] = {}
""":func:`decide`'s answers by (device, dtype, forced, TIGON_DISABLE, TRITON_INTERPRET): every input of the rules
that can change while the process runs is in the key, so a change of any of them (force_reference, the environment)
is a new key, never a stale answer. The rest is fixed for a process: whether Triton is installed (read once, by
:func:`_triton_installed`), torch's HIP build and a CUDA device's compute capability (a CUDA device without an index
means the current device, which can change: not cached). Bounded by the devices and dtypes seen times 8."""


def decide(device: torch.device, dtype: torch.dtype) -> Decision:
    """Which backend an op would use for tensors on ``device`` with ``dtype``, and why.

    Pure: no warning, no counting. See the module docstring for the rules. Memoised (see ``_decisions``).
    """
    if _ENV_DATA is None or os.environ is not _ENVIRON:
        disabled = os.environ.get("TIGON_DISABLE", "0") == "1"
    else:
        disabled = _ENV_DATA.get(_K_DISABLE) == _ONE
    key = (device, dtype, _forced(), disabled, interpreter_enabled())
    d = _decisions.get(key)
    if d is None:
        d = _decide(device, dtype, *key[2:])
        if device.type != "cuda" or device.index is not None:
            _decisions[key] = d
    return d


@functools.lru_cache(maxsize=None)
def _triton_installed() -> bool:
    """Whether Triton can be imported, asked once per process (installing it into a running process is not seen)."""
    return triton_version() is not None


def _decide(device: torch.device, dtype: torch.dtype, forced: bool, disabled: bool, interpreted: bool) -> Decision:
    """:func:`decide`'s rules, with the switches that can change at run time as arguments."""
    if forced or disabled:
        return Decision("reference", "kernels disabled (force_reference / TIGON_DISABLE=1)")
    if dtype not in KERNEL_DTYPES:
        return Decision("reference", f"dtype {dtype} has no kernel (supported: float32, bfloat16, float16)")
    if not _triton_installed():
        return Decision("reference", "triton is not installed")
    if interpreted:
        if device.type in ("cpu", "cuda"):
            return Decision("interpreter", "TRITON_INTERPRET=1: Triton kernels run by the interpreter")
        return Decision("reference", f"device {device.type!r} is not supported by the Triton interpreter")
    if device.type == "cuda":
        if torch.version.hip is not None:
            return Decision("triton", "ROCm device (kernels are tested on CUDA only)")
        major, minor = torch.cuda.get_device_capability(device)
        if major < 7:
            return Decision("reference", f"compute capability {major}.{minor} < 7.0")
        if dtype == torch.bfloat16 and major < 8:
            return Decision("reference", f"bfloat16 needs compute capability >= 8.0, found {major}.{minor}")
        return Decision("triton", f"CUDA device with compute capability {major}.{minor}")
    if device.type == "cpu":
        return Decision("reference", "CPU tensors (set TRITON_INTERPRET=1 to run the kernels interpreted)")
    return Decision("reference", f"device type {device.type!r} has no Triton backend")


def select_backend(op: str, tensor: torch.Tensor) -> str:
    """The backend ``op`` runs for ``tensor``; warns once per reason on fallback, raises in strict mode.

    Under ``torch.compile`` the choice is made once per trace: dynamo runs :func:`_traced_backend` as plain Python
    when it reaches the call (so the warning, the strict-mode error and the usage count happen then, once per
    compiled graph) and bakes the answer into the graph, instead of tracing through the environment, the
    thread-local and ``warnings.warn`` (a builtin dynamo cannot trace: a graph break). A compiled graph is guarded
    on its tensors' devices and dtypes, not on :func:`force_reference`, ``TIGON_DISABLE`` or strict mode: after
    changing those, ``torch.compiler.reset()`` makes an already compiled model pick again.

    Raises:
        UnsupportedError: strict mode is on and the op would fall back to the reference.
    """
    if torch.compiler.is_compiling():
        return BACKENDS[_traced_backend(op, tensor.device.type, tensor.device.index, tensor.dtype)]
    if not has_data(tensor):  # meta / fake tensors: shapes only, the reference carries them (no warning)
        _usage[(op, "reference")] += 1
        return "reference"
    return _select(op, tensor.device, tensor.dtype)


@_assume_constant_result
def _traced_backend(op: str, device_type: str, device_index: int | None, dtype: torch.dtype) -> int:
    """:func:`select_backend` for dynamo: constant arguments in, an index into :data:`BACKENDS` out.

    An int, not the backend's name: dynamo stores the result of an ``assume_constant_result`` function as a graph
    constant, and a string did not survive that (compared unequal to itself in torch 2.13).
    """
    device = torch.device(device_type) if device_index is None else torch.device(device_type, device_index)
    d = decide(device, dtype)
    if d.backend in ("triton", "interpreter") and compiled_choice(op) == "inductor":
        _usage[(op, "inductor")] += 1
        return BACKENDS.index("inductor")
    return BACKENDS.index(_select(op, device, dtype))


def _select(op: str, device: torch.device, dtype: torch.dtype) -> str:
    """select_backend's body: decide, then warn / raise / count."""
    d = decide(device, dtype)
    if d.backend == "reference" and not d.reason.startswith("kernels disabled"):
        if is_strict():
            raise UnsupportedError(f"tigon.{op}: no Triton path ({d.reason}) and strict mode is on")
        if d.reason not in _warned:
            _warned.add(d.reason)
            warnings.warn(
                f"Tigon falls back to the PyTorch reference: {d.reason}. "
                "Results are correct but not accelerated; set TIGON_STRICT=1 to make this an error.",
                TigonFallbackWarning,
                stacklevel=4,
            )
    _usage[(op, d.backend)] += 1
    return d.backend


def backend_usage(reset: bool = False) -> dict[str, dict[str, int]]:
    """Calls per op and backend since the last reset: ``{op name: {"triton": 12, ...}, ...}``."""
    out: dict[str, dict[str, int]] = {}
    for (op, backend), n in sorted(_usage.items()):
        out.setdefault(op, {})[backend] = n
    if reset:
        _usage.clear()
    return out


def describe_backend(usage: dict[str, dict[str, int]]) -> str:
    """One word for a run: the single backend used by all ops, or ``"mixed"`` (``"none"`` if no op ran)."""
    seen = {b for per_op in usage.values() for b in per_op}
    if not seen:
        return "none"
    return seen.pop() if len(seen) == 1 else "mixed"
