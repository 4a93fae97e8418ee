"""`gptedge quantize`: an INT8 (weight-only INT4, or fp16) variant of an fp32 model dir.

The options make one QuantizeRecipe (runtime/modeldir/recipe.py), the record the manifest keeps: the recipe's own
checks refuse what a method cannot store; what is left here is about the command line itself (an option
given to a method whose registry line says it takes none, a calibration file for a method that needs one).
"""

from __future__ import annotations

import dataclasses

import click

from gptedge.atomic import check_output
from gptedge.runtime.errors import GptEdgeError
from gptedge.runtime.modeldir.kv_cache import DEFAULT_KV_CACHE, KV_CACHES
from gptedge.runtime.modeldir.manifest import read_manifest
from gptedge.runtime.modeldir.recipe import ACTIVATION_SCALES, SCALE_SEARCHES, QuantizeRecipe
from gptedge.runtime.modeldir.tokenizer import encode, load_tokenizer
from gptedge.runtime.registry import QUANTIZATION_METHODS

from .group import command
from .options import FORCE_HELP, count, diag, grouped, import_extra, progress, read_text, registry_choice

# Options the recipe always carries a default for, by the methods that read them: given on the command line to
# any other method they would do nothing, so they are refused (exit 2) rather than silently ignored.
_READ_BY = {"per_channel": ("--per-channel/--per-tensor", ("dynamic", "static")),
            "reduce_range": ("--reduce-range/--full-range", ("dynamic",)),
            "activation_scale": ("--activation-scale", ("dynamic",)),
            "block_size": ("--block-size", ("weight-only",)), "accuracy_level": ("--accuracy-level", ("weight-only",)),
            "scale_search": ("--scale-search", ("weight-only",)), "awq": ("--awq", ("weight-only",)),
            "keep_8bit": ("--keep-8bit", ("weight-only",)), "rotate_down": ("--rotate-down", ("weight-only",))}

# Options that only some methods take, and which (from their registry lines).
_TAKEN_BY = {"--bits": lambda e: len(e.bits) > 1, "--embedding-bits": lambda e: len(e.bits) > 1,
             "--symmetric/--asymmetric": lambda e: e.asymmetric, "--float16": lambda e: e.float16}


def _recipe(method: str | None, bits: str | None, embedding_bits: str | None, symmetric: bool | None, float16: bool,
            keep_8bit: tuple[str, ...], **fields) -> QuantizeRecipe | None:
    if method is None:  # --kv-cache alone: the weights stay fp32 (checked in the command)
        return None
    entry = QUANTIZATION_METHODS.entry(method)
    for flag, value in (("--bits", bits), ("--symmetric/--asymmetric", symmetric),
                        ("--embedding-bits", embedding_bits), ("--float16", float16 or None)):
        if value is not None and not _TAKEN_BY[flag](entry):
            takers = QUANTIZATION_METHODS.names(_TAKEN_BY[flag])
            raise click.UsageError(f"{flag} applies to --method {' or '.join(takers)} only")
    return QuantizeRecipe(method=method, bits=int(bits) if bits else None, symmetric=symmetric, float16=float16,
                          embedding_bits=int(embedding_bits) if embedding_bits else None, keep_8bit=tuple(keep_8bit),
                          **fields)


