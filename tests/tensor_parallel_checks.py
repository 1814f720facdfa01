"""The tensor-parallel checks of tests/distributed_worker.py (run on every rank of its gloo launch; issue 22).

Every check trains the tiny fp32 Llama of the worker two SGD steps on one batch shared by the ranks (tensor parallel:
the ranks of a TP group see the same tokens), unpatched and patched under the same plan, and compares this rank's
losses, local gradients (a DTensor's: this rank's shard) and parameters (bounds: 1e-5, fp32). The patched model must
run the fused LM-head loss (no logits) vocab-parallel over the ranks, and say so in its report.

The head (the rest of the model replicated):

- ``tensor_parallel_head``: ``ColwiseParallel(output_layouts=Replicate())`` (transformers' ``colwise_gather_output``:
  the original all-gathers the logits).
- ``tensor_parallel_head_loss_parallel``: ``ColwiseParallel(use_local_output=False)``, the logits a ``Shard(-1)``
  DTensor and the original's loss taken under ``loss_parallel()`` (both runs inside it, as a training loop would).
- ``tensor_parallel_head_tied``: tied embeddings, the embedding ``RowwiseParallel`` and the head ``ColwiseParallel``
  sharing one ``Shard(0)`` parameter (re-tied after ``parallelize_module``, which gives each module its own).
- ``tensor_parallel_rowwise_head_skipped``: a head weight split by the hidden dimension (``Shard(1)``, row-wise):
  the fused loss is skipped with the reason in the report.

The whole decoder (torch's plan, :func:`tigon.integrations.tp_plan.apply_decoder_tp`: colwise q/k/v/gate/up, rowwise
o/down, the embedding rowwise):

- ``tensor_parallel_model``: no sequence parallelism (the row-wise ops see plain tensors, some of them a collective's
  result not waited for yet: AsyncCollectiveTensor).
- ``tensor_parallel_model_sequence_parallel``: ``SequenceParallel`` norms, the residual stream a ``Shard(1)``
  DTensor (token dimension); the final norm hands the head its tokens as a plain local tensor, which the head's
  ``ColwiseParallel(input_layouts=Shard(1))`` all-gathers. Tigon's row-wise ops must run on the local shards: every
  DTensor they receive is used with its own placements (no redistribution), and the norms, and the residual add fused
  with the post-attention norm (its ``SequenceParallel`` hooks run around it), see ``Shard(1)``.
- ``fsdp2_tensor_parallel_sequence_parallel_head_unit``: that plan with sequence parallelism on the "tp" dimension of a
  (1, world) mesh, ``fully_shard`` over "dp" on each layer, the LM head (its own unit) and the root.
- ``tensor_parallel_model_transformers_plan``: transformers' own ``tp_plan`` for Llama (its tensor-parallel styles,
  applied as ``from_pretrained(tp_plan="auto")`` applies them); SKIP where this transformers has no such API.
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, loss_parallel, parallelize_module

import tigon
from tigon import support
from tigon.integrations.sequence_parallel import sequence_parallel_hooks
from tigon.integrations.tp_plan import apply_decoder_tp
from tigon.numerics import rel_l2
from tigon.ops import _dtensor

STEPS, B, T = 2, 2, 8


class Unavailable(Exception):
    """The check cannot run with this torch / transformers (reported as SKIP with the reason)."""


def _mesh():
    return init_device_mesh("cpu", (dist.get_world_size(),))


def _local(t: torch.Tensor) -> torch.Tensor:
    return (t.to_local() if isinstance(t, DTensor) else t).detach().clone()


def torch_plan(kind: str):
    """``parallelize(model)`` applying torch's tensor-parallel plan ``kind`` (module docstring)."""

    def parallelize(model):
        mesh = _mesh()
        if kind == "head":
            plan = {"lm_head": ColwiseParallel(output_layouts=Replicate())}
        elif kind == "head_loss_parallel":
            plan = {"lm_head": ColwiseParallel(use_local_output=False)}
        elif kind == "head_tied":
            plan = {"model.embed_tokens": RowwiseParallel(input_layouts=Replicate()),
                    "lm_head": ColwiseParallel(output_layouts=Replicate())}
        elif kind in ("model", "model_sp"):  # the library's plan (torchtitan's, the residual stream Shard(1) with SP)
            return apply_decoder_tp(model, mesh, sequence_parallel=kind == "model_sp")
        elif kind == "fsdp2_model_sp_head_unit":  # FSDP2 over TP (a 2-D mesh), the head its own FSDP2 unit
            return _fsdp2_over_tp(model)
        else:
            raise ValueError(kind)
        parallelize_module(model, mesh, plan)
        if kind == "head_tied":
            model.lm_head.weight = model.model.embed_tokens.weight  # both Shard(0): one parameter again
        return model

    return parallelize


