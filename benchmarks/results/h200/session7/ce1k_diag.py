"""Why cross-entropy fwd+bwd at 1k tokens x 128256 bf16 (plain do_bench) swings between 0.38 and 0.82 ms, and a host
loop of fwd+bwd took 3.6 ms a call: GPU kernel time (graph), device allocations per call, profiler tables."""
import sys, time, torch, triton.testing
sys.path.insert(0, "src")
import tigon.functional as F
x = torch.randn(1024, 128256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
t = torch.randint(0, 128256, (1024,), device="cuda")
comp = torch.compile(lambda a, b: torch.nn.functional.cross_entropy(a.float(), b))
fns = {"tigon": lambda: F.cross_entropy(x, t), "tigon_fwdgrad": lambda: F.cross_entropy(x * 1, t, grad_in_forward=True),
       "compile": lambda: comp(x, t)}
for name, f in fns.items():
    def step():
        x.grad = None
        f().backward()
    for _ in range(10):
        step()
    torch.cuda.synchronize()
    s0 = torch.cuda.memory_stats()
    t0 = time.perf_counter()
    for _ in range(50):
        step()
    torch.cuda.synchronize()
    host = (time.perf_counter() - t0) / 50 * 1e6
    s1 = torch.cuda.memory_stats()
    mallocs = s1.get("num_device_alloc", 0) - s0.get("num_device_alloc", 0)
    frees = s1.get("num_device_free", 0) - s0.get("num_device_free", 0)
    retries = s1.get("num_alloc_retries", 0) - s0.get("num_alloc_retries", 0)
    try:
        g = triton.testing.do_bench_cudagraph(step, rep=50) * 1e3
    except Exception as e:  # noqa: BLE001
        g = f"n/a ({type(e).__name__}: {str(e)[:80]})"
    db = triton.testing.do_bench(step, rep=100) * 1e3
    print(f"{name:14s} loop {host:8.1f} us/step  cudaMalloc {mallocs} cudaFree {frees} retries {retries}  "
          f"graph {g}  do_bench {db:7.1f}", flush=True)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            step()
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=8, max_name_column_width=50), flush=True)
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=8, max_name_column_width=50), flush=True)
