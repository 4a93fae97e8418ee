"""lm-evaluation-harness through a real `gptedge serve` equals lm-eval's own `hf` backend on the same checkpoint
(issue 37): every loglikelihood request within 1e-4 on the fp32 export, the task's metrics equal. Offline: a
local multiple-choice task written from committed text (benchmarks/lm_eval_compare.py, which records the
figures in benchmarks/results/)."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from ..support.checkpoints import ROOT, SAMPLE_MODEL

pytest.importorskip("lm_eval")
pytest.importorskip("accelerate")  # lm-eval's hf backend imports it

DOCS = 20  # x 4 endings: 80 loglikelihood requests per backend


def _benchmark():
    spec = importlib.util.spec_from_file_location("lm_eval_compare", ROOT / "benchmarks" / "lm_eval_compare.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("lm_eval_compare", module)
    spec.loader.exec_module(module)
    return module


def test_the_task_is_written_from_committed_text(tmp_path):
    bench = _benchmark()
    docs = bench.task_docs(DOCS)
    assert len(docs) == DOCS and {d["gold"] for d in docs} == set(range(bench.CHOICES))
    for d in docs:
        assert len(d["endings"]) == bench.CHOICES == len(set(d["endings"]))
        assert all(e.startswith(" ") and len(e.split()) == bench.ENDING_WORDS for e in d["endings"])
    yaml = (bench.write_task(tmp_path, DOCS) / f"{bench.TASK}.yaml").read_text()
    assert "dataset_path: json" in yaml and str(tmp_path / "passages.jsonl") in yaml


@pytest.mark.slow
def test_lm_eval_through_the_server_equals_its_hf_backend(tmp_path, monkeypatch, sample_recipe_dirs):
    """The fp32 dir is conftest's session export of the sample model (the script exports its own)."""
    bench = _benchmark()
    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.setenv(name, "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "datasets-cache"))
    assert bench.SAMPLE == SAMPLE_MODEL  # the checkpoint that dir was exported from
    result = bench.compare(bench.SAMPLE, sample_recipe_dirs["fp32"], DOCS, tmp_path)
    assert result["requests"] == DOCS * bench.CHOICES
    assert result["max_diff"] < 1e-4
    assert result["served"] == result["hf"] and set(result["served"]) == {"acc", "acc_norm"}