recipe_options = grouped(
    "recipe", _recipe,
    click.option("--method", type=registry_choice(QUANTIZATION_METHODS),
                 help="fp16: no integers, every float halved (GPUs; the CUDA provider's attention needs it). "
                      "Required unless --kv-cache is given (then the weights stay fp32)."),
    click.option("--per-channel/--per-tensor", default=True, show_default=True,
                 help="Weight scales (dynamic, static)."),
    click.option("--block-size", default=32, show_default=True, type=count(1), help="Weight-only: weights per scale."),
    click.option("--accuracy-level", default=4, show_default=True, type=click.IntRange(0, 4),
                 help="Weight-only: 4 quantizes activations per block inside the kernel (fast); 0 keeps them "
                      "float (slightly more exact, far slower on CPU)."),
    click.option("--bits", type=click.Choice(["8", "4"]), default=None,
                 help="Weight-only: bits per linear weight (MatMulNBits).  [default: 8]"),
    click.option("--symmetric/--asymmetric", default=None,
                 help="Weight-only 4-bit: zero point 8, or a 4-bit zero point per block.  [default: asymmetric]"),
    click.option("--embedding-bits", type=click.Choice(["8", "4"]), default=None,
                 help="Weight-only: bits of the tied embedding / LM head.  [default: 8]"),
    click.option("--keep-8bit", "keep_8bit", multiple=True, metavar="PATTERN",
                 help="Weight-only 4-bit: keep the linears this glob names at 8 bits (repeatable; the same names "
                      "in every family: h.N.attention.{qkv,q,k,v,o}, h.N.mlp.{gate,up,down}, so '*.mlp.down' is "
                      "every block's MLP output; the graph's own names, e.g. GPT-2's h.3.mlp.c_proj, match too)."),
    click.option("--scale-search", type=click.Choice(SCALE_SEARCHES), default="range", show_default=True,
                 help="Weight-only: each block's scale (and zero point): range, from its min / max (a small clipping "
                      "grid at 4 bits); mse, the least squared error over a wider grid and refits. Same bytes."),
    click.option("--awq", is_flag=True,
                 help="Weight-only: activation-aware input-channel scales, measured on --calibration and folded "
                      "into the LayerNorm / RMSNorm (or a gated MLP's up projection) before each linear that reads "
                      "one (same graph, same bytes)."),
    click.option("--gptq", is_flag=True,
                 help="Weight-only: round each linear's weights by GPTQ's second-order updates on the activations "
                      "--calibration gives it (same graph, same bytes)."),
    click.option("--rotate-down", is_flag=True,
                 help="Weight-only: rotate each MLP down projection's input by a randomized Hadamard transform of "
                      "the block size (its weights by the inverse: the same function), so an outlier channel no "
                      "longer sets the rounding of its whole block. Three small ops a layer."),
    click.option("--float16", is_flag=True,
                 help="Weight-only: activations, scales and caches in fp16 (for --device cuda)."),
    click.option("--quantize-attention", is_flag=True, help="Also quantize QK^T and PV (activation products)."),
    click.option("--activation-scale", type=click.Choice(ACTIVATION_SCALES), default="per-row", show_default=True,
                 help="Dynamic: one activation scale per row (a sequence's tokens do not depend on its batch) or one "
                      "per tensor (one fused kernel)."),
    click.option("--reduce-range/--full-range", default=True, show_default=True,
                 help="Dynamic: 7-bit weights, so u8 x s8 sums never saturate on x86 CPUs without VNNI (AVX2)."),
    click.option("--quantize-head/--float-head", default=False, show_default=True,
                 help="Task-head dirs (export --task): quantize the head's linear with the blocks, or keep it fp32 "
                      "(default: measured closer to fp32, for a few KB)."),
    click.option("--calibration-sequences", default=32, show_default=True, type=count(1)),
    click.option("--calibration-length", default=128, show_default=True, type=count(1), help="Tokens per sequence."),
)


@command()
@click.argument("model", type=click.Path(path_type=str))
@click.option("-o", "--out", required=True, type=click.Path(path_type=str), help="Model directory to write.")
@recipe_options
@click.option("--calibration", type=click.Path(dir_okay=False, path_type=str),
              help="Static (required): calibration text file (UTF-8).")
@click.option("--kv-cache", type=click.Choice(list(KV_CACHES)), default=DEFAULT_KV_CACHE, show_default=True,
              help="kv_buffer graphs: the KV cache's storage (fp16 halves it, int8 a quarter, int4 an eighth; "
                   "int8/int4 scales are measured on --calibration).")
@click.option("--max-kl", type=float, default=None, metavar="K",
              help="Choose the recipe: the weight-only candidate (smallest, or fastest: --prefer) whose "
                   "KL(fp32 || q) is within K on --calibration (three quarters of it; confirmed on the rest). "
                   "Instead of --method.")
@click.option("--prefer", type=click.Choice(["size", "speed"]), default="size", show_default=True,
              help="--max-kl: the smallest recipe within K, or the fastest on this machine (every candidate within "
                   "K timed here, batch-1 greedy decode; wider blocks tried too).")
