"""Join two sweep_h200.py JSONs of one op and axis (each run measured its own ceilings; the first's are kept, the
second's copy bandwidth is recorded in ``merged_from``). Usage: python3 merge_sweeps.py A.json B.json OUT.json"""
import json
import sys

a, b = (json.load(open(p)) for p in sys.argv[1:3])
out = dict(a)
out["sweeps"] = {}
for key, sweep in a["sweeps"].items():
    out["sweeps"][key] = {"skipped": sweep["skipped"], "rows": sweep["rows"] + b["sweeps"][key]["rows"]}
out["merged_from"] = [f"{sys.argv[1]} (copy {a['ceilings']['copy_gbps']:.1f} GB/s)",
                      f"{sys.argv[2]} (copy {b['ceilings']['copy_gbps']:.1f} GB/s)"]
json.dump(out, open(sys.argv[3], "w"), indent=1)
