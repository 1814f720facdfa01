"""Session 6, run as .gpu/tune5.py (copied here as run). norm_old.py was `git show 95417f1:src/tigon/ops/norm.py` with
absolute imports; "new" was that file with _norm_bwd's non-prefetch loads moved to the loop top (not kept: slower).

rms_norm fwd+bwd at 16384 x 16384 and 16384 x 8192/12288: the backward's loads at the loop top (new) against the
loop-end loads (old), warps 16 / 32, in one run."""
import importlib.util, json, sys, time
sys.path.insert(0, "benchmarks")
import torch
import tigon.ops.rms_norm as rms_ops
import tigon.ops.norm as norm_ops
from tune_h200 import patched, timed, report, CFG
from tigon.workflows.bench import measure_ceilings, shapes_from_config
spec = importlib.util.spec_from_file_location("norm_old", ".gpu/norm_old.py"); old = importlib.util.module_from_spec(spec); spec.loader.exec_module(old)
ceil = measure_ceilings(torch.device("cuda"))
out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "ceilings": ceil,
       "command": "PYTHONPATH=src python3 .gpu/tune5.py OUT.json (script text in the results README)"}
shapes = [dict(shapes_from_config(CFG, tokens=16384)["rms_norm"], hidden=h) for h in (12288, 16384)]
out["peers"] = timed("rms_norm", shapes, ["compile", "liger"], ceil, ("fwd_bwd",)); report(out, "peers")
for rep in range(2):
    for name, mod in (("old", old), ("new", norm_ops)):
        for warps in (16, 32):
            base = mod.bwd_config
            cfg = (lambda M, bn, dev, is_rms, w=warps, b=base: b(M, bn, dev, is_rms)[:2] + (w,) + b(M, bn, dev, is_rms)[3:])
            with patched(mod, bwd_config=cfg), patched(rms_ops, norm_backward=mod.norm_backward):
                key = f"{name}_w{warps}_r{rep}"
                out[key] = timed("rms_norm", shapes, ["tigon"], ceil, ("fwd_bwd",)); report(out, key)
json.dump(out, open(sys.argv[1], "w"), indent=1)
