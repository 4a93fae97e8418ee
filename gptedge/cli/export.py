"""`gptedge export`: a checkpoint (a local HF dir or a Hub id) to a validated model dir; --precision fp16 halves it."""

from __future__ import annotations

import json
from pathlib import Path

import click

from gptedge.atomic import check_output, scratch_dir
from gptedge.runtime.contract import GRAPH_STANDARD
from gptedge.runtime.modeldir.recipe import QuantizeRecipe
from gptedge.runtime.registry import GRAPH_VARIANTS, TASKS

from .group import command
from .options import FORCE_HELP, RegistryChoice, count, diag, import_extra, registry_choice

LM = "lm"  # --task lm: a head checkpoint's language model, the head left out
SEQUENCE_HEAD, DOUBLE_HEADS = "ForSequenceClassification", "DoubleHeadsModel"


def special_tokens(ctx, param, value: tuple[str, ...]) -> dict[str, str | int]:
    """click callback: ROLE=TOKEN pairs -> {role: token text, or an id where TOKEN is all digits}."""
    out: dict[str, str | int] = {}
    for item in value:
        role, sep, token = item.partition("=")
        if not sep or not token:
            raise click.BadParameter(f"{item!r} is not ROLE=TOKEN (start, delimiter or extract)", ctx=ctx, param=param)
        out[role.strip()] = int(token) if token.isdigit() else token
    return out


@command()
@click.argument("source", type=click.Path(file_okay=False, path_type=str))
@click.option("-o", "--out", required=True, type=click.Path(path_type=str), help="Model directory to write.")
@click.option("--force", is_flag=True, help=FORCE_HELP)
@click.option("--opset", default=17, show_default=True, type=count(17), help="ONNX opset (>= 17).")
@click.option("--plain-ops", is_flag=True,
              help="Standard ONNX ops only (no ONNX Runtime contrib ops such as MultiHeadAttention).")
@click.option("--graph", "graph_variant", type=registry_choice(GRAPH_VARIANTS), default=GRAPH_STANDARD,
              show_default=True,
              help="kv_buffer: an in-place KV cache (faster decode, not Optimum's contract; GPT-2 and the "
                   "rotary families, not the original GPT).")
@click.option("--revision", default=None, help="Hub SOURCE: branch, tag or commit (default: main).")
@click.option("--precision", type=click.Choice(["fp32", "fp16"]), default="fp32", show_default=True,
              help="fp16: the validated fp32 export, halved (as quantize --method fp16); for --device cuda.")
@click.option("--task", type=RegistryChoice(lambda: (*TASKS.names(), LM)), default=None,
              help="Export the checkpoint's fine-tuned head (*ForSequenceClassification: classification, entailment "
                   "or similarity; *DoubleHeadsModel: multiple-choice) as a classifier dir for `gptedge classify`; "
                   "lm: its language model only, the head left out. Default: what config.json's architectures say "
                   "(a head checkpoint is refused without --task).")
@click.option("--special-token", "special", multiple=True, callback=special_tokens, metavar="ROLE=TOKEN",
              help="With --task: the start / delimiter / extract token (text or id), where the checkpoint's "
                   "tokenizer_config.json does not declare it (bos_token / sep_token / cls_token). Repeatable.")
