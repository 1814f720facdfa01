"""Which run drifts in bf16: train the mini model of a family (tests/test_families.py's config and batches) in
float32 (the trajectory both bf16 runs approximate) and in bf16, original and Tigon-patched; print each bf16 run's
largest relative loss distance from the float32 original over the steps. JSON to --out.

    PYTHONPATH=src:tests python3 benchmarks/bf16_drift.py --case gemma --steps 20 --out drift.json
    PYTHONPATH=src:tests python3 benchmarks/bf16_drift.py --case gemma --toggles --out toggles.json
"""

import argparse
import json

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--case", default="gemma")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--out", required=True)
    ap.add_argument("--toggles", action="store_true",
                    help="bf16 only: patch one kind at a time (none, norm, rope, mlp, flce, all) and report each run's "
                         "largest relative loss distance from the float32 original")
    args = ap.parse_args()
    if args.toggles:
        return toggles(args)
    import test_families as tf  # the test module: one definition of the mini configs and batches

    import tigon

    model_type, overrides, *_ = tf.CASES[args.case]
    batches = tf.text_batches(args.steps)
    runs = {}
    for dtype in (torch.float32, torch.bfloat16):
        tf.DTYPE = dtype
        for name in ("original", "tigon"):
            m = tf.build(model_type, overrides)
            if name == "tigon":
                tigon.patch(m)
            runs[f"{name}_{str(dtype)[6:]}"] = tf.train(m, batches)
            del m
    ref = runs["original_float32"]
    drift = {k: max(abs(a - b) / abs(b) for a, b in zip(v, ref)) for k, v in runs.items()}
    out = {"case": args.case, "steps": args.steps, "losses": runs, "max_rel_drift_from_fp32_original": drift}
    print(json.dumps(drift, indent=1))
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)


def toggles(args):
    import test_families as tf

    import tigon

    model_type, overrides, *_ = tf.CASES[args.case]
    batches = tf.text_batches(args.steps)
    tf.DTYPE = torch.float32
    ref = tf.train(tf.build(model_type, overrides), batches)
    tf.DTYPE = torch.bfloat16
    kinds = ("rms_norm", "rope", "mlp", "fused_linear_cross_entropy")
    runs = {"none": {k: False for k in kinds}, "all": {}}
    runs.update({name: {k: k == kind for k in kinds}
                 for name, kind in (("norm", "rms_norm"), ("rope", "rope"), ("mlp", "mlp"),
                                    ("flce", "fused_linear_cross_entropy"))})
    drift = {}
    for name in ("none", "norm", "rope", "mlp", "flce", "all"):
        m = tf.build(model_type, overrides)
        tigon.patch(m, **runs[name])
        losses = tf.train(m, batches)
        drift[name] = max(abs(a - b) / abs(b) for a, b in zip(losses, ref))
        print(name, drift[name], flush=True)
    with open(args.out, "w") as f:
        json.dump({"case": args.case, "steps": args.steps, "max_rel_drift_from_fp32_original": drift}, f, indent=1)


if __name__ == "__main__":
    main()