@click.option("--force", is_flag=True, help=FORCE_HELP)
def quantize(model: str, out: str, recipe: QuantizeRecipe | None, calibration: str | None, kv_cache: str,
             max_kl: float | None, prefer: str, force: bool) -> None:
    """Write an INT8 (weight-only INT4, or fp16) variant of the fp32 model dir MODEL into OUT; the manifest
    records the recipe. --kv-cache (kv_buffer graphs) also stores the KV cache in fewer bytes, with or
    without --method. --max-kl K picks the recipe itself (and records its search in the manifest)."""
    if max_kl is None and _given("prefer"):
        raise click.UsageError("--prefer applies to --max-kl only")
    if max_kl is not None:
        _search(model, out, recipe, calibration, kv_cache, max_kl, prefer, force)
        return
    if recipe is None and kv_cache == DEFAULT_KV_CACHE:
        raise click.UsageError("--method is required (or --kv-cache, to change the cache alone)")
    _refuse_options_that_do_nothing(model, recipe, calibration, kv_cache)
    if recipe is not None and calibration is None and QUANTIZATION_METHODS.entry(recipe.method).calibrated:
        raise click.UsageError(f"--method {recipe.method} needs --calibration TEXT_FILE")
    if recipe is not None and recipe.awq and calibration is None:
        raise click.UsageError("--awq needs --calibration TEXT_FILE (its scales are measured on it)")
    if recipe is not None and recipe.gptq and calibration is None:
        raise click.UsageError("--gptq needs --calibration TEXT_FILE (its rounding is measured on it)")
    if calibration is None and KV_CACHES[kv_cache].quantized:
        raise click.UsageError(f"--kv-cache {kv_cache} needs --calibration TEXT_FILE (its scales are measured)")
    check_output(out, force, inputs=[model, calibration])
    text = read_text(calibration) if calibration else None
    if text is not None and recipe is not None and recipe.method == "static" and _given("calibration_sequences"):
        _check_windows(model, text, recipe)
    q = import_extra("gptedge.quantize.quantizer", "quantize")
    manifest = q.quantize_model_dir(model, out, recipe, force=force, calibration_text=text,
                                    progress=progress("calibrating"), kv_cache=kv_cache)
    check = manifest.parity.vs_fp32
    if recipe is None:
        done = f"fp32 weights, {kv_cache} KV cache)"
    else:
        widths = "" if recipe.bits in (8, 16) else f", {recipe.bits}-bit, embedding {recipe.embedding_bits}-bit"
        widths += f", 8-bit {' '.join(recipe.keep_8bit)}" if recipe.keep_8bit else ""
        widths += ", mse scales" if recipe.scale_search == "mse" else ""
        widths += ", awq" if manifest.quantization.awq else ""  # as applied: a graph with nothing to fold drops it
        widths += ", gptq" if recipe.gptq else ""
        widths += ", rotated down" if recipe.rotate_down else ""
        widths += ", fp16 activations" if recipe.float16 else ""
        widths += f", {kv_cache} KV cache" if kv_cache != DEFAULT_KV_CACHE else ""
        done = (f"{recipe.method}{widths}): {sum(manifest.quantization.quantized_nodes.values())} "
                f"{'weights halved' if recipe.bits == 16 else 'nodes quantized'}")
    diag(f"quantized {model} -> {out} ({done}; vs fp32 on seeded ids ({check.device}): "
         f"top-1 {check.top1_agreement:.2%}, max |logit diff| {check.max_abs_logit_diff:.3g}"
         + ("" if check.greedy_agreement is None else f", greedy {check.greedy_agreement:.0%} identical"))


def _check_windows(model: str, text: str, recipe: QuantizeRecipe) -> None:
    """--calibration-sequences N asks for N windows of --calibration-length tokens: more than the text holds would
    calibrate on as many overlapping windows as it has start positions (minutes on a short text), not N."""
    try:
        tokens = len(encode(load_tokenizer(model), text))
    except (GptEdgeError, OSError):
        return  # the quantizer's own checks say what is wrong with the dir
    holds = max(0, tokens - recipe.calibration_length + 1)
    if recipe.calibration_sequences > holds:
        raise click.UsageError(f"--calibration-sequences {recipe.calibration_sequences}: the calibration text "
                               f"({tokens} tokens) holds {holds} windows of {recipe.calibration_length} tokens; give "
                               "fewer sequences or a longer text")


