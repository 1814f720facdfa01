"""Instance-level patches that survive ``copy.deepcopy`` and pickling (``torch.save(model)`` / ``torch.load``).

An instance-level patch is a bound method in the module's ``__dict__`` (``forward``, or ``_apply_gate`` for MoE
experts, and their ``forward`` too where the glue applies), built from a :class:`Recipe` by :func:`build`, which
also attaches the recipe to the function.

deepcopy
    ``copy`` rebinds a bound method to the copy of its module, so the copy keeps every patch; the rotary dispatcher
    registers the copy's attention modules on their first forward
    (:meth:`tigon.integrations.rotary_switch.RopeTarget.ensure`).
pickle
    A bound method pickles as ``getattr(module, name)``, which on load finds the class's own method: the patch would
    be lost without a word. :func:`install_reducer` registers a reducer for bound methods with :mod:`copyreg` that
    pickles Tigon's methods as ``rebind(module, recipe)`` instead (everything else pickles exactly as before);
    unpickling rebuilds the Tigon method for the module's class in the loading process. The loading process needs
    ``tigon`` importable (``torch.load(path, weights_only=False)``, as for any pickled model).

DataParallel replicas
    ``torch.nn.parallel.replicate`` (``nn.DataParallel``, the HF Trainer's wrapper with several GPUs and no
    distributed launch) copies each module's ``__dict__`` into a replica, bound methods included: the replica would
    run Tigon's forward on the original module (its parameters, on the first device). :func:`keep_on_replicas` gives
    a patched module (and a model whose forward TRL's switch replaced) an instance ``_replicate_for_data_parallel``
    that rebinds the methods bound to it in its ``__dict__`` to the replica.

``save_pretrained`` / ``from_pretrained`` keep no patch: a patch adds no parameter or buffer, so the state dict is the
unpatched model's, and a model loaded with ``from_pretrained`` is patched again with :func:`tigon.patch` (or loaded
with :class:`tigon.AutoModelForCausalLM`).
"""

from __future__ import annotations

import copyreg
import types
from dataclasses import dataclass, field

from . import components, hub_kernels
from . import rotary_forwards as rf
from .marks import tigon_mark
from .rotary_switch import RopeTarget

RECIPE = "__tigon_recipe__"


@dataclass(frozen=True)
class Recipe:
    """How an instance-level Tigon method was built, so it can be built again for a copy of its module.

    attr: the instance attribute (``forward`` or ``_apply_gate``); kind: the patch kind (``rms_norm``, ``mlp``,
    ``rope``, ...); comp: the component spec (NormSpec, MLPSpec, RopeSpec, DecoderLayerSpec, CausalLMSpec);
    family: the family name (or ``"generic"``); family_module: the modeling module's name; opts: the LM-head options
    of :func:`tigon.patch` (``{"fused", "ce", "flce"}``).
    """

    attr: str
    kind: str
    comp: object
    family: str
    family_module: str
    opts: dict = field(default_factory=dict, hash=False, compare=False)


def build(recipe: Recipe, original):
    """The Tigon function that replaces ``original`` (the class's attribute ``recipe.attr``), carrying ``recipe``."""
    if recipe.kind == "rope":
        c = recipe.comp
        target = RopeTarget(recipe.family_module, c.function, recipe.family, c.partial_rotary, c.layout, c.head_axis)
        fn = rf.attention_forward(recipe.family, original, target, c if c.layout == "rotate_half" else None)
    else:
        fn = components.factory(recipe.kind, recipe.comp, recipe.family, recipe.family_module, original, recipe.opts,
                                recipe.attr)
    if getattr(fn, RECIPE, None) is None:  # the factories cache their functions: the first recipe is as good
        setattr(fn, RECIPE, recipe)
    return fn


def _class_original(cls: type, attr: str):
    """``cls.<attr>`` without Tigon's class-level replacement, should the class be patched in this process."""
    original = getattr(cls, attr)
    while tigon_mark(original) is not None and hasattr(original, "__wrapped__"):
        original = original.__wrapped__
    return original


def rebind(module, recipe: Recipe) -> types.MethodType:
    """Unpickling of a Tigon method: the method built from ``recipe`` for ``module``'s class, bound to ``module``
    (which is not filled in yet when this runs: only its class is used). A class prepared for hub kernels keeps the
    forward through ``kernels.kernelize`` (:mod:`tigon.integrations.hub_kernels`)."""
    method = types.MethodType(build(recipe, _class_original(type(module), recipe.attr)), module)
    if recipe.attr == "forward":
        hub_kernels.guard(module)
    return method


REPLICATE = "_replicate_for_data_parallel"
"""The ``torch.nn.Module`` method that ``torch.nn.parallel.replicate`` calls on each module (a shallow copy)."""


def _replicate(self):
    """``self``'s DataParallel replica (``torch.nn.Module._replicate_for_data_parallel``: its ``__dict__`` copied), with
    every method of that copy bound to ``self`` (Tigon's, TRL switch's forward, accelerate's mixed-precision
    forward beside it) bound to the replica instead: run on ``self``, it would read the first device's parameters."""
    replica = getattr(type(self), REPLICATE)(self)
    d = replica.__dict__
    for attr, value in list(d.items()):
        if isinstance(value, types.MethodType) and value.__self__ is self:
            d[attr] = types.MethodType(value.__func__, replica)
    return replica


def keep_on_replicas(module) -> None:
    """Make DataParallel replicas of the patched ``module`` run Tigon's methods on themselves (see the module
    docstring): an instance ``_replicate_for_data_parallel``, removed by :func:`forget_replicas`."""
    module.__dict__[REPLICATE] = types.MethodType(_replicate, module)


def forget_replicas(module) -> None:
    """Remove :func:`keep_on_replicas`'s method from ``module`` (at unpatch), unless another method is still bound to
    it in its ``__dict__`` (TRL switch's forward)."""
    method = module.__dict__.get(REPLICATE)
    if isinstance(method, types.MethodType) and method.__func__ is _replicate and not any(
            isinstance(v, types.MethodType) and v.__self__ is module and v is not method
            for v in module.__dict__.values()):
        del module.__dict__[REPLICATE]


def _reduce_method(method: types.MethodType):
    if method.__func__ is _replicate:  # pickles as the module's own method again, rebound on load
        return _replicating, (method.__self__,)
    recipe = getattr(method.__func__, RECIPE, None)
    if recipe is None:
        return _PREVIOUS(method) if _PREVIOUS is not None else method.__reduce__()
    return rebind, (method.__self__, recipe)


def _replicating(module) -> types.MethodType:
    """Unpickling of :func:`keep_on_replicas`'s method."""
    return types.MethodType(_replicate, module)


_PREVIOUS = copyreg.dispatch_table.get(types.MethodType)


def install_reducer() -> None:
    """Register the bound-method reducer with :mod:`copyreg` (idempotent; done when this module is imported).
    Bound methods other than Tigon's reduce as before (through a reducer registered earlier, if any)."""
    if copyreg.dispatch_table.get(types.MethodType) is not _reduce_method:
        copyreg.pickle(types.MethodType, _reduce_method)


install_reducer()
