"""Which run drifts in bf16: train the mini model of a family (tests/test_families.py's config and batches) in
float32 (the trajectory both bf16 runs approximate) and in bf16, original and Tigon-patched; print each bf16 run's
largest relative loss distance from the float32 original over the steps. JSON to --out.

    PYTHONPATH=src:tests python3 benchmarks/bf16_drift.py --case gemma --steps 20 --out drift.json
    PYTHONPATH=src:tests python3 benchmarks/bf16_drift.py --case gemma --toggles --out toggles.json
    PYTHONPATH=src:tests python3 benchmarks/bf16_drift.py --case gemma --controls --out controls.json

``--controls`` measures how sensitive the mini model's bf16 trajectory is to a change of rounding alone, with no
Tigon code: the original model with HF's ``apply_rotary_pos_emb`` evaluated in float32 and rounded once (what
Tigon's RoPE kernel does, in plain PyTorch), next to the original and the Tigon-patched RoPE.
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
    ap.add_argument("--controls", action="store_true",
                    help="bf16 only: original, original with its RoPE in float32 (plain PyTorch), Tigon RoPE only")
    args = ap.parse_args()
    if args.toggles:
        return toggles(args)
    if args.controls:
        return controls(args)
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


def _bf16_setup(args):
    """(test module, model_type, overrides, batches, float32 original losses); leaves the test module in bf16."""
    import test_families as tf

    model_type, overrides, *_ = tf.CASES[args.case]
    batches = tf.text_batches(args.steps)
    tf.DTYPE = torch.float32
    ref = tf.train(tf.build(model_type, overrides), batches)
    tf.DTYPE = torch.bfloat16
    return tf, model_type, overrides, batches, ref


def toggles(args):
    import tigon

    tf, model_type, overrides, batches, ref = _bf16_setup(args)
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


def controls(args):
    import contextlib
    import sys

    import tigon

    tf, model_type, overrides, batches, ref = _bf16_setup(args)

    @contextlib.contextmanager
    def rope_in_fp32(model):
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

    out = {}
    for name in ("original", "original_rope_fp32", "tigon_rope_only"):
        m = tf.build(model_type, overrides)
        ctx = rope_in_fp32(m) if name == "original_rope_fp32" else contextlib.nullcontext()
        if name == "tigon_rope_only":
            tigon.patch(m, rms_norm=False, mlp=False, fused_linear_cross_entropy=False)
        with ctx:
            losses = tf.train(m, batches)
        out[name] = {"losses": losses, "max_rel_drift_from_fp32_original":
                     max(abs(a - b) / abs(b) for a, b in zip(losses, ref))}
        print(name, out[name]["max_rel_drift_from_fp32_original"], flush=True)
    with open(args.out, "w") as f:
        json.dump({"case": args.case, "steps": args.steps, "original_float32": ref, "runs": out}, f, indent=1)


if __name__ == "__main__":
    main()
