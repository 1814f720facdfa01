"""A patched model under Hugging Face's gradient checkpointing, in both of its modes, and under Tigon's selective
checkpointing (:mod:`tigon.checkpointing`), trains like the original without checkpointing.

Activation checkpointing runs each decoder layer's forward twice (once without saving, once during the backward) and,
in PyTorch's non-reentrant mode, through saved-tensor hooks; the reentrant mode re-runs the forward inside an
autograd Function's backward; the selective mode keeps some ops' outputs from the forward and hands them back to the
recomputation instead of running those ops again. Tigon's ops that save less (in-place backward of the MLP, gradients
formed in the forward of the fused loss, the fused decoder layer's add + norm) must give the same losses, gradients
and parameters in every mode as the unpatched model without checkpointing, and the selective mode must recompute
exactly the matmuls and attention kernels its plan does not keep (issue 26: checkpointing as a first-class case).
"""

from __future__ import annotations

import os

import pytest
import torch

import tigon
from torch.utils._python_dispatch import TorchDispatchMode

from model_matrix import CASES, DEVICE, DTYPE, GENERIC, MORE_FAMILIES, assert_report_runs, build, config, require_family
from tigon import checkpointing, data, support
from tigon.numerics import rel_l2

STEPS = 2 if DEVICE == "cpu" else 5
B, T = 2, 12
RTOL = (1e-5 if DEVICE == "cpu" else 1e-4) if DTYPE == torch.float32 else 2e-2
MODES = ("non_reentrant", "reentrant", "selective", "selective_partial")


def checkpointed(model, reentrant: bool):
    """``model`` with HF's gradient checkpointing on, in the given mode (newer transformers renamed the method)."""
    kwargs = {"use_reentrant": reentrant}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    assert model.is_gradient_checkpointing
    if reentrant:  # the reentrant mode needs an input that requires grad to run the layers' backward at all
        model.enable_input_require_grads()
    return model


class CountOps(TorchDispatchMode):
    """Counts the ATen matmuls (``mm`` / ``addmm``) and fused attention forwards that run while active: in a
    checkpointed model's backward, the gradients' matmuls plus whatever the recomputation runs again."""

    def __init__(self):
        super().__init__()
        self.matmuls = self.attention = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.matmuls += func in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default)
        self.attention += func in checkpointing.attention_ops()
        return func(*args, **(kwargs or {}))


def train(model, batches, counts: list | None = None):
    """``len(batches)`` AdamW steps; per step the loss and the gradients; ``counts`` gets each backward's
    :class:`CountOps`."""
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses, grads = [], []
    for ids in batches:
        out = model(input_ids=ids, labels=ids)
        with CountOps() as c:
            out.loss.backward()
        if counts is not None:
            counts.append(c)
        grads.append({n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None})
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(out.loss.item())
    return losses, grads


def fused_heads(model_type: str, overrides: dict) -> dict:
    """``overrides`` with as many key / value heads as query heads on CUDA in fp32, unchanged elsewhere. With
    grouped-query attention in fp32, CUDA's sdpa has no fused kernel (flash is 16-bit only, memory-efficient refuses
    ``enable_gqa``) and takes its math path (bmm + softmax, seen on an H100), where there is no attention output to
    keep or count: these tests are about what a fused attention kernel's layer offers. The CPU's fused kernel takes
    GQA, so the CPU keeps the matrix's grouped heads."""
    if DEVICE != "cuda" or DTYPE != torch.float32:
        return overrides
    cfg = config(model_type, overrides)  # (the matrix's own config: its tiny sizes under the overrides)
    heads, kv = getattr(cfg, "num_attention_heads", None), getattr(cfg, "num_key_value_heads", None)
    return {**overrides, "num_key_value_heads": heads} if heads and kv and kv != heads else overrides


