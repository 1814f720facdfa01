"""The CUDA compile check itself (tests/cuda_compile.py): a kernel that Triton's interpreter runs but its compiler
refuses (a plain float global, session 18's JSD_NEAR) fails it, with the kernel and the reason; a sound kernel and
the variants of a launch's constexprs compile. CPU only (on CUDA every test compiles its kernels for real)."""

import os
import textwrap

import pytest
import torch

import cuda_compile as cc

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="checks the interpreted run's tool")

KERNELS = textwrap.dedent('''
    import triton
    import triton.language as tl

    SCALE = 2.0  # a plain float global: the interpreter reads it, the compiler refuses it

    @triton.jit
    def bad(X, N, BLOCK: tl.constexpr):
        i = tl.arange(0, BLOCK)
        tl.store(X + i, tl.load(X + i, mask=i < N) * SCALE, mask=i < N)

    @triton.jit
    def good(X, N, TWICE: tl.constexpr, BLOCK: tl.constexpr):
        i = tl.arange(0, BLOCK)
        x = tl.load(X + i, mask=i < N)
        if TWICE:
            x = x * 2.0
        tl.store(X + i, x, mask=i < N)
''')


def test_the_check_fails_a_kernel_the_compiler_refuses(tmp_path, monkeypatch):
    reason = cc.unavailable()
    if reason is not None:
        pytest.skip(reason)
    (tmp_path / "tigon_cc_kernels.py").write_text(KERNELS)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))  # (the check's own interpreter imports the module too)
    import tigon_cc_kernels as k

    rec = cc.Recorder()
    rec.install()
    try:
        x = torch.ones(5)
        k.bad[(1,)](x, 5, BLOCK=8)
        for twice in (False, True):
            k.good[(1,)](x, 5, TWICE=twice, BLOCK=8)
        k.good[(1,)](x.to(torch.bfloat16), 3, TWICE=True, BLOCK=8)
    finally:
        rec.uninstall()
    assert x.tolist() == [4.0] * 5  # the interpreter ran both
    result = cc.run_check(rec, workers=1, timeout=300)
    assert result["skipped"] is None, result
    # good: two constexpr sets and two signatures in three launches, covered by two (bf16 twice, fp32 once); bad: one
    assert (result["kernels"], result["variants"]) == (2, 3), result
    (failure,) = result["failures"]
    assert failure["kernel"] == "tigon_cc_kernels.bad" and "SCALE" in failure["error"], failure


def test_signature_types_arguments_as_the_launcher_does():
    class P:
        def __init__(self, name, constexpr=False, default=None):
            self.name, self.is_constexpr, self.default = name, constexpr, default

    class Fn:
        params = [P("X"), P("n"), P("big"), P("eps"), P("flag"), P("opt"), P("BLOCK", True), P("DT", True)]

    sig, consts, opts = cc.signature(Fn, (("tensor", "bfloat16"), 7, 2**40, 1e-6, True, None),
                                     (("BLOCK", 2**18), ("DT", ("tl", "fp32")), ("num_warps", 8)))
    assert sig == {"X": "*bf16", "n": "i32", "big": "i64", "eps": "fp32", "flag": "i1", "opt": "constexpr",
                   "BLOCK": "constexpr", "DT": "constexpr"}
    assert consts["BLOCK"] == cc.MAX_BLOCK and consts["opt"] is None and str(consts["DT"]) == "fp32"
    assert opts == {"num_warps": 8}


def test_cover_keeps_every_value_in_few_variants():
    v = [((("X", "*fp32"),), (("B", "16"), ("F", "True")), ()), ((("X", "*fp32"),), (("B", "32"), ("F", "True")), ()),
         ((("X", "*bf16"),), (("B", "16"), ("F", "False")), ()), ((("X", "*bf16"),), (("B", "32"), ("F", "False")), ())]
    chosen = cc.cover(v)
    values = lambda variants: {p for c in variants for part in c for p in part}  # noqa: E731
    assert len(chosen) == 2 and values(chosen) == values(v)  # every dtype and constexpr value, in 2 of the 4
    assert len(cc.cover(v, cap=1)) == 1
