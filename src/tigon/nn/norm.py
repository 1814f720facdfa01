"""Normalisation modules: RMSNorm (HF LlamaRMSNorm / GemmaRMSNorm compatible), FusedAddRMSNorm (the residual add and
the norm of HF decoder layers; Liger-Kernel's LigerFusedAddRMSNorm), LayerNorm (Liger-Kernel's LigerLayerNorm, a
torch.nn.LayerNorm subclass), DyT (Dynamic Tanh, the element-wise replacement of a norm; Liger-Kernel's LigerDyT),
PolyNorm (Liger-Kernel's LigerPolyNorm) and GroupNorm (Liger-Kernel's LigerGroupNorm).

Each takes its Liger-Kernel counterpart's constructor arguments in Liger's order, positionally or by keyword, then
Tigon's own options keyword-only (``device``, ``dtype``); tests/test_liger_signatures.py checks the order and defaults
against Liger-Kernel 0.8.5's."""

from __future__ import annotations

import torch
from torch import nn

from .. import _checks
from .._checks import ALIAS, UNSET, liger_names
from .. import functional as TF


class RMSNorm(nn.Module):
    """Root-mean-square norm over the last dimension (Zhang & Sennrich 2019), via :func:`tigon.functional.rms_norm`.

    ``y = x / sqrt(mean(x**2, -1) + eps) * (offset + weight)``, statistics in fp32.

    Drop-in for Liger-Kernel's ``LigerRMSNorm(hidden_size, eps=1e-6, offset=0.0, casting_mode="llama",
    init_fn="ones", in_place=True, row_mode=None, elementwise_affine=True)``: the same arguments in the same order
    (positional or keyword), then Tigon's keyword-only ``device`` and ``dtype``. Attributes match HF
    ``LlamaRMSNorm`` (``weight``, ``variance_epsilon``) and Liger's (``offset``, ``casting_mode``, ``in_place``,
    ``row_mode``), so their state dicts load as is. Gemma's ``(1 + w)`` norm: ``offset=1.0, casting_mode="gemma"``
    (Liger's ``LigerRMSNormForGemma`` passes ``init_fn="zeros"`` too).

    Args:
        hidden_size: size of the last dimension, a positive int.
        eps: variance epsilon (HF ``rms_norm_eps``), a number >= 0.
        offset: added to the weight in the forward.
        casting_mode: ``"llama"`` | ``"gemma"`` | ``"none"`` (see :func:`tigon.reference.rms_norm.rms_norm`).
        init_fn: ``"ones"`` or ``"zeros"``, the weight's initial value (Liger's). None (default): zeros when
            ``offset`` is non-zero (so ``offset + w`` starts at 1, as HF ``GemmaRMSNorm``), else ones. Liger's
            default is ``"ones"`` whatever the offset; the two differ only for a non-zero offset without init_fn
            (Liger's weight then starts at ones, its scale at ``offset + 1``), and not at all once a state dict is
            loaded.
        in_place: Liger-Kernel's ``in_place`` (same default): the backward writes the input's gradient over the
            output's incoming gradient where autograd shows nothing else reads it; see
            :func:`tigon.functional.rms_norm` for when, and the bytes it saves.
        row_mode: Liger's launch hint (None, True or False: whether its kernel takes one row per program even for
            many short rows). It only picks Liger's kernel schedule, never the values; Tigon's launcher picks rows
            per program from the shape itself, so it is accepted, checked and kept as ``self.row_mode`` and
            otherwise unused (a no-op hint).
        elementwise_affine: False: no weight (``self.weight`` is None, as in Liger's
            ``LigerRMSNorm(elementwise_affine=False)``), ``y = x / sqrt(mean(x**2) + eps)`` in the input's dtype;
            ``offset`` and ``init_fn`` are then unused.
        device, dtype: of the weight (keyword-only).

    Shapes and dtypes:
        input (..., hidden_size), float32 / bfloat16 / float16 on the kernel path (other float dtypes run the
        reference); output has the input's shape, dtype as in :func:`tigon.functional.rms_norm`.

    Raises:
        TypeError: hidden_size is not an int, eps not a number, elementwise_affine or in_place not a bool,
            row_mode neither None nor a bool (at construction).
        ValueError: hidden_size < 1, eps < 0, unknown casting_mode or init_fn (at construction), or a last
            dimension other than hidden_size (forward).
    """

    def __init__(self, hidden_size: int, eps: float = 1e-6, offset: float = 0.0, casting_mode: str = "llama",
                 init_fn: str | None = None, in_place: bool = True, row_mode: bool | None = None,
                 elementwise_affine: bool = True, *, device=None, dtype=None) -> None:
        super().__init__()
        hidden_size = _checks.size("hidden_size", hidden_size)
        _checks.number("eps", eps, minimum=0.0)
        _checks.number("offset", offset)
        if casting_mode not in ("llama", "gemma", "none"):
            raise ValueError(f"casting_mode must be one of ('llama', 'gemma', 'none'), got {casting_mode!r}")
        if init_fn not in (None, "ones", "zeros"):
            raise ValueError(f"init_fn must be 'ones', 'zeros' or None, got {init_fn!r}")
        if row_mode is not None and not isinstance(row_mode, bool):
            raise TypeError(f"row_mode must be None or a bool (Liger's launch hint), got {type(row_mode).__name__} "
                            f"{row_mode!r}")
        _checks.flag("elementwise_affine", elementwise_affine)
        _checks.flag("in_place", in_place)
        self.hidden_size = hidden_size
        self.in_place = in_place
        self.row_mode = row_mode
        self.elementwise_affine = elementwise_affine
        if init_fn is None:
            init_fn = "zeros" if offset != 0.0 else "ones"
        if elementwise_affine:
            init = torch.ones if init_fn == "ones" else torch.zeros
            self.weight = nn.Parameter(init(hidden_size, device=device, dtype=dtype))
        else:
            self.register_parameter("weight", None)
        self.variance_epsilon = eps
        self.offset = offset
        self.casting_mode = casting_mode

    @property
    def eps(self) -> float:
        """Alias of ``variance_epsilon`` (the name GemmaRMSNorm uses)."""
        return self.variance_epsilon

    @eps.setter
    def eps(self, value: float) -> None:
        self.variance_epsilon = value

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if self.weight is None and hidden_states.shape[-1:] != (self.hidden_size,):
            raise ValueError(f"hidden_states' last dimension must be hidden_size {self.hidden_size}, got shape "
                             f"{tuple(hidden_states.shape)}")
        return TF.rms_norm(hidden_states, self.weight, self.variance_epsilon, self.offset, self.casting_mode,
                           self.in_place)

    def extra_repr(self) -> str:
        shape, affine = ((self.hidden_size,), ", elementwise_affine=False") if self.weight is None else \
            (tuple(self.weight.shape), "")
        row_mode = "" if self.row_mode is None else f", row_mode={self.row_mode}"
        return (f"{shape}, eps={self.variance_epsilon}, offset={self.offset}, casting_mode={self.casting_mode!r}"
                f"{affine}, in_place={self.in_place}{row_mode}")