def sdpa_llama():
    """The tiny Llama of the model matrix with PyTorch's fused attention (sdpa), whose output a selective checkpoint
    can keep (:func:`fused_heads`)."""
    model_type, overrides, *_ = CASES["llama"]
    model = build(model_type, fused_heads(model_type, overrides))
    model.config._attn_implementation = "sdpa"
    return model


@pytest.fixture(scope="module")
def reference():
    """The batches, and the unpatched model's losses, gradients and final parameters without checkpointing."""
    tokens = data.byte_tokens(data.corpus_text())
    batches = [b.to(DEVICE) for b in data.fixed_batches(tokens, STEPS, B, T, seed=0)]
    model = sdpa_llama()
    losses, grads = train(model, batches)
    return batches, losses, grads, [p.detach().clone() for p in model.parameters()]


def assert_trains_like(model, losses, grads, reference):
    _, ref_losses, ref_grads, ref_params = reference
    for step, (a, b) in enumerate(zip(losses, ref_losses)):
        assert abs(a - b) <= RTOL * abs(b), f"step {step}: {a} vs {b}"
    for step, (g, ref) in enumerate(zip(grads, ref_grads)):
        assert set(g) == set(ref), f"step {step}: parameters with a gradient differ"
        worst = max(ref, key=lambda n: rel_l2(g[n], ref[n]))
        assert rel_l2(g[worst], ref[worst]) <= RTOL, f"step {step}: {worst} {rel_l2(g[worst], ref[worst]):.2e}"
    for (n, p), q in zip(model.named_parameters(), ref_params):
        assert rel_l2(p, q) <= RTOL, n


@pytest.mark.parametrize("mode", MODES)
def test_patched_model_trains_like_the_original_under_checkpointing(mode, reference):
    """Every mode against the unpatched model without checkpointing; the backward's recomputation runs the layers'
    matmuls and attention again except what the selective plan keeps: everything ("selective", a budget that fits
    it all), or the top layer's projections and the first layer's q / k / v ("selective_partial": the outputs with
    the most FLOPs per byte first, from the top layer down)."""
    batches = reference[0]
    model = sdpa_llama()
    report = tigon.patch(model)
    layers = model.config.num_hidden_layers
    kept_mm = kept_attention = 0
    if mode.startswith("selective"):
        stack = [layer for _, layer in checkpointing.decoder_layers(model)]
        every = [checkpointing.candidates(model, layer, (B, T)) for layer in stack]
        offered = [k.name for k in every[0]]  # in forward order
        assert offered == ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "attention", "self_attn.o_proj",
                           "mlp.gate_proj", "mlp.up_proj"]  # not mlp.down_proj: never recomputed
        projections = [n for n in offered if n != "attention"]
        budget = (sum(k.bytes for c in every for k in c) if mode == "selective"
                  else sum(k.bytes for k in every[-1] if k.name != "attention") + sum(k.bytes for k in every[0][:3]))
        plan = checkpointing.enable(model, "selective", batch=(B, T), budget_bytes=budget)
        want = ([offered] * layers if mode == "selective"
                else [projections[:3]] + [[]] * (layers - 2) + [projections])
        assert [[k.name for k in lp.kept] for lp in plan.layers] == want, plan.describe()
        kept_mm = sum(k.name != "attention" for lp in plan.layers for k in lp.kept)
        kept_attention = sum(k.name == "attention" for lp in plan.layers for k in lp.kept)
        assert model.is_gradient_checkpointing
    else:
        checkpointed(model, mode == "reentrant")
    support.backend_usage(reset=True)
    counts: list[CountOps] = []
    losses, grads = train(model, batches, counts)
    used = support.backend_usage()
    assert_report_runs(report, used, steps=STEPS, checkpointed=mode != "reentrant")
    # the layers ran twice per step (forward, then recomputed in the backward): checkpointing did run
    assert sum(used["rope"].values()) == 2 * layers * STEPS, used["rope"]
    # non-reentrant: inside the checkpoint the MLP runs swiglu then the down projection (nn.Linear), so that the
    # recomputation stops before the down projection's matmul (child_calls.under_checkpoint); reentrant keeps the fold
    folded = sum(used.get("glu_linear", {}).values())
    assert (folded == 0) if mode != "reentrant" else (folded == 2 * layers * STEPS), used
    # the backward's matmuls: each projection's two gradients (the fused LM head forms its gradients in the forward)
    # plus the recomputed q, k, v, o, gate, up of every layer, less what the selective plan keeps; the attention
    # forward of every layer, less the kept ones
    if mode != "reentrant":  # (the reentrant recomputation runs under the backward's grad mode: counted the same, but
        for c in counts:     # its fold runs glu_linear's matmul too)
            assert (c.matmuls, c.attention) == (2 * 7 * layers + 6 * layers - kept_mm, layers - kept_attention), mode
    assert_trains_like(model, losses, grads, reference)


