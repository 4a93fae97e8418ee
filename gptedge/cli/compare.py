"""`gptedge compare`: model dirs (and peer engines) against a reference on one text, one table; or classifier dirs
on a labelled JSONL set (--labelled: compare_labelled.py)."""

from __future__ import annotations

import json
from contextlib import nullcontext
from pathlib import Path

import click

from gptedge import runtime
from gptedge.atomic import atomic_output_file, check_output_file
from gptedge.measure.peers import compare_names
from gptedge.measure.peers import score as peer_score
from gptedge.runtime.errors import ModelDirError
from gptedge.measure.plot import plot_compare

from .compare_labelled import any_classifier, check_options, compare_labelled
from .group import command
from .options import (CommaChoice, count, device_option, diag, import_extra, peer_source, progress, read_text,
                      threads_option)


@command()
@click.argument("ref", type=click.Path(path_type=str))
@click.argument("models", nargs=-1, type=click.Path(path_type=str))
@click.option("--text", "text_file", type=click.Path(dir_okay=False, path_type=str),
              help="UTF-8 text file (language-model dirs).")
@click.option("--labelled", "labelled_file", type=click.Path(dir_okay=False, path_type=str),
              help="Classifier dirs (export --task): a JSONL file, one example a line with the task's fields as "
                   "classify --jsonl reads them plus \"label\": the gold label (multiple choice: the gold choice's "
                   "index). Reports accuracy, agreement and KL against REF, confusion, examples/s at batch 1 and 32.")
@click.option("--repeats", default=3, show_default=True, type=count(1),
              help="--labelled: timed passes per batch size (the median is reported).")
@click.option("--prompts", default=8, show_default=True, type=count(1), help="Greedy agreement: number of prompts.")
@click.option("--new-tokens", default=32, show_default=True, type=count(1), help="Greedy agreement: tokens per prompt.")
@click.option("--prompt-tokens", default=32, show_default=True, type=count(1),
              help="Greedy agreement and decode tok/s: prompt tokens (from the text); 896 with --new-tokens 128 "
                   "times decoding at a long context (capped at the context minus --new-tokens).")
@click.option("--max-tokens", default=None, type=count(2), help="Use only the first N (>= 2) tokens of the text.")
@click.option("--peers", default="", type=CommaChoice(compare_names),
              help="Comma list of peer engines that quantize REF's HF checkpoint their own way and are scored on the "
                   "same windows (CPU): ctranslate2 int8 / int8_float32, llama.cpp Q8_0 / Q4_K_M / Q4_0 (needs "
                   "$GPTEDGE_LLAMA_CPP_SOURCE, see README), optimum dynamic int8. One not installed is skipped "
                   "with a hint.")
@click.option("--source", type=click.Path(file_okay=False, path_type=str),
              help="HF checkpoint for the peers (default: the one REF's manifest records).")
@device_option
@threads_option
@click.option("--json", "as_json", is_flag=True, help="Print the rows as a JSON list.")
@click.option("--markdown", type=click.Path(dir_okay=False, path_type=str), help="Also write the table here.")
@click.option("--plot", type=click.Path(dir_okay=False, path_type=str),
              help="Also draw size vs Δppl, size vs speed and the KL vs tok/s frontier (PNG).")
@click.pass_context
def compare(ctx: click.Context, ref: str, models: tuple[str, ...], text_file: str | None,
            labelled_file: str | None, repeats: int, prompts: int, new_tokens: int, prompt_tokens: int,
            max_tokens: int | None, peers: list[str], source: str | None, device: str, threads: int, as_json: bool,
            markdown: str | None, plot: str | None) -> None:
    """Compare MODELS (and peer engines) against REF on one text: size, perplexity, agreement, KL, speed.

    Classifier dirs (export --task, and quantize of one) are compared on --labelled FILE.jsonl instead: accuracy,
    agreement and KL with REF over the labels, per-label confusion, size, examples/s at batch 1 and 32."""
    from gptedge.measure.compare import check_comparable, markdown_table  # deferred: numpy, not needed at --help
    from gptedge.measure.compare import compare as run_compare

    if any_classifier((ref, *models)):
        check_options(ctx, text_file)
        if not labelled_file:
            raise click.UsageError("classifier dirs are compared on --labelled FILE.jsonl (one labelled example "
                                   "a line)")
        labelled_inputs = (ref, *models, labelled_file)
        if markdown:
            check_output_file(markdown, labelled_inputs)
        compare_labelled((ref, *models), labelled_file, repeats, device, threads, as_json, markdown, labelled_inputs)
        return
    if labelled_file:
        for d in (ref, *models):  # a mistyped dir says so, not that it is no classifier
            if not Path(d).is_dir():
                raise ModelDirError(f"{d}: no such model directory")
        raise click.UsageError(f"--labelled takes classifier dirs (gptedge export --task); {ref} is not one: "
                               "compare language models on --text FILE")
    if not text_file:
        raise click.UsageError("Missing option '--text'.")
    if ctx.get_parameter_source("repeats") != click.core.ParameterSource.DEFAULT:
        raise click.UsageError("--repeats applies to classifier dirs (--labelled) only")
    checkpoint = peer_source(ref, source) if peers else None
    inputs = (ref, *models, text_file, checkpoint)  # no output may replace or land inside one
    for path in (markdown, plot):
        if path:
            check_output_file(path, inputs)
    if markdown and plot and Path(markdown).resolve() == Path(plot).resolve():
        raise click.UsageError("--markdown and --plot name the same file")
    if plot:
        import_extra("matplotlib", "plot")
    text = read_text(text_file)
    loaded = [runtime.load(m, device=device, session=runtime.SessionConfig(threads=threads)) for m in (ref, *models)]
    check_comparable(loaded, prompts, new_tokens)
    ids = loaded[0].encode_prompt(text)[:max_tokens]  # bos first where the tokenizer adds one, as eval
    opened = peer_score.open_peers(peers, checkpoint, Path(ref), threads,
                                   notify=diag) if peers else nullcontext(([], []))
    with opened as (scorers, skipped):
        for line in skipped:
            diag(line)
        rows = run_compare(loaded, ids, prompts=prompts, new_tokens=new_tokens, prompt_length=prompt_tokens,
                           progress=progress("comparing"), peers=scorers)
    context = min([m.manifest.shape.context_length for m in loaded])
    greedy = f"{prompts} prompts x ({min(prompt_tokens, context - new_tokens - 1)} + {new_tokens}) tokens"
    table = markdown_table(rows, len(ids), text_file, greedy)
    if as_json:
        click.echo(json.dumps([r.to_dict() for r in rows], indent=2))
    else:
        click.echo(table, nl=False)
    if markdown:
        with atomic_output_file(markdown, inputs) as tmp:
            tmp.write_text(table, encoding="utf-8")
        diag(f"wrote {markdown}")
    if plot:
        with atomic_output_file(plot, inputs) as tmp:
            plot_compare(rows, tmp, f"gptedge compare on {text_file} ({len(ids):,} tokens)")
        diag(f"wrote {plot}")
