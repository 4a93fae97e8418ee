"""`gptedge generate`: continue a prompt; the text on stdout as it comes, timings on stderr."""

from __future__ import annotations

import json

import click

from gptedge import runtime
from gptedge.runtime.generation.generation_options import EMPTY_STOP, BeamOptions, SamplingParams
from gptedge.sample import sample_model_dir

from .group import command
from .options import count, device_option, diag, grouped, threads_option, utf8_text

sampling_options = grouped(
    "sampling", SamplingParams,
    click.option("--top-k", default=0, show_default=True, type=count(0), help="0: off."),
    click.option("--top-p", default=1.0, show_default=True, type=float, help="In (0, 1]; 1.0: off."),
    click.option("--temperature", default=1.0, show_default=True, type=float, help="0: greedy."),
    click.option("--repetition-penalty", default=1.0, show_default=True, type=float, help="> 0; 1.0: off."),
    click.option("--seed", default=None, type=count(0), help="Makes sampling reproducible."),
    click.option("--greedy", is_flag=True, help="Always the most likely token."),
)


def _beam_options(num_beams: int, length_penalty: float, early_stopping: str, num_return_sequences: int) -> BeamOptions:
    return BeamOptions(num_beams, length_penalty, {"true": True, "false": False}.get(early_stopping, early_stopping),
                       num_return_sequences)


beam_options = grouped(
    "beams", _beam_options,
    click.option("--num-beams", default=1, show_default=True, type=count(1),
                 help="Beam search over N beams (as transformers' generate(num_beams=N)); 1: sample or greedy."),
    click.option("--length-penalty", default=1.0, show_default=True, type=float,
                 help="Beams: scores are log-probability sums / length ** this."),
    click.option("--early-stopping", type=click.Choice(["false", "true", "never"]), default="false", is_flag=False,
                 flag_value="true", show_default=True,
                 help="Beams: stop once N hypotheses are done (true), or never early."),
    click.option("--num-return-sequences", default=1, show_default=True, type=count(1),
                 help="Beams: how many of the best sequences to print (<= --num-beams)."),
)


def _print_beams(loaded, prompt: str, max_new_tokens: int, beams: BeamOptions, as_json: bool) -> None:
    """Beam search: every returned sequence, best first (its text on stdout, its score on stderr)."""
    result = loaded.beam_search([prompt], max_new_tokens, beams.num_beams, beams.length_penalty, beams.early_stopping,
                                beams.num_return_sequences)[0]
    if as_json:
        click.echo(json.dumps({"prompt": prompt, "prompt_ids": result.prompt_ids, "sequences": [
            {"ids": ids, "text": text, "score": score}
            for ids, text, score in zip(result.sequences, result.texts, result.scores, strict=True)]},
                              ensure_ascii=False))
        return
    for k, (text, score) in enumerate(zip(result.texts, result.scores, strict=True)):
        diag(f"beam {k + 1} of {len(result.texts)}: score {score:.4f}")
        click.echo(text)


def stop_strings(ctx, param, value):
    """click callback: --stop values are UTF-8 text and never empty (the API's and the server's rule)."""
    if "" in utf8_text(ctx, param, value):
        raise click.BadParameter(EMPTY_STOP, ctx=ctx, param=param)
    return value


@command()
@click.argument("model", required=False, type=click.Path(path_type=str))
@click.option("-p", "--prompt", required=True, callback=utf8_text, help="Text to continue (valid UTF-8).")
@click.option("-n", "--max-new-tokens", default=64, show_default=True, type=count(1))
@sampling_options
@click.option("--stop", multiple=True, callback=stop_strings, help="Stop string (repeatable); the text ends before it.")
@device_option
@threads_option
@beam_options
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of streaming text.")
def generate(model: str | None, prompt: str, max_new_tokens: int, sampling: SamplingParams, stop: tuple[str, ...],
             device: str, threads: int, beams: BeamOptions, as_json: bool) -> None:
    """Continue PROMPT with the model in MODEL (default: the shipped sample model); text on stdout, timings on
    stderr."""
    if beams.num_beams == 1 and beams.num_return_sequences > 1:
        raise click.UsageError("--num-return-sequences needs --num-beams of at least as many")
    if beams.num_beams > 1 and (stop or sampling != SamplingParams()):
        raise click.UsageError("--num-beams takes no sampling options, repetition penalty or --stop")
    model = str(sample_model_dir()) if model is None else model
    loaded = runtime.load(model, device=device, session=runtime.SessionConfig(threads=threads))
    _ = loaded.tokenizer  # fail on a missing tokenizer before anything is printed
    diag(f"loaded {model} ({loaded.manifest.precision}) in {loaded.load_s:.2f}s on {', '.join(loaded.providers)}")
    if beams.num_beams > 1:
        return _print_beams(loaded, prompt, max_new_tokens, beams, as_json)
    if as_json:
        result = loaded.generate(prompt, max_new_tokens=max_new_tokens, stop=stop, sampling=sampling)
        click.echo(json.dumps({"prompt": prompt, **result.to_dict()}, ensure_ascii=False))
    else:
        stream = loaded.stream(prompt, max_new_tokens=max_new_tokens, stop=stop, sampling=sampling)
        for piece in stream:
            click.echo(piece, nl=False)
        click.echo()
        result = stream.result
    diag(f"{len(result.ids)} tokens, stop: {result.stop}; first token {result.time_to_first_token_s * 1000:.0f} ms, "
         f"decode {result.tokens_per_s:.1f} tok/s")
