"""Tiny seeded GPT models and their checkpoints, built from code (no downloads), and the files every test reads:
the GPT-2 tokenizer files shipped in samples/ and the held-out evaluation text. conftest.py's fixtures build on
these."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GPT2_TOKENIZER = ROOT / "samples" / "tokenizers" / "gpt2"
GPT2_VOCAB = 50257
EXCERPT = ROOT / "samples" / "eval" / "persuasion_ch1-7.txt"  # held-out evaluation text
SAMPLE_MODEL = ROOT / "samples" / "sample-model"  # the shipped GPT-2 trained on Austen + KJV


def reference_perplexity(model, ids: list[int], context: int, stride: int | None = None) -> float:
    """Sliding-window perplexity computed with the PyTorch reference: the oracle for `gptedge eval`."""
    import math

    import torch

    from gptedge.runtime.generation.evaluate import sliding_windows

    nll, count = 0.0, 0
    with torch.no_grad():
        for w in sliding_windows(len(ids), context, stride):
            logp = torch.log_softmax(model(torch.tensor([ids[w.begin:w.end]]))[0][0].double(), dim=-1)
            first = w.first_target - w.begin
            targets = torch.tensor(ids[w.first_target:w.end])
            nll -= logp[first - 1:-1].gather(1, targets[:, None]).sum().item()
            count += len(targets)
    return math.exp(nll / count)


def copy_gpt2_tokenizer(dst: Path) -> None:
    for name in ("encoder.json", "vocab.bpe"):
        shutil.copyfile(GPT2_TOKENIZER / name, dst / name)


def tiny_config(arch: str = "gpt2", **overrides):
    from gptedge.export.config import GPTConfig

    base = dict(arch=arch, vocab_size=GPT2_VOCAB, n_positions=128, n_embd=32, n_layer=2, n_head=4,
                bos_token_id=50256, eos_token_id=50256)
    if arch == "openai-gpt":
        base.update(bos_token_id=None, eos_token_id=None)
    base.update(overrides)
    return GPTConfig(**base)


def tiny_reference(arch: str = "gpt2", seed: int = 0, **overrides):
    from gptedge.export.reference import GPT

    return GPT(tiny_config(arch, **overrides)).init_weights(seed).eval()


def write_checkpoint(model, out: Path, tokenizer: bool = True) -> Path:
    from gptedge.export.checkpoint import save_checkpoint

    save_checkpoint(model, out)
    if tokenizer:
        copy_gpt2_tokenizer(out)
    return out


def built_once(tmp_path_factory, name: str, build, for_mutants: bool = True) -> Path:
    """A session fixture's folder, made by build(path): in a fresh temp folder; under pytest-xdist
    (scripts/test.sh runs 2 workers) once per run in the folder the workers' temp folders share, the first worker
    to ask building it while the others wait on a file lock (xdist's documented recipe); or, when
    GPTEDGE_TEST_CACHE is set (benchmarks/mutation.py), once per mutation run there, so each mutant's tests reuse
    what the unmutated baseline run built instead of exporting again (unless for_mutants is False: what the
    mutated code must rebuild). Tests read these folders, never write them."""
    cache = os.environ.get("GPTEDGE_TEST_CACHE") if for_mutants else None
    if not cache and os.environ.get("PYTEST_XDIST_WORKER"):
        cache = str(tmp_path_factory.getbasetemp().parent / "built-once")
    if not cache:
        return build(tmp_path_factory.mktemp(name) / name)
    from filelock import FileLock

    out = Path(cache) / name
    Path(cache).mkdir(parents=True, exist_ok=True)
    with FileLock(str(out) + ".lock"):
        if not out.exists():
            part = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=cache)) / name
            os.replace(build(part), out)
    return out
