"""One rank of tests/test_trainer_distributed.py: the HF Trainer on two ranks, a tiny Llama unpatched and patched.

Launched the way users launch the Trainer: ``torchrun --nproc-per-node 2 trainer_worker.py ddp`` (DDP),
``accelerate launch --config_file fsdp2.yaml trainer_worker.py fsdp2`` (accelerate's FSDP plugin, the config file
written by the test) or ``torchrun ... trainer_worker.py zero3 ds_config.json`` (``TrainingArguments(deepspeed=...)``).
In the one launch it trains the unpatched model, then the same model (same weights, data, seed) patched with
``tigon.patch`` before the Trainer, and compares the losses and gradient norms the Trainer logs at every step
(averaged over the ranks by the Trainer) and the final whole parameters. It prints
``RESULT <scenario> OK <measured differences>`` or ``FAIL <reason>`` per scenario, then ``DONE`` (also into
$TIGON_TRAINER_RESULTS/rank<R>.txt where set).
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
import time
import traceback

if "TRITON_INTERPRET" not in os.environ:
    import torch

    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"  # before tigon defines its kernels (as conftest)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import transformers  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))
sys.path.insert(0, os.path.dirname(__file__))
import tigon  # noqa: E402
from tigon import data  # noqa: E402
from tigon.numerics import rel_l2  # noqa: E402

STEPS, B, T = 3, 2, 16
TINY = dict(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=8, max_position_embeddings=64)
RTOL = 1e-5  # fp32: the house bound on the losses, gradient norms and parameters
# SGD (``optim="sgd"``), not the default AdamW: AdamW's first steps move each element by about lr * sign(gradient), so
# an element whose gradient is near zero turns a 1e-7 difference of the gradient into one of O(lr) in the parameter
# (measured 1.4e-5 rel. L2 after 3 AdamW steps at lr 1e-2 under ZeRO-3, with losses equal within 1e-7); under SGD a
# parameter's difference is lr times its gradient's.


def allow_fsdp_on_cpu() -> None:
    """Let accelerate's FSDP plugin run on CPU ranks (a test-only shim; no effect with CUDA).

    accelerate (1.x) makes a run FSDP only when its distributed type is a GPU-like one (``AcceleratorState``:
    MULTI_GPU, MULTI_XPU, ...); on CPU ranks (MULTI_CPU, gloo) it ignores the FSDP config and wraps with DDP. This
    turns the state that accelerate built from the launcher's FSDP settings into an FSDP one, so the rest (the
    plugin from ``accelerate launch --config_file``, ``fsdp2_prepare_model``'s ``fully_shard`` calls, the
    optimizer, gradient clipping and the gathers) is accelerate's own code on gloo."""
    from accelerate.state import AcceleratorState
    from accelerate.utils import DistributedType

    init = AcceleratorState.__init__

    def fsdp_on_cpu(self, *args, **kwargs):
        init(self, *args, **kwargs)
        plugin = kwargs.get("fsdp_plugin")
        if self.distributed_type == DistributedType.MULTI_CPU and plugin is not None:
            self.distributed_type, self.fsdp_plugin = DistributedType.FSDP, plugin

    AcceleratorState.__init__ = fsdp_on_cpu


def split_data_under_deepspeed_on_cpu() -> None:
    """Let accelerate see the ranks of a DeepSpeed run on the CPU (a test-only shim; no effect with CUDA).

    With ``TrainingArguments(deepspeed=...)`` and no GPU, accelerate (1.x) finds no distributed backend (it takes the
    backend from the GPU-like device, and ``use_cpu`` would switch DeepSpeed off), so it counts one process: every rank
    would train on the same batches while DeepSpeed itself (its own process group of all ranks) partitions and
    averages. This gives accelerate gloo, as for CPU ranks without DeepSpeed; DeepSpeed then sets up its process
    group on it and the Trainer's data loader gives each rank its own batches, as on GPUs."""
    from accelerate.state import PartialState
    from accelerate.utils import DistributedType

    prepare = PartialState._prepare_backend

    def gloo_for_deepspeed(self, cpu=False, sagemaker_dp=False, backend=None):
        got = prepare(self, cpu, sagemaker_dp, backend)
        if got == (None, DistributedType.NO) and int(os.environ.get("LOCAL_RANK", -1)) != -1 and \
                os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true":
            return "gloo", DistributedType.MULTI_CPU
        return got

    PartialState._prepare_backend = gloo_for_deepspeed


