"""compare's chart: size against Δ perplexity, and speed, one point per model (needs matplotlib)."""

from __future__ import annotations

import os
from pathlib import Path

from .errors import missing_extra


def plot_compare(rows, out: str | Path, title: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise missing_extra(e.name, "plot", "--plot") from None
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for i, r in enumerate(rows):
        name = Path(r.model).name
        dy = 4 if i % 2 == 0 else -12  # alternate label sides: variants of one size sit on top of each other
        size = r.size_bytes / 1e6
        ax1.scatter(size, r.delta_ppl_pct, s=60)
        ax1.annotate(f"{name}\nKL {r.kl:.4f}", (size, r.delta_ppl_pct), textcoords="offset points", xytext=(6, dy), fontsize=8)
        ax2.scatter(size, r.tokens_per_s, s=60)
        ax2.annotate(name, (size, r.tokens_per_s), textcoords="offset points", xytext=(6, dy), fontsize=8)
    ax1.axhline(0, color="grey", lw=0.8)
    ax1.set(xlabel="size on disk (MB)", ylabel="Δ perplexity vs reference (%)", title="accuracy cost")
    ax2.set(xlabel="size on disk (MB)", ylabel="decode tokens/s (batch 1)", title="speed")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
        ax.margins(x=0.25, y=0.2)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    out = Path(out)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.replace(out)
