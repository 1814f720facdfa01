"""Tensors with more than 2**31 elements (int64 offsets): GPU only, compiled kernels, every op.

Each test builds inputs a little past 2**31 elements (rows of hidden 4096 and of hidden 256 for the norms), runs the
op forward and backward, and checks, against the float64 reference:
- every row from just before element 2**31 to the end (the rows where an int32 offset would wrap), not only the
  tail, for the outputs and the input gradients;
- the weight / bias gradients (the persistent backward's partials): the upstream gradient is zero on the rows
  before the boundary, so those gradients come from the checked rows alone, and the input gradient before the
  boundary must be exactly zero;
- that nothing was left unwritten: the allocator is poisoned with NaN first, so an output row a kernel skipped
  reads NaN (issue 17: rows past 2**31 that came back as stale memory).
"""

import pytest
import torch

from tigon import functional as F
from tigon.numerics import rel_l2
from tigon.reference import cross_entropy as ref_ce
from tigon.reference import divergence as ref_div
from tigon.reference import dyt as ref_dyt
from tigon.reference import fused_add_rms_norm as ref_fadd
from tigon.reference import fused_linear_cross_entropy as ref_flce
from tigon.reference import glu as ref_glu
from tigon.reference import layer_norm as ref_ln
from tigon.reference import poly_norm as ref_poly_norm
from tigon.reference import relu_squared as ref_relu_squared
from tigon.reference import rms_norm as ref_rms
from tigon.reference import rope as ref_rope
from tigon.reference import softmax as ref_softmax
from tigon.reference import group_norm as ref_group_norm
from tigon.reference import sparsemax as ref_sparsemax

PAST = 2**31
MORE = 2**24  # elements past the boundary
TOL = 1e-2  # bf16 outputs against float64 (relative L2): rounding to bf16 is ~3e-3
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_properties(0).total_memory < 100e9,
                       reason="needs a CUDA GPU with >= 100 GB"),
]
BF16 = dict(device="cuda", dtype=torch.bfloat16)


