"""samples/train_sample_model.py's options for held-out checkpoints: which texts it trains on, an existing tokenizer
(GPT-2's own files) in place of a trained one, and a run that writes a loadable checkpoint with its log."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

from ..support.checkpoints import ROOT

pytestmark = pytest.mark.slow  # runs the training script

pytest.importorskip("torch")
SCRIPT = ROOT / "samples" / "train_sample_model.py"
GPT2_FILES = ROOT / "samples" / "tokenizers" / "gpt2"


def script():
    spec = importlib.util.spec_from_file_location("train_sample_model", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def corpus(tmp_path):
    """A corpus laid out as ../shared/corpus is, a few lines per text."""
    (tmp_path / "austen").mkdir()
    (tmp_path / "kjv").mkdir()
    (tmp_path / "austen" / "emma.txt").write_text("Emma Woodhouse, handsome, clever, and rich. " * 40)
    (tmp_path / "austen" / "persuasion.txt").write_text("Sir Walter Elliot, of Kellynch Hall. " * 40)
    (tmp_path / "kjv" / "kjv.txt").write_text("In the beginning God created the heaven and the earth. " * 40)
    return tmp_path


def test_training_files_hold_persuasion_out_and_pick_texts(corpus):
    files = script().training_files
    assert [p.name for p in files(corpus)] == ["emma.txt", "kjv.txt"]
    assert [p.name for p in files(corpus, ("kjv",))] == ["kjv.txt"]
    assert [p.name for p in files(corpus, ("austen",))] == ["emma.txt"]  # never persuasion.txt


def test_gpt2_tokenizer_from_its_two_files():
    tok = script().load_tokenizer(GPT2_FILES)
    assert tok.encode("Hello world").ids == [15496, 995] and tok.get_vocab_size() == 50257


def test_a_run_on_one_text_with_gpt2s_tokenizer_writes_a_checkpoint_and_log(corpus, tmp_path):
    out = tmp_path / "out"
    args = ["--corpus", str(corpus), "--out", str(out), "--work-dir", str(tmp_path / "work"), "--texts", "kjv",
            "--tokenizer", str(GPT2_FILES), "--n-layer", "1", "--n-embd", "32", "--n-head", "2", "--context", "16",
            "--batch", "2", "--steps", "2", "--warmup", "1", "--save-every", "2"]
    run = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "vocab 50257" in run.stdout
    log = json.loads((out / "training_log.json").read_text())
    assert log["steps"] == 2 and log["args"]["texts"] == "kjv" and log["args"]["tokenizer"] == str(GPT2_FILES)
    config = json.loads((out / "config.json").read_text())
    assert (config["vocab_size"], config["n_layer"]) == (50257, 1)
    assert json.loads((out / "tokenizer.json").read_text())["model"]["type"] == "BPE"
    bad = subprocess.run([sys.executable, str(SCRIPT), *args[:8], "--texts", "austen,bible"], capture_output=True,
                         text=True, timeout=600)
    assert bad.returncode != 0 and "--texts 'austen,bible': name austen and / or kjv" in bad.stderr
