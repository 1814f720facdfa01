"""Where the host time of one fused linear CE fwd+bwd goes at Qwen2.5-0.5B's head (4096 x 896 -> 151936, bf16)."""
import time, torch
import tigon.functional as F
dev = "cuda"
torch.manual_seed(0)
h = torch.randn(4096, 896, device=dev, dtype=torch.bfloat16, requires_grad=True)
w = (torch.randn(151936, 896, device=dev, dtype=torch.bfloat16) * 0.02).requires_grad_()
t = torch.randint(0, 151936, (4096,), device=dev)
def tig():
    F.fused_linear_cross_entropy(h, w, t).backward()
def hf():
    logits = (h @ w.t()).float()
    torch.nn.functional.cross_entropy(logits, t).backward()
for name, fn in (("tigon", tig), ("hf", hf)):
    for _ in range(5): fn()
    torch.cuda.synchronize()
    # host time to issue, device held by a long sleep
    torch.cuda._sleep(int(2e9 * 0.2))
    t0 = time.perf_counter(); fn(); t1 = time.perf_counter()
    torch.cuda.synchronize()
    print(name, "issue ms (behind sleep)", round((t1 - t0) * 1e3, 3), flush=True)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as p:
        torch.cuda._sleep(int(2e9 * 0.2)); fn()
    torch.cuda.synchronize()
    print(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=18, max_name_column_width=60), flush=True)
