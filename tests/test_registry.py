"""The op registry: every exported op has a valid record, every record's quick cases match its reference, and the
workflows and the CLI name no op themselves (the records are the one place that does)."""

from __future__ import annotations

import ast
import dataclasses
import pathlib

import pytest
import torch

from tigon import functional, ops, support
from tigon.numerics import compare

SRC = pathlib.Path(__file__).resolve().parents[1] / "src" / "tigon"
# Small and odd: masks, several row blocks, GQA, an even head dim that is not a power of two.
SMALL = ops.ModelShapes(tokens=6, batch=2, hidden=40, intermediate=24, heads=4, kv_heads=2, head_dim=12, vocab=37)

QUICK = [pytest.param(name, case.label, id=f"{name}-{case.label}")
         for name, spec in ops.registry().items() for case in spec.cases_tagged("quick")]


def test_every_export_has_a_record_in_export_order():
    specs = ops.registry()
    assert tuple(specs) == functional.OPS
    for name, spec in specs.items():
        assert spec.name == name and getattr(functional, name) is spec.fn
        assert spec.summary and spec.original_name and spec.size_format
        assert spec.category in ops.CATEGORIES


def test_record_validation_rejects_inconsistent_records():
    spec = ops.get("rms_norm")
    with pytest.raises(ValueError, match="exactly one of min_bytes"):
        dataclasses.replace(spec, flops=lambda s, m: 1.0)
    with pytest.raises(ValueError, match="unique"):
        dataclasses.replace(spec, cases=(ops.Case(), ops.Case()))
    with pytest.raises(ValueError, match="same positional arguments"):
        dataclasses.replace(spec, reference=lambda weight, x: x)
    with pytest.raises(ValueError, match="bench case needs a provider"):
        ops.Case("x", tags=frozenset({"bench"}))
    with pytest.raises(ValueError, match="leading_dims"):
        dataclasses.replace(spec, leading_dims=("hidden_states",))


def test_option_space_is_defaults_then_cases_then_shared_values():
    # what tests/test_properties.py draws: the options a case sets or PROPERTY_VALUES names, nothing else
    def fn(x, weight, reduction="mean", scale=1.0, flag=False):
        return x

    def build(s, dtype, device, gen, ignore_every=0, other=False):
        return {}

    spec = dataclasses.replace(ops.get("rms_norm"), fn=fn, reference=fn, make_inputs=build,
                               cases=(ops.Case(), ops.Case("s", options={"scale": 2.0}, inputs={"other": True})))
    options, inputs = spec.option_space()
    assert options == {"scale": (1.0, 2.0), "reduction": ("mean", "sum", "none")}
    assert inputs == {"other": (False, True), "ignore_every": (0, 1, 2, 3)}


def test_providers_are_base_then_variants_then_peers():
    provs = ops.providers()
    assert provs[:3] == ops.BASE_PROVIDERS
    assert set(ops.PEER_MODULES) <= set(provs)
    assert all(p.startswith("tigon_") for p in provs[3:] if p not in ops.PEER_MODULES)


@pytest.mark.parametrize("name, label", QUICK)
def test_quick_cases_match_the_float64_truth(name, label, device):
    # fp32: Tigon within ~1e-5 of a float64 evaluation of the original (the pass rule's floor), outputs and grads
    spec = ops.get(name)
    case = spec.case(label)
    gen = torch.Generator(device=device).manual_seed(0)
    shape = spec.shape_of(SMALL)
    inputs = {**spec.make_inputs(shape, torch.float32, torch.device(device), gen, **case.inputs), **case.options}
    checks = compare(case.fn or spec.fn, spec.original, inputs, spec.grad_inputs, factor=2.0)
    assert {c.tensor for c in checks} >= {"out"} | {f"grad_{g}" for g in spec.grad_inputs}
    bad = [c.as_dict() for c in checks if not c.passed]
    assert not bad, bad
    # the bytes / FLOPs of the record are positive and the size label names the shape
    moved = spec.bytes_moved(shape, 4, "fwd_bwd") or spec.flops_of(shape, "fwd_bwd")
    assert moved > 0 and spec.size_label(shape)


@pytest.mark.parametrize("name", list(ops.registry()))
def test_the_fallback_is_the_reference_exactly(name, device):
    spec = ops.get(name)
    case = spec.cases_tagged("verify")[0]
    gen = torch.Generator(device=device).manual_seed(1)
    inputs = {**spec.make_inputs(spec.shape_of(SMALL), torch.float32, torch.device(device), gen, **case.inputs),
              **case.options}
    with support.force_reference():
        got = (case.fn or spec.fn)(**inputs)
    want = spec.reference(**inputs)
    got, want = (x if isinstance(x, tuple) else (x,) for x in (got, want))
    assert all(torch.equal(a, b) for a, b in zip(got, want))


def _string_literals(path: pathlib.Path) -> set[str]:
    return {n.value for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Constant)
            and isinstance(n.value, str)}


@pytest.mark.parametrize("folder", ["workflows", "cli"])
def test_workflows_and_cli_name_no_op(folder):
    # torchtitan's spirit: a new op must not need an edit here; the registry record carries what they need
    names = set(ops.registry())
    found = {(p.name, s) for p in sorted((SRC / folder).glob("*.py")) for s in _string_literals(p) & names}
    assert not found, f"op names as string literals in {folder}/ (put them in the op's record): {sorted(found)}"


def _strided(t: torch.Tensor) -> torch.Tensor:
    """``t``'s values in memory with stride 2 along the last dimension (a view of a buffer twice as wide)."""
    if t.dim() == 0:
        return t
    buf = torch.zeros(*t.shape[:-1], 2 * t.shape[-1], dtype=t.dtype, device=t.device)
    view = buf[..., ::2]
    view.copy_(t)
    return view


@pytest.mark.parametrize("name", list(ops.registry()))
def test_every_tensor_input_may_be_strided(name, device):
    # weights, biases, targets and activations alike: a strided input gives the contiguous input's outputs and
    # gradients (a kernel reading a strided weight as if it were dense would be silently wrong)
    spec = ops.get(name)
    case = spec.cases_tagged("verify")[0]
    gen = torch.Generator(device=device).manual_seed(2)
    inputs = {**spec.make_inputs(spec.shape_of(SMALL), torch.float32, torch.device(device), gen, **case.inputs),
              **case.options}
    fn = case.fn or spec.fn

    def run(args):
        leaves = {k: (v.detach().requires_grad_(k in spec.grad_inputs) if isinstance(v, torch.Tensor) else v)
                  for k, v in args.items()}
        out = fn(**leaves)
        outs = [o for o in (out if isinstance(out, tuple) else (out,)) if isinstance(o, torch.Tensor)]
        grads = torch.autograd.grad([o.float().sum() * (i + 1) for i, o in enumerate(outs) if o.requires_grad],
                                    [leaves[k] for k in spec.grad_inputs], allow_unused=True)
        return [o.detach() for o in outs] + [g for g in grads if g is not None]

    want = run(inputs)
    got = run({k: (_strided(v) if isinstance(v, torch.Tensor) else v) for k, v in inputs.items()})
    assert len(got) == len(want)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
