"""`gptedge bench`: decode speed of model dirs (and peer engines) side by side, on the same prompt ids."""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path

import click

from gptedge.measure.peers import PEERS, bench_names
from gptedge.runtime.modeldir.manifest import read_manifest

from .group import command
from .options import CommaChoice, count, device_option, peer_source, threads_option


@command()
@click.argument("models", nargs=-1, required=True, type=click.Path(path_type=str))
@click.option("--prompt", "prompt_len", default=32, show_default=True, type=count(1), help="Prompt tokens.")
@click.option("--new", "new_tokens", default=128, show_default=True, type=count(1), help="New tokens (greedy).")
@click.option("--batch", default=1, show_default=True, type=count(1))
@click.option("--context", default=None, type=count(2), help="Decode up to this many tokens: prompt = CONTEXT - NEW.")
@threads_option
@click.option("--repeat", default=3, show_default=True, type=count(1), help="Timed runs per row (median reported).")
@click.option("--peers", default="", type=CommaChoice(bench_names),
              help="Comma list of peers run on the same weights in the same process (always on CPU; "
                   "genai runs the model dir itself).")
@click.option("--source", type=click.Path(file_okay=False, path_type=str), help="HF checkpoint for the peers.")
@device_option
@click.option("--json", "as_json", is_flag=True)
def bench(models: tuple[str, ...], prompt_len: int, new_tokens: int, batch: int, context: int | None, threads: int,
          repeat: int, peers: list[str], source: str | None, device: str, as_json: bool) -> None:
    """Decode speed of MODELS (and peers) side by side: load time, first token, tok/s, peak RSS."""
    # deferred: numpy (and the peers' packages), not needed at --help
    from gptedge.measure.bench import bench_gptedge, bench_prompts
    from gptedge.measure.peers.bench import bench_peers

    shape = read_manifest(models[0]).shape
    if context is not None:
        prompt_len = context - new_tokens
    if prompt_len < 1 or prompt_len + new_tokens > shape.context_length:
        raise click.UsageError(f"prompt {prompt_len} + new {new_tokens} tokens do not fit the context "
                               f"of {shape.context_length}")
    needs_checkpoint = any(PEERS.entry(p).checkpoint for p in peers)  # genai runs the model dir itself
    checkpoint = peer_source(models[0], source) if needs_checkpoint else None
    prompts = bench_prompts(shape.vocab_size, batch, prompt_len)
    rows = [bench_gptedge(m, prompts, new_tokens, threads, repeat, device, name=f"gptedge {Path(m).name}")
            for m in models]
    if peers:
        rows += bench_peers(peers, checkpoint, Path(models[0]), prompts, new_tokens, threads, repeat)
    setup = {"batch": batch, "prompt_tokens": prompt_len, "new_tokens": new_tokens, "threads": threads,
             "repeat": repeat, "device": device, "machine": f"{platform.machine()}, {os.cpu_count()} cpus",
             "python": platform.python_version()}
    if as_json:
        click.echo(json.dumps({"setup": setup, "rows": [r.to_dict() for r in rows]}, indent=2))
        return
    click.echo(f"batch {batch}, prompt {prompt_len}, new {new_tokens} (greedy), {threads} threads, median of {repeat}")
    click.echo("| engine | load s | first token ms | decode tok/s | peak RSS MiB | notes |")
    click.echo("|---|---:|---:|---:|---:|---|")
    for r in rows:
        click.echo(f"| {r.name} | {r.load_s:.2f} | {1000 * r.ttft_s:.1f} | {r.decode_tok_s:.1f} | {r.peak_rss_mb:.0f} "
                   f"| {r.notes} |")
