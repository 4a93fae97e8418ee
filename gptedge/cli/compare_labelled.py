"""`gptedge compare ... --labelled FILE.jsonl`: classifier dirs on a labelled set (gptedge/measure/classify_compare.py
measures; this formats): one table, then each dir's confusion matrix."""

from __future__ import annotations

import json
from pathlib import Path

import click

from gptedge import runtime
from gptedge.atomic import atomic_output_file
from gptedge.runtime.errors import GptEdgeError

from .options import diag, progress, read_text

# compare's options that only language models take: (parameter name, the option as typed)
LM_ONLY = (("prompts", "--prompts"), ("new_tokens", "--new-tokens"), ("max_tokens", "--max-tokens"),
           ("peers", "--peers"), ("source", "--source"), ("plot", "--plot"))


def any_classifier(dirs: tuple[str, ...]) -> bool:
    """Whether any dir's manifest names a task. A dir whose manifest cannot be read counts as neither: the
    language-model path reports it as it always has, the classifier path reads every manifest strictly."""
    for d in dirs:
        try:
            if runtime.read_manifest(d).task is not None:
                return True
        except (GptEdgeError, OSError):
            continue
    return False


def check_options(ctx: click.Context, text_file: str | None) -> None:
    """Classifier dirs take --labelled, not --text nor the language-model options (refused, not ignored)."""
    if text_file:
        raise click.UsageError("classifier dirs are compared on --labelled FILE.jsonl, not --text")
    given = [flag for name, flag in LM_ONLY
             if ctx.get_parameter_source(name) not in (click.core.ParameterSource.DEFAULT, None)]
    if given:
        raise click.UsageError(f"{', '.join(given)} applies to language-model dirs only, not to classifier dirs")


def markdown_report(rows, labelled_name: str, repeats: int) -> str:
    """The table, how it was measured, and each dir's confusion matrix (rows gold, columns predicted)."""
    ref = Path(rows[0].model).name
    lines = [f"Compared on {labelled_name} ({rows[0].examples:,} labelled examples, task {rows[0].task}); "
             f"reference: {ref} (agreement and KL are against it)", "",
             "| model | method | size MB | accuracy | agree with ref | KL(ref‖model) | ex/s batch 1 "
             "| ex/s batch 32 |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {Path(r.model).name} | {r.method} | {r.size_bytes / 1e6:.2f} | {100 * r.accuracy:.2f} % | "
                     f"{100 * r.agreement:.2f} % | {r.kl:.3g} | {r.examples_per_s_batch1:.1f} | "
                     f"{r.examples_per_s_batch32:.1f} |")
    lines += ["", "KL(ref‖model): mean over the examples, softmax over the labels (choices), nats. ex/s: examples a "
              f"second, the median of {repeats} timed passes over every example after one warm-up run, tokenization "
              "not timed; batch B is B examples a run (similarity: 2B rows; multiple choice: B examples of N choices)."]
    for r in rows:
        lines += ["", f"Confusion, {Path(r.model).name} (rows gold, columns predicted):", "",
                  "| gold \\ predicted | " + " | ".join(r.labels) + " |",
                  "|---|" + "---:|" * len(r.labels)]
        lines += [f"| {label} | " + " | ".join(str(c) for c in counts) + " |"
                  for label, counts in zip(r.labels, r.confusion, strict=True)]
    return "\n".join(lines) + "\n"


def compact_report(rows, labelled_name: str, repeats: int) -> str:
    """What stdout shows: the markdown table, then each dir's confusion matrix on one line."""
    table = markdown_report(rows, labelled_name, repeats).split("\n\nConfusion", 1)[0]
    lines = [table, "", f"confusion (rows gold, columns predicted: {', '.join(rows[0].labels)}):"]
    width = max(len(Path(r.model).name) for r in rows)
    lines += [f"  {Path(r.model).name:<{width}}  " + " ".join("[" + " ".join(map(str, c)) + "]" for c in r.confusion)
              for r in rows]
    return "\n".join(lines) + "\n"


def compare_labelled(dirs: tuple[str, ...], labelled_file: str, repeats: int, device: str, threads: int,
                     as_json: bool, markdown: str | None, inputs: tuple) -> None:
    """Everything is checked (kinds, tasks, label sets, every labelled line) before a model is loaded."""
    from gptedge.measure.classify_compare import check_classifier_dirs, compare_classifiers, read_labelled

    task = check_classifier_dirs([(d, runtime.read_manifest(d)) for d in dirs])
    labelled = read_labelled(task, read_text(labelled_file), labelled_file)
    session = runtime.SessionConfig(threads=threads)
    loaded = [runtime.load_classifier(d, device=device, session=session) for d in dirs]
    rows = compare_classifiers(loaded, labelled, repeats=repeats, progress=progress("comparing"))
    if as_json:
        click.echo(json.dumps([r.to_dict() for r in rows], indent=2))
    else:
        click.echo(compact_report(rows, labelled_file, repeats), nl=False)
    if markdown:
        with atomic_output_file(markdown, inputs) as tmp:
            tmp.write_text(markdown_report(rows, labelled_file, repeats), encoding="utf-8")
        diag(f"wrote {markdown}")