def export(source: str, out: str, force: bool, opset: int, plain_ops: bool, graph_variant: str,
           revision: str | None, precision: str, task: str | None, special: dict) -> None:
    """Export a GPT-2 / GPT / Llama-style / GPT-NeoX checkpoint to a model dir, then validate it.

    SOURCE: a local HF checkpoint dir, or a Hugging Face Hub id (gpt2, openai-community/gpt2-medium)."""
    check_output(out, force, inputs=[source])  # before importing torch, let alone loading
    dropped = _refuse_a_head_exported_as_lm(source) if task is None else None
    if task == LM:
        if special:
            raise click.UsageError("--special-token applies to --task exports of a head, not --task lm")
        task = None
    elif task is not None or special:
        return _export_task(source, out, force, opset, plain_ops, graph_variant, revision, precision, task, special)
    exporter = import_extra("gptedge.export.exporter", "export")
    if precision == "fp16":
        return _export_fp16(exporter, source, out, force, dict(opset=opset, fused=not plain_ops,
                                                               graph_variant=graph_variant, revision=revision))
    manifest = exporter.export_checkpoint(source, out, force=force, opset=opset, fused=not plain_ops,
                                          graph_variant=graph_variant, revision=revision)
    graph, greedy = manifest.parity.graph_vs_reference, manifest.parity.greedy_vs_reference
    diag(f"exported {source} -> {out}: graph vs reference max |diff| {graph.max_abs_diff:.2e} "
         f"({graph.output}, {graph.step}), top-1 {graph.top1_agreement:.2%}; "
         f"greedy {greedy.tokens_compared} tokens identical over {greedy.prompts} prompts")
    if dropped:
        diag(f"{source} is a {dropped}: its language model was exported, its multiple_choice_head left out "
             "(export it with --task multiple-choice)")


def _refuse_a_head_exported_as_lm(source: str) -> str | None:
    """A *ForSequenceClassification checkpoint (config.json's architectures) exported without --task would silently
    become a language model, its fine-tuned head dropped: refused, naming both ways out. A *DoubleHeadsModel is a
    language model and a head: its LM is exported, and the dropped head is returned to be said. (A Hub id is not
    read here.)"""
    try:
        config = json.loads((Path(source) / "config.json").read_text(encoding="utf-8"))
        archs = [a for a in config.get("architectures") or [] if isinstance(a, str)]
    except (OSError, ValueError, AttributeError, TypeError):
        return None  # not a local checkpoint, or no readable config: the exporter says what is wrong with it
    heads = [a for a in archs if a.endswith(SEQUENCE_HEAD)]
    if heads:
        raise click.UsageError(f"{source} is a {heads[0]} checkpoint (a fine-tuned head): export it with --task "
                               "classification (or entailment / similarity), or with --task lm for its language "
                               "model alone, the head left out")
    return next((a for a in archs if a.endswith(DOUBLE_HEADS)), None)


def _export_task(source: str, out: str, force: bool, opset: int, plain_ops: bool, graph_variant: str,
                 revision: str | None, precision: str, task: str | None, special: dict) -> None:
    if task is None:
        raise click.UsageError("--special-token applies to --task exports only")
    if graph_variant != GRAPH_STANDARD or precision != "fp32":
        raise click.UsageError("--task exports a classifier graph (no KV cache): --graph and --precision do not apply")
    heads = import_extra("gptedge.export.head_export", "export")
    manifest = heads.export_task(source, out, task=task, special=special, force=force, opset=opset,
                                 fused=not plain_ops, revision=revision)
    parity = manifest.parity.graph_vs_reference
    diag(f"exported {source} -> {out} ({manifest.task.name}, {manifest.task.head} head): head vs reference "
         f"max |diff| {parity.max_abs_diff:.2e} ({parity.output}), top-1 {parity.top1_agreement:.2%}")


def _export_fp16(exporter, source: str, out: str, force: bool, options: dict) -> None:
    """The fp32 export, checked against the PyTorch reference, in a scratch dir beside OUT; then halved into OUT."""
    q = import_extra("gptedge.quantize.quantizer", "quantize")
    with scratch_dir(out) as work:
        fp32 = exporter.export_checkpoint(source, work / "fp32", **options)
        graph = fp32.parity.graph_vs_reference
        diag(f"exported {source} (fp32): graph vs reference max |diff| {graph.max_abs_diff:.2e}, "
             f"top-1 {graph.top1_agreement:.2%}")
        check = q.quantize_model_dir(work / "fp32", out, QuantizeRecipe(method="fp16"), force=force,
                                     record_input=False).parity.vs_fp32
    diag(f"wrote {out} (fp16): vs fp32 ({check.device}) max |logit diff| {check.max_abs_logit_diff:.3g}, "
         f"top-1 {check.top1_agreement:.2%}, greedy {check.greedy_agreement:.0%} identical")
