"""Session 28 diagnostic: tests/test_moe_experts.py::test_compiled_training_step_equals_eager failed on CUDA (H100,
BackendCompilerFailed, a data-dependent error in the backward of transformers' grouped_mm fallback). Does the
unpatched model fail the same way under torch.compile(aot_eager, fullgraph=True)? Prints one line per case.
    PYTHONPATH=src:tests python3 benchmarks/results/h200/session28/diag_moe_compile.py
"""
import os
import sys
import traceback

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "../../../../tests"))
import tigon  # noqa: E402
from test_moe_experts import ONLY_MLP, build, step  # noqa: E402

for name in ("olmoe", "gpt_oss"):
    for patched in (False, True):
        for mode in ("kernels", "auto"):
            if not patched and mode == "auto":
                continue
            os.environ["TIGON_COMPILE_OPS"] = mode
            model = build(name)
            if patched:
                tigon.patch(model, **ONLY_MLP)
            step(model)
            torch._dynamo.reset()
            try:
                step(model, call=torch.compile(model, backend="aot_eager", fullgraph=True))
                print(name, "patched" if patched else "original", mode, "ok", flush=True)
            except Exception as e:  # noqa: BLE001
                tb = traceback.format_exc().splitlines()
                print(name, "patched" if patched else "original", mode, "FAILED", type(e).__name__,
                      str(e).splitlines()[:3], flush=True)
                print("\n".join(line for line in tb if "File" in line)[-3000:], flush=True)
            torch._dynamo.reset()