def test_plan_and_its_errors():
    """The plan's arithmetic at the tiny shape, the budget's order (FLOPs per byte, top layer first) and the argument
    checks, each naming the argument."""
    model = sdpa_llama()
    cand = checkpointing.candidates(model, checkpointing.decoder_layers(model)[0][1], (B, T))
    tokens, hidden = B * T, model.config.hidden_size
    q = cand[0]
    assert (q.name, q.bytes, q.flops) == ("self_attn.q_proj", tokens * 64 * 4, 2.0 * tokens * hidden * 64)
    attention = next(k for k in cand if k.name == "attention")
    assert attention.bytes == tokens * 4 * 16 * 4 + B * 4 * T * 4 and attention.flops == 2.0 * B * 4 * T * (T + 1) * 16
    p = checkpointing.plan(model, batch=(B, T), budget_bytes=q.bytes)  # one q-sized output: the top layer's q_proj
    assert [lp.kept for lp in p.layers] == [[], [q]] and p.bytes == q.bytes and p.flops == q.flops
    assert "layer 1 keep self_attn.q_proj" in p.describe() and p.as_dict()["kept_bytes"] == q.bytes
    text = p.describe()  # a tiny plan in units that show it (KiB / MFLOP), not "0.00 GiB, 0.000 TFLOP"
    assert "0.00 GiB" not in text and " 0.000 " not in text and f"{q.bytes / 2**10:.2f} KiB" in text, text
    assert checkpointing.plan(model, "full").bytes == 0
    auto = checkpointing.plan(model, batch=(B, T))  # no budget: the layers' gradient room (auto_budget)
    assert auto.budget_bytes == checkpointing.auto_budget(model, (B, T)) > 0 and 0 < auto.bytes <= auto.budget_bytes
    with pytest.raises(ValueError, match="policy"):
        checkpointing.plan(model, "everything")
    with pytest.raises(ValueError, match="reentrant"):
        checkpointing.plan(model, batch=(B, T), reentrant=True)
    with pytest.raises(ValueError, match="batch"):
        checkpointing.plan(model)
    with pytest.raises(ValueError, match="budget_bytes"):
        checkpointing.plan(model, batch=(B, T), budget_bytes=-1)
    with pytest.raises(ValueError, match="budget_bytes"):
        checkpointing.plan(model, "full", budget_bytes=0)
    with pytest.raises(ValueError, match="model"):
        checkpointing.plan(torch.nn.Linear(2, 2), batch=(B, T))


