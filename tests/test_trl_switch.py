"""tigon.integrations.trl.patch_trainer: TRL's trainers with and without the switch give the same losses and weights.

Tiny fp32 Llama models built from a config (no downloads), a byte-level tokenizer built in memory, English text from
``pydoc_data.topics`` (tigon.data). Each trainer test trains the same model ten steps with and without the switch and
compares every logged loss (1e-5 relative) and every parameter at the end. Skipped as a whole without TRL 1.x.
"""

from __future__ import annotations

import copy
import importlib
import warnings

import pytest
import torch

transformers = pytest.importorskip("transformers")
trl = pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")
trl_utils = importlib.import_module("trl.trainer.utils")
if not hasattr(trl_utils, "add_fused_lm_head"):
    pytest.skip("TRL without add_fused_lm_head (older than 1.x): the switch falls back there", allow_module_level=True)

import tigon  # noqa: E402
from tigon import data, support  # noqa: E402
from tigon.integrations import trl as tigon_trl  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
V = 300
RTOL = 1e-5
STEPS = 10


def config(**overrides):
    cfg = transformers.LlamaConfig(**{
        **dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
               head_dim=16, vocab_size=V, max_position_embeddings=64, pad_token_id=256, bos_token_id=None,
               eos_token_id=257), **overrides})
    cfg._attn_implementation = "eager"
    return cfg


def tiny_model(seed=0, **overrides):
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(config(**overrides)).float().to(DEVICE)


def byte_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    table = {c: i for i, c in enumerate(sorted(alphabet, key=_byte_of))}
    table["<pad>"], table["<eos>"] = 256, 257
    tok = Tokenizer(models.BPE(vocab=table, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>")


def _byte_of(ch: str) -> int:
    """GPT-2's printable character -> the byte it stands for."""
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(map(chr, cs), bs))[ch]


def snippets(n, width, start=0):
    text = data.corpus_text()
    return [text[start + i * width:start + (i + 1) * width] for i in range(n)]


def assert_same_run(got, ref):
    """Losses of every logged step within RTOL; every parameter within RTOL (relative to its norm)."""
    (lg, pg), (lr, pr) = got, ref
    assert len(lg) == len(lr) == STEPS, (lg, lr)
    for a, b in zip(lg, lr):
        assert abs(a - b) <= RTOL * abs(b) + 1e-7, (lg, lr)
    for name, p in pr.items():
        err = (pg[name] - p).norm() / p.norm().clamp(min=1e-12)
        assert err <= RTOL, (name, float(err))


def train(trainer, switch):
    report = None
    if switch:
        report = tigon_trl.patch_trainer(trainer, strict=True)
        assert report.ok, str(report)
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    params = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    return (losses, params), report


def common_args(out, **kw):
    return dict(output_dir=str(out), max_steps=STEPS, logging_steps=1, report_to=[], save_strategy="no",
                use_cpu=DEVICE == "cpu", seed=0, bf16=False, disable_tqdm=True, learning_rate=1e-3, **kw)


# ---- the head itself ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("temperature, scale", [(1.0, None), (0.7, 4.0)])
def test_fused_head_outputs_match_trls(temperature, scale):
    """Every field of TRL's FusedCausalLMOutput, and the gradients of a loss on them, equal TRL's own head."""
    outputs = ("log_probs", "entropy", "mean_logits", "is_top1", "log_sum_sq_probs")
    ref = tiny_model(**({} if scale is None else {"logits_scaling": 1 / scale}))
    ref.lm_head.bias = None
    got = copy.deepcopy(ref)
    for m in (ref, got):
        trl_utils.add_fused_lm_head(m, temperature=temperature, outputs=outputs)

    class Trainer(trl.SFTTrainer):  # the switch reads only the models off the trainer
        def __init__(self, model):
            self.model = model

    report = tigon_trl.patch_trainer(Trainer(got), strict=True)
    assert report.ok and "fused_linear_logprobs" in str(report)
    ids = torch.randint(0, 256, (2, 12), device=DEVICE)
    labels = ids.clone()
    labels[0, :5] = -100
    labels[1, 9:] = -100
    res = []
    support.backend_usage(reset=True)
    for m in (ref, got):
        o = m(input_ids=ids, labels=labels, fused_lm_head=True, num_items_in_batch=7)
        (o.loss + 0.3 * o.entropy.sum()).backward()
        res.append((o, {n: p.grad.clone() for n, p in m.named_parameters()}))
    (o_ref, g_ref), (o_got, g_got) = res
    used = support.backend_usage()
    assert {"fused_linear_logprobs", "fused_linear_cross_entropy"} <= set(used), used
    assert torch.equal(o_got.label_mask, o_ref.label_mask)
    assert torch.equal(o_got.is_top1, o_ref.is_top1)
    for f in ("loss", "log_probs", "entropy", "mean_logits", "log_sum_sq_probs"):
        torch.testing.assert_close(getattr(o_got, f), getattr(o_ref, f), rtol=RTOL, atol=1e-6, msg=f)
    for n in g_ref:
        torch.testing.assert_close(g_got[n], g_ref[n], rtol=RTOL, atol=1e-6, msg=n)
    # the plain forward (generation, evaluation) is the model's own
    torch.testing.assert_close(got(input_ids=ids).logits, ref(input_ids=ids).logits)
    assert tigon_trl.unpatch_trainer(Trainer.__new__(Trainer)) is False
