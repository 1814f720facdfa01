"""tigon profile's whole-part measurements (tigon.workflows.profile_layer): one decoder layer's forward + backward
and the rest of the model, original, patched and patched with one kind left out, the same code on CPU and CUDA.
On CPU the patched parts run Triton's interpreter, so only the structure is checked: positive times for every
variant, the JSON carries them, the model is left as it was. The arithmetic is tests/test_predict.py's."""

import json

import pytest
import torch

from tigon.integrations.marks import tigon_mark
from tigon.workflows import predict as PR
from tigon.workflows import profile_layer as PL
from tigon.workflows.e2e_models import build_model, hf_config, random_batches
from tigon.workflows.profile import _replacements


class _Layer(torch.nn.Module):
    def __init__(self, attention_type=None, mlp=torch.nn.Identity):
        super().__init__()
        if attention_type is not None:
            self.attention_type = attention_type
        self.mlp = mlp()


class _Typed(torch.nn.Module):
    def __init__(self, layer_type):
        super().__init__()
        self.layer_type = layer_type


def test_layer_groups_tell_alike_layers_apart():
    # Gemma-2-like: sliding and global attention alternate; a MoE-like model: a dense first layer, sparse after.
    gemma = [_Layer("sliding_attention" if i % 2 == 0 else "full_attention") for i in range(6)]
    groups = PL.layer_groups(gemma)
    assert [(g.index, g.count) for g in groups] == [(0, 3), (1, 3)]
    assert "sliding_attention" in groups[0].key and "full_attention" in groups[1].key
    # transformers' Gemma-2 keeps the type on the attention module
    attn = [_Layer(mlp=lambda t=t: _Typed(t)) for t in ("sliding_attention", "full_attention") * 2]
    assert [(g.index, g.count) for g in PL.layer_groups(attn)] == [(0, 2), (1, 2)]
    moe = [_Layer(mlp=torch.nn.Identity)] + [_Layer(mlp=torch.nn.ReLU) for _ in range(5)]
    assert [(g.index, g.count) for g in PL.layer_groups(moe)] == [(0, 1), (1, 5)]
    # past the cap, the later groups' layers count with the largest group
    many = [_Layer(f"t{i}") for i in range(3)] + [_Layer("t0")] * 2 + [_Layer("t3"), _Layer("t4")]
    capped = PL.layer_groups(many, max_groups=3)
    assert [(g.index, g.count) for g in capped] == [(0, 5), (1, 1), (2, 1)]
    assert sum(g.count for g in capped) == len(many)


def few_timing_samples(mp: pytest.MonkeyPatch) -> None:
    """On CPU, one timed call per part and variant in place of 2 x 5 (x 2 rounds): the checks here are structural
    (positive times, which variants and parts), and each interpreted call of the patched layer costs ~0.1 s."""
    if torch.cuda.is_available():
        return
    for name in ("LAYER_CALLS", "LAYER_GROUPS", "LAYER_ROUNDS"):
        mp.setattr(PL, name, 1)
    mp.setattr(PL.unheld_ms, "__defaults__", (1, 1))  # its calls / groups defaults, bound at definition


def _tiny(layers=2):
    hfc, _ = hf_config("tiny", layers)
    model = build_model(hfc, torch.float32, torch.device("cpu"), 0)
    model.train()
    return hfc, model, random_batches(int(hfc.vocab_size), 1, 1, 8, 0)[0]


def test_without_layers_swaps_them_out_and_back():
    _, model, batch = _tiny()
    layers = model.model.layers
    with PL.without_layers(model):
        assert len(model.model.layers) == 0
        loss = model(input_ids=batch, labels=batch, use_cache=False).loss
        assert torch.isfinite(loss)
    assert model.model.layers is layers
    with pytest.raises(RuntimeError, match="no `layers`"):
        with PL.without_layers(torch.nn.Linear(2, 2)):
            pass
    inputs = PL.capture_layer_inputs(model, batch, [0, 1])
    args, kwargs = inputs[1]
    hidden = args[0] if args else kwargs["hidden_states"]
    assert hidden.shape == (1, 8, model.config.hidden_size) and not hidden.requires_grad



def test_rest_call_of_a_moe_model_with_the_router_loss_on():
    # the rest of a model without its layers has no routers: HF's router loss over none raised IndexError (OLMoE,
    # GPT-OSS, Qwen3-VL-MoE ... with output_router_logits=True: "measuring whole decoder layers failed")
    transformers = pytest.importorskip("transformers")
    hfc = transformers.OlmoeConfig(vocab_size=61, hidden_size=32, intermediate_size=32, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, num_experts=4, num_experts_per_tok=2,
                                   output_router_logits=True, max_position_embeddings=64)
    model = build_model(hfc, torch.float32, torch.device("cpu"), 0).train()
    fn, leaves = PL.rest_call(model, random_batches(61, 1, 1, 8, 0)[0])
    fn()
    assert model.model.embed_tokens.weight.grad is not None and len(model.model.layers) == 2

