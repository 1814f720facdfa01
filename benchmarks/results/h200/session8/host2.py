"""Cross-entropy at 1k tokens x 128256 bf16, fwd+bwd: host time of one step (synchronize, clock, step, clock: the
launches are asynchronous, so this is the CPU's time), median of 200, for each variant; GPU time of the step in a
CUDA graph; and a cProfile of 300 steps of the lazy default (tottime)."""
import cProfile, io, pstats, statistics, sys, time
import torch
sys.path.insert(0, "src")
import tigon.functional as F

N, V = 1024, 128256
x = torch.randn(N, V, device="cuda", dtype=torch.bfloat16, requires_grad=True)
t = torch.randint(0, V, (N,), device="cuda")
comp = torch.compile(lambda a, b: torch.nn.functional.cross_entropy(a.float(), b))
variants = {
    "lazy": lambda: F.cross_entropy(x, t),
    "fwdgrad": lambda: F.cross_entropy(x.view_as(x), t, grad_in_forward=True),
    "compile": lambda: comp(x, t),
    "torch_fwd_only_empty": lambda: torch.empty((), device="cuda", requires_grad=True) * 1,
}

def step_of(f):
    def step():
        x.grad = None
        f().backward()
    return step

def host(step, n=200):
    out = []
    for _ in range(n):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        out.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    return statistics.median(out) * 1e6

def graph_us(step):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    x.grad = None
    with torch.cuda.graph(g):
        step()
    import triton.testing
    return triton.testing.do_bench(g.replay, rep=200) * 1e3

for rnd in range(3):
    for name, f in variants.items():
        st = step_of(f)
        for _ in range(10):
            st()
        print(f"round {rnd} {name:22s} host {host(st):7.1f} us/step", flush=True)
for name in ("lazy", "fwdgrad", "compile"):
    try:
        print(f"graph {name:10s} {graph_us(step_of(variants[name])):7.1f} us", flush=True)
    except Exception as e:
        print("graph", name, "failed", repr(e)[:200])
st = step_of(variants["lazy"])
pr = cProfile.Profile()
for _ in range(300):
    torch.cuda.synchronize()
    pr.enable()
    st()
    pr.disable()
torch.cuda.synchronize()
s = io.StringIO()
pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(35)
print(s.getvalue()[:7000])
