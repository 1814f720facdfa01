"""Which rotary functions an attention module's forward actually calls, read from its source.

The engine routes a modeling module's global rotary function (``apply_rotary_pos_emb``) to Tigon inside patched
attention modules. That only runs when the forward calls it for this instance: DeepSeek-V3's attention calls
``apply_rotary_pos_emb_interleave`` instead when ``config.rope_interleave`` is set, SmolLM3's and Llama-4's NoPE
layers call nothing. :func:`reach` answers per instance, on a weightless (meta) model as on a real one: it walks the
class forward's syntax tree and takes, at every ``if`` whose test reads only attributes of ``self`` (and constants,
``not``, ``and`` / ``or``, comparisons), the branch that test selects for this instance; any other test keeps both
branches (it depends on the call's arguments).

Rotary functions are the module-global functions with ``rotary`` or ``rope`` among the ``_``-separated words of
their names (``apply_rotary_pos_emb``, ``apply_rotary_emb``, ``apply_rope``); a function that transformers'
``use_kernel_forward_from_hub`` turned into a callable module object (with the ``kernels`` package installed) counts
as one too.
"""

from __future__ import annotations

import ast
import functools
import inspect
import operator
import sys
import textwrap
import types
from dataclasses import dataclass

_UNKNOWN = object()
_PLAIN = (bool, int, float, str, type(None))
_RUNTIME = ("training", "gradient_checkpointing")  # flags that change after patching: never decided here
_COMPARE = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
            ast.Gt: operator.gt, ast.GtE: operator.ge, ast.Is: operator.is_, ast.IsNot: operator.is_not,
            ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b}


@dataclass(frozen=True)
class Reach:
    """What one attention instance's forward calls.

    called: the rotary functions (module-global names) on the branches this instance takes.
    decided: the ``self`` conditions that chose a branch, as ``"self.config.rope_interleave is True"``.
    """

    called: frozenset[str]
    decided: tuple[str, ...]


def rotary_functions(cls: type) -> frozenset[str]:
    """Names of the rotary functions (module-global functions of ``cls``'s module, see the module docstring) that
    ``cls.forward`` refers to."""
    module = sys.modules.get(cls.__module__)
    code = getattr(_forward(cls), "__code__", None)
    if module is None or code is None:
        return frozenset()
    return frozenset(n for n in code.co_names if _is_rotary(n) and _is_function(getattr(module, n, None)))


def _is_function(obj) -> bool:
    """A plain function, or a callable object standing for one (not a class): transformers 5.2x with ``kernels``
    installed wraps ``apply_rotary_pos_emb`` in a ``Func`` module instance (``use_kernel_forward_from_hub``)."""
    return isinstance(obj, types.FunctionType) or (callable(obj) and not isinstance(obj, type)
                                                   and not isinstance(obj, types.ModuleType))


def _is_rotary(name: str) -> bool:
    return not {"rotary", "rope"}.isdisjoint(name.lower().split("_"))


def reach(module, function: str) -> Reach | None:
    """The rotary functions ``type(module).forward`` calls for this instance (``function`` among the candidates
    even when its name does not look rotary), or None when that cannot be told: the forward's source cannot be read,
    or does not name ``function`` at all (it may call it through a helper)."""
    parsed = _parse(type(module))
    if parsed is None:
        return None
    tree, self_name = parsed
    if not any(isinstance(n, ast.Name) and n.id == function for n in ast.walk(tree)):
        return None
    names = rotary_functions(type(module)) | {function}
    called: set[str] = set()
    decided: list[str] = []

    def value(node):
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Attribute):
            if node.attr in _RUNTIME:
                return _UNKNOWN
            base = module if isinstance(node.value, ast.Name) and node.value.id == self_name else value(node.value)
            return _UNKNOWN if base is _UNKNOWN else getattr(base, node.attr, _UNKNOWN)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            v = value(node.operand)
            return not v if isinstance(v, _PLAIN) else _UNKNOWN
        if isinstance(node, ast.BoolOp):  # Python's short circuit: the first falsy (and) / truthy (or) value
            for v in (value(v) for v in node.values):
                if not isinstance(v, _PLAIN):
                    return _UNKNOWN
                if bool(v) is not isinstance(node.op, ast.And):
                    return v
            return v
        if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _COMPARE:
            a, b = value(node.left), value(node.comparators[0])
            if not all(isinstance(x, _PLAIN + (tuple, list, frozenset, set)) for x in (a, b)):
                return _UNKNOWN
            try:
                return _COMPARE[type(node.ops[0])](a, b)
            except TypeError:
                return _UNKNOWN
        return _UNKNOWN

    def mentions(branch) -> bool:
        return any(isinstance(n, ast.Name) and n.id in names
                   for stmt in (branch if isinstance(branch, list) else [branch]) for n in ast.walk(stmt))

    def visit(node):
        if isinstance(node, (ast.If, ast.IfExp)):
            v = value(node.test)
            branches = [node.body, node.orelse]
            if isinstance(v, _PLAIN):
                branches = [node.body if v else node.orelse]
                if mentions(node.body) or mentions(node.orelse):  # a choice between rotary calls (or none)
                    decided.append(f"{ast.unparse(node.test)} is {bool(v)}")
            for branch in branches:
                for child in branch if isinstance(branch, list) else [branch]:
                    visit(child)
            return
        if isinstance(node, ast.Name) and node.id in names:
            called.add(node.id)
        for child in ast.iter_child_nodes(node):
            visit(child)

    for stmt in tree.body:
        visit(stmt)
    return Reach(frozenset(called), tuple(decided))


def forward_statements(forward) -> tuple[ast.FunctionDef, list[ast.stmt]] | str:
    """The syntax tree of the function ``forward`` (a class's, read from its source) and its statements without
    docstrings, or a string saying why it cannot be read."""
    try:
        fn = ast.parse(textwrap.dedent(inspect.getsource(forward))).body[0]
    except (OSError, TypeError, SyntaxError, IndexError):
        return "its forward's source cannot be read, so its form cannot be checked"
    if not isinstance(fn, ast.FunctionDef):
        return "its forward is not a plain function"
    return fn, [s for s in fn.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]


def _forward(cls: type):
    """``cls.forward`` without its decorators (``functools.wraps`` chains), or None."""
    fn = getattr(cls, "forward", None)
    return inspect.unwrap(fn) if fn is not None else None


@functools.lru_cache(maxsize=None)
def _parse(cls: type) -> tuple[ast.FunctionDef, str] | None:
    """The syntax tree of ``cls.forward`` and the name of its ``self`` argument, or None without source."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(_forward(cls))))
    except (OSError, TypeError, SyntaxError):
        return None
    func = tree.body[0] if tree.body and isinstance(tree.body[0], (ast.FunctionDef, ast.AsyncFunctionDef)) else None
    if func is None or not func.args.args:
        return None
    return func, func.args.args[0].arg
