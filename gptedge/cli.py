"""The `gptedge` command: generated text on stdout, diagnostics (load time, tok/s, provider) on stderr."""

from __future__ import annotations

import functools
import json
import logging
import os
import sys
from pathlib import Path

import click

from gptedge import __version__
from gptedge.runtime.errors import GptEdgeError

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


def one_line_errors(fn):
    """Library errors become one-line click errors; nothing else is swallowed."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except GptEdgeError as e:
            raise click.ClickException(str(e)) from None

    return wrapper


def import_extra(module: str, extra: str):
    """Import a part that needs an extra (torch, onnx); a one-line hint when it is missing."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise click.ClickException(f"{e.name or e} is not installed: this command needs "
                                   f"pip install torch==2.13.0 'gptedge[{extra}]'") from None


def diag(message: str) -> None:
    click.echo(message, err=True)


@click.group(context_settings=CONTEXT)
@click.version_option(__version__, "--version", prog_name="gptedge")
@click.option("-v", "--verbose", is_flag=True, help="Log progress to stderr.")
def main(verbose: bool) -> None:
    """Export GPT-2 / GPT to ONNX, quantize it, and generate with ONNX Runtime."""
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, stream=sys.stderr,
                        format="%(levelname)s %(name)s: %(message)s")


@main.command(context_settings=CONTEXT)
@click.argument("source", type=click.Path(file_okay=False, path_type=str))
@click.option("-o", "--out", required=True, type=click.Path(path_type=str), help="Model directory to write.")
@click.option("--force", is_flag=True, help="Replace OUT if it exists (only once the new one is complete).")
@click.option("--opset", default=17, show_default=True, type=int, help="ONNX opset (>= 17).")
@click.option("--plain-ops", is_flag=True,
              help="Standard ONNX ops only (no ONNX Runtime contrib ops such as MultiHeadAttention).")
@click.option("--graph", "graph_variant", type=click.Choice(["standard", "kv_buffer"]), default="standard",
              show_default=True, help="kv_buffer: GPT-2 only, an in-place KV cache (faster decode, not Optimum's contract).")
@one_line_errors
def export(source: str, out: str, force: bool, opset: int, plain_ops: bool, graph_variant: str) -> None:
    """Export a local HF checkpoint dir (GPT2LMHeadModel / OpenAIGPTLMHeadModel) to a model dir, then validate it."""
    exporter = import_extra("gptedge.export.exporter", "export")
    manifest = exporter.export_checkpoint(source, out, force=force, opset=opset, fused=not plain_ops,
                                          graph_variant=graph_variant)
    graph, greedy = manifest.parity.graph_vs_reference, manifest.parity.greedy_vs_reference
    diag(f"exported {source} -> {out}: graph vs reference max |diff| {graph.max_abs_diff:.2e} "
         f"({graph.output}, {graph.step}), top-1 {graph.top1_agreement:.2%}; "
         f"greedy {greedy.tokens_compared} tokens identical over {greedy.prompts} prompts")


def _sampling_options(fn):
    for opt in reversed([
        click.option("-n", "--max-new-tokens", default=64, show_default=True, type=int),
        click.option("--top-k", default=0, show_default=True, type=int, help="0: off."),
        click.option("--top-p", default=1.0, show_default=True, type=float, help="1.0: off."),
        click.option("--temperature", default=1.0, show_default=True, type=float, help="0: greedy."),
        click.option("--repetition-penalty", default=1.0, show_default=True, type=float, help="1.0: off."),
        click.option("--seed", default=None, type=int, help="Makes sampling reproducible."),
        click.option("--greedy", is_flag=True, help="Always the most likely token."),
        click.option("--stop", multiple=True, help="Stop string (repeatable); the text ends before it."),
        click.option("--device", default="auto", show_default=True, help="cpu, cuda or auto."),
        click.option("--threads", default=None, type=int, help="ONNX Runtime intra-op threads."),
    ]):
        fn = opt(fn)
    return fn


