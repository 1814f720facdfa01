"""Cross-entropy fwd+bwd at 8k and 64k tokens x 128256 bf16: the same providers timed four ways in one run, to see
what each method adds: plain do_bench (L2 flushed, host included), CUDA-graph replay (where capturable), the summed
kernel durations of one call (torch.profiler, as bench does for host-syncing providers), and CUDA events around
back-to-back calls without a flush."""
import sys, time
import torch, triton.testing
sys.path.insert(0, "src")
import tigon.workflows.bench as B
from tigon.presets import PRESETS

case = B.CASES["cross_entropy"]
for tokens in (8192, 65536):
    shape = B.shapes_from_config(PRESETS["llama3-8b"]["config"], tokens=tokens)["cross_entropy"]
    inputs = case.make(shape, torch.bfloat16, torch.device("cuda"))
    x = inputs["logits"]
    for prov in ("tigon_fwdgrad", "tigon", "liger"):
        fn = case.providers[prov]
        def step():
            x.grad = None
            fn(**inputs).backward()
        for _ in range(3):
            step()
        torch.cuda.synchronize()
        plain = triton.testing.do_bench(step, warmup=25, rep=200)
        ks = B._kernel_time(step, grad_to_none=[x])[0]
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(10):
            step()
        e.record(); torch.cuda.synchronize()
        ev = s.elapsed_time(e) / 10
        graph = None
        if prov != "liger":
            graph = triton.testing.do_bench_cudagraph(step, rep=200)
        print(f"{tokens:6d} {prov:14s} plain {plain:7.3f}  kernels {ks:7.3f}  events_10 {ev:7.3f}  graph {graph}",
              flush=True)
    del inputs, x
    torch.cuda.empty_cache()
# Liger's kernel alone vs tigon's at 8k, from the profiler table
inputs = case.make(B.shapes_from_config(PRESETS["llama3-8b"]["config"], tokens=8192)["cross_entropy"],
                   torch.bfloat16, torch.device("cuda"))
x = inputs["logits"]
for prov in ("tigon_fwdgrad", "liger"):
    fn = case.providers[prov]
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            x.grad = None
            fn(**inputs).backward()
        torch.cuda.synchronize()
    print(prov)
    print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=8))
