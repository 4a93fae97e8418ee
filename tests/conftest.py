"""Tiny seeded models built in fixtures; no downloads. The GPT-2 tokenizer files ship in samples/."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GPT2_TOKENIZER = ROOT / "samples" / "tokenizers" / "gpt2"
GPT2_VOCAB = 50257
EXCERPT = ROOT / "samples" / "eval" / "persuasion_ch1-7.txt"  # held-out evaluation text


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


def built_once(tmp_path_factory, name: str, build) -> Path:
    """A session fixture's folder, made by build(path): in a fresh temp folder, or, when GPTEDGE_TEST_CACHE is
    set (benchmarks/mutation.py), once per mutation run there, so each mutant's tests reuse what the unmutated
    baseline run built instead of exporting again."""
    cache = os.environ.get("GPTEDGE_TEST_CACHE")
    if not cache:
        return build(tmp_path_factory.mktemp(name) / name)
    out = Path(cache) / name
    if not out.exists():
        Path(cache).mkdir(parents=True, exist_ok=True)
        part = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=cache)) / name
        os.replace(build(part), out)
    return out


@pytest.fixture(scope="session")
def gpt2_checkpoint(tmp_path_factory) -> Path:
    """A tiny seeded GPT-2 in HF layout with the real GPT-2 tokenizer files."""
    return built_once(tmp_path_factory, "ck-gpt2", lambda out: write_checkpoint(tiny_reference("gpt2"), out))


def _export(checkpoint: Path, **options):
    from gptedge.export.exporter import export_checkpoint

    def build(out: Path) -> Path:
        export_checkpoint(checkpoint, out, **options)
        return out
    return build


@pytest.fixture(scope="session")
def gpt2_model_dir(tmp_path_factory, gpt2_checkpoint) -> Path:
    return built_once(tmp_path_factory, "md-gpt2", _export(gpt2_checkpoint))


@pytest.fixture(scope="session")
def openai_gpt_model_dir(tmp_path_factory) -> Path:
    ck = built_once(tmp_path_factory, "ck-openai",
                    lambda out: write_checkpoint(tiny_reference("openai-gpt", seed=1), out))
    return built_once(tmp_path_factory, "md-openai", _export(ck))


@pytest.fixture(scope="session")
def gpt2_loaded(gpt2_model_dir):
    from gptedge.runtime import load

    return load(gpt2_model_dir, device="cpu")


@pytest.fixture(scope="session")
def gpt2_kv_buffer_loaded(tmp_path_factory, gpt2_checkpoint):
    from gptedge.runtime import load

    return load(built_once(tmp_path_factory, "md-gpt2-kvb", _export(gpt2_checkpoint, graph_variant="kv_buffer")),
                device="cpu")


@pytest.fixture(scope="session")
def task_checkpoints(tmp_path_factory) -> dict[str, Path]:
    """transformers' fine-tuned classes (tests/task_checkpoints.py), tiny and seeded: head name -> checkpoint dir."""
    from .task_checkpoints import build_checkpoints

    return build_checkpoints(tmp_path_factory.mktemp("task-checkpoints"))


@pytest.fixture(scope="session")
def task_dirs(tmp_path_factory, task_checkpoints) -> dict[str, Path]:
    """Those checkpoints exported as classifier dirs (task_checkpoints.EXPORTS): name -> dir."""
    from .task_checkpoints import build_dirs

    return build_dirs(tmp_path_factory.mktemp("task-dirs"), task_checkpoints)


SAMPLE_MODEL = ROOT / "samples" / "sample-model"
# The web / mobile targets' recipes, made from the shipped (trained) sample model: its peaked distributions keep
# greedy ids comparable across ONNX Runtime builds (Node's, WASM's, Python's), which a random tiny model's are not.
WEB_RECIPES = {"fp32": None, "dynamic": dict(method="dynamic"), "w8": dict(method="weight-only"),
               "w4": dict(method="weight-only", bits=4)}


@pytest.fixture(scope="session")
def sample_recipe_dirs(tmp_path_factory) -> dict[str, Path]:
    """The sample model exported (standard graph, unvalidated: test_export checks exports) and quantized with
    every recipe the web target ships: name -> model dir."""
    from gptedge.export.exporter import export_checkpoint
    from gptedge.quantize.quantizer import QuantizeRecipe, quantize_model_dir

    root = tmp_path_factory.mktemp("recipes")
    dirs = {}
    for name, recipe in WEB_RECIPES.items():
        dirs[name] = root / name
        if recipe is None:
            export_checkpoint(SAMPLE_MODEL, dirs[name], validate=False)
        else:
            quantize_model_dir(dirs["fp32"], dirs[name], QuantizeRecipe(**recipe))
    return dirs