def test_optimizer_step_room_in_the_automatic_budget():
    """The foreach AdamW step's temporary (one buffer the size of the trainable parameters) is room for kept
    activations; the fused step and the single-tensor path (the largest parameter) leave less; bad names and classes
    are refused by name."""
    model = sdpa_llama()
    params = [p for p in model.parameters() if p.requires_grad]
    total, largest = (f([p.numel() * p.element_size() for p in params]) for f in (sum, max))
    foreach = total if DEVICE != "cpu" else largest  # PyTorch's default: foreach on an accelerator
    assert checkpointing.step_workspace_bytes(model, "adamw_torch") == foreach
    assert checkpointing.step_workspace_bytes(model, "adamw_torch_fused") == 0
    assert checkpointing.step_workspace_bytes(model, None) == 0
    assert checkpointing.step_workspace_bytes(model, torch.optim.AdamW(params, foreach=True)) == total
    assert checkpointing.step_workspace_bytes(model, torch.optim.Adam(params, foreach=False)) == largest
    base = checkpointing.auto_budget(model, (B, T))
    assert checkpointing.auto_budget(model, (B, T), "adamw_torch") == base + foreach
    p = checkpointing.plan(model, batch=(B, T), optimizer=torch.optim.AdamW(params, foreach=True))
    assert p.budget_bytes == base + total
    # an instance counts its own groups, one at a time (HF's Trainer: decay / no-decay groups) and its own parameters
    half = len(params) // 2
    groups = [{"params": params[:half]}, {"params": params[half:], "weight_decay": 0.0}]
    sizes = [sum(p.numel() * p.element_size() for p in g["params"]) for g in groups]
    assert checkpointing.step_workspace_bytes(model, torch.optim.AdamW(groups, foreach=True)) == max(sizes) < total
    first = params[0].numel() * params[0].element_size()
    assert checkpointing.step_workspace_bytes(model, torch.optim.AdamW(params[:1], foreach=True)) == first
    largest_first_half = max(p.numel() * p.element_size() for p in params[:half])
    mixed = torch.optim.AdamW([{"params": params[:half], "foreach": False}, {"params": params[half:], "foreach": True}])
    assert checkpointing.step_workspace_bytes(model, mixed) == max(largest_first_half, sizes[1])
    with pytest.raises(ValueError, match="optimizer"):
        checkpointing.step_workspace_bytes(model, "sgd")
    with pytest.raises(TypeError, match="optimizer"):
        checkpointing.step_workspace_bytes(model, torch.optim.SGD(params, lr=0.1))
    with pytest.raises(ValueError, match="optimizer"):
        checkpointing.plan(model, batch=(B, T), budget_bytes=0, optimizer="adamw_torch")
    with pytest.raises(ValueError, match="optimizer"):
        checkpointing.plan(model, "full", optimizer="adamw_torch")


def test_no_attention_output_counted_in_a_hybrid_models_linear_attention_layers():
    """Qwen3-Next alternates Gated DeltaNet layers (no softmax attention kernel) with attention layers: only the
    latter offer the attention's output, so the plan spends no budget on, and claims no recompute avoided by, an
    attention output the policy could never save."""
    model_type, overrides, *_ = MORE_FAMILIES["qwen3_next"]
    model = build(model_type, fused_heads(model_type, overrides))
    model.config._attn_implementation = "sdpa"
    kinds = model.config.layer_types
    for (_, layer), kind in zip(checkpointing.decoder_layers(model), kinds, strict=True):
        names = [k.name for k in checkpointing.candidates(model, layer, (B, T))]
        assert ("attention" in names) == (kind == "full_attention"), (kind, names)