class FusedAddRMSNorm(RMSNorm):
    """Residual add then RMSNorm, via :func:`tigon.functional.fused_add_rms_norm`: ``forward(hidden_states, residual)
    -> (rms_norm(hidden_states + residual), hidden_states + residual)``.

    Replaces the two lines of an HF decoder layer ``hidden_states = residual + hidden_states; residual =
    hidden_states`` and the following norm's call, as Liger-Kernel's ``LigerFusedAddRMSNorm(hidden_size, eps=1e-6,
    offset=0.0, casting_mode="llama", init_fn="ones", in_place=False)`` (the same arguments in the same order, then
    Tigon's keyword-only ``device`` and ``dtype``). A subclass of :class:`RMSNorm` (the same weight, epsilon, offset
    and casting mode; its state dict is an RMSNorm's, so HF LlamaRMSNorm / GemmaRMSNorm weights load as is) whose
    forward also takes the residual.

    Args:
        hidden_size: size of the last dimension, a positive int.
        eps: variance epsilon (HF ``rms_norm_eps``).
        offset: added to the weight in the forward (1.0 for Gemma's ``(1 + w)``).
        casting_mode: ``"llama"`` | ``"gemma"`` | ``"none"`` (see :func:`tigon.reference.rms_norm.rms_norm`).
        init_fn: ``"ones"`` or ``"zeros"``, the weight's initial value; None (default): zeros when offset is
            non-zero (so ``(offset + w)`` starts at 1, as GemmaRMSNorm), else ones, as :class:`RMSNorm`. (Liger's
            default is ``"ones"`` whatever the offset.)
        in_place: the backward writes the gradient of hidden_states and residual over the first output's incoming
            gradient where nothing else reads it (see :func:`tigon.functional.fused_add_rms_norm`). Default False,
            as Liger's module (and as :func:`tigon.functional.fused_add_rms_norm`, whose Liger counterpart
            defaults to True).
        device, dtype: of the weight (keyword-only).

    Shapes and dtypes:
        hidden_states and residual (..., hidden_size), one shape and dtype (float32 / bfloat16 / float16 on the
        kernel path); outputs as in :func:`tigon.functional.fused_add_rms_norm`.

    Raises:
        ValueError: hidden_size < 1, unknown casting_mode or init_fn (at construction); mismatched shapes (forward).
        TypeError: hidden_size not an int, in_place not a bool (at construction).
    """

    def __init__(self, hidden_size: int, eps: float = 1e-6, offset: float = 0.0, casting_mode: str = "llama",
                 init_fn: str | None = None, in_place: bool = False, *, device=None, dtype=None) -> None:
        super().__init__(hidden_size, eps, offset, casting_mode, init_fn, in_place, device=device, dtype=dtype)

    def forward(self, hidden_states: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return TF.fused_add_rms_norm(hidden_states, residual, self.weight, self.variance_epsilon, self.offset,
                                     self.casting_mode, self.in_place)



class LayerNorm(nn.LayerNorm):
    """LayerNorm over the last dimension (Ba, Kiros & Hinton 2016), computed by :func:`tigon.functional.layer_norm`.

    Drop-in for Liger-Kernel's ``LigerLayerNorm(hidden_size, eps=1e-6, bias=False, init_fn="ones", impl=None,
    mode=None, backend=None)``: the same arguments in the same order (positional or keyword), then Tigon's
    keyword-only ``device`` and ``dtype``; the same parameters and initialisation: ``weight`` (hidden_size,) of ones
    (zeros with ``init_fn="zeros"``) and a learnable ``bias`` (hidden_size,) in either case, zeros with
    ``bias=False`` and a standard normal draw with ``bias=True`` (Liger's rule; torch's bias starts at zeros). So a
    LigerLayerNorm's state dict loads as is, and so does a ``torch.nn.LayerNorm``'s (``weight``, ``bias``).

    Not torch's constructor: ``torch.nn.LayerNorm(normalized_shape, eps=1e-5, elementwise_affine=True,
    bias=True)`` differs from Liger's in the third position, eps's default and what ``bias`` means, so one class
    cannot take both calls; this one follows the drop-in rule (Liger's). It is still a subclass of
    ``torch.nn.LayerNorm`` (``isinstance(m, torch.nn.LayerNorm)`` holds: optimizer no-decay groups and
    ``normalized_shape`` / ``eps`` / ``elementwise_affine`` (True) keep working; so does code that re-initialises
    every torch LayerNorm, e.g. an HF model's ``_init_weights``: ones and zeros, whatever init_fn / bias said). For
    torch's call use ``torch.nn.LayerNorm`` itself (``tigon.patch`` runs the LayerNorm families' instances through
    :func:`tigon.functional.layer_norm`) or :func:`tigon.functional.layer_norm`.

    Args:
        hidden_size: size of the last dimension, a positive int (or a 1-element sequence of one).
        eps: added to the variance (Liger's default 1e-6; torch's is 1e-5). ``variance_epsilon`` is an alias.
        bias: the bias's initial value: a standard normal draw (True) or zeros (False). The bias is a learnable
            parameter either way, as in Liger's module.
        init_fn: ``"ones"`` or ``"zeros"``, the weight's initial value.
        impl, mode, backend: Liger's kernel-backend selection (``backend`` its legacy alias of ``impl``): None or a
            string. Tigon has one implementation per device, picked by :mod:`tigon.support`, so these are accepted,
            checked and kept (``self.impl``, ``self.mode``; ``self.backend`` reads ``impl``) and otherwise unused.
        device, dtype: of the parameters (keyword-only).

    Shapes and dtypes:
        input (..., hidden_size), float32 / bfloat16 / float16 on the kernel path (``forward(input)``, torch's name;
        Liger's ``hidden_states=`` is taken as a keyword); output: same shape, the input's dtype.

    Raises:
        TypeError: hidden_size not an int, eps not a number, bias not a bool, impl / mode / backend neither None nor
            a string (at construction).
        ValueError: hidden_size < 1 or a sequence of more than one dimension, eps < 0, unknown init_fn (at
            construction).
    """

    def __init__(self, hidden_size: int, eps: float = 1e-6, bias: bool = False, init_fn: str = "ones",
                 impl: str | None = None, mode: str | None = None, backend: str | None = None, *, device=None,
                 dtype=None) -> None:
        if not isinstance(hidden_size, int) and isinstance(hidden_size, (tuple, list, torch.Size)):
            if len(hidden_size) != 1:
                raise ValueError(f"tigon.nn.LayerNorm normalises the last dimension only; hidden_size must be an "
                                 f"int or a 1-element sequence, got {hidden_size!r}")
            hidden_size = hidden_size[0]
        hidden_size = _checks.size("hidden_size", hidden_size)
        _checks.number("eps", eps, minimum=0.0)
        _checks.flag("bias", bias)
        if init_fn not in ("ones", "zeros"):
            raise ValueError(f"init_fn must be 'ones' or 'zeros', got {init_fn!r}")
        for name, value in (("impl", impl), ("mode", mode), ("backend", backend)):
            if value is not None and not isinstance(value, str):
                raise TypeError(f"{name} must be None or a string (Liger's backend selection; Tigon picks its own), "
                                f"got {type(value).__name__} {value!r}")
        self._init_fn, self._random_bias = init_fn, bias
        super().__init__(hidden_size, eps=eps, elementwise_affine=True, bias=True, device=device, dtype=dtype)
        self.hidden_size = hidden_size
        self.impl = impl if impl is not None else backend
        self.mode = mode

    def reset_parameters(self) -> None:
        """Liger's initialisation: weight ones (``init_fn="zeros"``: zeros), bias zeros (``bias=True``: randn)."""
        with torch.no_grad():
            self.weight.fill_(1.0 if getattr(self, "_init_fn", "ones") == "ones" else 0.0)
            if getattr(self, "_random_bias", False):
                self.bias.normal_()
            else:
                self.bias.zero_()

    @property
    def variance_epsilon(self) -> float:
        """Alias of ``eps`` (Liger's module has both)."""
        return self.eps

    @variance_epsilon.setter
    def variance_epsilon(self, value: float) -> None:
        self.eps = value

    @property
    def backend(self) -> str | None:
        """Liger's legacy alias of ``impl``."""
        return self.impl

    @backend.setter
    def backend(self, value: str | None) -> None:
        self.impl = value

    def forward(self, input: torch.Tensor = UNSET, *, hidden_states: torch.Tensor = ALIAS) -> torch.Tensor:
        if input is UNSET or hidden_states is not ALIAS:  # (Liger's keyword name: hidden_states)
            (input,) = liger_names("LayerNorm.forward", ("input", input, "hidden_states", hidden_states))
        return TF.layer_norm(input, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return f"{self.hidden_size}, eps={self.eps}"


class DyT(nn.Module):
    """Dynamic Tanh, ``gamma * tanh(alpha * x) + beta`` (Zhu et al. 2025, "Transformers without Normalization"),
    via :func:`tigon.functional.dyt`: the element-wise replacement of a norm layer.

    Drop-in for Liger-Kernel's ``LigerDyT(hidden_size, beta=True, init_alpha=0.5)``: the same constructor arguments
    (then the keyword-only ``device`` and ``dtype``), parameters ``alpha`` (1,) = init_alpha, ``gamma``
    (hidden_size,) = 1 and ``beta`` (hidden_size,) = 0 (None with ``beta=False``), so its state dict loads as is.

    Args:
        hidden_size: size of the last dimension.
        beta: whether there is a shift ``beta`` (True).
        init_alpha: alpha's initial value (0.5, the paper's default for LLMs' non-attention norms).
        device, dtype: of the parameters (keyword-only).

    Shapes and dtypes:
        input (..., hidden_size), float32 / bfloat16 / float16 on the kernel path; output: same shape, the input's
        dtype.

    Raises:
        TypeError: hidden_size not an int, init_alpha not a real number, beta not a bool (at construction).
        ValueError: hidden_size < 1, init_alpha not finite (at construction); a last dimension other than
            hidden_size (forward).
    """

    def __init__(self, hidden_size: int, beta: bool = True, init_alpha: float = 0.5, *, device=None,
                 dtype=None) -> None:
        super().__init__()
        hidden_size = _checks.size("hidden_size", hidden_size)
        alpha = _checks.number("init_alpha", init_alpha)
        _checks.flag("beta", beta)
        self.hidden_size = hidden_size
        self.init_alpha = init_alpha
        kw = {"device": device, "dtype": dtype}
        self.alpha = nn.Parameter(torch.full((1,), alpha, **kw))
        self.gamma = nn.Parameter(torch.ones(hidden_size, **kw))
        self.beta = nn.Parameter(torch.zeros(hidden_size, **kw)) if beta else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return TF.dyt(x, self.alpha, self.gamma, self.beta)

    def extra_repr(self) -> str:
        return f"{self.hidden_size}, init_alpha={self.init_alpha}, beta={self.beta is not None}"


class PolyNorm(nn.Module):
    """PolyNorm, ``weight[0] norm(x^3) + weight[1] norm(x^2) + weight[2] norm(x) + bias`` with ``norm(u) = u /
    sqrt(mean(u^2) + eps)`` (Zhuo et al. 2024, "Polynomial Composition Activations"), via
    :func:`tigon.functional.poly_norm`.

    Drop-in for Liger-Kernel's ``LigerPolyNorm(eps=1e-6, in_place=True)``: the same constructor arguments (then
    the keyword-only ``device`` and ``dtype``), parameters ``weight`` (3,) = 1/3 and ``bias`` 0-d = 1.0 (PolyCom's
    initialisation) and attribute ``variance_epsilon``, so its state dict loads as is.

    Args:
        eps: added to each mean square.
        in_place: the backward writes the input's gradient over the output's incoming gradient where nothing else
            reads it (see :func:`tigon.functional.poly_norm`; False here, True in Liger's: opt-in until its CUDA tests
            pass).
        device, dtype: of the parameters (keyword-only).

    Shapes and dtypes:
        input (..., N), N <= 65536 on the kernel path, float32 / bfloat16 / float16 on the kernel path; output: same
        shape and dtype.

    Raises:
        TypeError: in_place is not a bool (at construction).
        As :func:`tigon.functional.poly_norm`, at the forward, for bad inputs.
    """

    def __init__(self, eps: float = 1e-6, in_place: bool = False, *, device=None, dtype=None) -> None:
        super().__init__()
        if not isinstance(in_place, bool):
            raise TypeError(f"in_place must be a bool, got {type(in_place).__name__} {in_place!r}")
        kw = {"device": device, "dtype": dtype}
        self.weight = nn.Parameter(torch.full((3,), 1.0 / 3.0, **kw))
        self.bias = nn.Parameter(torch.tensor(1.0, **kw))
        self.variance_epsilon = eps
        self.in_place = in_place

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return TF.poly_norm(hidden_states, self.weight, self.bias, self.variance_epsilon, self.in_place)

    def extra_repr(self) -> str:
        return f"weight_shape={tuple(self.weight.shape)}, eps={self.variance_epsilon}, in_place={self.in_place}"


class GroupNorm(nn.Module):
    """Group normalisation over (B, num_channels, *) (Wu & He 2018, "Group Normalization"), via
    :func:`tigon.functional.group_norm`.

    Drop-in for Liger-Kernel's ``LigerGroupNorm(num_channels, num_groups, eps=1e-6, bias=False, init_fn="ones")``:
    the same constructor arguments (then the keyword-only ``device`` and ``dtype``), parameters ``weight``
    (num_channels,) (ones, or zeros with ``init_fn="zeros"``) and ``bias`` (num_channels,), and attribute
    ``variance_epsilon``, so its state dict loads as is. As in Liger's module the bias is a learnable parameter
    either way: zeros with ``bias=False``, a standard normal draw with ``bias=True`` (torch.nn.GroupNorm starts it
    at zeros).

    Args:
        num_channels: C, the input's dimension 1.
        num_groups: G, dividing C.
        eps: added to the variance.
        bias: whether the bias starts from a standard normal draw (True) or zeros (False).
        init_fn: ``"ones"`` or ``"zeros"``, the weight's initial value.
        device, dtype: of the parameters (keyword-only).

    Shapes and dtypes:
        input (B, num_channels, *) with at least 3 dimensions (as Liger's module requires), float32 / bfloat16 /
        float16 on the kernel path; output: same shape and dtype.

    Raises:
        TypeError: num_channels / num_groups not ints, bias not a bool (at construction).
        ValueError: num_channels or num_groups < 1, num_groups not dividing num_channels, eps not finite and >= 0 or
            init_fn unknown (at construction); an input of fewer than 3 dimensions, or as
            :func:`tigon.functional.group_norm` (forward).
    """

    def __init__(self, num_channels: int, num_groups: int, eps: float = 1e-6, bias: bool = False,
                 init_fn: str = "ones", *, device=None, dtype=None) -> None:
        super().__init__()
        if init_fn not in ("ones", "zeros"):
            raise ValueError(f"init_fn must be 'ones' or 'zeros', got {init_fn!r}")
        num_channels, num_groups = _checks.size("num_channels", num_channels), _checks.size("num_groups", num_groups)
        _checks.number("eps", eps, minimum=0.0)
        _checks.flag("bias", bias)
        if num_channels % num_groups:
            raise ValueError(f"num_groups must be a positive divisor of num_channels ({num_channels}), got "
                             f"{num_groups}")
        kw = {"device": device, "dtype": dtype}
        self.num_channels, self.num_groups = num_channels, num_groups
        self.weight = nn.Parameter((torch.ones if init_fn == "ones" else torch.zeros)(num_channels, **kw))
        self.bias = nn.Parameter(torch.randn(num_channels, **kw) if bias else torch.zeros(num_channels, **kw))
        self.variance_epsilon = eps

    @property
    def eps(self) -> float:
        """Alias of ``variance_epsilon`` (Liger's module has both, as plain attributes); setting it sets both, as
        setting ``torch.nn.GroupNorm``'s ``eps`` changes its epsilon."""
        return self.variance_epsilon

    @eps.setter
    def eps(self, value: float) -> None:
        self.variance_epsilon = value

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if hidden_states.dim() < 3:
            raise ValueError(f"hidden_states must be (B, num_channels, *) with at least 3 dimensions, got shape "
                             f"{tuple(hidden_states.shape)}")
        return TF.group_norm(hidden_states, self.weight, self.bias, self.num_channels, self.num_groups,
                             self.variance_epsilon)

    def extra_repr(self) -> str:
        return f"num_channels={self.num_channels}, num_groups={self.num_groups}, eps={self.variance_epsilon}"
