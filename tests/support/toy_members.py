"""One toy member for each registry, as a plugin would write them: a module, then one line (a `register`).

Each registry reads its own attribute, so one module holds all four: FAMILY (GPT-2's blocks under
another name and model_type), METHOD (dynamic INT8 under another name), VARIANT (the standard graph's
runtime under another name) and ENGINE (a peer: bench runs gptedge on the model dir itself; compare
scores the PyTorch reference GPT of the checkpoint).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import torch

from gptedge.export import gpt2
from gptedge.export.checkpoint import load_checkpoint
from gptedge.export.reference import greedy_ids
from gptedge.measure.bench import BenchRow, bench_gptedge
from gptedge.measure.peers.base import BenchJob, Greedy, PeerEngine, PeerInfo, PlannedRow, ScoreJob, timed_greedy
from gptedge.quantize import dynamic
from gptedge.runtime.graphs.standard_graph import StandardGraph

TOY_ARCH, TOY_METHOD, TOY_GRAPH, TOY_PEER = "toy-gpt", "toy-int8", "toy_standard", "toy"


def _config_from_hf(d):
    return dataclasses.replace(gpt2.config_from_hf(d), arch=TOY_ARCH)


def _config_to_hf(cfg):
    return {**gpt2.config_to_hf(cfg), "model_type": TOY_ARCH}


FAMILY = dataclasses.replace(gpt2.FAMILY, arch=TOY_ARCH, hf_model_type=TOY_ARCH, config_from_hf=_config_from_hf,
                             config_to_hf=_config_to_hf)

METHOD = dataclasses.replace(dynamic.METHOD, name=TOY_METHOD)


class ToyGraph(StandardGraph):
    name = TOY_GRAPH


VARIANT = ToyGraph


def _bench_rows(job: BenchJob) -> list[PlannedRow]:
    def run() -> BenchRow:
        row = bench_gptedge(str(job.model_dir), job.prompts, job.new_tokens, job.threads, job.repeat, "cpu")
        return dataclasses.replace(row, name="toy peer (gptedge itself)")

    return [("toy", run)]


class ReferenceScorer:
    """The checkpoint's PyTorch reference GPT, fp32: compare's Scorer protocol, nothing else."""

    resolved = None

    def __init__(self, source: Path, vocab_size: int, context_length: int):
        self.model, _ = load_checkpoint(source)
        self.model.eval()
        self.vocab_size, self.context_length = vocab_size, context_length
        self.info = PeerInfo("toy fp32", "toy (reference GPT)", "fp32", "reference", 0)

    def logits(self, ids: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return self.model(torch.from_numpy(ids)[None])[0][0].numpy()  # (L, V)

    def greedy(self, prompt: list[int], max_new_tokens: int, eos_id: int | None) -> Greedy:
        with torch.no_grad():
            return timed_greedy(iter(greedy_ids(self.model, prompt, max_new_tokens)), max_new_tokens, eos_id)


def _scorer(recipe: str, job: ScoreJob) -> ReferenceScorer:
    return ReferenceScorer(job.source, job.vocab_size, job.context_length)


ENGINE = PeerEngine(TOY_PEER, needs=("torch",), bench=_bench_rows, recipes=("fp32",), scorer=_scorer)
