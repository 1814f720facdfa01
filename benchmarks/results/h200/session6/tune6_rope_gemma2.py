"""Session 6, run as .gpu/gemma_rope.py (copied here); rope_heads_old.py is `git show 7d35902:src/tigon/ops/rope.py` with
absolute imports.

RoPE at Gemma-2-9B heads (16 q / 8 kv, D=256): the row-tile kernel's default (1024-element half tiles, 2 warps)
against tile x warps variants, the per-position kernel it replaced (rope_heads_old.py), torch.compile and Liger;
fwd (CUDA graphs) at 4k / 16k / 64k tokens, fwd+bwd for the providers. One run."""
import importlib.util, json, sys
sys.path.insert(0, "benchmarks")
import torch
import tigon.ops.rope as rope_ops
from tigon.presets import PRESETS
from tigon.workflows.bench import measure_ceilings, shapes_from_config
from tune_h200 import patched, timed, report
cfg = PRESETS["gemma2-9b"]["config"]
ceil = measure_ceilings(torch.device("cuda"))
out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "ceilings": ceil}
shapes = [shapes_from_config(cfg, tokens=n)["rope"] for n in (4096, 16384, 65536)]
out["peers"] = timed("rope", shapes, ["compile", "tigon", "liger"], ceil, ("fwd", "fwd_bwd")); report(out, "peers")
spec = importlib.util.spec_from_file_location("old", ".gpu/rope_heads_old.py"); old = importlib.util.module_from_spec(spec); spec.loader.exec_module(old)
with patched(rope_ops, rope_apply=old.rope_apply):
    out["heads_old"] = timed("rope", shapes, ["tigon"], ceil, ("fwd", "fwd_bwd")); report(out, "heads_old")
for tile in (512, 1024, 2048):
    for w in (1, 2, 4):
        with patched(rope_ops, HALF_TILE=tile, TILE_WARPS=w):
            k = f"rows_t{tile}_w{w}"; out[k] = timed("rope", shapes, ["tigon"], ceil, ("fwd",)); report(out, k)
json.dump(out, open(sys.argv[1], "w"), indent=1)
