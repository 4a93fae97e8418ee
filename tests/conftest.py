"""The shared fixtures: tiny seeded models built once per session (no downloads), their exports, and the shipped
sample model's web recipes. The plain helpers live in tests/support/ (checkpoints.py and beside it); they are
imported here too, so `from .conftest import tiny_reference` keeps working."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from .support.cpus import EVERY_CPU
from .support.checkpoints import (  # noqa: F401 - re-exported for test files that import them from here
    EXCERPT, GPT2_TOKENIZER, GPT2_VOCAB, ROOT, SAMPLE_MODEL, built_once, copy_gpt2_tokenizer, reference_perplexity,
    tiny_config, tiny_reference, write_checkpoint)


# pytest-xdist (scripts/test.sh: `-n 2 --dist loadgroup`) runs a work unit per worker: one test, or all the tests of
# one xdist_group. A fixture wider than a test and narrower than the session is built once per worker that runs one
# of its tests, so each test module holding one is a group (its fixture is built once, as in a serial run); tests/ray
# is one group (the one Ray cluster of tests/ray/conftest.py, which two workers must not start twice).
# Session fixtures are built once per worker, or once per run where they share a folder (built_once).
SERIAL_FOLDERS = {"ray": "tests/ray"}


def pytest_configure(config):
    _keep_the_worker_to_its_cpus()


def _keep_the_worker_to_its_cpus() -> None:
    """Under xdist, worker gwI (of N) and every thread and process it starts run on CPUs I, I+N, ... only. ONNX
    Runtime sizes its intra-op pool by the CPUs a process may use, and its threads spin-wait after each run: two
    workers on 2 cores each running 2-thread pools spun against each other, and the suite took longer on two workers
    than on one (about 30 min vs 24). Kept to one core each, every session of a worker is one thread that never waits
    for the other worker's. GPTEDGE_TEST_PIN=0 turns it off."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER", ""), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if not worker.startswith("gw") or count < 2 or os.environ.get("GPTEDGE_TEST_PIN") == "0":
        return
    if not hasattr(os, "sched_setaffinity"):  # not Linux
        return
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < count:
        return
    share = set(cpus[int(worker[2:]) % count::count])
    os.environ[EVERY_CPU] = ",".join(map(str, cpus))  # for a test that must see them all (tests/support/cpus.py)
    for task in os.listdir("/proc/self/task"):  # every thread already running (execnet's), not only this one
        try:
            os.sched_setaffinity(int(task), share)
        except OSError:  # a thread that ended meanwhile
            pass


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    if not getattr(config.option, "loadgroup", False):  # set on the workers of `--dist loadgroup` only
        return
    for item in items:
        group = None if item.get_closest_marker("xdist_group") else _work_unit(item)
        if group:
            item.add_marker(pytest.mark.xdist_group(group))
        group = group or next((m.args[0] for m in item.iter_markers("xdist_group") if m.args), None)
        if group and hasattr(item, "_id") and item.nodeid.rfind("@") <= item.nodeid.rfind("]"):
            # The scheduler groups by "NODEID@GROUP". xdist 3.8 writes that into item._nodeid, which pytest 9.2
            # no longer reads (a node id is item._id), so its groups would be silently ignored: write it here.
            from _pytest.nodeid import NodeId

            item._id = NodeId.parse(f"{item.nodeid}@{group}")


def _work_unit(item) -> str | None:
    """The xdist_group of a test: its folder's, its module (when it takes a wider fixture), or none (alone)."""
    module = item.nodeid.split("::")[0]
    for group, folder in SERIAL_FOLDERS.items():
        if module.startswith(folder + "/"):
            return group
    wide = any(defs and defs[-1].scope in ("class", "module", "package")
               for defs in item._fixtureinfo.name2fixturedefs.values())
    return module if wide else None


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
    from .support.task_checkpoints import HEADS, build_checkpoints

    root = built_once(tmp_path_factory, "task-checkpoints", lambda out: _folder_of(build_checkpoints, out),
                      for_mutants=False)
    return {head: root / head for head in HEADS}


@pytest.fixture(scope="session")
def task_dirs(tmp_path_factory, task_checkpoints) -> dict[str, Path]:
    """Those checkpoints exported as classifier dirs (task_checkpoints.EXPORTS): name -> dir."""
    from .support.task_checkpoints import EXPORTS, build_dirs

    root = built_once(tmp_path_factory, "task-dirs",
                      lambda out: _folder_of(lambda folder: build_dirs(folder, task_checkpoints), out),
                      for_mutants=False)
    return {name: root / name for name in EXPORTS}


def _folder_of(build, out: Path) -> Path:
    """build(out) fills the folder out (made here) with several things; built_once wants the folder back."""
    out.mkdir(parents=True)
    build(out)
    return out


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

    def build(root: Path) -> Path:
        root.mkdir(parents=True)
        for name, recipe in WEB_RECIPES.items():
            if recipe is None:
                export_checkpoint(SAMPLE_MODEL, root / name, validate=False)
            else:
                quantize_model_dir(root / "fp32", root / name, QuantizeRecipe(**recipe))
        return root

    root = built_once(tmp_path_factory, "recipes", build, for_mutants=False)
    return {name: root / name for name in WEB_RECIPES}
