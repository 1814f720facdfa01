"""group_norm's two-launch path (groups > FUSED_GROUP elements): per-kernel device time, against torch eager."""
import torch, triton
from torch.profiler import profile, ProfilerActivity
from tigon import functional as F
torch.manual_seed(0)
for (B, C, G, H, W) in [(8, 320, 32, 64, 64), (128, 128, 32, 64, 64), (16, 512, 32, 32, 32)]:
    x = torch.randn(B, C, H, W, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(C, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    b = torch.randn(C, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn_like(x)
    def tg(): F.group_norm(x, w, b, G, 1e-5).backward(dy)
    def te(): torch.nn.functional.group_norm(x, G, w, b, 1e-5).backward(dy)
    for f in (tg, te):
        f(); torch.cuda.synchronize()
    ms_t = triton.testing.do_bench(tg, grad_to_none=[x, w, b])
    ms_e = triton.testing.do_bench(te, grad_to_none=[x, w, b])
    print(f"B{B} C{C} G{G} {H}x{W} group={C//G*H*W}: tigon {ms_t:.3f} ms, eager {ms_e:.3f} ms")
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(3): tg()
        torch.cuda.synchronize()
    print(p.key_averages().table(sort_by="cuda_time_total", row_limit=8, max_name_column_width=60))
