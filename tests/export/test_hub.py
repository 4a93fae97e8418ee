"""Hugging Face Hub ids as export sources, from a Hub-layout cache built here; no test touches the network.

Every test runs with HF_HUB_OFFLINE=1 and HF_HOME in a temporary dir holding
hub/models--org--name/{refs/main, snapshots/<rev>/...}, the layout huggingface_hub writes.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from ..support.checkpoints import tiny_reference, write_checkpoint

pytestmark = pytest.mark.slow  # Hub-layout caches built and exported from, one per test

REV_A = "a" * 40
REV_B = "b" * 40


def add_snapshot(hf_home: Path, repo_id: str, rev: str, seed: int, main: bool) -> Path:
    """A tiny seeded GPT-2 as a cached Hub snapshot of repo_id at commit rev."""
    repo = hf_home / "hub" / ("models--" + repo_id.replace("/", "--"))
    snapshot = write_checkpoint(tiny_reference("gpt2", seed=seed), repo / "snapshots" / rev)
    (snapshot / "tf_model.h5").write_bytes(b"not read")  # a file the export must not need
    if main:
        (repo / "refs").mkdir(parents=True, exist_ok=True)
        (repo / "refs" / "main").write_text(rev)
    return snapshot


@pytest.fixture
def hub(tmp_path, monkeypatch):
    home = tmp_path / "hf"
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    add_snapshot(home, "org/tiny-gpt2", REV_A, seed=0, main=True)
    add_snapshot(home, "org/tiny-gpt2", REV_B, seed=5, main=False)
    add_snapshot(home, "tiny", REV_A, seed=2, main=True)  # an id without an org, like "gpt2"
    return home


def export(*args: str):
    from gptedge.cli import main

    return CliRunner().invoke(main, ["export", *args])


def manifest(out: Path) -> dict:
    return json.loads((out / "gptedge.json").read_text())


def test_hub_id_resolves_from_offline_cache_and_is_recorded(hub, tmp_path):
    result = export("org/tiny-gpt2", "-o", str(tmp_path / "out"))
    assert result.exit_code == 0, result.output
    source = manifest(tmp_path / "out")["source"]
    assert source["hub_repo_id"] == "org/tiny-gpt2" and source["hub_revision"] == REV_A
    assert Path(source["path"]) == (hub / "hub" / "models--org--tiny-gpt2" / "snapshots" / REV_A).resolve()
    assert (tmp_path / "out" / "genai_config.json").is_file()


def test_id_without_org(hub, tmp_path):
    assert export("tiny", "-o", str(tmp_path / "out")).exit_code == 0
    assert manifest(tmp_path / "out")["source"]["hub_revision"] == REV_A


def test_revision_option_picks_that_snapshot(hub, tmp_path):
    from gptedge.export.checkpoint import file_sha256

    assert export("org/tiny-gpt2", "--revision", REV_B, "-o", str(tmp_path / "b")).exit_code == 0
    source = manifest(tmp_path / "b")["source"]
    weights = hub / "hub" / "models--org--tiny-gpt2" / "snapshots" / REV_B / "model.safetensors"
    assert source["hub_revision"] == REV_B and source["sha256"] == file_sha256(weights)
    assert export("org/tiny-gpt2", "-o", str(tmp_path / "a")).exit_code == 0
    assert manifest(tmp_path / "a")["source"]["sha256"] != source["sha256"]


def test_local_dir_wins_over_hub_id(hub, tmp_path):
    local = write_checkpoint(tiny_reference("gpt2", seed=9), tmp_path / "org" / "tiny-gpt2")
    assert export("org/tiny-gpt2", "-o", str(tmp_path / "out")).exit_code == 0
    source = manifest(tmp_path / "out")["source"]
    assert Path(source["path"]) == local.resolve() and source["hub_repo_id"] is None
    result = export("org/tiny-gpt2", "--revision", REV_B, "-o", str(tmp_path / "out2"))
    assert result.exit_code == 1 and "local directory" in result.output


def test_offline_and_not_cached_is_one_line(hub, tmp_path):
    result = export("openai-community/gpt2-medium", "-o", str(tmp_path / "out"))
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "openai-community/gpt2-medium" in lines[0] and "HF_HUB_OFFLINE=1" in lines[0]
    assert not (tmp_path / "out").exists()
    missing_rev = export("org/tiny-gpt2", "--revision", "c" * 40, "-o", str(tmp_path / "out"))
    assert missing_rev.exit_code == 1 and "c" * 40 in missing_rev.output


def test_not_a_dir_nor_an_id(hub, tmp_path):
    result = export("./no/such/../dir", "-o", str(tmp_path / "out"))
    assert result.exit_code == 1 and "not a Hugging Face Hub id" in result.output


def test_only_export_files_are_asked_for_and_token_is_passed(hub, tmp_path, monkeypatch):
    """snapshot_download gets the allow-list (no TF/Flax/ONNX copies), HF_TOKEN and the cache read from
    the environment at call time."""
    import huggingface_hub

    from gptedge.export.hub import resolve_source

    calls = []
    real = huggingface_hub.snapshot_download

    def spy(repo_id, **kwargs):
        calls.append(kwargs)
        return real(repo_id, **kwargs)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", spy)
    monkeypatch.setenv("HF_TOKEN", "hf_test_token")
    path, info = resolve_source("org/tiny-gpt2")
    assert info == {"hub_repo_id": "org/tiny-gpt2", "hub_revision": REV_A}
    (kwargs,) = calls
    assert kwargs["token"] == "hf_test_token" and kwargs["local_files_only"] is True
    assert Path(kwargs["cache_dir"]) == hub / "hub"
    assert "model.safetensors" in kwargs["allow_patterns"] and "config.json" in kwargs["allow_patterns"]
    assert not any(p.endswith((".h5", ".msgpack", ".onnx", ".bin")) for p in kwargs["allow_patterns"])
    assert path.name == REV_A


def test_task_head_exports_from_a_hub_id(hub, tmp_path):
    """export --task takes a Hub id as the LM export does: the cached snapshot is read and recorded."""
    from ..support.task_checkpoints import make_checkpoint

    repo = hub / "hub" / "models--org--tiny-entail"
    make_checkpoint("gpt2-seq", repo / "snapshots" / REV_A)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(REV_A)
    result = export("org/tiny-entail", "-o", str(tmp_path / "cls"), "--task", "entailment")
    assert result.exit_code == 0, result.output
    m = manifest(tmp_path / "cls")
    assert m["source"]["hub_repo_id"] == "org/tiny-entail" and m["source"]["hub_revision"] == REV_A
    assert m["task"]["name"] == "entailment" and m["task"]["id2label"]["2"] == "entailment"
    missing = export("org/not-cached", "-o", str(tmp_path / "none"), "--task", "entailment")
    assert missing.exit_code != 0 and len(missing.output.strip().splitlines()) == 1
    assert not (tmp_path / "none").exists()
