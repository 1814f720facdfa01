"""Which run drifts in bf16: train the mini model of a family (tests/test_families.py's config and batches) in
float32 (the trajectory the bf16 runs approximate) and in bf16, original and Tigon-patched; report each run's largest
relative loss distance from the float32 original over the steps.

GPU (repository root; tests/ is put on the path by the script):
    PYTHONPATH=src python3 benchmarks/numerics/bf16_drift.py --case gemma --steps 20 \
        --out $OUT/bf16-drift_gemma-mini_h200_<date>.json
    PYTHONPATH=src python3 benchmarks/numerics/bf16_drift.py --case gemma --toggles --out ...
    PYTHONPATH=src python3 benchmarks/numerics/bf16_drift.py --case gemma --controls --out ...

--toggles patches one kind at a time (none, norm, rope, mlp, flce, all), in bf16 only. --controls measures how
sensitive the mini model's bf16 trajectory is to a change of rounding alone, with no Tigon code: the original model
with HF's apply_rotary_pos_emb evaluated in float32 and rounded once (what Tigon's RoPE kernel does, in plain
PyTorch), next to the original and the Tigon-patched RoPE. Results: benchmarks/results/h200/bf16_drift_gemma.json,
session5/final/bf16_controls_{gemma,llama}.json.
"""

import contextlib
import os
import sys

import torch
from _runner import max_rel_distance, run

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests"))

KINDS = ("rms_norm", "rope", "mlp", "fused_linear_cross_entropy")
TOGGLES = {"none": (), "norm": ("rms_norm",), "rope": ("rope",), "mlp": ("mlp",),
           "flce": ("fused_linear_cross_entropy",), "all": KINDS}  # all: tigon.patch's defaults


def add_arguments(ap):
    ap.add_argument("--case", default="gemma", help="a case of tests/test_families.py (default: gemma)")
    ap.add_argument("--steps", type=int, default=20)
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--toggles", action="store_true", help="bf16 only: one kind patched at a time")
    mode.add_argument("--controls", action="store_true",
                      help="bf16 only: original, original with its RoPE in float32 (plain PyTorch), Tigon RoPE only")


@contextlib.contextmanager
def rope_in_fp32(model):
    """HF's apply_rotary_pos_emb of ``model``'s family evaluated in float32 and rounded once, while inside."""
    mod = sys.modules[type(model.model.layers[0].self_attn).__module__]
    original, rotate_half = mod.apply_rotary_pos_emb, mod.rotate_half

    def apply_rotary_pos_emb(q, k, cos, sin, *a, unsqueeze_dim=1, **kw):
        c, s = cos.unsqueeze(unsqueeze_dim).float(), sin.unsqueeze(unsqueeze_dim).float()
        rot = lambda x: (x.float() * c + rotate_half(x.float()) * s).to(x.dtype)  # noqa: E731
        return rot(q), rot(k)

    mod.apply_rotary_pos_emb = apply_rotary_pos_emb
    try:
        yield
    finally:
        mod.apply_rotary_pos_emb = original


def study(args) -> dict:
    import test_families as tf  # the test module: one definition of the mini configs and batches

    import tigon

    model_type, overrides, *_ = tf.CASES[args.case]
    batches = tf.text_batches(args.steps)

    def losses(dtype, patch=None, fp32_rope=False):
        """The run's losses; ``patch``: tigon.patch's keywords (None: not patched)."""
        tf.DTYPE = dtype
        m = tf.build(model_type, overrides)
        if patch is not None:
            tigon.patch(m, **patch)
        with rope_in_fp32(m) if fp32_rope else contextlib.nullcontext():
            return tf.train(m, batches)

    ref = losses(torch.float32)
    out = {"case": args.case, "steps": args.steps}
    if args.toggles:
        drift = {}
        for name, kinds in TOGGLES.items():
            patch = {} if name == "all" else {k: k in kinds for k in KINDS}
            drift[name] = max_rel_distance(losses(torch.bfloat16, patch), ref)
            print(name, drift[name], flush=True)
        return dict(out, max_rel_drift_from_fp32_original=drift)
    if args.controls:
        runs = {}
        for name, patch, fp32_rope in (("original", None, False), ("original_rope_fp32", None, True),
                                       ("tigon_rope_only", {k: k == "rope" for k in KINDS}, False)):
            got = losses(torch.bfloat16, patch, fp32_rope)
            runs[name] = {"losses": got, "max_rel_drift_from_fp32_original": max_rel_distance(got, ref)}
            print(name, runs[name]["max_rel_drift_from_fp32_original"], flush=True)
        return dict(out, original_float32=ref, runs=runs)
    runs = {"original_float32": ref, "tigon_float32": losses(torch.float32, {}),
            "original_bfloat16": losses(torch.bfloat16), "tigon_bfloat16": losses(torch.bfloat16, {})}
    drift = {k: max_rel_distance(v, ref) for k, v in runs.items()}
    for k, v in drift.items():
        print(f"{k:18s} {v:.4g}")
    return dict(out, losses=runs, max_rel_drift_from_fp32_original=drift)


if __name__ == "__main__":
    sys.exit(run(__doc__, study, add_arguments))
