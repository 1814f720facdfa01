"""PNG plots for the CLI (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from typing import Any


def plot_compare(result: dict[str, Any], path: str) -> None:
    """Write a PNG of a ``tigon compare`` result to ``path``.

    Top: both loss curves over the steps. Bottom: the per-step relative difference
    ``|patched - original| / |original|``, with the maximum marked and the verdict on agreement as its title.

    Args:
        result: :meth:`tigon.workflows.compare.CompareResult.as_dict`.
        path: the output file (PNG).
    """
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    orig, pat, rel = result["loss_original"], result["loss_patched"], result["rel_loss_diff"]
    steps = list(range(1, len(orig) + 1))
    fig, (ax_loss, ax_rel) = plt.subplots(2, 1, figsize=(8, 6.5), sharex=True,
                                          gridspec_kw={"height_ratios": [2, 1]})
    ax_loss.plot(steps, orig, label="original", color="tab:blue", linewidth=2.2)
    ax_loss.plot(steps, pat, label=f"Tigon-patched ({result['backend']})", color="tab:orange",
                 linewidth=1.2, linestyle="--", marker=".")
    ax_loss.set_ylabel("training loss (nats)")
    ax_loss.legend()
    ax_loss.grid(alpha=0.3)
    cfg, model = result["config"], result["model"]
    source = model.get("source", "")
    ax_loss.set_title(
        f"tigon compare: {source}, {model.get('num_hidden_layers')} layers, {cfg['dtype']}, "
        f"{result['device']}\nbatch {cfg['batch_size']} x seq {cfg['seq_len']}, AdamW lr {cfg['lr']:g}, "
        f"seed {cfg['seed']}",
        fontsize=10,
    )
    finite = [r if r == r and r != float("inf") else float("nan") for r in rel]
    ax_rel.plot(steps, finite, color="tab:red", marker=".", linewidth=1)
    ax_rel.set_ylabel("|patched - original| / |original|")
    ax_rel.set_xlabel("step")
    ax_rel.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax_rel.ticklabel_format(axis="y", style="sci", scilimits=(-2, 2))
    ax_rel.grid(alpha=0.3)
    max_rel, max_step = result["max_rel_loss_diff"], result["max_rel_loss_diff_step"]
    if max_rel == max_rel and max_rel != float("inf"):
        right = max_step > (len(steps) + 1) / 2
        ax_rel.annotate(f"max {max_rel:.2e} (step {max_step})", xy=(max_step, max_rel),
                        xytext=(-6 if right else 6, -12), textcoords="offset points", fontsize=9,
                        ha="right" if right else "left")
    verdict = (result.get("agreement") or {}).get("summary")
    if verdict:  # the verdict on agreement (tigon.workflows.compare_verdict.judge_agreement)
        differ = result["agreement"]["verdict"] == "differ"
        ax_rel.set_title(verdict, fontsize=9, color="tab:red" if differ else "black")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


_PROVIDER_STYLE = {"eager": ("tab:gray", "o"), "compile": ("tab:purple", "v"), "tigon": ("tab:orange", "s"),
                   "tigon_inplace": ("tab:red", "D"), "tigon_fwdgrad": ("tab:brown", "X"),
                   "tigon_lean": ("tab:pink", "*"), "liger": ("tab:blue", "^"), "cce": ("tab:green", "P")}


def plot_bench(result: dict[str, Any], out_dir: str) -> list[str]:
    """Write one PNG per op of a ``tigon bench`` result into ``out_dir``; returns the paths written.

    Each figure: left, the fwd+bwd median time (ms, log scale) with its 20-80 percentile band; right, the peak
    extra memory of one forward+backward (MiB; CUDA only). x: the sweep axis (tokens, or hidden size for
    ``--sweep hidden``), log2 scale; one line per provider. File names: ``bench_<op>.png``.

    Args:
        result: :meth:`tigon.workflows.bench.BenchResult.as_dict`.
        out_dir: an existing directory.
    """
    import os

    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    axis = "hidden" if result.get("sweep") == "hidden" else "tokens"
    rows = [r for r in result["rows"] if r["mode"] == "fwd_bwd"]
    paths = []
    for op in dict.fromkeys(r["op"] for r in rows):
        fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(11, 4.2), sharex=True)
        any_mem = False
        for prov in dict.fromkeys(r["provider"] for r in rows if r["op"] == op):
            pts = sorted(((r["shape"].get(axis), r) for r in rows if r["op"] == op and r["provider"] == prov
                          and r["ms"] is not None and r["shape"].get(axis) is not None), key=lambda t: t[0])
            failed = any(r["ms"] is None for r in rows if r["op"] == op and r["provider"] == prov)
            if not pts:
                continue
            color, marker = _PROVIDER_STYLE.get(prov, (None, "o"))
            xs = [x for x, _ in pts]
            label = prov + (" (some sizes failed)" if failed else "")
            ax_t.plot(xs, [r["ms"] for _, r in pts], marker=marker, color=color, label=label)
            lo = [r["ms_p20"] if r["ms_p20"] is not None else r["ms"] for _, r in pts]
            hi = [r["ms_p80"] if r["ms_p80"] is not None else r["ms"] for _, r in pts]
            ax_t.fill_between(xs, lo, hi, color=color, alpha=0.15, linewidth=0)
            mem = [(x, r["peak_extra_bytes"] / 2**20) for x, r in pts if r["peak_extra_bytes"] is not None]
            if mem:
                any_mem = True
                ax_m.plot([x for x, _ in mem], [m for _, m in mem], marker=marker, color=color, label=prov)
        for ax in (ax_t, ax_m):
            ax.set_xscale("log", base=2)
            ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v / 1024:g}k" if v >= 1024 else f"{v:g}"))
            ax.set_xlabel("tokens" if axis == "tokens" else "hidden size")
            ax.grid(alpha=0.3, which="both")
        ax_t.set_yscale("log")
        ax_t.set_ylabel("fwd+bwd time (ms, median; band: p20-p80)")
        ax_t.legend(fontsize=8)
        ax_m.set_ylabel("peak extra memory (MiB)")
        if any_mem:
            ax_m.legend(fontsize=8)
        else:
            ax_m.text(0.5, 0.5, "not measured on CPU", transform=ax_m.transAxes, ha="center", va="center")
        shape = next(r["shape"] for r in rows if r["op"] == op)
        fixed = ", ".join(f"{k} {v}" for k, v in shape.items() if k not in (axis, "batch", "seq") and v is not None)
        fig.suptitle(f"tigon bench: {op} ({fixed}), {rows[0]['dtype']}, {result['device']}", fontsize=10)
        fig.tight_layout()
        path = os.path.join(out_dir, f"bench_{op}.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths
