"""`gptedge classify`: a classifier dir (export --task) on text, a pair, choices or a JSONL file; the labels and
their probabilities on stdout (one line an example, or JSON), timings on stderr."""

from __future__ import annotations

import json
import time

import click

from gptedge import runtime
from gptedge.runtime.modeldir.tasks import read_jsonl

from .group import command
from .options import count, device_option, diag, read_text, threads_option, utf8_text


def _examples(text: str | None, pair: tuple[str, str] | None, choices: tuple[str, ...], jsonl: str | None) -> list:
    given = [name for name, v in (("TEXT", text), ("--pair", pair), ("--jsonl", jsonl)) if v]
    if len(given) != 1 or (choices and not text):
        raise click.UsageError("give one of TEXT (with --choice for multiple choice), --pair A B or --jsonl FILE")
    if jsonl:
        return read_jsonl(read_text(jsonl), jsonl)
    if pair:
        return [list(pair)]
    return [[text, list(choices)]] if choices else [text]


def _line(result) -> str:
    """'label  0.8123  (other 0.1500, third 0.0377)': the best label first, then the others, most likely first."""
    ranked = sorted(zip(result.labels, result.probabilities, strict=True), key=lambda lp: -lp[1])
    rest = ", ".join(f"{label} {p:.4f}" for label, p in ranked[1:])
    return f"{ranked[0][0]}\t{ranked[0][1]:.4f}" + (f"\t({rest})" if rest else "")


@command()
@click.argument("model", type=click.Path(path_type=str))
@click.argument("text", required=False, callback=utf8_text)
@click.option("--pair", nargs=2, default=None, callback=utf8_text, metavar="A B",
              help="Two texts: premise and hypothesis (entailment) or the two sentences (similarity).")
@click.option("--choice", "choices", multiple=True, callback=utf8_text,
              help="Multiple choice: one answer to TEXT (the context). Repeat for each answer.")
@click.option("--jsonl", type=click.Path(dir_okay=False, path_type=str), default=None,
              help="One JSON object a line with the task's fields (text; premise, hypothesis; a, b; context, "
                   "choices).")
@click.option("--batch-size", default=32, show_default=True, type=count(1), help="Rows per ONNX Runtime run.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object an example: label, probabilities, logits.")
@device_option
@threads_option
def classify(model: str, text: str | None, pair: tuple[str, str] | None, choices: tuple[str, ...],
             jsonl: str | None, batch_size: int, as_json: bool, device: str, threads: int) -> None:
    """Classify TEXT (or --pair A B, or TEXT with --choice ..., or --jsonl FILE) with the classifier dir MODEL.

    MODEL is a dir `gptedge export --task` wrote (or quantize made from one); its manifest says the task and how
    an example becomes token rows (start / delimiter / extract tokens; similarity's two orders; one row a choice)."""
    examples = _examples(text, pair, choices, jsonl)
    clf = runtime.load_classifier(model, device=device, session=runtime.SessionConfig(threads=threads))
    started = time.perf_counter()
    results = clf.classify_batch(examples, batch_size=batch_size)
    elapsed = time.perf_counter() - started
    for result in results:
        click.echo(json.dumps(result.to_dict(), ensure_ascii=False) if as_json else _line(result))
    diag(f"{clf.manifest.task.name}: {len(results)} examples in {elapsed:.3f}s "
         f"({len(results) / max(elapsed, 1e-9):.1f}/s), load {clf.load_s:.2f}s, {clf.providers[0]}")