def _fsdp2_over_tp(model):
    """torchtitan's 2-D wrapping on a (1, world) mesh ("dp", "tp"): the decoder's plan with sequence parallelism over
    "tp", then ``fully_shard`` over "dp" on each decoder layer, on the LM head as its own unit and on the root. The
    head's unit gathers its vocabulary rows; its input hook all-gathers the tokens the final norm leaves sharded."""
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (1, dist.get_world_size()), mesh_dim_names=("dp", "tp"))
    apply_decoder_tp(model, mesh["tp"], sequence_parallel=True)
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh["dp"])
    fully_shard(model.lm_head, mesh=mesh["dp"])
    return fully_shard(model, mesh=mesh["dp"])


def transformers_plan(model):
    """transformers' own tensor-parallel plan of ``model`` (``model.tp_plan``: Llama's ``base_model_tp_plan`` and
    ``lm_head: colwise_gather_output``), applied by its ``apply_tensor_parallelism`` as ``from_pretrained`` does."""
    try:
        from transformers.distributed.tensor_parallel import apply_tensor_parallelism
    except ImportError as e:
        raise Unavailable(f"transformers has no distributed.tensor_parallel.apply_tensor_parallelism ({e})") from None
    if not hasattr(model, "_expand_parallel_plan") or not getattr(model, "tp_plan", None):
        raise Unavailable("this transformers' model has no tp_plan / _expand_parallel_plan")
    assert model.tp_plan.get("lm_head", "").startswith("colwise"), model.tp_plan
    try:
        plan = model._expand_parallel_plan(model.tp_plan)
        apply_tensor_parallelism(model, _mesh(), plan)
    except (TypeError, AttributeError) as e:  # another transformers' private signatures (before tigon.patch runs)
        raise Unavailable(f"this transformers' apply_tensor_parallelism / _expand_parallel_plan differ: {e}") from None
    return model


def _batch(vocab: int):
    g = torch.Generator().manual_seed(5)  # one batch for every rank
    ids = torch.randint(0, vocab, (B, T), generator=g)
    labels = ids.clone()
    labels[0, :2] = -100
    return ids, labels


class _PlacementSpy:
    """Records every DTensor row input of Tigon's row-wise ops (tigon.ops._dtensor): (op, placements it arrived
    with, placements it ran with)."""

    def __init__(self):
        self.calls = []
        self._original = None

    def __enter__(self):
        self._original = original = _dtensor._local_placements

        def spy(op, name, t, mixed):
            run, back = original(op, name, t, mixed)
            self.calls.append((op, tuple(t.placements), tuple(run)))
            return run, back

        _dtensor._local_placements = spy
        return self

    def __exit__(self, *exc):
        _dtensor._local_placements = self._original


def train(build, parallelize, patched: bool, *, ctx=contextlib.nullcontext) -> dict:
    """Losses, per-step local gradients and final local parameters of one run; the patch report."""
    model = parallelize(build())
    report = None
    if patched:
        report = tigon.patch(model)
        assert report.counts.get("lm_head_loss") == 1, f"LM head not patched: {report}"
    ids, labels = _batch(model.config.vocab_size)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    run = {"losses": [], "grads": [], "fused": [], "report": report}
    for _ in range(STEPS):
        with ctx():
            out = model(input_ids=ids, labels=labels)
            out.loss.backward()
        run["fused"].append(out.logits is None)
        run["losses"].append(out.loss.item())
        run["grads"].append({n: _local(p.grad) for n, p in model.named_parameters() if p.grad is not None})
        opt.step()
        opt.zero_grad(set_to_none=True)
    run["params"] = {n: _local(p) for n, p in model.named_parameters()}
    run["sharded"] = sorted(n for n, p in model.named_parameters() if isinstance(p, DTensor))
    return run


def compare(build, parallelize, *, ctx=contextlib.nullcontext, rtol: float = 1e-5,
            reported: bool = True) -> tuple[dict, str]:
    """Train unpatched then patched; assert they agree. Returns the patched run and the measured differences.
    ``reported``: the patch report names the vocabulary-parallel loss (False: a head whose weight is not yet
    vocabulary-sharded when patched, e.g. an FSDP2 unit over TP: not asserted)."""
    ref = train(build, parallelize, False, ctx=ctx)
    support.backend_usage(reset=True)
    with _PlacementSpy() as spy:
        got = train(build, parallelize, True, ctx=ctx)
    got["dtensor_calls"] = spy.calls
    got["usage"] = {op: sum(n.values()) for op, n in support.backend_usage(reset=True).items()}
    assert all(got["fused"]) and not any(ref["fused"]), (got["fused"], ref["fused"])
    world = dist.get_world_size()
    entry = next(e for e in got["report"].replaced if e.kind == "lm_head_loss")
    assert not reported or f"vocab-parallel over {world} ranks" in entry.detail, entry.detail
    worst = {"loss": 0.0, "grad": 0.0, "param": 0.0}
    for step, (a, b) in enumerate(zip(got["losses"], ref["losses"])):
        worst["loss"] = max(worst["loss"], abs(a - b) / abs(b))
        assert abs(a - b) <= rtol * abs(b), f"step {step} loss {a} vs {b}"
    for step, (g, r) in enumerate(zip(got["grads"], ref["grads"])):
        assert g.keys() == r.keys(), f"step {step}: parameters with a gradient differ: {sorted(g.keys() ^ r.keys())}"
        for n in r:
            d = rel_l2(g[n], r[n])
            worst["grad"] = max(worst["grad"], d)
            assert d <= rtol, f"step {step} grad {n}: rel L2 {d:.2e}"
    for n, r in ref["params"].items():
        d = rel_l2(got["params"][n], r)
        worst["param"] = max(worst["param"], d)
        assert d <= rtol, f"param {n} after {STEPS} steps: rel L2 {d:.2e}"
    return got, " ".join(f"{k}={v:.1e}" for k, v in worst.items())


