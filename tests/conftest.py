"""The shared fixtures: tiny seeded models built once per session (no downloads), their exports, and the shipped
sample model's web recipes. The plain helpers live in tests/support/ (checkpoints.py and beside it); they are
imported here too, so `from .conftest import tiny_reference` keeps working."""

from __future__ import annotations

from pathlib import Path

import pytest

from .support.checkpoints import (  # noqa: F401 - re-exported for test files that import them from here
    EXCERPT, GPT2_TOKENIZER, GPT2_VOCAB, ROOT, SAMPLE_MODEL, built_once, copy_gpt2_tokenizer, reference_perplexity,
    tiny_config, tiny_reference, write_checkpoint)


@pytest.fixture
def runner():
    """click's CliRunner: the `gptedge` command in process (tests/support/cli.py has the subprocess runners)."""
    from click.testing import CliRunner

    return CliRunner()


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
    """transformers' fine-tuned classes (tests/support/task_checkpoints.py), tiny and seeded: head name -> checkpoint
    dir."""
    from .support.task_checkpoints import build_checkpoints

    return build_checkpoints(tmp_path_factory.mktemp("task-checkpoints"))


@pytest.fixture(scope="session")
def task_dirs(tmp_path_factory, task_checkpoints) -> dict[str, Path]:
    """Those checkpoints exported as classifier dirs (task_checkpoints.EXPORTS): name -> dir."""
    from .support.task_checkpoints import build_dirs

    return build_dirs(tmp_path_factory.mktemp("task-dirs"), task_checkpoints)


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
