"""Where a training step's memory goes, per provider: bytes saved for backward per decoder layer and op, and the
LM-head loss's own allocations, for Hugging Face's model (``original``), ``tigon.patch`` (``tigon``, and
``tigon_lean``: grad_weight accumulated in the weight's dtype) and Liger-Kernel (``liger``, when importable).

    TRITON_INTERPRET=1 PYTHONPATH=src python benchmarks/step_memory.py                    # CPU, a few minutes
    PYTHONPATH=src python benchmarks/step_memory.py --device cuda --seq-len 2048 --batch-size 4 --scale 1

Part A (saved for backward): the preset's model (default ``llama3.2-1b``) with ``--layers`` decoder layers, in bf16,
on ``--batch-size`` x ``--seq-len`` tokens; its decoder stack (``model.model``) runs forward under
``torch.autograd.graph.saved_tensors_hooks``, and every tensor an op saves is counted once by its storage (a storage
saved by several ops counts for the first; parameters are left out), under the innermost module running when it was
saved (an attention module's own ops - RoPE, SDPA - count under ``self_attn``). The table gives bytes per decoder layer
(the mean over the layers) scaled linearly to ``--full-tokens`` tokens (exact for every tensor saved here, which are all
(tokens, ...) shaped: SDPA's flash / memory-efficient paths save (tokens, heads) statistics, no (tokens, tokens) matrix;
the CPU's "math" SDPA fallback would not, so look at the attention row on the GPU), then the sum over the preset's
layers.

Part B (the LM-head loss): the head's shapes (tokens ``--full-tokens``, hidden, vocabulary) divided by ``--scale``
(all three, so that every 2-D buffer keeps its ratio and shrinks by scale**2), one forward + backward of each
provider's loss on bf16 inputs with the tied weight requiring grad, under ``torch.profiler`` (``profile_memory``):
the peak live bytes above the inputs during the forward, what the forward leaves alive for the backward, and the peak
during the backward, multiplied by scale**2. Tigon's default chunk rule on CUDA is reproduced at the small shapes by
passing its CUDA budget scaled by scale**2 as ``memory=`` (the same chunk count and buffers); ``--scale 1`` on
``--device cuda`` runs the real rule. Liger's rule (V / H chunks of tokens) keeps its chunk count by itself.

CPU caveats: Tigon's bf16 products into fp32 buffers run blocked there (:func:`_cuda_like_matmuls`; CUDA writes them
with ``out_dtype``, no copy), and Triton's interpreter's reference cycles are collected after each launch
(:func:`_collect_after_launches`), so Tigon's rows are the CUDA path's buffers. The peers' bf16 GEMMs on the CPU
allocate fp32 copies of their operands (the (V, H) weight: 1.05 GB at Llama-3.2-1B), which inflate their forward peaks
there (Liger-Kernel's CUDA peak is about what it leaves for the backward plus one 256-row chunk); ``--device cuda``
measures every row as it is.

The last table adds them up: the layers' saved bytes plus the loss forward's peak (where the step's peak falls for
these three providers: the end of the forward, before any weight gradient exists; the weights, their AdamW state and
the embedding's saved ids are the same for all and left out).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import torch
import triton
import triton.language as tl

GB = 1e9
PROVIDERS = ("original", "tigon", "tigon_lean", "liger")


def _storage_key(t: torch.Tensor):
    s = t.untyped_storage()
    return (t.device, s.data_ptr()), s.nbytes()


def saved_per_module(model, ids) -> dict[str, dict[str, int]]:
    """{layer index: {module label: bytes}} of the unique storages saved for backward by ``model.model``'s forward on
    ``ids``, each under the innermost module running when it was first saved (see the module docstring). The module is
    found on the Python stack (the innermost frame whose ``self`` is one of the model's modules), not by module hooks,
    which would change the patched code's path (a patched MLP folds its down projection only without hooks)."""
    params = {_storage_key(p)[0] for p in model.parameters()}
    names = {id(m): n for n, m in model.named_modules()}
    seen: set = set()
    out: dict[str, dict[str, int]] = {}

    def where() -> str:
        f = sys._getframe(2)
        while f is not None:
            obj = f.f_locals.get("self")
            if obj is not None and id(obj) in names:
                return names[id(obj)]
            f = f.f_back
        return "(outside)"

    def pack(t):
        key, nbytes = _storage_key(t)
        if key not in seen and key not in params:
            seen.add(key)
            parts = where().split(".")
            if "layers" in parts:
                i = parts.index("layers")
                layer, label = parts[i + 1], ".".join(parts[i + 2:]) or "(layer)"
            else:
                layer, label = "-", ".".join(parts)
            out.setdefault(layer, {})
            out[layer][label] = out[layer].get(label, 0) + nbytes
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        hidden = model.model(input_ids=ids).last_hidden_state
    del hidden
    return out


@triton.jit
def _rsqrt(x):
    return tl.rsqrt(x)


def _liger_interpreter_shim() -> None:
    """Liger-Kernel under Triton's interpreter: float kernel arguments stay Python floats there, which Liger's kernels
    call ``.to`` on (``eps.to(...)`` in its RMSNorm): passed as fp32 scalars, as the compiled launch does; and its
    RMSNorms' ``libdevice.rsqrt`` (no interpreter version) becomes ``tl.math.rsqrt``."""
    import importlib

    from triton.runtime import interpreter

    if getattr(interpreter, "_tigon_float_shim", False):
        return
    import numpy as np

    cvt = interpreter._implicit_cvt

    def implicit_cvt(arg):
        if isinstance(arg, float):
            return tl.tensor(interpreter.TensorHandle(np.array([arg], dtype=np.float32), tl.float32), tl.float32)
        return cvt(arg)

    interpreter._implicit_cvt = implicit_cvt
    interpreter._tigon_float_shim = True
    for mod in ("rms_norm", "fused_add_rms_norm"):
        importlib.import_module(f"liger_kernel.ops.{mod}").rsqrt = _rsqrt


def build(provider: str, layers: int, device: torch.device, model_name: str):
    """The preset's bf16 model with ``layers`` decoder layers, patched for ``provider``."""
    import tigon
    from tigon.workflows.e2e_models import build_model, hf_config

    config, _ = hf_config(model_name, layers)
    model = build_model(config, torch.bfloat16, device, 0)
    if provider == "tigon":
        tigon.patch(model)
    elif provider == "tigon_lean":
        tigon.patch(model, fused_linear_cross_entropy={"accum_dtype": torch.bfloat16})
    elif provider == "liger":
        from tigon.workflows.liger_patch import apply_liger

        if os.environ.get("TRITON_INTERPRET") == "1":
            _liger_interpreter_shim()

        apply_liger(model)
    return model


# ---- part B: the LM-head loss -----------------------------------------------------------------------------------
def _cuda_rows(tokens: int, vocab: int, hidden: int) -> int:
    """Rows per chunk of Tigon's default rule on CUDA for a bf16 head with an fp32 grad_weight accumulator."""
    from tigon.kernels import fused_linear_cross_entropy as k

    old = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "0"
    try:
        return k.chunk_rows(tokens, vocab, hidden, torch.device("cuda"), fp32_weight_grad=True)
    finally:
        if old is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = old


def loss_fn(provider: str, device: torch.device, scale: int, tokens: int, vocab: int, hidden: int):
    """(callable(h, w, target) -> loss) of ``provider``'s LM-head loss (HF's: the logits in bf16, upcast to fp32,
    torch's cross-entropy)."""
    if provider == "original":
        def hf(h, w, t):
            return torch.nn.functional.cross_entropy((h @ w.t()).float(), t)
        return hf
    if provider == "liger":
        from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy

        return lambda h, w, t: liger_fused_linear_cross_entropy(h, w, t)
    from tigon.functional import fused_linear_cross_entropy
    from tigon.kernels import fused_linear_cross_entropy as k

    if device.type == "cpu":
        _cuda_like_matmuls()
    kw = {"accum_dtype": torch.bfloat16} if provider == "tigon_lean" else {}
    if provider == "tigon" and (scale != 1 or device.type != "cuda"):
        # the CUDA rule's rows at the full shapes, as a byte budget that gives rows / scale at these
        rows = _cuda_rows(tokens * scale, vocab * scale, hidden * scale) // scale
        kw["memory"] = 4 * vocab * hidden + rows * vocab * 2
    return lambda h, w, t: fused_linear_cross_entropy(h, w, t, **kw)


def _cuda_like_matmuls() -> None:
    """On the CPU, the LM-head loss's bf16 products into fp32 buffers (grad_weight's accumulator, grad_hidden) go
    through fp32 copies of whole operands (:class:`tigon.kernels.head_grads._Matmuls`: a (rows, V) fp32 copy of the
    logits chunk, 2x its bytes), where CUDA's ``torch.mm(..., out_dtype=torch.float32)`` allocates nothing: here they
    run in 64 x 64 blocks, whose fp32 copies are small, so that the profile shows the CUDA path's buffers."""
    from tigon.kernels import head_grads

    if getattr(head_grads._Matmuls, "_blocked", False):
        return
    mm0, addmm0 = head_grads._Matmuls.mm, head_grads._Matmuls.addmm_

    def blocked(out, a, b, add):
        sm, sk = max(1, -(-a.shape[0] // 64)), max(1, -(-a.shape[1] // 64))
        for i in range(0, a.shape[0], sm):
            o = out[i:i + sm]
            if not add:
                o.zero_()
            for k in range(0, a.shape[1], sk):
                o.addmm_(a[i:i + sm, k:k + sk].float(), b[k:k + sk].float())

    def mm(self, out, a, b):
        return blocked(out, a, b, False) if out.dtype != a.dtype else mm0(self, out, a, b)

    def addmm_(self, acc, a, b):
        return blocked(acc, a, b, True) if acc.dtype != a.dtype else addmm0(self, acc, a, b)

    head_grads._Matmuls.mm, head_grads._Matmuls.addmm_, head_grads._Matmuls._blocked = mm, addmm_, True


def _collect_after_launches() -> None:
    """Triton's interpreter leaves each launch's arguments in reference cycles (its ``_to_cpu`` / ``_from_cpu``
    closures), so a buffer a kernel was given outlives its last use until the garbage collector runs: a young-generation
    collection after every interpreted launch frees them where the compiled launch would have."""
    import gc

    from triton.runtime import interpreter

    call = interpreter.GridExecutor.__call__
    if getattr(call, "_collects", False):
        return

    def collecting(self, *args, **kwargs):
        try:
            return call(self, *args, **kwargs)
        finally:
            gc.collect(0)

    collecting._collects = True
    interpreter.GridExecutor.__call__ = collecting


class LiveBytes:
    """Live bytes on ``device`` from ``torch.profiler``'s memory events (CPU) or the CUDA allocator's counters."""

    def __init__(self, device: torch.device):
        self.device = device

    def measure(self, fn):
        """Runs ``fn``; returns (its result, peak live bytes above the start, live bytes at the end above the start,
        the sizes of the allocations alive at the peak, largest first)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            res = fn()
            torch.cuda.synchronize()
            return res, torch.cuda.max_memory_allocated() - base, torch.cuda.memory_allocated() - base, []
        from torch.profiler import ProfilerActivity, profile

        if os.environ.get("TRITON_INTERPRET") == "1":
            _collect_after_launches()

        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            res = fn()
        events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events()
                        if e.name() == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU)
        live = peak = 0
        alive: list[int] = []  # sizes of the live allocations (a free takes the latest one of its size: no addresses)
        at_peak: list[int] = []
        for _, nbytes in events:
            live += nbytes
            if nbytes > 0:
                alive.append(nbytes)
            elif -nbytes in alive:
                del alive[len(alive) - 1 - alive[::-1].index(-nbytes)]
            if live > peak:
                peak, at_peak = live, sorted(alive, reverse=True)
        return res, peak, live, at_peak


def loss_memory(provider: str, device: torch.device, scale: int, tokens: int, hidden: int, vocab: int) -> dict:
    """Part B for one provider: bytes (already multiplied by scale**2) of the loss's forward peak, what the forward
    leaves for the backward, the backward's peak, and the largest buffers alive at the forward's peak."""
    n, h, v = tokens // scale, hidden // scale, vocab // scale
    g = torch.Generator(device="cpu").manual_seed(0)
    hs = (torch.randn(n, h, generator=g) / 4).to(device, torch.bfloat16).requires_grad_()
    w = (torch.randn(v, h, generator=g) / h ** 0.5).to(device, torch.bfloat16).requires_grad_()
    t = torch.randint(0, v, (n,), generator=g).to(device)
    fn = loss_fn(provider, device, scale, n, v, h)
    fn(hs, w, t).backward()  # warm-up (kernels, caches), then measured
    hs.grad = w.grad = None
    meter = LiveBytes(device)
    loss, fwd_peak, held, at_peak = meter.measure(lambda: fn(hs, w, t))
    _, bwd_peak, _, _ = meter.measure(lambda: loss.backward())
    k = scale ** 2
    return {"fwd_peak": fwd_peak * k, "held": held * k, "bwd_peak": (held + bwd_peak) * k,
            "at_peak": [b * k for b in at_peak[:4]]}


# ---- one provider in its own process (Liger rebinds classes) -----------------------------------------------------
def run_one(args) -> dict:
    """One provider's figures (run in a process of its own: Liger patches classes): ``{"provider", "layer": {module
    label: bytes saved per decoder layer at --full-tokens}, "outside": {label: bytes}, "full_layers", "loss":
    :func:`loss_memory`'s dict}``."""
    device = torch.device(args.device)
    torch.manual_seed(0)
    out: dict = {"provider": args.one}
    model = build(args.one, args.layers, device, args.model)
    cfg = model.config
    ids = torch.randint(0, cfg.vocab_size, (args.batch_size, args.seq_len), device=device)
    per = saved_per_module(model, ids)
    tokens = args.batch_size * args.seq_len
    layer_keys = [k for k in per if k != "-"]
    labels = sorted({lab for k in layer_keys for lab in per[k]})
    f = args.full_tokens / tokens
    out["layer"] = {lab: f * sum(per[k].get(lab, 0) for k in layer_keys) / len(layer_keys) for lab in labels}
    out["outside"] = {lab: f * b for lab, b in per.get("-", {}).items()}
    out["full_layers"] = getattr(cfg, "full_layers", None)
    del model
    out["loss"] = loss_memory(args.one, device, args.scale, args.full_tokens, cfg.hidden_size, cfg.vocab_size)
    return out


def _available(provider: str) -> bool:
    """Whether ``provider`` can run here (Liger-Kernel importable for ``liger``)."""
    if provider != "liger":
        return True
    try:
        import liger_kernel  # noqa: F401
    except ImportError:
        return False
    return True


def main() -> None:
    """The command line: each provider in a subprocess (``--one``), then the three tables."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="llama3.2-1b", help="preset name (tigon.presets)")
    p.add_argument("--layers", type=int, default=2, help="decoder layers built for part A")
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--full-tokens", type=int, default=8192, help="tokens per step the figures are scaled to")
    p.add_argument("--scale", type=int, default=32, help="part B's divisor of tokens, hidden and vocabulary")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--providers", default=",".join(PROVIDERS))
    p.add_argument("--json", help="also write the raw figures here")
    p.add_argument("--one", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        print("RESULT " + json.dumps(run_one(args)))
        return
    from tigon.workflows.e2e_models import hf_config

    n_layers = hf_config(args.model)[0].num_hidden_layers
    rows = {}
    for prov in args.providers.split(","):
        if not _available(prov):
            print(f"{prov}: not importable here, skipped", file=sys.stderr)
            continue
        cmd = [sys.executable, __file__, *sys.argv[1:], "--one", prov]
        res = subprocess.run(cmd, capture_output=True, text=True, env=os.environ)
        line = [ln for ln in res.stdout.splitlines() if ln.startswith("RESULT ")]
        if res.returncode or not line:
            print(f"{prov}: failed\n{res.stderr[-2000:]}", file=sys.stderr)
            continue
        rows[prov] = json.loads(line[-1][7:])
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)
    print_tables(rows, n_layers, args)


def print_tables(rows: dict, n_layers: int, args) -> None:
    """Tables A (saved bytes per layer and op, GB), B (the LM-head loss's buffers, GB) and C (their sum at the end of
    the forward, and each provider minus Liger) of ``rows`` (provider -> :func:`run_one`'s dict)."""
    provs = list(rows)
    head = f"{'':34s}" + "".join(f"{p:>12s}" for p in provs)
    print(f"A. saved for backward per decoder layer, GB at {args.full_tokens} tokens ({args.model}, bf16, measured on "
          f"{args.batch_size} x {args.seq_len} tokens, {args.device})")
    print(head)
    labels = sorted({lab for r in rows.values() for lab in r["layer"]})
    for lab in labels:
        print(f"{lab:34s}" + "".join(f"{rows[p]['layer'].get(lab, 0) / GB:12.3f}" for p in provs))
    layer_sum = {p: sum(rows[p]["layer"].values()) for p in provs}
    print(f"{'= per layer':34s}" + "".join(f"{layer_sum[p] / GB:12.3f}" for p in provs))
    print(f"{f'x {n_layers} layers':34s}" + "".join(f"{n_layers * layer_sum[p] / GB:12.3f}" for p in provs))
    outside = {p: sum(rows[p]["outside"].values()) for p in provs}
    print(f"{'outside the layers (final norm ...)':34s}" + "".join(f"{outside[p] / GB:12.3f}" for p in provs))
    print(f"\nB. LM-head loss, GB at {args.full_tokens} tokens (measured at 1/{args.scale} of each dimension, "
          f"x {args.scale ** 2})")
    print(head)
    for key, what in (("fwd_peak", "forward peak above the inputs"), ("held", "left for the backward"),
                      ("bwd_peak", "backward peak (from the same base)")):
        print(f"{what:34s}" + "".join(f"{rows[p]['loss'][key] / GB:12.3f}" for p in provs))
    for p in provs:
        print(f"  {p}: largest buffers at the forward peak, GB: "
              + ", ".join(f"{b / GB:.3f}" for b in rows[p]["loss"]["at_peak"]))
    print("\nC. the end of the forward (layers' saved bytes + outside + the loss forward's peak), GB")
    print(head)
    total = {p: n_layers * layer_sum[p] + outside[p] + rows[p]["loss"]["fwd_peak"] for p in provs}
    print(f"{'total':34s}" + "".join(f"{total[p] / GB:12.3f}" for p in provs))
    if "liger" in total:
        print(f"{'minus Liger':34s}" + "".join(f"{(total[p] - total['liger']) / GB:12.3f}" for p in provs))


if __name__ == "__main__":
    main()