def build(patched: bool) -> torch.nn.Module:
    """The tiny fp32 Llama (untied embeddings), the same weights on every rank and in both runs."""
    cfg = transformers.LlamaConfig(**TINY, tie_word_embeddings=False)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).float()
    if patched:
        report = tigon.patch(model)
        assert report.counts.get("lm_head_loss") == 1, f"LM head not patched: {report}"
    return model


def dataset() -> list[dict]:
    """STEPS * B * world rows of T byte ids of the text shipped with Python (tigon.data): each rank its own rows."""
    tokens = data.byte_tokens(data.corpus_text()[:20000])
    rows = data.fixed_batches(tokens, STEPS, B * dist.get_world_size(), T, seed=3)
    return [{"input_ids": ids, "labels": ids.clone()} for batch in rows for ids in batch]


def whole_parameters(trainer) -> dict[str, torch.Tensor]:
    """The trained model's whole parameters, gathered by the engine (FSDP2: DTensor.full_tensor; ZeRO-3:
    deepspeed.zero.GatheredParameters), on the CPU."""
    model = trainer.model_wrapped if trainer.is_deepspeed_enabled else trainer.model
    named = dict(model.named_parameters())
    if trainer.is_deepspeed_enabled:
        import deepspeed

        with deepspeed.zero.GatheredParameters(list(named.values())):
            return {n.removeprefix("module."): p.detach().cpu().clone() for n, p in named.items()}
    out = {}
    for n, p in named.items():
        full = p.full_tensor() if hasattr(p, "full_tensor") else p
        out[n.removeprefix("module.")] = full.detach().cpu().clone()
    return out


def train(patched: bool, scenario: str, ds_config: str | None) -> dict:
    model = build(patched)
    fused = []
    model.register_forward_hook(lambda m, args, out: fused.append(out.logits is None))
    with tempfile.TemporaryDirectory() as out_dir:
        args = transformers.TrainingArguments(
            output_dir=out_dir, max_steps=STEPS, per_device_train_batch_size=B, learning_rate=0.5,
            optim="sgd",
            logging_steps=1, report_to=[], save_strategy="no", seed=0, dataloader_num_workers=0,
            use_cpu=not torch.cuda.is_available() and ds_config is None, deepspeed=ds_config, disable_tqdm=True)
        trainer = transformers.Trainer(model=model, args=args, train_dataset=dataset())
        trainer.train()
        logs = [h for h in trainer.state.log_history if "loss" in h]
        run = {"losses": [h["loss"] for h in logs], "grad_norms": [h.get("grad_norm") for h in logs],
               "params": whole_parameters(trainer), "fused": fused, "engine": engine(trainer)}
    return run


def engine(trainer) -> str:
    """What wrapped the model: the wrapper's class, and under FSDP2 the names of its units below the root
    (``fully_shard``; ``model.layers.*``: every decoder layer)."""
    wrapped = trainer.model_wrapped
    name = type(wrapped).__name__
    if trainer.is_deepspeed_enabled:  # the stage, and under ZeRO-3 whether the head's weight is partitioned
        stage = wrapped.zero_optimization_stage()
        head = trainer.model.lm_head.weight
        partitioned = hasattr(head, "ds_id") and head.numel() == 0  # an empty placeholder outside the head's call
        return f"{name}(zero{stage}{', head partitioned' if partitioned else ''})"
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:
        return name
    units = {re.sub(r"\.\d+\b", ".*", n) for n, m in wrapped.named_modules() if n and isinstance(m, FSDPModule)}
    return name + (f"[{','.join(sorted(units))}]" if units else "")


