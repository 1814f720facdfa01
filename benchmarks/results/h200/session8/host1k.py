"""Cross-entropy at 1k tokens x 128256 bf16, fwd+bwd (host-bound): per-step host (enqueue) time, wall time and
do_bench for each variant; the cost of one Triton launch through the JIT path against CompiledKernel.run; a cProfile
of the one-pass step."""
import cProfile, pstats, sys, time, io
import torch, triton, triton.testing
sys.path.insert(0, "src")
import tigon.functional as F
import tigon.ops.cross_entropy as ce

N, V = 1024, 128256
x = torch.randn(N, V, device="cuda", dtype=torch.bfloat16, requires_grad=True)
t = torch.randint(0, V, (N,), device="cuda")
comp = torch.compile(lambda a, b: torch.nn.functional.cross_entropy(a.float(), b))
variants = {
    "lazy": lambda: F.cross_entropy(x, t),
    "onepass": lambda: F.cross_entropy(x.view_as(x), t, grad_in_forward=True),
    "compile": lambda: comp(x, t),
}
try:
    from liger_kernel.transformers.functional import liger_cross_entropy
    variants["liger"] = lambda: liger_cross_entropy(x, t)
except Exception as e:
    print("no liger", e)

def step_of(f):
    def step():
        x.grad = None
        f().backward()
    return step

def host_us(step, n=100):
    torch.cuda.synchronize()
    torch.cuda._sleep(int(2e9))  # ~1 s of GPU work ahead: the loop below only enqueues
    t0 = time.perf_counter()
    for _ in range(n):
        step()
    h = (time.perf_counter() - t0) / n * 1e6
    torch.cuda.synchronize()
    return h

def wall_us(step, n=100):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        step()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n * 1e6

for rnd in range(2):
    for name, f in variants.items():
        if name == "two_pass":
            continue
        st = step_of(f)
        for _ in range(10):
            st()
        h, w = host_us(st), wall_us(st)
        db = triton.testing.do_bench(st, rep=200) * 1e3
        print(f"round {rnd} {name:9s} host {h:7.1f} us/step  wall {w:7.1f}  do_bench {db:7.1f} us", flush=True)
    ce.ONEPASS = False
    st = step_of(variants["onepass"])
    for _ in range(5):
        st()
    print(f"round {rnd} two_pass  host {host_us(st):7.1f} us/step  wall {wall_us(st):7.1f}", flush=True)
    ce.ONEPASS = True

# one launch: the JIT path against the compiled kernel's own launcher (_scale_kernel with g == 1: no memory traffic)
g = torch.ones((), device="cuda")
y = torch.empty(N, V, device="cuda", dtype=torch.bfloat16)
args = (y, y.stride(0), N, V, g)
k = ce._scale_kernel[(N,)](*args, BLOCK_M=1, BLOCK_V=8192, num_warps=8)
print("CompiledKernel attrs:", [a for a in dir(k) if not a.startswith("__")][:40])
def jit_launch():
    ce._scale_kernel[(N,)](*args, BLOCK_M=1, BLOCK_V=8192, num_warps=8)
stream = torch.cuda.current_stream().cuda_stream
def direct_launch():
    k.run(N, 1, 1, stream, k.function, k.packed_metadata, None, None, None, *args, 1, 8192)
for name, fn in (("jit", jit_launch), ("direct", direct_launch), ("jit", jit_launch), ("direct", direct_launch)):
    try:
        fn(); torch.cuda.synchronize()
        torch.cuda._sleep(int(2e9))
        t0 = time.perf_counter()
        for _ in range(500):
            fn()
        us = (time.perf_counter() - t0) / 500 * 1e6
        torch.cuda.synchronize()
        print(f"launch {name:7s} {us:6.2f} us", flush=True)
    except Exception as e:
        print("launch", name, "failed", repr(e)[:300], flush=True)
        torch.cuda.synchronize()

st = step_of(variants["onepass"])
pr = cProfile.Profile()
torch.cuda._sleep(int(4e9))
pr.enable()
for _ in range(200):
    st()
pr.disable()
torch.cuda.synchronize()
s = io.StringIO()
pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(30)
print(s.getvalue()[:6000])
