"""What a peer engine is to gptedge: the two protocols (bench's timed generation, compare's scoring) and
what every engine shares. Standard library only: the registry (gptedge.measure.peers) and the CLI import it at
`--help`, and the runtime's compare names `Scorer` in its annotations.

An engine module (torch.py, optimum.py, ctranslate2.py, llama_cpp.py, genai.py) ends with
`ENGINE = PeerEngine(...)` offering one or both:

- `bench(job) -> [(label, run)]`: the rows it adds to `gptedge bench`, each `run()` a BenchRow timed
  with `timed` (gptedge bench's own warm-up, first-token and decode clocks), on the job's prompt ids;
- `scorer(recipe, job) -> Scorer`: one recipe of its own quantization of the job's checkpoint, scored
  by `gptedge compare` on the same windows as gptedge's rows (`Scorer.logits`) and decoding greedily
  with its own loop (`Scorer.greedy`, timed with `timed_greedy`).

Its heavy packages (torch, transformers, optimum, ctranslate2, llama_cpp, onnxruntime_genai) are imported
where they are used: a peer that is not installed is skipped with a hint, never an ImportError at load.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import numpy as np

    from gptedge.measure.bench import BenchRow


@dataclass(frozen=True)
class PeerInfo:
    """A peer row's identity: `name` is its model column (e.g. "llama.cpp Q8_0")."""

    name: str
    engine: str
    precision: str
    method: str
    size_bytes: int


@dataclass
class Greedy:
    """A greedy continuation and its decode rate, as a Generation has them (ids, tokens_per_s)."""

    ids: list[int]
    tokens_per_s: float


class Scorer(Protocol):
    """A peer engine as compare sees it: one recipe, loaded and ready."""

    info: PeerInfo
    vocab_size: int
    context_length: int
    # What the recipe resolved to on this CPU, where two recipes may resolve to one engine configuration
    # (CTranslate2 runs int8 as int8_float32 on CPU): two scorers of one peer that resolve alike are one row.
    resolved: str | None

    def logits(self, ids: np.ndarray) -> np.ndarray:
        """(L,) int64 ids, no past -> (L, V) logits predicting the token after each position."""

    def greedy(self, prompt: list[int], max_new_tokens: int, eos_id: int | None) -> Greedy:
        """Greedy continuation by the engine's own generation loop, timed with `timed_greedy` / `decode_rate`."""


@dataclass(frozen=True)
class ScoreJob:
    """What every recipe of one compare run is built from."""

    source: Path  # the HF checkpoint (with a tokenizer.json or vocab.json: with_hf_tokenizer)
    work: Path  # conversions, removed when compare ends
    threads: int
    id_to_token: Callable[[int], str]  # the reference's tokenizer (CTranslate2 takes token strings)
    vocab_size: int
    context_length: int


@dataclass(frozen=True)
class BenchJob:
    """What every row of one bench run shares: the same prompt ids, token counts, threads and repeats."""

    source: Path | None  # the HF checkpoint (None when only engines that run the model dir were asked)
    model_dir: Path  # the first benchmarked gptedge dir (GenAI runs it as it is)
    prompts: list[list[int]]  # (B, P) ids, equal lengths
    new_tokens: int
    threads: int
    repeat: int
    work: Path  # conversions, removed when bench ends


PlannedRow = tuple[str, "Callable[[], BenchRow]"]  # (label for a 'not run' note, the timed run)


@dataclass(frozen=True)
class PeerEngine:
    name: str  # as --peers takes it, and its line in the registry
    needs: tuple[str, ...] = ()  # modules its scorers import, in the order they are checked (compare)
    install: str = "peers"  # errors.install_hint key for the first of `needs`
    missing: Callable[[], str | None] = lambda: None  # why it cannot run although `needs` import (one line)
    bench: Callable[[BenchJob], list[PlannedRow]] | None = None
    recipes: tuple[str, ...] = ()  # compare's recipes, by default
    scorer: Callable[[str, ScoreJob], Scorer] | None = None


def timed(generate: Callable[[int], None], new_tokens: int, batch: int, repeat: int,
          sync: Callable[[], None] = lambda: None) -> tuple[float, float, list[float]]:
    """-> (time to first token, decode tok/s, each run's tok/s) from generate(n) producing n tokens per row.
    sync: waits for queued GPU work (torch.cuda.synchronize) before each clock read."""
    generate(2)  # warm-up (and compilation)
    sync()
    ttfts, rates = [], []
    for _ in range(repeat):
        t0 = time.perf_counter()
        generate(1)
        sync()
        ttft = time.perf_counter() - t0
        t0 = time.perf_counter()
        generate(new_tokens)
        sync()
        total = time.perf_counter() - t0
        ttfts.append(ttft)
        rates.append(batch * (new_tokens - 1) / max(total - ttft, 1e-9))
    return statistics.median(ttfts), statistics.median(rates), rates


def decode_rate(tokens: int, first_s: float, end_s: float) -> float:
    """Generation.tokens_per_s: the tokens after the first, over the time from the first to the last."""
    return (tokens - 1) / (end_s - first_s) if tokens > 1 and end_s > first_s else 0.0


def timed_greedy(tokens: Iterable[int], max_new_tokens: int, eos_id: int | None) -> Greedy:
    """Draw a peer's own greedy token stream as gptedge's generation does: stop after eos (kept in
    the ids) or max_new_tokens, time from the first token to the last."""
    ids: list[int] = []
    first = None
    for tok in tokens:
        ids.append(int(tok))
        if first is None:
            first = time.perf_counter()
        if (eos_id is not None and ids[-1] == eos_id) or len(ids) >= max_new_tokens:
            break
    end = time.perf_counter()
    return Greedy(ids, decode_rate(len(ids), end if first is None else first, end))


def with_hf_tokenizer(source: Path, model_dir: Path, work: Path) -> Path:
    """transformers and CTranslate2's converter want tokenizer.json or vocab.json beside the weights;
    a checkpoint with only GPT-2's original encoder.json / vocab.bpe gets the model dir's tokenizer.json."""
    if (source / "tokenizer.json").is_file() or (source / "vocab.json").is_file():
        return source
    linked = work / "source"
    linked.mkdir()
    for f in source.iterdir():
        (linked / f.name).symlink_to(f.resolve())
    (linked / "tokenizer.json").write_bytes((model_dir / "tokenizer.json").read_bytes())
    return linked
