"""The CPU cost of the dry run behind ``tigon inspect`` / ``verify --model`` / ``bench --model`` / ``profile``:
:func:`tigon.workflows.verify.model_ops` (``tigon.patch`` on the weightless model) per model, each in a fresh process:
its first call (imports apart), the median of three more, and the process's peak resident memory (``ru_maxrss``)
above what it held before the first call.

    PYTHONPATH=src python3 benchmarks/dry_run_cost.py --out benchmarks/results/cpu/dry-run-cost_<rev>.json
    PYTHONPATH=<worktree of an older commit>/src python3 benchmarks/dry_run_cost.py --out ...   # the same, before

Models: the llama3-8b preset (a family of its own: no probes) and Seed-OSS-36B's sizes (transformers'
``SeedOssConfig`` defaults: hidden 5120, intermediate 27648, 64 layers, vocabulary 155136; no Tigon family, so the
generic matcher probes its modules), as config.json files in a temporary directory.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

CHILD = r"""
import json, resource, statistics, sys, time
import torch, transformers
from tigon.workflows import verify
model = sys.argv[1]
rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t = time.perf_counter(); ops = verify.model_ops(model); first = time.perf_counter() - t
warm = []
for _ in range(3):
    t = time.perf_counter(); verify.model_ops(model); warm.append(time.perf_counter() - t)
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps(dict(ops=ops, first_s=first, warm_s=statistics.median(warm),
                      peak_rss_extra_mib=(rss - rss0) / 1024, torch=torch.__version__,
                      transformers=transformers.__version__)))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="the JSON file written")
    args = ap.parse_args()
    import transformers

    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        seed = os.path.join(tmp, "seed-oss-36b")
        transformers.SeedOssConfig(hidden_size=5120, num_attention_heads=80, num_key_value_heads=8,
                                   head_dim=128).save_pretrained(seed)
        for name, model in (("llama3-8b", "llama3-8b"), ("seed-oss-36b", seed)):
            out = subprocess.run([sys.executable, "-c", CHILD, model], capture_output=True, text=True, check=True)
            rows[name] = json.loads(out.stdout.strip().splitlines()[-1])
            print(name, {k: v for k, v in rows[name].items() if k != "ops"}, flush=True)
    src = os.environ.get("PYTHONPATH", "")
    rev = subprocess.run(["git", "-C", src.split(os.pathsep)[0] or ".", "rev-parse", "--short", "HEAD"],
                         capture_output=True, text=True).stdout.strip()
    with open(args.out, "w") as f:
        json.dump(dict(command=" ".join(sys.argv), commit=rev, pythonpath=src, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
