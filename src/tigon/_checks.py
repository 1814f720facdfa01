"""Argument validation shared by the public API: clear errors naming the argument and what was expected."""

from __future__ import annotations

import math
import numbers
import operator

import torch


UNSIGNED = tuple(getattr(torch, n) for n in ("uint8", "uint16", "uint32", "uint64") if hasattr(torch, n))
"""torch's unsigned integer dtypes (uint16 / 32 / 64 since torch 2.3)."""


def tensor(name: str, t, *, floating: bool | None = None, integer: bool = False, signed: bool = False,
           ndim=None) -> torch.Tensor:
    """Check that ``t`` is a tensor (optionally floating / integer, with ``ndim`` in an int or tuple).

    ``signed`` (with ``integer``): refuse unsigned dtypes too, for labels compared with a negative ``ignore_index``
    (a uint8 target failed inside the kernel: "Cannot perform a binary operation between an unsigned tensor and a
    negative scalar").

    Raises:
        TypeError: not a tensor, or the wrong kind of dtype.
        ValueError: the wrong number of dimensions.
    """
    cls = type(t)
    if cls is not torch.Tensor and cls is not torch.nn.Parameter:  # (a plain tensor skips both checks)
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if tensor_kind(t) == "subclass":
            dtensor = " (DTensor: the row-wise ops take it; see tigon.ops._dtensor)" if is_dtensor(t) else ""
            raise TypeError(
                f"{name} is a {type(t).__module__}.{type(t).__qualname__}{dtensor}, a tensor subclass whose memory "
                "is not its data: Tigon's kernels read tensors' memory directly and cannot run on it. Pass a plain "
                "tensor (e.g. .full_tensor() or .to_local() of a DTensor, a dequantised copy of a quantised tensor)")
    if floating and not t.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {t.dtype}")
    if integer and (t.is_floating_point() or t.is_complex() or t.dtype == torch.bool):
        raise TypeError(f"{name} must be an integer tensor, got dtype {t.dtype}")
    if integer and signed and t.dtype in UNSIGNED:
        raise TypeError(f"{name} must be a signed integer tensor (int64, int32, ...; ignore_index is negative), got "
                        f"dtype {t.dtype}: convert it with .long()")
    if ndim is not None and t.dim() != ndim:
        allowed = (ndim,) if isinstance(ndim, int) else tuple(ndim)
        if t.dim() not in allowed:
            dims = " or ".join(map(str, allowed)) + (" dimension" if allowed == (1,) else " dimensions")
            raise ValueError(f"{name} must have {dims}, got shape {tuple(t.shape)}")
    return t


def same_device(**tensors) -> None:
    """Raise ValueError when the given (non-None) tensors are not all on one device."""
    first = None
    for v in tensors.values():  # the usual case, one device, without building the lists below
        if v is not None:
            if first is None:
                first = v.device
            elif v.device != first:
                break
    else:
        return
    items = [(k, v) for k, v in tensors.items() if v is not None]
    devices = {v.device for _, v in items}
    if len(devices) > 1:
        desc = ", ".join(f"{k} on {v.device}" for k, v in items)
        raise ValueError(f"all tensors must be on one device, got {desc}")


def choice(name: str, value, allowed) -> None:
    """Raise ValueError when ``value`` is not one of ``allowed``."""
    if value not in allowed:
        raise ValueError(f"{name} must be one of {tuple(allowed)}, got {value!r}")


def flag(name: str, value) -> bool:
    """``value`` itself when it is a bool. Raises TypeError naming ``name`` otherwise (1, None or a tensor is not a
    flag: a truthy stand-in would silently pick a path)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__} {value!r}")
    return value


def finite(v) -> bool:
    """Whether the real number ``v`` is finite (NaN and +-inf are not), as ``math.isfinite``, also on the
    symbolic float Dynamo traces for a Python float under ``torch.compile(dynamic=True)`` (a module's ``eps``,
    a function's default): ``math.isfinite`` on one is a graph break, a comparison is a guard."""
    return -math.inf < v < math.inf


def number(name: str, value, *, minimum: float | None = None) -> float:
    """``value`` as a finite float (at least ``minimum``).

    Raises:
        TypeError: not a real number. ValueError: not finite, or below ``minimum``.
    """
    if type(value) is not float and (isinstance(value, bool) or not isinstance(value, numbers.Real)):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__} {value!r}")
    v = float(value)  # (numbers.Real: a numpy scalar too, as Liger-Kernel takes one)
    if not -math.inf < v < math.inf or (minimum is not None and v < minimum):  # (finite(v), inline)
        bound = f" >= {minimum:g}" if minimum is not None else ""
        raise ValueError(f"{name} must be a finite number{bound}, got {value!r}")
    return v


def softcap(name: str, value) -> float | None:
    """``value`` as a float, or None: a final-logit soft-cap ``c`` (``c tanh(z / c)``, Gemma 2's
    ``final_logit_softcapping``).

    Raises:
        ValueError: not None and not a finite real number > 0 (a bool is not one).
    """
    if value is None:
        return None
    if (not isinstance(value, numbers.Real) or isinstance(value, bool) or not -math.inf < float(value) < math.inf
            or not float(value) > 0.0):
        raise ValueError(f"{name} must be None or a finite float > 0, got {value!r}")
    return float(value)


def integer(name: str, value) -> int:
    """``value`` as an int (any sign: ``ignore_index``), from an int, a numpy integer or a one-element integer tensor.

    Raises:
        TypeError: a bool, a float (``-100.5`` would have been truncated to -100 by ``int()``) or anything else that
            is not an integer.
    """
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got bool {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}") from None


