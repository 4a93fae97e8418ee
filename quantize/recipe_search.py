"""`gptedge quantize MODEL -o OUT --max-kl K --calibration TEXT [--prefer size|speed]`: the smallest, or the
fastest on this machine, recipe within a KL budget.

The calibration text is split in two at a paragraph near CALIBRATION_SHARE of its characters: the first part
calibrates (AWQ's scales, the int8 cache's) and ranks the candidates, the second confirms the choice on windows
no candidate saw. Candidates (CANDIDATES, each weight-only with the error-aware quantizers) are tried in order of
their estimated bytes, smallest first. A candidate FAR x over K skips the larger ones of its width.
- size: the first whose KL(fp32 || q) on the calibration windows is within K and whose held-out KL is within
  HELD_OUT_SLACK x K is written, and the search stops there.
- speed: the space adds wider blocks (SPEED_CANDIDATES: fewer scale bytes, and on CPUs whose int8 dot products make
  MatMulNBits compute-bound at blocks of 32 a faster kernel per byte); every candidate within the budget is kept,
  then timed on this machine, interleaved over TIMING_ROUNDS rounds (greedy decode, batch 1, seeded prompt ids),
  and the one with the highest median tok/s is written. Pruned (batch-1 decode reads every weight once a token):
  a candidate over SPEED_BYTES_CAP x the smallest qualifying one's bytes ends the search, and one whose block size
  a smaller qualifying candidate already has is skipped (the same block size's kernel, more bytes: at 4 and at 8
  bits alike, measured per byte in benchmarks/results/zen4-2026-11-27.md and 8bit-decode-2026-11-26.md, the 4-bit
  layout of a block size is the faster), so a loose budget tries one candidate per block size.
The manifest's quantization.search records the budget, every candidate tried (options, bytes, KL, tok/s where
timed) and the chosen one; a budget no candidate meets is a one-line error naming the closest.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx

from gptedge import runtime
from gptedge.atomic import check_output
from gptedge.runtime.errors import InvalidArgumentError, QuantizationError
from gptedge.runtime.graphs.session import SessionConfig
from gptedge.runtime.generation.evaluate import log_softmax, sliding_windows, window_logits
from gptedge.runtime.modeldir.manifest import ModelShape, RecipeSearch, SearchCandidate, read_manifest, write_manifest
from gptedge.runtime.modeldir.recipe import QuantizeRecipe, block_linears, kept_at_8bit

from . import gptq
from .quantizer import quantize_model_dir
from .weight_only import linear_widths

log = logging.getLogger(__name__)

PREFER = ("size", "speed")
CALIBRATION_SHARE = 0.75
# A candidate this far over K rules out the rest of its width (4-bit with more kept at 8 bits moved KL by < 2x on
# the sample model, where 8-bit is 10x lower): they are skipped, unrecorded, so a tight budget reaches 8 bits sooner.
FAR = 4.0
HELD_OUT_SLACK = 1.1  # the held-out KL may exceed the budget by this much (the target for the chosen recipe)
MAX_TOKENS = 2048  # per part: enough windows to rank recipes, few enough to score each candidate in seconds
# (options as `quantize` spells them, the recipe's fields): the space, smallest first. The error-aware quantizers
# where they paid at equal bytes (benchmarks/results/quantizers-2026-11-26.md, -26b.md): GPTQ rounding at 4 bits
# (KL 0.27-0.97x the plain rounding's on four checkpoints, below mse scales' on each; with mse scales 0.37-0.71x,
# better on two of them, so both are tried at the same bytes) and mse + AWQ at 8 bits (-5 to -14 % on the same
# calibration; GPTQ there was noise).
_4 = dict(bits=4, gptq=True)
_8 = dict(bits=8, scale_search="mse", awq=True)
# 8 bits in blocks of 64 with down's input rotated (quantize/rotation.py): 0.72-0.95x Q8_0's KL on the two trained
# gated-MLP checkpoints with GPTQ on mse scales, where plain blocks of 64 were 1.31-1.40x
# (docs/quantization.md#rotated-down-projections)
_8R = dict(bits=8, gptq=True, scale_search="mse", rotate_down=True, block_size=64)
CANDIDATES: tuple[tuple[str, dict], ...] = (
    ("--bits 4 --gptq", _4),
    ("--bits 4 --gptq --scale-search mse", dict(_4, scale_search="mse")),
    ("--bits 4 --gptq --keep-8bit '*.attention.o'", dict(_4, keep_8bit=("*.attention.o",))),
    ("--bits 4 --gptq --keep-8bit '*.attention.*'", dict(_4, keep_8bit=("*.attention.*",))),
    ("--bits 4 --gptq --block-size 16 --keep-8bit '*.attention.*'",
     dict(_4, block_size=16, keep_8bit=("*.attention.*",))),
    ("--bits 8 --gptq --scale-search mse --rotate-down --block-size 64", _8R),
    ("--bits 8 --scale-search mse --awq", _8),
    # blocks of 32 rotated: where the int8 cache's error is added (--kv-cache int8, what long contexts want), the
    # one 8-bit layout left under Q8_0's KL on both trained gated-MLP checkpoints (0.76x / 0.81x;
    # docs/quantization.md#rotated-down-projections)
    ("--bits 8 --gptq --scale-search mse --rotate-down", dict(_8R, block_size=32)),
    ("--bits 8 --scale-search mse --awq --block-size 16", dict(_8, block_size=16)),
)


# --prefer speed's wider blocks, on the grids that paid at blocks of 32. Blocks of 128 need n_embd (and the MLP's
# width) divisible by 128; a candidate whose block does not divide n_embd is dropped before the search.
SPEED_CANDIDATES: tuple[tuple[str, dict], ...] = CANDIDATES + tuple(
    (f"{opts} --block-size {b}", dict(fields, block_size=b))
    for b in (64, 128) for opts, fields in (("--bits 4 --gptq --scale-search mse", dict(_4, scale_search="mse")),
                                            ("--bits 8 --scale-search mse --awq", _8))) + (
    ("--bits 8 --gptq --scale-search mse --rotate-down --block-size 128", dict(_8R, block_size=128)),)
SPEED_BYTES_CAP = 2.0  # --prefer speed: candidates over this x the smallest qualifying one's bytes are not tried
TIMING_PROMPT, TIMING_NEW, TIMING_ROUNDS = 32, 64, 3  # --prefer speed: seeded prompt ids, greedy tokens, rounds


def estimated_bytes(recipe: QuantizeRecipe, shape: ModelShape) -> float:
    """Weight bytes of the model under the recipe: the order candidates are tried in (the record keeps the real file
    sizes). Per weight: bits / 8, plus a 4-byte scale (and a 4-bit zero point, asymmetric) per block. Weights per
    linear by its neutral name; the MLP taken as 4C wide (the manifest does not record its width)."""
    c, kv = shape.n_embd, shape.kv_heads * shape.head_dim
    sizes = {"attention.qkv": c * (c + 2 * kv), "attention.q": c * c, "attention.k": c * kv, "attention.v": c * kv,
             "attention.o": c * c, "mlp.gate": 4 * c * c, "mlp.up": 4 * c * c, "mlp.down": 4 * c * c}

    def per_weight(bits: int) -> float:
        zp = 0.5 if bits == 4 and not recipe.symmetric else 0.0
        return bits / 8 + (4 + zp) / recipe.block_size

    total = shape.vocab_size * c * per_weight(recipe.embedding_bits)
    for graph_name, neutral in block_linears(shape.n_layer, shape.arch).items():
        bits = 8 if recipe.bits == 8 or kept_at_8bit((graph_name, neutral), recipe.keep_8bit) else recipe.bits
        total += sizes[neutral.split(".", 2)[2]] * per_weight(bits)
    return total


def split_text(text: str, share: float = CALIBRATION_SHARE) -> tuple[str, str]:
    """-> (calibration part, held-out part), cut at the paragraph break nearest `share` of the characters."""
    at = int(len(text) * share)
    cut = text.rfind("\n\n", 0, at)
    cut = cut if cut > len(text) // 4 else at
    return text[:cut], text[cut:]


def kl_on(model, ref_windows: list[tuple[np.ndarray, np.ndarray]], ids: list[int], windows) -> float:
    """Mean KL(ref || model) over the scored tokens of the windows; ref_windows: the reference's (log p, p) each."""
    total, count = 0.0, 0
    for (ref_logp, ref_p), w in zip(ref_windows, windows, strict=True):
        logp = log_softmax(window_logits(model, ids, w)[0])
        total += float((ref_p * (ref_logp - logp)).sum())
        count += len(logp)
    return total / count


