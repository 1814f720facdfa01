"""Host cost of an in-place scale of a (4096, 896) fp32 gradient by a 0-d CUDA tensor, behind a GPU sleep (the
2.2 ms aten::mul_ of the fused linear CE's backward in flce_host.py), and of the whole FLCE call at 20 repeats."""
import time, torch
import tigon.functional as F
dev = "cuda"
t = torch.randn(4096, 896, device=dev)
s = torch.ones((), device=dev)
def behind(fn, n=20):
    torch.cuda.synchronize(); torch.cuda._sleep(int(4e8))
    t0 = time.perf_counter()
    for _ in range(n): fn()
    t1 = time.perf_counter(); torch.cuda.synchronize()
    return (t1 - t0) / n * 1e6
for name, fn in (("mul_ 0-d cuda", lambda: t.mul_(s)), ("mul_ float", lambda: t.mul_(1.0)),
                 ("mul out=", lambda: torch.mul(t, s, out=t)), ("to bf16", lambda: t.to(torch.bfloat16))):
    fn(); print(name, round(behind(fn), 1), "us", flush=True)
h = torch.randn(4096, 896, device=dev, dtype=torch.bfloat16, requires_grad=True)
w = (torch.randn(151936, 896, device=dev, dtype=torch.bfloat16) * 0.02).requires_grad_()
y = torch.randint(0, 151936, (4096,), device=dev)
def fl(): F.fused_linear_cross_entropy(h, w, y).backward()
def fwd(): F.fused_linear_cross_entropy(h, w, y)
for _ in range(3): fl()
print("flce fwd+bwd", round(behind(fl, 10), 1), "us; fwd only", round(behind(fwd, 10), 1), "us", flush=True)
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as p:
    torch.cuda._sleep(int(4e8))
    for _ in range(10): fl()
torch.cuda.synchronize()
print(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=12, max_name_column_width=50), flush=True)
