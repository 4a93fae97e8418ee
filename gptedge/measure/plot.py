"""compare's chart (needs matplotlib): size against Δ perplexity, size against speed, and the
accuracy x speed frontier (KL(ref‖model) on a log axis against decode tok/s), one point per row.

gptedge rows are circles, peer engines' squares. On the frontier panel the Pareto front (rows no
other row beats on both KL and tok/s, runtime.frontier) is joined by a step line and drawn filled;
dominated rows are hollow. The reference's KL is 0, which a log axis cannot place: it is the dotted
vertical line at its tok/s (every row left of it is dominated by it).
"""

from __future__ import annotations

import os
from pathlib import Path

from gptedge.runtime.errors import missing_extra

from .frontier import pareto_front

GPTEDGE, PEER = "o", "s"  # markers


def _label(r) -> str:
    return r.model if r.peer else Path(r.model).name


def plot_frontier(ax, rows) -> None:
    """KL (log) against decode tok/s; the front as a step line, dominated points hollow."""
    points = [(r.kl, r.tokens_per_s) for r in rows]
    front = set(pareto_front(points))
    shown = [i for i, r in enumerate(rows) if r.kl > 0]
    for k, i in enumerate(shown):
        r = rows[i]
        marker = PEER if r.peer else GPTEDGE
        color = f"C{i % 10}"
        ax.scatter(r.tokens_per_s, r.kl, s=60, marker=marker, edgecolors=color, linewidths=1.5,
                   facecolors=color if i in front else "none", zorder=3)
        ax.annotate(_label(r), (r.tokens_per_s, r.kl), textcoords="offset points",
                    xytext=(6, 4 if k % 2 == 0 else -12), fontsize=8)
    line = sorted((points[i] for i in front if rows[i].kl > 0), key=lambda p: p[1])  # slowest (lowest KL) first
    if len(line) > 1:
        ax.step([p[1] for p in line], [p[0] for p in line], where="pre", color="black", lw=1, alpha=0.6,
                label="Pareto front")
    for r in rows:
        if r.kl <= 0:
            ax.axvline(r.tokens_per_s, color="grey", ls=":", lw=1, label=f"{_label(r)} (KL 0)")
    if shown:
        ax.set_yscale("log")
    ax.set(xlabel="decode tokens/s (batch 1)", ylabel="KL(ref‖model), log", title="frontier: filled = not dominated")
    ax.legend(fontsize=7, loc="upper left")


def plot_compare(rows, out: str | Path, title: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise missing_extra(e.name, "plot", "--plot") from None
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(16.5, 4.6))
    for i, r in enumerate(rows):
        name = _label(r)
        dy = 4 if i % 2 == 0 else -12  # alternate label sides: variants of one size sit on top of each other
        size = r.size_bytes / 1e6
        marker = PEER if r.peer else GPTEDGE
        ax1.scatter(size, r.delta_ppl_pct, s=60, marker=marker, color=f"C{i % 10}")
        ax1.annotate(f"{name}\nKL {r.kl:.4f}", (size, r.delta_ppl_pct), textcoords="offset points", xytext=(6, dy),
                     fontsize=8)
        ax2.scatter(size, r.tokens_per_s, s=60, marker=marker, color=f"C{i % 10}")
        ax2.annotate(name, (size, r.tokens_per_s), textcoords="offset points", xytext=(6, dy), fontsize=8)
    ax1.axhline(0, color="grey", lw=0.8)
    ax1.set(xlabel="size on disk (MB)", ylabel="Δ perplexity vs reference (%)", title="accuracy cost")
    ax2.set(xlabel="size on disk (MB)", ylabel="decode tokens/s (batch 1)", title="speed (squares: peer engines)")
    plot_frontier(ax3, rows)
    for ax in (ax1, ax2, ax3):
        ax.grid(alpha=0.3)
        ax.margins(x=0.25, y=0.2)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    out = Path(out)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.replace(out)