def test_measure_variants_on_a_tiny_model(monkeypatch):
    few_timing_samples(monkeypatch)
    hfc, model, batch = _tiny()
    kinds, _, _, _, paths = _replacements(hfc)
    keywords = {k["kind"]: k["keyword"] for k in kinds}
    costs = PL.measure_variants(model, batch, torch.device("cpu"), targets=paths["targets"], keywords=keywords)
    assert [(g.index, g.count) for g in costs.groups] == [(0, 2)] and costs.notes == []
    names = ["original", "patched", *(f"without {kw}" for kw in dict.fromkeys(keywords.values()))]
    assert list(costs.variants) == names
    for side in ("original", "patched"):
        v = costs.variants[side]
        assert v.layers[0]["host_ms"] > 0 and v.rest["host_ms"] > 0, side
        assert v.layers[0]["unheld_ms"] > 0 and v.rest["unheld_ms"] > 0, side
        assert v.layers[0]["device_ms"] == 0 == v.rest["device_ms"]  # CPU: everything is host time
    # a variant re-measures only the parts where its kind has targets: the LM head + loss is outside the layers,
    # the MLP inside, the norms both (the final norm)
    assert costs.variants["without fused_linear_cross_entropy"].layers == {}
    assert costs.variants["without fused_linear_cross_entropy"].rest["host_ms"] > 0
    assert costs.variants["without mlp"].rest is None and costs.variants["without mlp"].layers[0]["host_ms"] > 0
    assert costs.variants["without rms_norm"].rest is not None
    o, p = costs.variants["original"], costs.variants["patched"]
    assert costs.delta_ms("patched") == pytest.approx(2 * (p.layers[0]["host_ms"] - o.layers[0]["host_ms"])
                                                      + p.rest["host_ms"] - o.rest["host_ms"])
    w = costs.variants["without mlp"]
    assert costs.delta_ms("without mlp") == pytest.approx(2 * (w.layers[0]["host_ms"] - o.layers[0]["host_ms"])
                                                          + p.rest["host_ms"] - o.rest["host_ms"])
    d = json.loads(json.dumps(costs.as_dict()))
    assert d["variants"]["original"]["layers"]["0"]["host_ms"] > 0 and d["variants"]["patched"]["rest"]["host_ms"] > 0
    assert d["host_delta_ms"]["patched"] == pytest.approx(costs.delta_ms("patched"))
    assert d["unheld_delta_ms"]["patched"] == pytest.approx(costs.delta_ms("patched", "unheld_ms"))
    assert d["groups"] == [{"key": costs.groups[0].key, "index": 0, "count": 2}]
    hm = PL.host_model(costs, keywords)
    assert isinstance(hm, PR.HostModel) and hm.delta_ms == pytest.approx(costs.delta_ms("patched"))
    assert set(hm.without_ms) == set(keywords)
    unheld = PL.host_model(costs, keywords, "unheld_ms")
    assert unheld.delta_ms == pytest.approx(costs.delta_ms("patched", "unheld_ms"))
    step = PR.StepCost(10.0, 10.0, 0.0)
    changes = [PR.OpChange(k, k, kw, 1, PR.OpCost(0.1, 0.0), PR.OpCost(0.2, 0.0)) for k, kw in keywords.items()]
    host, extra = PL.prediction(step, changes, costs)  # the default basis: per op, the whole parts beside it
    assert host is None and extra["host_basis"] == "per_op" and extra["step_ms_per_op"] == pytest.approx(
        PR.predict(step, changes).step_ms)
    assert extra["layers"]["step_ms"] == pytest.approx(PR.predict(step, changes, host=hm).step_ms)
    monkeypatch.setattr(PL, "HOST_BASIS", "layers")
    host, extra = PL.prediction(step, changes, costs)
    assert host == hm and extra["host_basis"] == "layers" and extra["alternative"]["host_side"] == "unheld_ms"
    assert extra["alternative"]["step_ms"] == pytest.approx(PR.predict(step, changes, host=unheld).step_ms)
    assert extra["step_ms_per_op"] == pytest.approx(10.0 + 0.1 * len(keywords))
    assert PL.prediction(step, changes, None)[0] is None
    # the model is left unpatched and unhooked, its gradients cleared
    assert all(tigon_mark(m.__dict__.get("forward")) is None for m in model.modules())
    assert all(not m._forward_pre_hooks and not m._forward_hooks for m in model.modules())
    assert all(p.grad is None for p in model.parameters())


def test_a_failing_patch_is_a_note_and_the_model_stays_unpatched(monkeypatch):
    few_timing_samples(monkeypatch)
    hfc, model, batch = _tiny(1)
    calls = []

    def patch(m, **kw):
        calls.append(kw)
        if kw:
            raise ValueError("no such kind")

    costs = PL.measure_variants(model, batch, torch.device("cpu"), targets={"model.layers.0.mlp": "mlp"},
                                keywords={"mlp": "mlp"}, patch=patch, unpatch=lambda m: calls.append("unpatch"))
    assert calls == [{}, "unpatch", {"mlp": False}, "unpatch"]
    assert list(costs.variants) == ["original", "patched"] and "without mlp failed: ValueError" in costs.notes[0]
    assert PL.host_model(costs, {"mlp": "mlp"}).without_ms == {}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="device time needs CUDA")
def test_measure_variants_on_cuda():
    hfc, _ = hf_config("tiny", 2)
    device = torch.device("cuda")
    model = build_model(hfc, torch.bfloat16, device, 0)
    model.train()
    batch = random_batches(int(hfc.vocab_size), 1, 2, 64, 0)[0]
    kinds, _, _, _, paths = _replacements(hfc)
    costs = PL.measure_variants(model, batch, device, targets=paths["targets"],
                                keywords={k["kind"]: k["keyword"] for k in kinds})
    for side in ("original", "patched"):
        v = costs.variants[side]
        for c in (v.layers[0], v.rest):
            assert c["host_ms"] > 0 and c["device_ms"] > 0 and not c["waited"], (side, c)