class _Scorer:
    """The fp32 reference's log-probabilities on one text's windows, computed once; KL of any dir against them."""

    def __init__(self, ref, text: str):
        self.ids = ref.encode_prompt(text)[:MAX_TOKENS]  # bos first where the tokenizer adds one, as compare
        if len(self.ids) < 2:
            raise InvalidArgumentError("--calibration text is too short to score a recipe on (needs >= 2 tokens "
                                       "per part)")
        self.windows = sliding_windows(len(self.ids), ref.manifest.shape.context_length)
        self.ref = []
        for w in self.windows:
            logp = log_softmax(window_logits(ref, self.ids, w)[0])
            self.ref.append((logp, np.exp(logp)))

    def kl(self, model_dir: Path) -> float:
        return kl_on(runtime.load(model_dir, device="cpu"), self.ref, self.ids, self.windows)


def search_recipe(model_dir: str | Path, out: str | Path, max_kl: float, text: str, prefer: str = "size",
                  kv_cache: str = "fp32", force: bool = False,
                  progress: Callable[[int, int], None] | None = None,
                  candidates: tuple[tuple[str, dict], ...] | None = None, threads: int | None = None):
    """Quantize `model_dir` with the smallest (prefer="size") or fastest (prefer="speed") candidate within `max_kl`
    into `out` -> its manifest (search recorded). threads: intra-op threads the speed candidates are timed with."""
    model_dir, out = Path(model_dir), Path(out)
    if not max_kl > 0:
        raise InvalidArgumentError(f"--max-kl must be a positive KL, got {max_kl}")
    if prefer not in PREFER:
        raise InvalidArgumentError(f"--prefer {prefer} is not offered: choose {' or '.join(PREFER)}")
    check_output(out, force, inputs=[model_dir])
    manifest = read_manifest(model_dir)
    shape = manifest.shape
    if candidates is None:
        candidates = SPEED_CANDIDATES if prefer == "speed" else CANDIDATES
    recipes = [(opts, QuantizeRecipe("weight-only", **fields)) for opts, fields in candidates]
    graph = onnx.load(str(model_dir / manifest.model_file), load_external_data=False)
    widths = set(linear_widths(graph, model_dir).values()) | {shape.n_embd}  # every K: the MLP width too
    recipes = [(opts, r) for opts, r in recipes if all(k % r.block_size == 0 for k in widths)]
    # by bytes; at equal bytes the layout without the rotation's ops first: where it meets K, the rotated one of the
    # same block size is no faster (and --prefer speed skips it), so it is tried only where the plain one fails
    recipes.sort(key=lambda c: (estimated_bytes(c[1], shape), c[1].rotate_down))
    calibration, held_out = split_text(text)
    ref = runtime.load(model_dir, device="cpu")
    scorers = _Scorer(ref, calibration), _Scorer(ref, held_out)
    del ref
    tried: list[SearchCandidate] = []
    scratch = Path(tempfile.mkdtemp(prefix=".max-kl-", dir=out.parent if out.parent.exists() else None))
    hopeless: set[int] = set()  # widths (bits) ruled out by a candidate FAR over the budget
    within: list[tuple[int, Path]] = []  # --prefer speed: (index in tried, dir) of the candidates within the budget
    floor: float | None = None  # --prefer speed: the estimated bytes of the smallest of them
    qualified_blocks: set[int] = set()  # --prefer speed: their block sizes
    try:
        with gptq.factor_cache(scratch / "gptq-factors"):  # the GPTQ candidates share H and its factors
            for i, (opts, recipe) in enumerate(recipes):
                if recipe.bits in hopeless:
                    continue
                size_guess = estimated_bytes(recipe, shape)
                if floor is not None and size_guess > SPEED_BYTES_CAP * floor:
                    break  # sorted by bytes: the rest are larger still
                if recipe.block_size in qualified_blocks:
                    continue  # the same kernel's block size with fewer bytes is within K already: no faster
                d = scratch / f"c{i}"
                quantize_model_dir(model_dir, d, recipe, calibration_text=calibration, kv_cache=kv_cache)
                m = read_manifest(d)
                size = sum(f.size for f in m.files if f.path.startswith(m.model_file))  # the graph and its data
                kl = scorers[0].kl(d)
                held = scorers[1].kl(d) if kl <= max_kl else None
                tried.append(SearchCandidate(opts, size, kl, held))
                log.info("--max-kl %g: %s: %d bytes, KL %.3g calibration, %s held out", max_kl, opts, size, kl,
                         "-" if held is None else f"{held:.3g}")
                if progress:
                    progress(i + 1, len(recipes))
                if kl > FAR * max_kl:
                    hopeless.add(recipe.bits)
                met = held is not None and held <= HELD_OUT_SLACK * max_kl
                if met and prefer == "size":
                    return _finish(d, out, force, RecipeSearch(max_kl, prefer, len(scorers[0].ids), len(scorers[1].ids),
                                                               tuple(tried), opts))
                if met:
                    within.append((len(tried) - 1, d))
                    floor = floor or size_guess
                    qualified_blocks.add(recipe.block_size)
                else:
                    shutil.rmtree(d, ignore_errors=True)  # keep the scratch folder to the candidates still in play
        if within:
            rates = time_candidates([d for _, d in within], shape.vocab_size, threads)
            for (j, _), rate in zip(within, rates, strict=True):
                tried[j] = dataclasses.replace(tried[j], decode_tok_s=rate)
            j, d = max(zip(within, rates, strict=True), key=lambda x: x[1])[0]
            return _finish(d, out, force, RecipeSearch(max_kl, prefer, len(scorers[0].ids), len(scorers[1].ids),
                                                       tuple(tried), tried[j].options))
        closest = min(tried, key=lambda c: c.kl_held_out if c.kl_held_out is not None else c.kl_calibration)
        raise QuantizationError(f"no recipe meets --max-kl {max_kl:g}: the closest is `{closest.options}` "
                                f"(KL {closest.kl_calibration:.3g} on the calibration windows"
                                + ("" if closest.kl_held_out is None else f", {closest.kl_held_out:.3g} held out")
                                + f", {closest.size_bytes / 1e6:.2f} MB)")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def time_candidates(dirs: list[Path], vocab: int, threads: int | None,
                    rounds: int = TIMING_ROUNDS) -> list[float]:
    """Median decode tok/s of each dir (batch 1, TIMING_PROMPT seeded ids + TIMING_NEW greedy tokens), the dirs
    interleaved within each round so that a machine's drift falls on all of them alike. Each dir is loaded once and
    warmed up by a short run first."""
    prompt = np.random.default_rng(0).integers(0, vocab, size=(1, TIMING_PROMPT)).tolist()
    models = [runtime.load(d, device="cpu", session=SessionConfig(threads=threads)) for d in dirs]
    for model in models:
        model.generate_batch(prompt, max_new_tokens=4, greedy=True, ignore_eos=True, with_text=False)
    runs: list[list[float]] = [[] for _ in dirs]
    for _ in range(rounds):
        for model, rates in zip(models, runs, strict=True):
            out = model.generate_batch(prompt, max_new_tokens=TIMING_NEW, greedy=True, ignore_eos=True,
                                       with_text=False)
            rates.append(out[0].tokens_per_s)
    for d, rates in zip(dirs, runs, strict=True):
        log.info("--prefer speed: %s: %s tok/s", d.name, ", ".join(f"{r:.1f}" for r in rates))
    return [statistics.median(r) for r in runs]


def _finish(chosen: Path, out: Path, force: bool, search: RecipeSearch):
    manifest = read_manifest(chosen)
    q = dataclasses.replace(manifest.quantization, search=search)
    manifest = write_manifest(chosen, manifest.replace(quantization=q))
    if out.exists() and force:
        shutil.rmtree(out)
    os.replace(chosen, out)
    return manifest
