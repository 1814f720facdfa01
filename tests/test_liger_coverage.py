"""Every Liger-Kernel op name has a Tigon replacement or a written reason (issue 21): tigon.liger_coverage, its
rows in ``tigon env``, and the README's "Not (yet) in Tigon" paragraph."""

import importlib.util
import inspect
import pathlib
import re

import pytest
import torch

import tigon
from tigon import functional as F
from tigon import nn as tnn
from tigon.liger_coverage import LIGER_OPS, missing

LIGER = importlib.util.find_spec("liger_kernel") is not None
README = pathlib.Path(__file__).resolve().parents[1] / "README.md"

# the ops issue 21 names (Liger's list beyond the Llama-family ones): each replaced or explained
ISSUE_21 = ["liger_group_norm", "liger_softmax", "liger_sparsemax", "liger_dyt", "liger_poly_norm",
            "liger_relu_squared", "liger_tvd", "liger_kl_div", "liger_jsd", "LigerTiledSwiGLUMLP",
            "LigerTiledGEGLUMLP", "liger_multi_token_attention", "liger_modulated_rms_norm"]


def test_every_name_once_and_every_target_exists():
    names = [op.liger for op in LIGER_OPS]
    assert len(names) == len(set(names))
    assert set(ISSUE_21) <= set(names)
    families = set(tigon.integrations.FAMILIES)
    for op in LIGER_OPS:
        if op.tigon is None:
            assert op.note and "not" in op.note, op  # a reason, saying it is not there
        elif op.tigon.startswith("F."):
            assert hasattr(F, op.tigon[2:]), op
        elif op.tigon.startswith("nn."):
            assert hasattr(tnn, op.tigon[3:]), op
        else:  # a family patch, named by its family
            named = re.findall(r"\b([a-z0-9_]+)\b(?= family patch)|\(tigon\.patch: ([a-z0-9_]+)", op.tigon)
            assert named and all(n in families for pair in named for n in pair if n), op


@pytest.mark.skipif(not README.exists(), reason="run from the source tree")
def test_readme_names_every_missing_op():
    text = README.read_text()
    paragraph = text[text.index("Not (yet) in Tigon, with the reason:"):text.index("**With `torch.compile(model)`.**")]
    for names in missing().values():
        for name in names:
            assert f"`{name}`" in paragraph, name


def test_env_reports_every_name():
    from tigon.workflows.env import run_env

    rows = run_env().as_dict()["liger"]
    assert [r["liger"] for r in rows] == [op.liger for op in LIGER_OPS]
    assert {r["liger"] for r in rows if r["tigon"] is None} == {n for names in missing().values() for n in names}


@pytest.mark.skipif(not LIGER, reason="liger_kernel is not installed")
def test_no_liger_name_is_left_out():
    import liger_kernel.chunked_loss as chunked
    import liger_kernel.transformers as lt
    from liger_kernel.transformers import functional as LF

    known = {op.liger for op in LIGER_OPS}
    functions = {n for n, v in vars(LF).items() if n.startswith("liger_") and inspect.isfunction(v)}
    modules = {n for mod in (lt, chunked) for n in dir(mod)
               if n.startswith("Liger") and isinstance(getattr(mod, n, None), type)
               and issubclass(getattr(mod, n), torch.nn.Module)
               and not n.startswith("LigerKernelFor")}
    assert functions - known == set() and modules - known == set()


@pytest.mark.skipif(not LIGER, reason="liger_kernel is not installed")
def test_mapped_functions_take_liger_positional_arguments():
    # drop-in by position: each liger_X's parameters, in order, are the first of tigon.functional.X's, with Liger's
    # defaults except where the README's drop-in table says otherwise (in_place False until the CUDA in-place tests
    # pass). Keyword names differ for some (Liger's X / W / a / b / input against Tigon's x / weight / gate / up /
    # logits / hidden): checked here by position only.
    from liger_kernel.transformers import functional as LF

    documented = {("liger_poly_norm", "in_place"), ("liger_fused_add_rms_norm", "in_place")}
    checked = 0
    for op in LIGER_OPS:
        name = op.tigon[2:] if op.tigon and op.tigon.startswith("F.") else None
        if not op.liger.startswith("liger_") or name is None or not hasattr(LF, op.liger) or not hasattr(F, name):
            continue
        theirs = list(inspect.signature(getattr(LF, op.liger)).parameters.values())
        ours = list(inspect.signature(getattr(F, name)).parameters.values())
        assert len(ours) >= len(theirs), (op.liger, [p.name for p in theirs], [p.name for p in ours])
        for a, b in zip(theirs, ours):
            assert a.kind in (a.POSITIONAL_OR_KEYWORD, a.POSITIONAL_ONLY) or a.kind == b.kind, (op.liger, a, b)
            if a.default is not a.empty and (op.liger, a.name) not in documented:
                assert repr(a.default) == repr(b.default), (op.liger, a.name, a.default, b.default)
        checked += 1
    assert checked >= 15, checked