@main.command(context_settings=CONTEXT)
@click.argument("model", required=False, type=click.Path(path_type=str))
@click.option("-p", "--prompt", required=True, help="Text to continue.")
@_sampling_options
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of streaming text.")
@one_line_errors
def generate(model: str, prompt: str, max_new_tokens: int, top_k: int, top_p: float, temperature: float,
             repetition_penalty: float, seed: int | None, greedy: bool, stop: tuple[str, ...], device: str,
             threads: int | None, as_json: bool) -> None:
    """Continue PROMPT with the model in MODEL (default: the shipped sample model); text on stdout, timings on stderr."""
    from gptedge.runtime import SessionConfig, load

    if model is None:
        from gptedge.sample import sample_model_dir

        model = str(sample_model_dir())

    loaded = load(model, device=device, session=SessionConfig(threads=threads))
    loaded.tokenizer  # fail on a missing tokenizer before anything is printed
    diag(f"loaded {model} ({loaded.manifest.precision}) in {loaded.load_s:.2f}s on {', '.join(loaded.providers)}")
    sampling = dict(top_k=top_k, top_p=top_p, temperature=temperature, repetition_penalty=repetition_penalty,
                    seed=seed, greedy=greedy)
    if as_json:
        result = loaded.generate(prompt, max_new_tokens=max_new_tokens, stop=stop, **sampling)
        click.echo(json.dumps({"prompt": prompt, **result.to_dict()}, ensure_ascii=False))
    else:
        stream = loaded.stream(prompt, max_new_tokens=max_new_tokens, stop=stop, **sampling)
        for piece in stream:
            click.echo(piece, nl=False)
        click.echo()
        result = stream.result
    diag(f"{len(result.ids)} tokens, stop: {result.stop}; first token {result.time_to_first_token_s * 1000:.0f} ms, "
         f"decode {result.tokens_per_s:.1f} tok/s")


def _progress(label: str):
    """A progress bar on stderr, driven by the library's (done, total) callbacks."""
    state = {}

    def update(done: int, total: int) -> None:
        if "bar" not in state:
            state["bar"] = click.progressbar(length=total, label=label, file=sys.stderr)
            state["bar"].__enter__()
            state["seen"] = 0
        state["bar"].update(done - state["seen"])
        state["seen"] = done
        if done >= total:
            state.pop("bar").__exit__(None, None, None)

    return update


