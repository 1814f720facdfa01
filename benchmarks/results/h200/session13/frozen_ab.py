import torch, json
from triton.testing import do_bench
import tigon.functional as F
h = torch.randn(8192, 4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
w = torch.randn(128256, 4096, device="cuda", dtype=torch.bfloat16) * .02
t = torch.randint(0, 128256, (8192,), device="cuda")
r = {}
for k, m in (("one_chunk_old", 3 << 30), ("frozen_default", "auto"), ("one_chunk_old_2", 3 << 30),
             ("frozen_default_2", "auto")):
    torch.cuda.synchronize(); torch.cuda.reset_peak_memory_stats(); b = torch.cuda.memory_allocated()
    ms = do_bench(lambda: F.fused_linear_cross_entropy(h, w, t, memory=m).backward(), warmup=5, rep=50)
    r[k] = {"ms": ms, "peak_extra_GiB": (torch.cuda.max_memory_allocated() - b) / 2**30}
print(json.dumps(r))