def _given(name: str) -> bool:
    source = click.get_current_context().get_parameter_source(name)
    return source is not None and source != click.core.ParameterSource.DEFAULT


def _refuse_options_that_do_nothing(model: str, recipe: QuantizeRecipe | None, calibration: str | None,
                                    kv_cache: str) -> None:
    """An option the recipe would not read is a wrong command line (exit 2), never silently ignored."""
    method = recipe.method if recipe is not None else None
    for name, (flag, methods) in _READ_BY.items():
        if _given(name) and method not in methods:
            raise click.UsageError(f"{flag} applies to --method {' or '.join(methods)} only")
    if recipe is not None and method == "weight-only" and 4 not in (recipe.bits, recipe.embedding_bits):
        for name, flag in (("symmetric", "--symmetric/--asymmetric"), ("keep_8bit", "--keep-8bit")):
            if _given(name):
                raise click.UsageError(f"{flag} applies to 4-bit weights only (--bits 4 or --embedding-bits 4)")
    reads_text = (recipe is not None and (QUANTIZATION_METHODS.entry(method).calibrated or recipe.awq
                                             or recipe.gptq)) \
        or KV_CACHES[kv_cache].quantized
    if calibration is not None and not reads_text:
        raise click.UsageError("--calibration applies to --method static, --awq, --gptq, an int8 / int4 "
                               "--kv-cache or --max-kl only")
    for name in ("calibration_sequences", "calibration_length"):
        if _given(name) and not reads_text:
            raise click.UsageError(f"--{name.replace('_', '-')} applies with --calibration only (--method static, "
                                   "--awq, --gptq, an int8 / int4 --kv-cache)")
    if _given("quantize_head"):
        try:
            task = read_manifest(model).task
        except (GptEdgeError, OSError):
            return  # the quantizer's own checks say what is wrong with the dir
        if task is None:
            raise click.UsageError("--quantize-head/--float-head applies to task-head dirs (export --task) only: "
                                   f"{model} is a language model")


def _search(model: str, out: str, recipe: QuantizeRecipe | None, calibration: str | None, kv_cache: str,
            max_kl: float, prefer: str, force: bool) -> None:
    if recipe is not None:
        raise click.UsageError("--max-kl chooses the recipe: give it no --method")
    fields = {f.name for f in dataclasses.fields(QuantizeRecipe)}
    for param in click.get_current_context().command.params:  # each candidate is its own recipe: these would do nothing
        if param.name in fields and _given(param.name):
            flag = "/".join(param.opts + param.secondary_opts)
            raise click.UsageError(f"{flag}: --max-kl chooses the recipe itself (its candidates are listed in "
                                   "docs/quantization.md#error-aware-quantizers-and-max-kl): give it no recipe options")
    if calibration is None:
        raise click.UsageError("--max-kl needs --calibration TEXT_FILE (candidates are calibrated and scored on it)")
    check_output(out, force, inputs=[model, calibration])
    search = import_extra("gptedge.quantize.recipe_search", "quantize")
    manifest = search.search_recipe(model, out, max_kl, read_text(calibration), prefer=prefer, kv_cache=kv_cache,
                                    force=force, progress=progress("candidates"))
    s = manifest.quantization.search
    chosen = next(c for c in s.candidates if c.options == s.chosen)
    timed = sum(c.decode_tok_s is not None for c in s.candidates)
    diag(f"quantized {model} -> {out} with `{s.chosen}`: KL {chosen.kl_calibration:.3g} on the calibration windows, "
         f"{chosen.kl_held_out:.3g} held out (budget {max_kl:g}), {chosen.size_bytes / 1e6:.2f} MB"
         + ("" if chosen.decode_tok_s is None else
            f", {chosen.decode_tok_s:.1f} tok/s here (the fastest of {timed} within the budget)")
         + f"; {len(s.candidates)} candidate(s) tried")