def head(build) -> str:
    got, diffs = compare(build, torch_plan("head"))
    assert got["sharded"] == ["lm_head.weight"], got["sharded"]
    return f"{diffs}, head rows on this rank {got['grads'][0]['lm_head.weight'].shape[0]}"


def head_loss_parallel(build) -> str:
    # the original's loss on Shard(-1) DTensor logits needs loss_parallel(); the fused one runs the same inside it
    return compare(build, torch_plan("head_loss_parallel"), ctx=loss_parallel)[1]


def head_tied(build) -> str:
    got, diffs = compare(lambda: build(tied=True), torch_plan("head_tied"))
    assert got["sharded"] == ["model.embed_tokens.weight"], got["sharded"]  # one parameter, listed once
    entry = next(e for e in got["report"].replaced if e.kind == "lm_head_loss")
    assert "tied to the input embedding" in entry.detail, entry.detail
    return diffs


def rowwise_head_skipped(build) -> str:
    """A head weight split by the hidden dimension: skipped with the reason, nothing raises, the original runs."""
    model = build()
    model.lm_head.weight = torch.nn.Parameter(distribute_tensor(model.lm_head.weight.data, _mesh(), [Shard(1)]))
    report = tigon.patch(model)
    skipped = [e for e in report.skipped if e.kind == "lm_head_loss"]
    assert "lm_head_loss" not in report.counts and skipped, str(report)
    assert "row-wise parallel" in skipped[0].detail and "the original forward runs" in skipped[0].detail, \
        skipped[0].detail
    return "skipped: " + skipped[0].detail[:60]


def model(build) -> str:
    got, diffs = compare(build, torch_plan("model"))
    _check_patched(got, ("rms_norm", "fused_add_rms_norm", "mlp", "rope"))
    return diffs


def model_sequence_parallel(build) -> str:
    got, diffs = compare(build, torch_plan("model_sp"))
    _check_patched(got, ("rms_norm", "fused_add_rms_norm", "mlp", "rope"))
    calls = got["dtensor_calls"]
    gathered = [c for c in calls if c[1] != c[2]]
    assert not gathered, f"row-wise ops redistributed their DTensor inputs: {gathered[:3]}"
    layers = len(build().model.layers)
    # per step and layer: the input norm, and the residual add + post-attention norm fused (the norm's SequenceParallel
    # hooks run around it); then the final norm; each on its local tokens
    norms = [c for c in calls if c[0] == "rms_norm" and c[1] == (Shard(1),)]
    fused = [c for c in calls if c[0] == "fused_add_rms_norm" and c[1] == (Shard(1),)]
    assert len(norms) == STEPS * (layers + 1) and len(fused) == STEPS * layers, calls
    assert got["usage"].get("fused_add_rms_norm") == STEPS * layers, got["usage"]  # the op itself ran, no fallback
    # only torch's SequenceParallel hooks, and nothing else on the norm, are run around the fused op
    norm = torch_plan("model_sp")(build()).model.layers[0].post_attention_layernorm
    hooks = sequence_parallel_hooks(norm)
    assert hooks is not None and hooks.placements == (Shard(1),), hooks
    handle = norm.register_forward_hook(lambda m, args, out: None)
    assert sequence_parallel_hooks(norm) is None
    handle.remove()
    return f"{diffs}, {len(calls)} DTensor row-wise calls on local shards"


def fsdp2_model_sequence_parallel_head_unit(build) -> str:
    # FSDP2 + TP: inside the head's FSDP2 unit the loss gets the hidden states as the head's ColwiseParallel input hook
    # lays them out (sequence parallel: this rank's tokens, all-gathered), not as the final norm left them
    return compare(build, torch_plan("fsdp2_model_sp_head_unit"), reported=False)[1]


def model_transformers_plan(build) -> str:
    try:
        probe = transformers_plan(build())
    except Unavailable as e:
        return f"SKIP {e}"
    assert "lm_head.weight" in {n for n, p in probe.named_parameters() if isinstance(p, DTensor)}
    got, diffs = compare(build, transformers_plan)
    _check_patched(got, ("rms_norm", "fused_add_rms_norm", "mlp", "rope"))
    return diffs


def _check_patched(run: dict, kinds) -> None:
    counts = run["report"].counts
    missing = [k for k in kinds if not counts.get(k)]
    assert not missing, f"not patched under the plan: {missing}; {run['report']}"
