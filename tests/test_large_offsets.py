"""Tensors with more than 2**31 elements (int64 offsets): GPU only, compiled kernels.

Each test builds one such tensor, runs the op, and checks the rows at the far end (past element 2**31, where an
int32 offset would wrap) against the reference computed on just those rows.
"""

import pytest
import torch

from tigon import functional as F
from tigon.numerics import rel_l2
from tigon.reference.cross_entropy import cross_entropy as ref_ce
from tigon.reference.fused_add_rms_norm import fused_add_rms_norm as ref_fadd
from tigon.reference.rms_norm import rms_norm as ref_rms
from tigon.reference.rope import rope as ref_rope

BIG = 2**31 + 2**20
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_properties(0).total_memory < 60e9,
                       reason="needs a CUDA GPU with >= 60 GB"),
]


def _tail(t, rows=64):
    return t[-rows:]


def test_rms_norm_over_2_31_elements():
    n = 4096
    x = torch.randn(BIG // n, n, device="cuda", dtype=torch.bfloat16).requires_grad_(True)
    w = torch.rand(n, device="cuda", dtype=torch.bfloat16) + 0.5
    y = F.rms_norm(x, w)
    dy = torch.randn_like(y)
    y.backward(dy)
    xt = _tail(x.detach()).double().requires_grad_(True)
    yt = ref_rms(xt, w.double())
    yt.backward(_tail(dy).double())
    assert rel_l2(_tail(y), yt) < 1e-2
    assert rel_l2(_tail(x.grad), xt.grad) < 1e-2
    del x, y, dy
    torch.cuda.empty_cache()


def test_fused_add_rms_norm_over_2_31_elements():
    # x, residual and both outputs past 2**31 elements; the backward with s's gradient (HAS_DS), written in place
    # into dy (the rows past the boundary are read and written through the same int64 offsets).
    n = 4096
    x = torch.randn(BIG // n, n, device="cuda", dtype=torch.bfloat16).requires_grad_(True)
    r = torch.randn_like(x.detach()) * 3
    w = torch.rand(n, device="cuda", dtype=torch.bfloat16) + 0.5
    y, s = F.fused_add_rms_norm(x, r, w, in_place=True)
    dy, ds = torch.randn_like(y), torch.randn_like(s)
    dy_tail = _tail(dy).clone()
    torch.autograd.backward([y, s], [dy, ds])
    xt = _tail(x.detach()).double().requires_grad_(True)
    yt, st = ref_fadd(xt, _tail(r).double(), w.double())
    torch.autograd.backward([yt, st], [dy_tail.double(), _tail(ds).double()])
    assert rel_l2(_tail(y), yt) < 1e-2 and rel_l2(_tail(s), st) < 1e-2
    assert rel_l2(_tail(x.grad), xt.grad) < 1e-2
    del x, r, y, s, dy, ds
    torch.cuda.empty_cache()


def test_swiglu_over_2_31_elements():
    g = torch.randn(BIG, device="cuda", dtype=torch.bfloat16)
    u = torch.randn(BIG, device="cuda", dtype=torch.bfloat16)
    out = F.swiglu(g, u)
    tail = slice(BIG - 4096, BIG)
    ref = torch.nn.functional.silu(g[tail].double()) * u[tail].double()
    assert rel_l2(out[tail], ref) < 1e-2
    del g, u, out
    torch.cuda.empty_cache()


def test_cross_entropy_over_2_31_elements():
    v = 128256
    n = BIG // v + 1
    logits = torch.randn(n, v, device="cuda", dtype=torch.bfloat16)
    target = torch.randint(0, v, (n,), device="cuda")
    loss = F.cross_entropy(logits, target, reduction="none")
    ref = ref_ce(_tail(logits).double(), _tail(target), reduction="none")
    assert rel_l2(_tail(loss), ref) < 1e-5
    # grad_in_forward: the forward writes the (sum-reduced) gradient over the logits, the backward scales it by 0.5
    tail = _tail(logits).double().requires_grad_(True)
    (ref_ce(tail, _tail(target), reduction="sum") * 0.5).backward()
    leaf = logits.requires_grad_(True)
    (F.cross_entropy(leaf * 1, target, reduction="sum", grad_in_forward=True) * 0.5).backward()
    assert rel_l2(_tail(leaf.grad), tail.grad) < 1e-2
    del logits, leaf
    torch.cuda.empty_cache()


def _check_rope_tail(hq: int, d: int, t: int, cos_sin) -> None:
    """F.rope on HF-layout bf16 q (1, t, hq, d) and k (1, t, 1, d); the last 16 positions against the reference."""
    q = torch.randn(1, t, hq, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    k = torch.randn(1, t, 1, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    cos, sin = cos_sin
    qo, ko = F.rope(q, k, cos, sin)
    tail = slice(t - 16, t)
    qr, kr = ref_rope(q[:, :, tail].double(), k[:, :, tail].double(), cos[:, tail].double(), sin[:, tail].double())
    assert rel_l2(qo[:, :, tail], qr) < 1e-2
    assert rel_l2(ko[:, :, tail], kr) < 1e-2
    del q, k, qo, ko
    torch.cuda.empty_cache()


def test_rope_over_2_31_elements():
    # q has > 2**31 elements (element offsets need int64); k is small (GQA-like).
    hq, d = 32, 128
    t = BIG // (hq * d) + 1
    pos = torch.arange(t, device="cuda", dtype=torch.float32)
    inv = 1.0 / (10000.0 ** (torch.arange(0, d, 2, device="cuda", dtype=torch.float32) / d))
    emb = torch.cat([pos[:, None] * inv, pos[:, None] * inv], -1)[None]
    _check_rope_tail(hq, d, t, (emb.cos(), emb.sin()))


def test_rope_over_2_31_rows():
    # More than 2**31 rows (batch * positions * heads) in q: the row index itself needs int64 (head dim 2 keeps the
    # tensor at 8 GiB).
    hq, d = 32, 2
    t = 2**31 // hq + 1
    ang = torch.arange(t, device="cuda", dtype=torch.float32)[None, :, None].expand(1, t, d)
    _check_rope_tail(hq, d, t, (ang.cos(), ang.sin()))
