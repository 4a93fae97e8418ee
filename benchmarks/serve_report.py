"""The serve-vs-llama-server report of benchmarks/serve_load.py: columns (one per server, every run's result),
the table, the targets judged met or missed on the means, and the JSON of every figure with the machine facts.
Pure: tests build it from result dicts."""

from __future__ import annotations

import json
import math
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

# The gptedge recipe each llama.cpp recipe is judged against (column pair keys); the rest are reported beside.
PEER_PAIRS = {"Q8_0": "weight-only 8", "Q4_K_M": "weight-only 4"}

@dataclass
class Column:
    name: str  # the table's heading
    side: str  # "gptedge" or "llama-server"
    pair: str | None  # what pairs it with a column of the other side ("weight-only 8"); None: reported beside
    path: str  # the model dir or GGUF
    runs: list[dict] = field(default_factory=list)  # one result (bench_model / bench_peer) per run


def gptedge_column(model: Path | str, manifest) -> Column:
    """Named from the manifest: its quantization method (and bits for weight-only), else its precision."""
    q = manifest.quantization
    kind = manifest.precision if q is None else f"weight-only {q.bits}" if q.method == "weight-only" else q.method
    name = f"gptedge {kind}" + (" fp16" if q is not None and q.float16 else "")
    if manifest.kv_cache != "fp32":
        name += f" kv {manifest.kv_cache}"
    return Column(name, "gptedge", kind if kind in PEER_PAIRS.values() else None, str(model))


def peer_column(recipe: str, gguf: Path | str) -> Column:
    return Column(f"llama-server {recipe}", "llama-server", PEER_PAIRS.get(recipe), str(gguf))


def order_columns(ours: list[Column], peers: list[Column]) -> list[Column]:
    """gptedge's in the order given, each paired recipe right after its first gptedge column, the rest last;
    a name two dirs share gets the dir's name after it."""
    names = [c.name for c in ours]
    for c in ours:
        if names.count(c.name) > 1:
            c.name += f" ({Path(c.path).name})"
    ordered, left = [], list(peers)
    for c in ours:
        ordered.append(c)
        ordered += [p for p in left if p.pair and p.pair == c.pair]
        left = [p for p in left if p not in ordered]
    return ordered + left


def latency_clients(clients: list[int]) -> list[int]:
    return [c for c in (8, 16) if c in clients] or [max(clients)]


def table_rows(clients: list[int]) -> list[tuple[str, str, int | None, str]]:
    """(label, result key, client count or None for a whole-run figure, format) per row."""
    rows = [(f"{c}: tok/s", "tok_s", c, "{:.1f}") for c in clients]
    lat = latency_clients(clients)
    rows += [(f"{c}: TTFT p99 ms", "ttft_p99", c, "{:.1f}") for c in lat]
    rows += [(f"{c}: inter-token p99 ms", "itl_p99", c, "{:.2f}") for c in lat]
    if 1 in clients and 1 not in lat:
        rows.append(("1: inter-token p99 ms", "itl_p99", 1, "{:.2f}"))
    return rows + [("peak RSS MiB", "peak_rss_mib", None, "{:.0f}"), ("model file MiB", "size_mib", None, "{:.1f}")]


def figure(run: dict, key: str, clients: int | None) -> float:
    if clients is None:
        return run[key]
    return next((r[key] for r in run["rows"] if r["clients"] == clients), float("nan"))


def build_table(columns: list[Column], clients: list[int]) -> list[str]:
    lines = ["| clients | " + " | ".join(c.name for c in columns) + " |", "|---|" + "---:|" * len(columns)]
    for label, key, n, fmt in table_rows(clients):
        cells = [" / ".join(fmt.format(figure(run, key, n)) for run in c.runs) or "-" for c in columns]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines


def verdict(what: str, mine: list[float], theirs: list[float], factor: float, higher: bool) -> str:
    """One target line: met or missed on the means of the runs, each run's ratio, and whether the runs disagree."""
    if not mine or any(math.isnan(v) for v in [*mine, *theirs]):
        return f"- {what}: not measured"

    def met(a: float, b: float) -> bool:
        return a >= factor * b if higher else a <= factor * b

    a, b = float(np.mean(mine)), float(np.mean(theirs))
    runs = [met(x, y) for x, y in zip(mine, theirs, strict=False)]
    ratios = ", ".join(f"{x / y:.2f}x" if y else "-" for x, y in zip(mine, theirs, strict=False))
    line = (f"- {what}: **{'met' if met(a, b) else 'missed'}**: {a:.2f} vs {b:.2f} "
            f"({a / b:.2f}x; {'>=' if higher else '<='} {factor:g}x wanted), mean of {len(mine)} run(s); "
            f"per run {ratios}")
    if len(set(runs)) > 1:
        line += "; **runs disagree**: " + ", ".join(f"run {i} {'met' if r else 'missed'}"
                                                     for i, r in enumerate(runs, start=1))
    return line


