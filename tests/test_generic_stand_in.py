"""The generic matcher's probes of weightless models on shrunk CPU stand-ins (tigon.integrations.generic_stand_in):
the same decisions as full-size stand-ins over every model of the test matrix that goes through the generic matcher,
and a dry run of a 36B-sized model of no family that costs well under a second and a few MB of CPU tensors."""

from __future__ import annotations

import functools
import re
import time

import pytest
import torch

transformers = pytest.importorskip("transformers")

import tigon  # noqa: E402
import model_matrix as mm  # noqa: E402
from _memory import CpuTensorBytes  # noqa: E402
from tigon.integrations import generic_stand_in  # noqa: E402
from tigon.workflows.dry_run import dry_run  # noqa: E402

GENERIC_PATCH = functools.partial(tigon.patch, family="generic")
# (model_type, overrides, forced family) of every matrix model that goes through the generic matcher: no family
# (CASES, GENERIC, GENERIC_ONLY), or one forced with family="generic" (GENERIC_MOE, GENERIC_DATA's generic counts,
# Llama 4 as tests/test_report_truth.py runs it, Llama as tests/test_generic.py compares it with its family)
GENERIC_PATH = {
    **{case: (*e[:2], False) for case, e in mm.CASES.items() if e[2] == "generic"},
    **{case: (*e[:2], False) for case, e in mm.GENERIC.items()},
    **{case: (*e[:2], True) for case, e in mm.GENERIC_MOE.items()},
    **{f"{case}-as-generic": (*e[:2], True) for case, e in mm.GENERIC_DATA.items() if e[5] is not None},
    "llama4-as-generic": (*mm.MORE_FAMILIES["llama4"][:2], True),
    "llama-as-generic": (*mm.CASES["llama"][:2], True),
}
# a Seed-OSS-36B-sized model (of no Tigon family): its MLP was a 1.7 GB stand-in, ~10 s to fill with random numbers
SEED_OSS_36B = dict(hidden_size=5120, intermediate_size=27648, num_attention_heads=80, num_key_value_heads=8,
                    head_dim=128)


def _dry_report(model_type: str, overrides: dict, forced: bool, shrunk: list | None = None) -> dict:
    """The dry run's report of a matrix model (``forced``: with family="generic"), as a dict whose probe error figures
    (``1.2e-03``: random, they differ between stand-ins of different sizes) read ``<e>``; ``shrunk`` collects the
    shrink factor of every stand-in made."""
    with dry_run(mm.config(model_type, overrides), GENERIC_PATCH if forced else None) as (_, report):
        d = report.as_dict()
    return {k: re.sub(r"\d\.\de[+-]\d\d", "<e>", repr(v)) for k, v in d.items()}


@pytest.mark.parametrize("case", list(GENERIC_PATH))
def test_shrunk_stand_ins_decide_as_full_size_ones(case, monkeypatch):
    """Every report entry (kind, target, ops, detail) is the same whether the MLPs' stand-ins are shrunk (forced here
    to a factor of 8 or more: the matrix's widths are below the default threshold) or full size."""
    model_type, overrides, forced = GENERIC_PATH[case]
    mm.require_family(model_type)
    factors = []
    original = generic_stand_in.stand_in

    def recording(module, shrink=False):
        c = original(module, shrink)
        if shrink:  # (the norms' stand-ins are full size)
            factors.append(generic_stand_in.shrink_factor(module))
        return c

    monkeypatch.setattr(generic_stand_in, "stand_in", recording)
    monkeypatch.setattr(generic_stand_in, "SHRINK_FROM", 10**9)
    full = _dry_report(model_type, overrides, forced)
    assert set(factors) <= {1}
    factors.clear()
    monkeypatch.setattr(generic_stand_in, "SHRINK_FROM", 8)
    monkeypatch.setattr(generic_stand_in, "SHRINK_TO", 4)
    assert _dry_report(model_type, overrides, forced) == full
    assert min(factors, default=8) >= 8 and (factors or case == "generic-minimax")  # (its MLPs are all experts)


def test_shrunk_stand_in_keeps_the_widths_relations():
    # a fused gate-up projection (twice the intermediate size), a LoRA-like small dimension and the size attributes
    with torch.device("meta"):
        mlp = transformers.models.glm.modeling_glm.GlmMLP(transformers.GlmConfig(hidden_size=5120,
                                                                                 intermediate_size=27648))
        mlp.adapter = torch.nn.Linear(5120, 16, bias=False)
    assert generic_stand_in.shrink_factor(mlp) == 128  # gcd 1024; 5120 / 128 = 40 >= SHRINK_TO
    c = generic_stand_in.stand_in(mlp, shrink=True)
    assert c.gate_up_proj.weight.shape == (2 * 216, 40) and c.down_proj.weight.shape == (40, 216)
    assert (c.gate_up_proj.in_features, c.gate_up_proj.out_features, c.adapter.weight.shape) == (40, 432, (16, 40))
    assert not any(p.is_meta for p in c.parameters()) and all(p.is_meta for p in mlp.parameters())
    assert generic_stand_in.stand_in(mlp).down_proj.weight.shape == (5120, 27648)  # shrink=False: full size


def test_a_probe_that_fails_on_the_shrunk_stand_in_is_run_full_size():
    class Reshaping(torch.nn.Module):  # reads its width from elsewhere than its weights (a shared config)
        width = 512

        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(self.width, self.width, bias=False)

    with torch.device("meta"):
        m = Reshaping()

    def probe(module):
        try:
            return module.proj(torch.zeros(1, Reshaping.width)).shape[-1]
        except RuntimeError:
            return "probe failed: shapes"

    cache = {}
    retry = lambda r: isinstance(r, str)  # noqa: E731
    assert generic_stand_in.probe_meta(cache, "mlp", m, probe, shrink=True, retry_full=retry) == 512
    assert list(cache.values()) == [512]


def test_dry_run_of_a_36b_model_of_no_family_costs_milliseconds_and_megabytes():
    # the widths of Seed-OSS-36B (hidden 5120, intermediate 27648); 4 layers and a small vocabulary: the probes are
    # made once per group of alike modules, and the head probe's tensors grow with the vocabulary (logits of 8 tokens)
    cfg = transformers.SeedOssConfig(**SEED_OSS_36B, num_hidden_layers=4, vocab_size=4096)
    with dry_run(mm.config("seed_oss", {})):  # imports the modeling module and Tigon's lazily imported parts
        pass
    start = time.perf_counter()
    with dry_run(cfg) as (_, report):
        seconds = time.perf_counter() - start
    assert (report.family, report.counts) == ("generic", {"rms_norm": 9, "mlp": 4, "rope": 4, "lm_head_loss": 1})
    assert seconds < 2.0  # a full-size stand-in: ~7 s (2-core CPU)
    with CpuTensorBytes() as cpu, dry_run(cfg):
        pass
    assert cpu.peak < 4 * 2**20, cpu.peak  # a full-size stand-in: 2.7 GB
