"""PNG plots for the CLI (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from typing import Any


def plot_compare(result: dict[str, Any], path: str) -> None:
    """Write a PNG of a ``tigon compare`` result to ``path``.

    Top: both loss curves over the steps. Bottom: the per-step relative difference
    ``|patched - original| / |original|``, with the maximum marked.

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
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