def judge(columns: list[Column], clients: list[int]) -> list[str]:
    """Each paired gptedge column against its llama-server recipe, and its own 8-client vs 1-client latency."""
    lines = []
    for ours in (c for c in columns if c.side == "gptedge" and c.pair):
        peers = [p for p in columns if p.side != "gptedge" and p.pair == ours.pair]
        lines.append(f"{ours.name} vs {', '.join(p.name for p in peers) or 'no paired recipe (--peer-recipes)'}:")

        def series(col: Column, key: str, n: int | None) -> list[float]:
            return [figure(run, key, n) for run in col.runs]

        for p in peers:
            targets = [("1 client tok/s", "tok_s", 1, 1.1, True)]
            targets += [(f"{n} clients tok/s", "tok_s", n, 1.5, True) for n in (8, 16)]
            targets += [(f"{n} clients TTFT p99", "ttft_p99", n, 1.0, False) for n in (8, 16)]
            targets += [(f"{n} clients inter-token p99", "itl_p99", n, 1.0, False) for n in (8, 16)]
            targets.append(("peak RSS", "peak_rss_mib", None, 0.7, False))
            for what, key, n, factor, higher in targets:
                if n is not None and n not in clients:
                    lines.append(f"- {what} vs {p.name}: not measured (--clients has no {n})")
                    continue
                lines.append(verdict(f"{what} vs {p.name}", series(ours, key, n), series(p, key, n), factor, higher))
        if 1 in clients and 8 in clients:
            lines.append(verdict("its own inter-token p99, 8 clients vs 1", series(ours, "itl_p99", 8),
                                 series(ours, "itl_p99", 1), 2.0, False))
        else:
            lines.append("- its own inter-token p99, 8 clients vs 1: not measured (--clients needs 1 and 8)")
    return lines or ["no gptedge weight-only 8- or 4-bit dir given: nothing judged"]


def token_notes(columns: list[Column], new: int) -> list[str]:
    """Whether every request of every server returned --new tokens, and who counted them."""
    lines = []
    for c in columns:
        for i, run in enumerate(c.runs, start=1):
            got = [t for row in run["rows"] for t in row["tokens"]]
            by = sorted({b for row in run["rows"] for b in row["counted_by"]})
            off = [t for t in got if t != new]
            lines.append(f"- {c.name}, run {i}: {len(got)} requests, "
                         + (f"all {new} tokens" if not off else f"**{len(off)} not {new}**: {sorted(set(off))}")
                         + f" (counted by {', '.join(by)})")
    return lines


NOTES = [
    ("- Same prompts (seeded ids) and the same warm-up (one 8-token request) on both sides; each server is a fresh "
    "process per run; peak RSS is the server process's VmHWM after the load (llama-server mmaps its GGUF: the pages "
    "it touched count, as gptedge's loaded weights do)."),
    ("- llama-server's requests carry `cache_prompt: false`: a slot never reuses the KV of a prompt seen before "
    "(this load repeats prompts across client counts); gptedge's prefix reuse is off likewise (`--prefix-cache-mb "
    "0`, unless its command above sets it)."),
    ("- llama-server keeps its host-memory prompt cache (`--cache-ram`, default 8192 MiB: idle slots' KV states are "
    "saved there) unless its command above has `--cache-ram 0`; what it holds counts in its peak RSS."),
    ("- Token counts are each server's own (`usage.completion_tokens`); inter-token gaps are between chunks with "
    "text, and both servers hold back a token that ends inside a UTF-8 character, so both err high alike."),
]


def render_report(facts: list[str], columns: list[Column], clients: list[int], new: int) -> str:
    runs = max((len(c.runs) for c in columns), default=0)
    lines = ["# gptedge serve vs llama-server: streaming load", "", *facts, "", "## Servers", ""]
    lines += [f"- {c.name}: `{c.path}`" for c in columns]
    lines += ["", f"## Load (cells: {' / '.join(f'run {i}' for i in range(1, runs + 1)) or 'no runs'})", ""]
    lines += build_table(columns, clients)
    lines += ["", "## Targets (means of the runs; weight-only 8-bit vs Q8_0, weight-only 4-bit vs Q4_K_M)", ""]
    lines += judge(columns, clients)
    lines += ["", "## Tokens per request", "", *token_notes(columns, new), "", "## Notes", "", *NOTES]
    return "\n".join(lines) + "\n"


def write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    umask = os.umask(0)
    os.umask(umask)
    try:
        os.fchmod(fd, 0o666 & ~umask)  # mkstemp's 0600 would outlive the rename
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def report_json(facts: list[str], columns: list[Column]) -> str:
    """Every figure with the machine, versions and command it came from (the report's header lines)."""
    return json.dumps({"facts": [f.removeprefix("- ") for f in facts], "columns": [asdict(c) for c in columns]},
                      indent=1) + "\n"