def _read_text(path: str) -> str:
    try:
        return open(path, encoding="utf-8").read()
    except UnicodeDecodeError as e:
        raise click.ClickException(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except OSError as e:
        raise click.ClickException(f"{path}: {e.strerror}") from None


@main.command(context_settings=CONTEXT)
@click.argument("model", type=click.Path(path_type=str))
@click.option("-o", "--out", required=True, type=click.Path(path_type=str), help="Model directory to write.")
@click.option("--method", required=True, help="dynamic | static | weight-only")
@click.option("--per-channel/--per-tensor", default=True, show_default=True, help="Weight scales (dynamic, static).")
@click.option("--block-size", default=32, show_default=True, type=int, help="Weight-only: weights per scale.")
@click.option("--accuracy-level", default=4, show_default=True, type=int,
              help="Weight-only: 4 quantizes activations per block inside the kernel (fast); 0 keeps them "
                   "float (slightly more exact, far slower on CPU).")
@click.option("--quantize-attention", is_flag=True, help="Also quantize QK^T and PV (activation products).")
@click.option("--calibration", type=click.Path(dir_okay=False, path_type=str), help="Static: calibration text file.")
@click.option("--calibration-sequences", default=32, show_default=True, type=int)
@click.option("--calibration-length", default=128, show_default=True, type=int, help="Tokens per sequence.")
@click.option("--force", is_flag=True, help="Replace OUT if it exists.")
@one_line_errors
def quantize(model: str, out: str, method: str, per_channel: bool, block_size: int, accuracy_level: int,
             quantize_attention: bool, calibration: str | None, calibration_sequences: int, calibration_length: int,
             force: bool) -> None:
    """Write an INT8 variant of the fp32 model dir MODEL into OUT; the manifest records the recipe."""
    q = import_extra("gptedge.quantize.quantizer", "quantize")
    recipe = q.QuantizeRecipe(method=method, per_channel=per_channel, block_size=block_size,
                              accuracy_level=accuracy_level, quantize_attention=quantize_attention,
                              calibration_sequences=calibration_sequences, calibration_length=calibration_length)
    text = _read_text(calibration) if calibration else None
    manifest = q.quantize_model_dir(model, out, recipe, force=force, calibration_text=text,
                                    progress=_progress("calibrating"))
    check = manifest.parity.vs_fp32
    diag(f"quantized {model} -> {out} ({method}): {sum(manifest.quantization.quantized_nodes.values())} nodes "
         f"quantized; vs fp32 on seeded ids: top-1 {check.top1_agreement:.2%}, "
         f"max |logit diff| {check.max_abs_logit_diff:.3g}")


@main.command(name="eval", context_settings=CONTEXT)
@click.argument("model", type=click.Path(path_type=str))
@click.option("--text", "text_file", required=True, type=click.Path(dir_okay=False, path_type=str))
@click.option("--stride", default=None, type=int, help="Sliding-window stride (default: half the context).")
@click.option("--device", default="auto", show_default=True, help="cpu, cuda or auto.")
@click.option("--json", "as_json", is_flag=True)
@one_line_errors
def eval_(model: str, text_file: str, stride: int | None, device: str, as_json: bool) -> None:
    """Perplexity of MODEL over the whole of a text file."""
    from gptedge.runtime import load
    from gptedge.runtime.evaluate import perplexity

    loaded = load(model, device=device)
    ids = loaded.encode(_read_text(text_file))
    result = perplexity(loaded, ids, stride, progress=_progress("evaluating"))
    if as_json:
        click.echo(json.dumps({"model": model, "text": text_file, **result.to_dict()}))
    else:
        click.echo(f"perplexity {result.perplexity:.4f} over {result.tokens:,} tokens "
                   f"({result.tokens_per_s:,.0f} tokens/s)")


@main.command(context_settings=CONTEXT)
@click.argument("ref", type=click.Path(path_type=str))
@click.argument("models", nargs=-1, type=click.Path(path_type=str))
@click.option("--text", "text_file", required=True, type=click.Path(dir_okay=False, path_type=str))
@click.option("--prompts", default=8, show_default=True, type=int, help="Greedy agreement: number of prompts.")
@click.option("--new-tokens", default=32, show_default=True, type=int, help="Greedy agreement: tokens per prompt.")
@click.option("--max-tokens", default=None, type=int, help="Use only the first N tokens of the text.")
@click.option("--device", default="cpu", show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the rows as a JSON list.")
@click.option("--markdown", type=click.Path(dir_okay=False, path_type=str), help="Also write the table here.")
@click.option("--plot", type=click.Path(dir_okay=False, path_type=str), help="Also draw size vs Δppl and speed (PNG).")
@one_line_errors
def compare(ref: str, models: tuple[str, ...], text_file: str, prompts: int, new_tokens: int, max_tokens: int | None,
            device: str, as_json: bool, markdown: str | None, plot: str | None) -> None:
    """Compare MODELS against REF on one text: size, perplexity, agreement, KL, speed."""
    from gptedge.runtime import load
    from gptedge.runtime.compare import compare as run_compare
    from gptedge.runtime.compare import markdown_table
    from gptedge.runtime.manifest import write_text_atomic

    loaded = [load(m, device=device) for m in (ref, *models)]
    ids = loaded[0].encode(_read_text(text_file))[: max_tokens or None]
    rows = run_compare(loaded, ids, prompts=prompts, new_tokens=new_tokens, progress=_progress("comparing"))
    table = markdown_table(rows, len(ids), text_file)
    if as_json:
        click.echo(json.dumps([r.to_dict() for r in rows], indent=2))
    else:
        click.echo(table, nl=False)
    if markdown:
        write_text_atomic(markdown, table)
        diag(f"wrote {markdown}")
    if plot:
        from gptedge.runtime.plot import plot_compare

        plot_compare(rows, plot, f"gptedge compare on {text_file} ({len(ids):,} tokens)")
        diag(f"wrote {plot}")


def _peer_source(model_dir: str, source: str | None) -> Path:
    """The HF checkpoint the peers load: --source, or what the manifest says the model came from."""
    from gptedge.runtime.manifest import read_manifest

    if source:
        return Path(source)
    path = read_manifest(model_dir).source.checkpoint
    if not path or not Path(path, "config.json").is_file():
        raise click.ClickException(f"{model_dir}: no HF checkpoint recorded for the peers; pass --source DIR")
    return Path(path)


@main.command(context_settings=CONTEXT)
@click.argument("models", nargs=-1, required=True, type=click.Path(path_type=str))
@click.option("--prompt", "prompt_len", default=32, show_default=True, type=int, help="Prompt tokens.")
@click.option("--new", "new_tokens", default=128, show_default=True, type=int, help="New tokens (greedy).")
@click.option("--batch", default=1, show_default=True, type=int)
@click.option("--context", default=None, type=int, help="Decode up to this many tokens: prompt = CONTEXT - NEW.")
@click.option("--threads", default=2, show_default=True, type=int)
@click.option("--repeat", default=3, show_default=True, type=int, help="Timed runs per row (median reported).")
@click.option("--peers", default="", help="Comma list of torch, optimum, ctranslate2 (same weights, same run).")
@click.option("--source", type=click.Path(file_okay=False, path_type=str), help="HF checkpoint for the peers.")
@click.option("--device", default="cpu", show_default=True)
@click.option("--json", "as_json", is_flag=True)
@one_line_errors
def bench(models: tuple[str, ...], prompt_len: int, new_tokens: int, batch: int, context: int | None, threads: int,
          repeat: int, peers: str, source: str | None, device: str, as_json: bool) -> None:
    """Decode speed of MODELS (and peers) side by side: load time, first token, tok/s, peak RSS."""
    import platform

    from gptedge.runtime.bench import bench_gptedge, bench_prompts
    from gptedge.runtime.manifest import read_manifest

    shape = read_manifest(models[0]).shape
    if context:
        prompt_len = context - new_tokens
    if prompt_len < 1 or prompt_len + new_tokens > shape.context_length:
        raise click.ClickException(f"prompt {prompt_len} + new {new_tokens} tokens do not fit the context "
                                   f"of {shape.context_length}")
    prompts = bench_prompts(shape.vocab_size, batch, prompt_len)
    rows = [bench_gptedge(m, prompts, new_tokens, threads, repeat, device, name=f"gptedge {Path(m).name}")
            for m in models]
    peer_names = [p.strip() for p in peers.split(",") if p.strip()]
    if peer_names:
        from gptedge.peers import bench_peers

        rows += bench_peers(peer_names, _peer_source(models[0], source), Path(models[0]), prompts, new_tokens,
                            threads, repeat)
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
        click.echo(f"| {r.name} | {r.load_s:.2f} | {1000 * r.ttft_s:.1f} | {r.decode_tok_s:.1f} | {r.peak_rss_mb:.0f} | {r.notes} |")


@main.command(context_settings=CONTEXT)
@click.argument("model", type=click.Path(path_type=str))
@click.option("--device", default="auto", show_default=True, help="cpu, cuda or auto.")
@one_line_errors
def info(model: str, device: str) -> None:
    """Print the manifest of MODEL and the execution providers available and used."""
    from gptedge.runtime import load
    from gptedge.runtime.session import available_providers

    loaded = load(model, device=device)
    click.echo(json.dumps({"model_dir": model, "manifest": loaded.manifest.to_dict(),
                           "providers_available": available_providers(), "providers_used": loaded.providers},
                          indent=2))


from gptedge.serve.command import serve  # noqa: E402  (its own module; starlette/uvicorn load inside it)
main.add_command(serve)

if __name__ == "__main__":
    main()