def test_bad_arguments_refused_when_nothing_in_the_layers_is_trainable():
    """Layers frozen (the budget is then 0: plain checkpointing): an optimizer typo or class and a bad batch still
    raise, naming the argument, instead of being ignored because the budget came out 0 early."""
    model = sdpa_llama()
    for _, layer in checkpointing.decoder_layers(model):
        layer.requires_grad_(False)
    assert checkpointing.auto_budget(model, (B, T), "adamw_torch") == 0
    with pytest.raises(ValueError, match="optimizer"):
        checkpointing.plan(model, batch=(B, T), optimizer="adamw_troch")
    with pytest.raises(TypeError, match="optimizer"):
        checkpointing.enable(model, batch=(B, T), optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    model.requires_grad_(False)
    with pytest.raises(ValueError, match="optimizer"):
        checkpointing.step_workspace_bytes(model, "adam")
    with pytest.raises(ValueError, match="batch"):
        checkpointing.auto_budget(model, B * T)


def test_selective_checkpointing_of_a_patched_peft_model():
    """PEFT LoRA on every projection, patched (Tigon's fused LoRA adds the low-rank product into the base matmul's
    output in place): the plan keeps no LoRA projection, only the attention, and one step's loss and adapter gradients
    equal the unpatched PEFT model's without checkpointing."""
    peft = pytest.importorskip("peft")
    batches = [b.to(DEVICE) for b in data.fixed_batches(data.byte_tokens(data.corpus_text()), 1, B, T, seed=0)]
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]

    def lora_model():
        torch.manual_seed(1)  # random B (init_lora_weights=False): with B = 0 every gradient of A would be zero
        config = peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=targets, init_lora_weights=False)
        return peft.get_peft_model(sdpa_llama(), config)

    ref_losses, ref_grads = train(lora_model(), batches)
    model = lora_model()
    assert tigon.patch(model).counts.get("lora")
    plan = checkpointing.enable(model, "selective", batch=(B, T), budget_bytes=2**30)
    assert all([k.name for k in lp.kept] == ["attention"] for lp in plan.layers), plan.describe()
    losses, grads = train(model, batches)
    assert abs(losses[0] - ref_losses[0]) <= RTOL * abs(ref_losses[0])
    assert set(grads[0]) == set(ref_grads[0]) and len(grads[0]) == 2 * 7 * model.config.num_hidden_layers
    for name, g in grads[0].items():
        assert rel_l2(g, ref_grads[0][name]) <= RTOL, name


TEXT_MATRIX = {**CASES, **MORE_FAMILIES, **{k: v for k, v in GENERIC.items() if v[5] is None}}
# sdpa refuses their config (softcap; per-layer head_dim): no attention kernel to keep
EAGER_ONLY = {"gemma2", "gemma4"}
CPU_MATRIX = {"mixtral", "qwen3_next", "falcon_h1", "bamba", "gemma3", "gemma2", "deepseek_v3", "gemma3n"}
"""The cases the CPU run checks the recompute counts of, one per layout (dense, MoE, linear-attention hybrid with a
shared expert, parallel Mamba + attention, Mamba layers, post-norms, eager attention, fused q / k / v and gate / up,
parallel residual, MLA, a projection run twice per forward); all of them on CUDA or with TIGON_FAMILY_ALL=1."""


def matrix_model(case: str):
    """The matrix's tiny ``case`` with PyTorch's fused attention where the family's config allows it (skipped on
    CPU outside :data:`CPU_MATRIX` unless TIGON_FAMILY_ALL=1)."""
    if DEVICE == "cpu" and case not in CPU_MATRIX and os.environ.get("TIGON_FAMILY_ALL") != "1":
        pytest.skip("checked on CUDA or with TIGON_FAMILY_ALL=1 (CPU_MATRIX: one case per layout)")
    model_type, overrides, *_ = TEXT_MATRIX[case]
    require_family(model_type)
    model = build(model_type, fused_heads(model_type, overrides))
    model.config._attn_implementation = "eager" if case in EAGER_ONLY else "sdpa"
    return model


