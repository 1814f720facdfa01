"""Host cost of cross-entropy at 1k tokens x 128256 (bf16): per-call time of a host-bound loop (no L2 flush,
200 calls then one sync), the kernels' own time (CUDA graph of the forward), and a cProfile of tigon's forward."""
import cProfile, io, pstats, sys, time, torch, triton.testing
sys.path.insert(0, "src")
import tigon.functional as F
from liger_kernel.transformers.functional import liger_cross_entropy
x = torch.randn(1024, 128256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
t = torch.randint(0, 128256, (1024,), device="cuda")
comp = torch.compile(lambda a, b: torch.nn.functional.cross_entropy(a.float(), b))
fns = {"tigon": lambda: F.cross_entropy(x, t), "compile": lambda: comp(x, t), "liger": lambda: liger_cross_entropy(x, t)}
for name, f in fns.items():
    for _ in range(20):
        f()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(200):
        f()
    torch.cuda.synchronize()
    loop = (time.perf_counter() - t0) / 200 * 1e6
    t0 = time.perf_counter()
    for _ in range(200):
        f().backward()
        x.grad = None
    torch.cuda.synchronize()
    loop_fb = (time.perf_counter() - t0) / 200 * 1e6
    try:
        with torch.no_grad():
            g = triton.testing.do_bench_cudagraph(f, rep=50) * 1e3
    except Exception as e:  # noqa: BLE001
        g = f"n/a ({type(e).__name__})"
    ev = triton.testing.do_bench(f, rep=100) * 1e3
    print(f"{name:8s} fwd loop {loop:7.1f} us/call  fwd+bwd loop {loop_fb:7.1f}  fwd graph(no grad) {g}  "
          f"fwd do_bench {ev:7.1f}", flush=True)
pr = cProfile.Profile()
pr.enable()
for _ in range(300):
    F.cross_entropy(x, t)
pr.disable()
torch.cuda.synchronize()
s = io.StringIO()
pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(25)
print(s.getvalue()[:6000])