@pytest.fixture(autouse=True)
def poisoned_allocator():
    """Fill the caching allocator's free memory with NaN, so that outputs made with torch.empty start as NaN."""
    torch.cuda.empty_cache()
    free = torch.cuda.mem_get_info()[0]
    blob = torch.full((int(free * 0.8) // 2,), float("nan"), **BF16)
    del blob  # its blocks stay cached: the next allocations reuse NaN-filled memory
    yield
    torch.cuda.empty_cache()


def _first_row(n: int) -> int:
    """The first checked row of an (M, n) tensor: the one holding element 2**31 - 1, minus one."""
    return max((PAST - 1) // n - 1, 0)


def _check_rows(name, got, ref, r0):
    assert not torch.isnan(got[r0:]).any(), f"{name}: NaN (unwritten) rows past row {r0}"
    err = rel_l2(got[r0:], ref)
    assert err < TOL, f"{name}: relative error {err:.2e} on rows {r0}..{got.shape[0]}"


def _upstream_after(shape, r0):
    """A random upstream gradient, zero on the rows before r0."""
    dy = torch.randn(shape, **BF16)
    dy[:r0] = 0
    return dy


def _zero_before(name, grad, r0):
    assert int(torch.count_nonzero(grad[:r0])) == 0, f"{name}: non-zero gradient before row {r0}"


def _leaf(t):
    return t.double().requires_grad_(True)


@pytest.mark.parametrize("hidden", [4096, 256])
@pytest.mark.parametrize("op", ["rms_norm", "layer_norm", "fused_add_rms_norm", "rms_norm_no_weight"])
def test_norms_past_2_31_elements(op, hidden):
    m = (PAST + MORE) // hidden
    r0 = _first_row(hidden)
    x = torch.randn(m, hidden, **BF16).requires_grad_(True)
    w = (torch.rand(hidden, device="cuda") + 0.5).to(torch.bfloat16).requires_grad_(True)
    b = torch.randn(hidden, **BF16).requires_grad_(True)
    r = torch.randn(m, hidden, **BF16).requires_grad_(True)
    if op == "rms_norm":
        outs, refs = (F.rms_norm(x, w),), lambda xt, rt, wt, bt: (ref_rms.rms_norm(xt, wt),)
    elif op == "rms_norm_no_weight":
        outs, refs = (F.rms_norm(x, None),), lambda xt, rt, wt, bt: (ref_rms.rms_norm(xt, None),)
    elif op == "layer_norm":
        outs, refs = (F.layer_norm(x, w, b),), lambda xt, rt, wt, bt: (ref_ln.layer_norm(xt, wt, bt),)
    else:
        outs, refs = F.fused_add_rms_norm(x, r, w), lambda xt, rt, wt, bt: ref_fadd.fused_add_rms_norm(xt, rt, wt)
    ups = [_upstream_after(o.shape, r0) for o in outs]
    torch.autograd.backward(outs, ups)
    xt, rt, wt, bt = _leaf(x.detach()[r0:]), _leaf(r.detach()[r0:]), _leaf(w.detach()), _leaf(b.detach())
    ref_outs = refs(xt, rt, wt, bt)
    torch.autograd.backward(ref_outs, [u[r0:].double() for u in ups])
    for i, (o, ro) in enumerate(zip(outs, ref_outs)):
        _check_rows(f"{op} output {i}", o.detach(), ro, r0)
    _check_rows(f"{op} dx", x.grad, xt.grad, r0)
    _zero_before(f"{op} dx", x.grad, r0)
    if op != "rms_norm_no_weight":
        assert rel_l2(w.grad, wt.grad) < TOL
    if op == "layer_norm":
        assert rel_l2(b.grad, bt.grad) < TOL
    if op == "fused_add_rms_norm":
        _check_rows(f"{op} dresidual", r.grad, rt.grad, r0)


@pytest.mark.parametrize("op", ["swiglu", "geglu", "glu_linear"])
def test_glu_past_2_31_elements(op):
    n = 14336  # Llama-3-8B's intermediate size
    m = (PAST + MORE) // n
    r0 = _first_row(n)
    g = torch.randn(m, n, **BF16).requires_grad_(True)
    u = torch.randn(m, n, **BF16).requires_grad_(True)
    wd = (torch.randn(64, n, **BF16) / n**0.5).requires_grad_(True)
    gt, ut, wt = _leaf(g.detach()[r0:]), _leaf(u.detach()[r0:]), _leaf(wd.detach())
    if op == "glu_linear":
        out, ref = F.glu_linear(g, u, wd), ref_glu.glu_linear(gt, ut, wt)
    else:
        out, ref = getattr(F, op)(g, u), getattr(ref_glu, op)(gt, ut)
    dy = _upstream_after(out.shape, r0)
    out.backward(dy)
    ref.backward(dy[r0:].double())
    _check_rows(f"{op} output", out.detach(), ref, r0)
    for name, got, want in (("dgate", g.grad, gt.grad), ("dup", u.grad, ut.grad)):
        _check_rows(f"{op} {name}", got, want, r0)
        _zero_before(f"{op} {name}", got, r0)
    if op == "glu_linear":
        assert rel_l2(wd.grad, wt.grad) < TOL


@pytest.mark.parametrize("hidden", [4096, 256])
@pytest.mark.parametrize("op", ["relu_squared", "softmax", "dyt", "poly_norm", "sparsemax"])
def test_liger_ops_past_2_31_elements(op, hidden):
    # The ops of Liger's list beyond the Llama ones: x (M, hidden) past 2**31 elements, their parameters' gradients
    # from the checked rows alone (the upstream gradient is zero before them).
    m = (PAST + MORE) // hidden
    r0 = _first_row(hidden)
    x = torch.randn(m, hidden, **BF16).requires_grad_(True)
    params = {"relu_squared": [], "softmax": [], "sparsemax": [],
              "dyt": [torch.tensor([0.6], **BF16), (torch.rand(hidden, device="cuda") + 0.5).to(torch.bfloat16),
                      torch.randn(hidden, **BF16)],
              "poly_norm": [torch.tensor([0.3, 0.3, 0.4], **BF16), torch.tensor(0.5, **BF16)]}[op]
    params = [p.requires_grad_(True) for p in params]
    ref = {"relu_squared": ref_relu_squared.relu_squared, "softmax": ref_softmax.softmax, "dyt": ref_dyt.dyt,
           "poly_norm": ref_poly_norm.poly_norm, "sparsemax": ref_sparsemax.sparsemax}[op]
    out = getattr(F, op)(x, *params)
    dy = _upstream_after(out.shape, r0)
    out.backward(dy)
    xt, pt = _leaf(x.detach()[r0:]), [_leaf(p.detach()) for p in params]
    want = ref(xt, *pt)
    want.backward(dy[r0:].double())
    _check_rows(f"{op} output", out.detach(), want, r0)
    _check_rows(f"{op} dx", x.grad, xt.grad, r0)
    _zero_before(f"{op} dx", x.grad, r0)
    for p, q in zip(params, pt):
        assert rel_l2(p.grad, q.grad) < TOL, f"{op}: parameter gradient {rel_l2(p.grad, q.grad):.2e}"


def _rope_inputs(hq, d, t):
    """HF-layout q (1, hq, t, d) (a transposed view) and k (1, 1, t, d), cos / sin (1, t, d)."""
    q = torch.randn(1, t, hq, d, **BF16).transpose(1, 2).requires_grad_(True)
    k = torch.randn(1, t, 1, d, **BF16).transpose(1, 2).requires_grad_(True)
    pos = torch.arange(t, device="cuda", dtype=torch.float32)
    inv = 1.0 / (10000.0 ** (torch.arange(0, d, 2, device="cuda", dtype=torch.float32) / d))
    emb = torch.cat([pos[:, None] * inv, pos[:, None] * inv], -1)[None]
    return q, k, emb.cos(), emb.sin()


@pytest.mark.parametrize("hq,d", [(32, 128), (32, 2)], ids=["elements", "rows"])
def test_rope_past_2_31(hq, d):
    # (32, 128): q has > 2**31 elements; (32, 2): > 2**31 rows (batch * positions * heads), the row index itself
    # needs int64 (head dim 2 keeps the tensor at 8 GiB). Positions from the boundary's on are checked.
    t = (PAST + MORE) // (hq * d) if d > 2 else 2**31 // hq + 2**16
    q, k, cos, sin = _rope_inputs(hq, d, t)
    qo, ko = F.rope(q, k, cos, sin)
    p0 = max((PAST - 1) // (hq * d) - 1, 0) if d > 2 else 2**31 // hq - 2**10
    dq = torch.randn_like(qo)
    dq[:, :, :p0] = 0
    (qo * dq).sum().backward()
    sl = slice(p0, t)
    qt, kt = _leaf(q.detach()[:, :, sl]), _leaf(k.detach()[:, :, sl])
    qr, kr = ref_rope.rope(qt, kt, cos[:, sl].double(), sin[:, sl].double())
    (qr * dq[:, :, sl].double()).sum().backward()
    for name, got, want in (("q out", qo[:, :, sl], qr), ("k out", ko[:, :, sl], kr),
                            ("dq", q.grad[:, :, sl], qt.grad)):
        assert not torch.isnan(got).any(), f"rope {name}: NaN (unwritten) past position {p0}"
        assert rel_l2(got, want) < TOL, name
    assert int(torch.count_nonzero(q.grad[:, :, :p0])) == 0


@pytest.mark.parametrize("grad_in_forward", [False, None, True])
def test_cross_entropy_past_2_31_elements(grad_in_forward):
    v = 128256
    n = (PAST + MORE) // v
    r0 = _first_row(v)
    leaf = (torch.randn(n, v, **BF16) * 3).requires_grad_(True)
    target = torch.randint(0, v, (n,), device="cuda")
    target[r0 + 3] = -100
    logits = leaf * 1  # a non-leaf (grad_in_forward writes the gradient over it)
    scalar = grad_in_forward is not False  # True: formed over the logits; None: into a buffer of its own
    if scalar:  # a scalar loss: the rows before the boundary are ignored, so their gradient is zero
        target[:r0] = -100
        loss = F.cross_entropy(logits, target, reduction="sum", grad_in_forward=grad_in_forward)
        loss.backward()
        rows = None
    else:
        rows = F.cross_entropy(logits, target, reduction="none")
        up = torch.rand(n, device="cuda")
        up[:r0] = 0
        rows.backward(up)
    xt = _leaf(leaf.detach()[r0:])
    ref_rows = ref_ce.cross_entropy(xt, target[r0:], reduction="none")
    (ref_rows.sum() if scalar else (ref_rows * up[r0:].double()).sum()).backward()
    if rows is not None:
        _check_rows("cross_entropy loss rows", rows.detach()[:, None], ref_rows[:, None], r0)
    _check_rows("cross_entropy dlogits", leaf.grad, xt.grad, r0)
    _zero_before("cross_entropy dlogits", leaf.grad, r0)


def test_fused_linear_cross_entropy_past_2_31_hidden_elements():
    h, v = 4096, 8192
    n = (PAST + MORE) // h
    r0 = _first_row(h)
    hid = torch.randn(n, h, **BF16).requires_grad_(True)
    w = (torch.randn(v, h, **BF16) / h**0.5 * 2).requires_grad_(True)
    target = torch.randint(0, v, (n,), device="cuda")
    rows = F.fused_linear_cross_entropy(hid, w, target, reduction="none")
    up = torch.rand(n, device="cuda")
    up[:r0] = 0
    rows.backward(up)
    ht, wt = _leaf(hid.detach()[r0:]), _leaf(w.detach())
    ref_rows = ref_flce.fused_linear_cross_entropy(ht, wt, target[r0:], reduction="none")
    (ref_rows * up[r0:].double()).sum().backward()
    _check_rows("flce loss rows", rows.detach()[:, None], ref_rows[:, None], r0)
    _check_rows("flce dhidden", hid.grad, ht.grad, r0)
    _zero_before("flce dhidden", hid.grad, r0)
    assert rel_l2(w.grad, wt.grad) < TOL


def test_divergences_past_2_31_elements():
    # jsd (its gradient formed in the forward; the rows before the boundary ignored, so their gradient is zero) and
    # tvd with reduction="none" (the pointwise losses and the recomputing backward with an (N, V) upstream)
    v = 128256
    n = (PAST + MORE) // v
    r0 = _first_row(v)
    x = torch.randn(n, v, **BF16).log_softmax(-1)
    y = (torch.randn(n, v, **BF16) * 2).log_softmax(-1)
    labels = torch.randint(0, v, (n,), device="cuda")
    labels[:r0] = -100
    labels[r0 + 2] = -100
    leaf = x.clone().requires_grad_(True)
    F.jsd(leaf, y, labels, beta=0.3).backward()
    xt = _leaf(x[r0:])
    ref_div.jsd(xt, y[r0:].double(), labels[r0:], beta=0.3).backward()
    _check_rows("jsd dinput", leaf.grad, xt.grad, r0)
    _zero_before("jsd dinput", leaf.grad, r0)
    del leaf, xt
    p, q = x.exp(), y.exp()
    del x, y
    leaf = p.clone().requires_grad_(True)
    rows = F.tvd(leaf, q, reduction="none")
    up = torch.randn(n, v, device="cuda")
    up[:r0] = 0
    rows.backward(up)
    pt = _leaf(p[r0:])
    ref_rows = ref_div.tvd(pt, q[r0:].double(), reduction="none")
    (ref_rows * up[r0:].double()).sum().backward()
    _check_rows("tvd loss", rows.detach(), ref_rows.detach(), r0)
    _check_rows("tvd dinput", leaf.grad, pt.grad, r0)
    _zero_before("tvd dinput", leaf.grad, r0)


@pytest.mark.parametrize("positions", [4096, 3])
def test_group_norm_past_2_31_elements(positions):
    # X (B, 128 channels, positions) past 2**31 elements, 32 groups; the check starts at the batch row holding element
    # 2**31 - 1 (minus one), whole groups; the weight / bias gradients come from those rows alone
    c, g = 128, 32
    per_row = c * positions
    b = (PAST + MORE) // per_row
    b0 = _first_row(per_row)
    x = torch.randn(b, c, positions, **BF16).requires_grad_(True)
    w = (torch.rand(c, device="cuda") + 0.5).to(torch.bfloat16).requires_grad_(True)
    bias = torch.randn(c, **BF16).requires_grad_(True)
    out = F.group_norm(x, w, bias, c, g)
    dy = _upstream_after(out.shape, b0)
    out.backward(dy)
    xt, wt, bt = _leaf(x.detach()[b0:]), _leaf(w.detach()), _leaf(bias.detach())
    want = ref_group_norm.group_norm(xt, wt, bt, c, g)
    want.backward(dy[b0:].double())
    _check_rows("group_norm output", out.detach().view(b, per_row), want.reshape(-1, per_row), b0)
    _check_rows("group_norm dx", x.grad.view(b, per_row), xt.grad.reshape(-1, per_row), b0)
    _zero_before("group_norm dx", x.grad, b0)
    assert rel_l2(w.grad, wt.grad) < TOL and rel_l2(bias.grad, bt.grad) < TOL


def _even_offsets(rows: int, experts: int) -> torch.Tensor:
    """grouped_mm's cumulative rows of ``experts`` experts sharing ``rows`` sorted rows about evenly (int32, CUDA)."""
    return torch.linspace(rows / experts, rows, experts, device=BF16["device"]).round().to(torch.int32)


def _rebased(offsets: torch.Tensor, base: int) -> torch.Tensor:
    """The offsets of the rows from ``base`` on (those of the float64 reference on the checked slice)."""
    return (offsets.long() - base).clamp(min=0).to(torch.int32)


@pytest.mark.parametrize("activation", ["silu", "clamped_swiglu"])
def test_moe_expert_gate_past_2_31_elements(activation):
    # gate_up (S, 2I) past 2**31 elements, 8 experts with biases; the bias gradient comes from the checked rows alone
    from tigon.reference import moe_glue as ref_moe

    n2, e = 4096, 8
    s = (PAST + MORE) // n2 + 1
    r0 = _first_row(n2)
    offsets = _even_offsets(s, e)
    gu = torch.randn(s, n2, **BF16).requires_grad_(True)
    bias = (0.1 * torch.randn(e, n2, **BF16)).requires_grad_(True)
    limit = 7.0 if activation == "clamped_swiglu" else None  # (GPT-OSS's swiglu_limit)
    h = F.moe_expert_gate(gu, offsets, bias, activation, limit=limit)
    dh = _upstream_after(h.shape, r0)
    h.backward(dh)
    gt, bt = _leaf(gu.detach()[r0:]), _leaf(bias.detach())
    want = ref_moe.moe_expert_gate(gt, _rebased(offsets, r0), bt, activation, limit=limit)
    want.backward(dh[r0:].double())
    _check_rows(f"moe_expert_gate {activation} output", h.detach(), want, r0)
    _check_rows(f"moe_expert_gate {activation} d gate_up", gu.grad, gt.grad, r0)
    _zero_before("moe_expert_gate d gate_up", gu.grad, r0)
    assert rel_l2(bias.grad, bt.grad) < TOL


def test_moe_gather_and_combine_past_2_31_elements():
    # the sorted rows (S = T k, H) past 2**31 elements, k = 2, positions in token order (row t k + j), 8 experts with
    # biases; checked from the token whose first row holds element 2**31 - 1 (minus one), gradients from there alone
    from tigon.reference import moe_glue as ref_moe

    h, k, e = 4096, 2, 8
    t = (PAST + MORE) // (h * k) + 1
    s = t * k
    t0 = _first_row(h) // k
    r0 = t0 * k
    positions = torch.arange(s, device=BF16["device"]).view(t, k)
    offsets = _even_offsets(s, e)
    x = torch.randn(t, h, **BF16).requires_grad_(True)
    rows = F.moe_gather(x, positions)
    d_rows = _upstream_after(rows.shape, r0)
    rows.backward(d_rows)
    assert torch.equal(rows.detach()[r0:], x.detach()[t0:].repeat_interleave(k, dim=0)), "moe_gather rows"
    _check_rows("moe_gather dx", x.grad, d_rows[r0:].double().view(-1, k, h).sum(1), t0)
    _zero_before("moe_gather dx", x.grad, t0)
    del rows, d_rows, x

    y = torch.randn(s, h, **BF16).requires_grad_(True)
    w = torch.rand(t, k, **BF16).requires_grad_(True)
    bias = (0.1 * torch.randn(e, h, **BF16)).requires_grad_(True)
    out = F.moe_combine(y, w, positions, offsets, bias)
    dout = _upstream_after(out.shape, t0)
    out.backward(dout)
    yt, wt, bt = _leaf(y.detach()[r0:]), _leaf(w.detach()[t0:]), _leaf(bias.detach())
    want = ref_moe.moe_combine(yt, wt, positions[t0:] - r0, _rebased(offsets, r0), bt)
    want.backward(dout[t0:].double())
    _check_rows("moe_combine output", out.detach(), want, t0)
    _check_rows("moe_combine d x", y.grad, yt.grad, r0)
    _zero_before("moe_combine d x", y.grad, r0)
    _check_rows("moe_combine d weights", w.grad, wt.grad, t0)
    assert rel_l2(bias.grad, bt.grad) < TOL