def backward_counts(model, ids) -> tuple[CountOps, float, dict]:
    """One forward and backward of ``model`` on ``ids``: the backward's op counts, the loss and every gradient."""
    model.zero_grad(set_to_none=True)
    out = model(input_ids=ids, labels=ids)
    with CountOps() as c:
        out.loss.backward()
    return c, out.loss.item(), {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("case", sorted(TEXT_MATRIX))
def test_every_offered_output_saves_its_recompute_on_the_matrix(case):
    """On every family of the matrix: a plan that keeps everything :func:`candidates` offers removes from the
    backward exactly one matmul per kept projection and one attention kernel per kept attention, against plain
    non-reentrant checkpointing of the same model (so no offered output is useless: each one's op did run again), and
    the loss and every gradient stay those of plain checkpointing (fp32, 1e-5)."""
    model = matrix_model(case)
    ids = data.fixed_batches(data.byte_tokens(data.corpus_text()), 1, 1, T, seed=0)[0].to(DEVICE)
    checkpointing.hf_enable(model, False)
    plain, ref_loss, ref_grads = backward_counts(model, ids)
    p = checkpointing.enable(model, "selective", batch=(1, T), budget_bytes=2**40)
    assert all(lp.kept == lp.offered for lp in p.layers), p.describe()
    kept = [k for lp in p.layers for k in lp.kept]
    assert kept, f"{case}: nothing offered\n{p.describe()}"
    check_kept(p, kept, plain, ref_loss, ref_grads, *backward_counts(model, ids))


def check_kept(p, kept, plain, ref_loss, ref_grads, sel, loss, grads) -> None:
    """The backward under plan ``p`` (counts ``sel``) recomputes exactly the ``kept`` outputs fewer than plain
    checkpointing (``plain``), with the same loss and gradients."""
    n_attention = sum(k.calls for k in kept if k.name == "attention")  # a projection run twice is kept twice
    n_matmuls = sum(k.calls for k in kept if k.name != "attention")
    assert (plain.matmuls - sel.matmuls, plain.attention - sel.attention) == (n_matmuls, n_attention), p.describe()
    assert abs(loss - ref_loss) <= RTOL * abs(ref_loss)
    assert set(grads) == set(ref_grads)
    for name, g in grads.items():
        assert rel_l2(g, ref_grads[name]) <= RTOL, name


def offered(model) -> list[list[str]]:
    return [[k.name for k in checkpointing.candidates(model, layer, (B, T))]
            for _, layer in checkpointing.decoder_layers(model)]


@pytest.mark.parametrize("case", ["mixtral", "qwen3_moe", "olmoe", "qwen3_next", "gpt_oss", "granitemoe"])
def test_moe_layers_offer_and_keep_the_attention_output_projection(case):
    """An MoE block's experts and router hold bare parameters (no ``nn.Linear``), so the layer's last ``nn.Linear``
    is the attention's o_proj, whose output the recomputation needs (the MoE block runs after it): it is offered in
    every attention layer and kept once the budget fits the top layer's outputs (registration order dropped it:
    never kept)."""
    model = matrix_model(case)
    names = offered(model)
    attention_layers = [i for i, n in enumerate(names) if "attention" in n]
    assert attention_layers and all("self_attn.o_proj" in names[i] for i in attention_layers), names
    top = checkpointing.candidates(model, checkpointing.decoder_layers(model)[-1][1], (B, T))
    p = checkpointing.plan(model, batch=(B, T), budget_bytes=sum(k.bytes for k in top))
    assert "self_attn.o_proj" in [k.name for k in p.layers[-1].kept], p.describe()


@pytest.mark.parametrize("case", ["falcon_h1", "bamba"])
def test_hybrid_layers_offer_no_output_the_recomputation_stops_before(case):
    """Falcon-H1 and Bamba register the MLP before the mixers it runs after: their last projection run is the MLP's
    down_proj (scaled by a number and added to the residual: nothing saves its output, the recomputation stops before
    its matmul), never offered; the mixers' output projections (o_proj, mamba.out_proj) are."""
    names = offered(matrix_model(case))
    assert all("feed_forward.down_proj" not in n for n in names), names
    assert all("self_attn.o_proj" in n or "mamba.out_proj" in n for n in names), names


@pytest.mark.parametrize("case", ["gemma3", "olmo2", "glm4"])
def test_a_down_projection_followed_by_a_norm_is_offered(case):
    """A post-feed-forward norm saves the down projection's output: the recomputation runs that matmul again, so
    keeping it saves recompute (the rule is what runs again, not the layer's last projection)."""
    names = offered(matrix_model(case))
    assert all("mlp.down_proj" in n for n in names), names


def test_plan_table_states_units_and_why_layers_keep_less():
    """The printed plan gives bytes in a binary unit, ms at a stated rate, and for a layer that keeps less than it
    was offered why: the budget was spent (what was left, with its size) or nothing in it is worth keeping."""
    model = sdpa_llama()
    every = offered(model)
    first = checkpointing.candidates(model, checkpointing.decoder_layers(model)[-1][1], (B, T))
    p = checkpointing.plan(model, batch=(B, T), budget_bytes=first[0].bytes)
    text = p.describe()
    assert "layer 1 keep self_attn.q_proj" in text and " ms" in text and "TFLOP/s" in text, text
    assert "budget exhausted" in text and "KiB" in text, text
    line0 = next(line for line in text.splitlines() if line.startswith("  layer 0"))
    assert "input only (budget exhausted" in line0 and all(n in line0 for n in every[0]), text
    empty = checkpointing.CheckpointPlan("selective", False, (B, T), 2**20, [checkpointing.LayerPlan(0, "layers.0")])
    assert "nothing worth keeping" in empty.describe(), empty.describe()


@pytest.mark.parametrize("policy,reentrant", [("full", True), ("full", False), ("selective", False)])
def test_enable_in_both_of_hugging_faces_modes_trains_like_no_checkpointing(policy, reentrant):
    """:func:`enable` in Hugging Face's reentrant and non-reentrant modes (full) and selective: the loss and every
    gradient equal the un-checkpointed model's (fp32, 1e-5), also after HF's own reentrant checkpointing was turned on
    first (selective replaces it); with frozen input embeddings (LoRA-like) the reentrant mode still gives the layers
    their gradients; selective with reentrant=True is refused, naming the argument."""
    ids = data.fixed_batches(data.byte_tokens(data.corpus_text()), 1, B, T, seed=0)[0].to(DEVICE)
    for frozen in (False, True):
        ref = sdpa_llama()
        model = sdpa_llama()
        for m in (ref, model):
            m.get_input_embeddings().requires_grad_(not frozen)
        _, ref_loss, ref_grads = backward_counts(ref, ids)
        if policy == "selective":  # HF's reentrant mode first, as a Trainer with use_reentrant=True would set it
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
        p = checkpointing.enable(model, policy, reentrant=reentrant, **(
            {"batch": (B, T), "budget_bytes": 2**20} if policy == "selective" else {}))
        assert p.reentrant is reentrant and model.is_gradient_checkpointing
        _, loss, grads = backward_counts(model, ids)
        assert abs(loss - ref_loss) <= RTOL * abs(ref_loss), (frozen, loss, ref_loss)
        assert set(grads) == set(ref_grads), (frozen, set(ref_grads) - set(grads))
        for name, g in grads.items():
            assert rel_l2(g, ref_grads[name]) <= RTOL, (frozen, name)
    with pytest.raises(ValueError, match="reentrant"):
        checkpointing.enable(sdpa_llama(), "selective", batch=(B, T), reentrant=True)


def test_a_model_whose_forward_fails_is_refused_naming_it():
    """The plan runs the model once to find what its layers recompute: a model whose forward fails there (Gemma 2's
    softcap under sdpa) gets a ValueError naming ``model`` with the cause, and keeps its checkpointing settings and
    training flag. transformers 5.25's sdpa refuses the softcap; 5.17's (the GPU image's) runs without it, so the
    attention here raises transformers' newer error itself."""
    model_type, overrides, *_ = CASES["gemma2"]
    model = build(model_type, overrides).eval()
    model.config._attn_implementation = "sdpa"

    def refuses(*args, **kwargs):
        raise ValueError("`sdpa` attention does not support `softcap`. Try using `eager`")

    for _, layer in checkpointing.decoder_layers(model):
        layer.self_attn.forward = refuses
    with pytest.raises(ValueError, match="model: .*softcap"):
        checkpointing.plan(model, batch=(B, T), budget_bytes=0)
    assert not model.training and not any(layer.gradient_checkpointing
                                          for _, layer in checkpointing.decoder_layers(model))
