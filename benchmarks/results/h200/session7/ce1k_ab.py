"""Cross-entropy fwd+bwd at 1k tokens x 128256 bf16 (host-bound): the autograd.Function before (HEAD) and after
set_materialize_grads(False), alternating A B A B: host loop per step and plain do_bench, with compile as reference."""
import sys, time, torch, triton.testing
sys.path.insert(0, "src"); sys.path.insert(0, ".gpu")
import tigon.functional as F
import tigon.ops.cross_entropy as ce
import ce_old
new_fn = ce.CrossEntropyFunction
x = torch.randn(1024, 128256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
t = torch.randint(0, 128256, (1024,), device="cuda")
comp = torch.compile(lambda a, b: torch.nn.functional.cross_entropy(a.float(), b))
def run(name, f):
    def step():
        x.grad = None
        f().backward()
    for _ in range(10):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(100):
        step()
    torch.cuda.synchronize()
    host = (time.perf_counter() - t0) / 100 * 1e6
    db = triton.testing.do_bench(step, rep=200) * 1e3
    print(f"{name:10s} loop {host:7.1f} us/step  do_bench {db:7.1f} us", flush=True)
for rnd in range(2):
    ce.CrossEntropyFunction = ce_old.CrossEntropyFunction
    run("before", lambda: F.cross_entropy(x, t))
    ce.CrossEntropyFunction = new_fn
    run("after", lambda: F.cross_entropy(x, t))
    run("compile", lambda: comp(x, t))
