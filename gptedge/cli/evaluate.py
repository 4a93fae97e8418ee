"""`gptedge eval`: perplexity of a model over a whole text file."""

from __future__ import annotations

import json

import click

from gptedge import runtime

from .group import command
from .options import count, device_option, progress, read_text, threads_option


@command(name="eval")
@click.argument("model", type=click.Path(path_type=str))
@click.option("--text", "text_file", required=True, type=click.Path(dir_okay=False, path_type=str),
              help="UTF-8 text file.")
@click.option("--stride", default=None, type=count(1),
              help="Sliding-window stride, 1..context (default: half the context).")
@device_option
@threads_option
@click.option("--json", "as_json", is_flag=True)
def eval_(model: str, text_file: str, stride: int | None, device: str, threads: int, as_json: bool) -> None:
    """Perplexity of MODEL over the whole of a text file."""
    from gptedge.runtime.generation.evaluate import perplexity  # deferred: numpy, not needed at --help

    text = read_text(text_file)
    loaded = runtime.load(model, device=device, session=runtime.SessionConfig(threads=threads))
    # bos first where the tokenizer adds one (Llama, Gemma): the text as transformers' tokenizer gives it, which
    # its perplexity recipe scores (the bos itself is context, never a target)
    result = perplexity(loaded, loaded.encode_prompt(text), stride, progress=progress("evaluating"))
    if as_json:
        click.echo(json.dumps({"model": model, "text": text_file, **result.to_dict()}))
    else:
        click.echo(f"perplexity {result.perplexity:.4f} over {result.tokens:,} tokens "
                   f"({result.tokens_per_s:,.0f} tokens/s)")
