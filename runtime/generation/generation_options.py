"""How to generate, as frozen records checked field by field: SamplingParams (each token) and BeamOptions
(beam search), and the prefill defaults (PREFILL_CHUNK, GPU_PREFILL_BUDGET, PREFIX_CACHE_MB). No numpy: the CLI
builds them from its options before anything heavy is imported, and passes them whole to the runtime
(LoadedModel.generate / stream, the engine's requests)."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

from ..errors import InvalidArgumentError

# Prompt tokens per prefill run: generate()'s prefill_chunk, the engine's, and `gptedge serve --prefill-budget`'s
# default (one concept, one default; the server's on a GPU whose pool shares prefill runs: GPU_PREFILL_BUDGET).
# Attention kernels compute every (query, key) pair of a run, the causal half included; prefilling in chunks skips
# the blocks above the diagonal. 256 was the fastest chunk for a 512-token prompt on GPT-2 small (2 cores): int8
# -10 %, fp32 -8 %; in the server, a burst of eight 32-token prompts in one run (benchmarks/results/serve-* show what
# it does to first-token and inter-token latency).
PREFILL_CHUNK = 256

# The server's prefill budget on a GPU (`gptedge serve --prefill-budget`'s default there). A prefill run through the
# ordinary session is launch-bound on a GPU (GPT-2 small fp16: ~3.5-4.5 ms whether it holds 1 or 64 prompts on an
# H200), so at 256 a burst of 64 32-token prompts took 8 runs, each with an ordinary decode step after it: at 64
# clients an engine trace showed 57 prefill turns of 8.3 ms for 384 requests. 2048 takes such a burst in one run;
# a running row then waits at most one 2048-position run (~5 ms there) between two tokens.
GPU_PREFILL_BUDGET = 2048

# MiB of keys and values the server's prefix cache keeps (runtime/serving/prefix_cache.py): the engine's default
# and `gptedge serve --prefix-cache-mb`'s. GPT-2 small's fp32 cache takes 72 KiB a position, so 256 MiB holds
# about 3,600 positions (3.5 full 1,024-token contexts; four times as many with an int8 cache): a handful of
# system prompts and conversations, for less than a --max-batch 8 pool's own cache may touch (16 rows x 72 MiB).
PREFIX_CACHE_MB = 256

# One rule for empty stop strings (the API's stop=, `generate --stop`, the server's `stop` field): refused, never
# silently dropped.
EMPTY_STOP = "a stop string is empty (it would end the text before it starts); leave it out"


def is_count(value) -> bool:
    """An integer as callers hold one: int or a numpy integer (numbers.Integral, without importing numpy), never a
    bool (True is 1 to Python: max_new_tokens=True would mean one token) or a float."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


@dataclass(frozen=True)
class SamplingParams:
    """How to pick each token. temperature 0, top_k 1 or greedy=True all mean argmax."""

    temperature: float = 1.0
    top_k: int = 0  # 0: no top-k filter
    top_p: float = 1.0  # 1.0: no nucleus filter
    repetition_penalty: float = 1.0  # 1.0: off; > 1 discourages tokens already seen (CTRL / HF rule)
    greedy: bool = False
    seed: int | None = None

    def __post_init__(self) -> None:
        for name in ("temperature", "top_k", "top_p", "repetition_penalty", "seed"):
            if isinstance(getattr(self, name), bool):  # bool is an int to Python: top_k=True would mean greedy
                raise InvalidArgumentError(f"{name} must be a number, got {getattr(self, name)!r}")
        if not isinstance(self.greedy, bool):
            raise InvalidArgumentError(f"greedy must be true or false, got {self.greedy!r}")
        if not (isinstance(self.temperature, (int, float)) and math.isfinite(self.temperature)
                and self.temperature >= 0):
            raise InvalidArgumentError(f"temperature must be a finite number >= 0, got {self.temperature!r}")
        if not is_count(self.top_k) or self.top_k < 0:
            raise InvalidArgumentError(f"top_k must be an integer >= 0, got {self.top_k!r}")
        object.__setattr__(self, "top_k", int(self.top_k))  # numpy's integers as plain ints
        if not (isinstance(self.top_p, (int, float)) and 0.0 < self.top_p <= 1.0):
            raise InvalidArgumentError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not (isinstance(self.repetition_penalty, (int, float)) and math.isfinite(self.repetition_penalty)
                and self.repetition_penalty > 0):
            raise InvalidArgumentError(f"repetition_penalty must be a number > 0, got {self.repetition_penalty!r}")
        if self.seed is not None and (not is_count(self.seed) or self.seed < 0):
            raise InvalidArgumentError(f"seed must be an integer >= 0, got {self.seed!r}")
        if self.seed is not None:
            object.__setattr__(self, "seed", int(self.seed))

    @property
    def is_greedy(self) -> bool:
        return self.greedy or self.temperature == 0 or self.top_k == 1


@dataclass(frozen=True)
class BeamOptions:
    num_beams: int = 4
    length_penalty: float = 1.0
    early_stopping: bool | str = False  # True: stop once num_beams hypotheses are done; "never": exhaustive
    num_return_sequences: int = 1

    def __post_init__(self) -> None:
        if not is_count(self.num_beams) or self.num_beams < 1:
            raise InvalidArgumentError(f"num_beams must be an integer >= 1, got {self.num_beams!r}")
        if not is_count(self.num_return_sequences) or not 1 <= self.num_return_sequences <= self.num_beams:
            raise InvalidArgumentError(f"num_return_sequences must be in 1..num_beams ({self.num_beams}), "
                                       f"got {self.num_return_sequences!r}")
        if self.early_stopping not in (True, False, "never"):
            raise InvalidArgumentError(f"early_stopping must be true, false or 'never', got {self.early_stopping!r}")
        object.__setattr__(self, "num_beams", int(self.num_beams))
        object.__setattr__(self, "num_return_sequences", int(self.num_return_sequences))
        if not isinstance(self.length_penalty, (int, float)) or not math.isfinite(self.length_penalty):
            raise InvalidArgumentError(f"length_penalty must be a finite number, got {self.length_penalty!r}")