def size(name: str, value) -> int:
    """``value`` as an int >= 1 (a module's width: ``hidden_size``, ``intermediate_size``).

    Raises:
        TypeError: not an integer (a bool, a float or a tensor is not a size). ValueError: zero or negative.
    """
    if isinstance(value, bool) or isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a positive int, got {type(value).__name__} {value!r}")
    try:
        v = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be a positive int, got {type(value).__name__} {value!r}") from None
    if v < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return v


def num_items(value, *, zero: bool = False, real: bool = False) -> None:
    """Validate a ``num_items_in_batch`` (HF's count of the tokens a summed loss is divided by): None, an int (with
    ``real``, any real number) or a one-element real tensor; finite and > 0 (with ``zero``, >= 0). A CPU tensor's
    value is read; a CUDA one's is not (a host sync per call), nor any while torch.compile traces (a data-dependent
    guard).

    Raises:
        TypeError: a bool, a float without ``real``, another non-number; a bool or complex tensor.
        ValueError: a tensor of more than one element (it would broadcast the loss); NaN, inf, or below the minimum.
    """
    if value is None:
        return
    if isinstance(value, torch.Tensor):
        if value.dtype == torch.bool or value.is_complex():
            raise TypeError(f"num_items_in_batch must be a one-element real tensor, got dtype {value.dtype}")
        if value.numel() != 1:
            raise ValueError(f"num_items_in_batch must be a number or a one-element tensor, got shape "
                             f"{tuple(value.shape)}")
        if not (value.is_cpu and has_data(value) and not torch.compiler.is_compiling()):
            return
        v = value.item()
    elif isinstance(value, numbers.Real if real else numbers.Integral) and not isinstance(value, bool):
        v = value
    else:
        raise TypeError(f"num_items_in_batch must be None, {'a real number' if real else 'an int'} or a one-element "
                        f"tensor, got {type(value).__name__} {value!r}")
    if not (finite(v) and (v >= 0 if zero else v > 0)):
        raise ValueError(f"num_items_in_batch must be {'>= 0' if zero else '> 0'} and finite, got {value!r}")


def is_dtensor(t) -> bool:
    """Whether ``t`` is a torch.distributed DTensor (without importing torch.distributed when it is not loaded)."""
    import sys

    mod = sys.modules.get("torch.distributed.tensor")
    return mod is not None and isinstance(t, mod.DTensor)


def tensor_kind(t: torch.Tensor) -> str:
    """``"plain"`` (a tensor or Parameter over real memory, meta included), ``"fake"`` (FakeTensor: shapes only,
    as torch.compile and FakeTensorMode trace) or ``"subclass"`` (a wrapper subclass with its own
    ``__torch_dispatch__``, e.g. DTensor, whose memory is not its data)."""
    cls = type(t)
    if cls is torch.Tensor or cls is torch.nn.Parameter or cls.__torch_dispatch__ is torch.Tensor.__torch_dispatch__:
        return "plain"
    from torch._subclasses.fake_tensor import FakeTensor

    return "fake" if isinstance(t, FakeTensor) else "subclass"


def has_data(t: torch.Tensor) -> bool:
    """Whether ``t``'s values can be read on the host: False for meta and fake tensors (shapes only)."""
    return not t.is_meta and tensor_kind(t) == "plain"  # (is_meta: ~10x cheaper than t.device.type)


class _Unset:
    """The type of :data:`UNSET` and :data:`ALIAS` (each one instance, also through pickle and copy)."""

    __slots__ = ("_name",)

    def __init__(self, name: str):
        self._name = name

    def __repr__(self) -> str:
        return "<required>" if self._name == "UNSET" else "<Liger's name of it>"

    def __reduce__(self):
        return self._name


UNSET = _Unset("UNSET")
"""Default of a required argument that Liger-Kernel names differently (see :func:`liger_names`): ``rms_norm(X=x,
W=w)`` must bind, so ``x`` and ``weight`` get this default (shown as ``<required>``)."""

ALIAS = _Unset("ALIAS")
"""Default of Liger's keyword-only name of such an argument (``X``, ``W``...; shown as ``<Liger's name of it>``): not
given unless it is something else."""


def liger_names(op: str, *pairs) -> list:
    """The values of an op's required arguments given by Tigon's or by Liger-Kernel's keyword names.

    Called by a public op only when one of them is :data:`UNSET` or a Liger name was given, so a call by position
    costs the op a few identity tests and no Python call.

    Args:
        op: the op's name, for the messages.
        pairs: ``(name, value, liger_name, liger_value)`` per argument, in order (``value`` :data:`UNSET` and
            ``liger_value`` :data:`ALIAS` where not given); ``liger_name`` None (and ``liger_value`` :data:`ALIAS`)
            for a required argument that Liger names as Tigon does.

    Returns:
        One value per pair.

    Raises:
        TypeError: an argument given under both names, or under neither.
    """
    out = []
    for name, value, liger_name, liger_value in pairs:
        if liger_value is not ALIAS:
            if value is not UNSET:
                raise TypeError(f"{op}() got {name!r} and {liger_name!r} (Liger-Kernel's name for it): give one")
            value = liger_value
        elif value is UNSET:
            also = "" if liger_name is None else f" (or {liger_name!r}, Liger-Kernel's name for it)"
            raise TypeError(f"{op}() missing required argument {name!r}{also}")
        out.append(value)
    return out