def check(scenario: str, ds_config: str | None) -> str:
    ref = train(False, scenario, ds_config)
    got = train(True, scenario, ds_config)
    assert got["fused"] and all(got["fused"]), f"the fused LM-head loss did not run (logits returned): {got['fused']}"
    assert not any(ref["fused"])
    expected = {"ddp": "DistributedDataParallel", "fsdp2": "FSDPLlamaForCausalLM[",
                "zero3": "DeepSpeedEngine(zero3, head partitioned)", "zero2": "DeepSpeedEngine(zero2)"}[scenario]
    assert got["engine"] == ref["engine"] and got["engine"].startswith(expected), (ref["engine"], got["engine"])
    if scenario.startswith("zero"):
        assert got["engine"] == expected, got["engine"]
    if scenario.startswith("fsdp"):  # each decoder layer a unit (the config's transformer-layer policy)
        assert "model.layers.*" in got["engine"], got["engine"]
    assert len(got["losses"]) == len(ref["losses"]) == STEPS, (got["losses"], ref["losses"])
    worst = {"loss": 0.0, "grad_norm": 0.0, "param": 0.0}
    for step, (a, b) in enumerate(zip(got["losses"], ref["losses"])):
        worst["loss"] = max(worst["loss"], abs(a - b) / abs(b))
        assert abs(a - b) <= RTOL * abs(b), f"step {step + 1} loss {a} vs {b}"
    assert None not in got["grad_norms"] + ref["grad_norms"], (got["grad_norms"], ref["grad_norms"])
    for step, (a, b) in enumerate(zip(got["grad_norms"], ref["grad_norms"])):
        worst["grad_norm"] = max(worst["grad_norm"], abs(a - b) / abs(b))
        assert abs(a - b) <= RTOL * abs(b), f"step {step + 1} grad norm {a} vs {b}"
    assert got["params"].keys() == ref["params"].keys(), sorted(got["params"].keys() ^ ref["params"].keys())
    for n, r in ref["params"].items():
        d = rel_l2(got["params"][n], r)
        worst["param"] = max(worst["param"], d)
        assert d <= RTOL, f"param {n} after {STEPS} steps: rel L2 {d:.2e}"
    return (" ".join(f"{k}={v:.1e}" for k, v in worst.items()) + f" engine={got['engine']}"
            + " losses=" + ",".join(f"{x:.6f}" for x in got["losses"]))


def report(line: str) -> None:
    """Print ``line`` and append it to $TIGON_TRAINER_RESULTS/rank<R>.txt where set (a launcher interleaves the
    ranks' output)."""
    print(line, flush=True)
    out_dir = os.environ.get("TIGON_TRAINER_RESULTS")
    if out_dir:
        with open(os.path.join(out_dir, f"rank{dist.get_rank()}.txt"), "a") as f:
            f.write(line + "\n")


def main(specs: list[str]) -> None:
    """``specs``: scenarios, each ``NAME`` or ``NAME=DEEPSPEED_JSON`` (``zero3=ds.json``), run one after the other."""
    for spec in specs:
        scenario, _, ds_config = spec.partition("=")
        if scenario.startswith("fsdp") and not torch.cuda.is_available():
            allow_fsdp_on_cpu()
        if scenario.startswith("zero") and not torch.cuda.is_available():
            split_data_under_deepspeed_on_cpu()
        start = time.perf_counter()
        try:
            detail = check(scenario, ds_config or None)
            report(f"RESULT {scenario} OK {detail} ({time.perf_counter() - start:.1f} s)")
        except Exception as e:  # noqa: BLE001 - reported to the test, which fails with it
            tb = traceback.format_exc(limit=-3).replace("\n", " | ")
            report(f"RESULT {scenario} FAIL {type(e).__name__}: {e} | {tb}")
    import ranks

    if dist.is_initialized():
        report("DONE")
    ranks.finish("")


if __name__ == "__main__":
    main(sys.argv[1:])
