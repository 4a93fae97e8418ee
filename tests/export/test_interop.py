"""Interop: transformers checkpoints in, Optimum both ways."""

from __future__ import annotations

import shutil

import pytest
import torch

from gptedge.export.exporter import export_checkpoint
from gptedge.runtime import load

from ..support.checkpoints import copy_gpt2_tokenizer

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.interop

PROMPTS = ["Hello world", "It is a truth universally acknowledged that a single man", "In the beginning"]


def save_pretrained_gpt2(out, dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    cfg = transformers.GPT2Config(n_embd=48, n_layer=3, n_head=4, n_positions=160, vocab_size=50257)
    model = transformers.GPT2LMHeadModel(cfg).eval().to(dtype)
    model.save_pretrained(out)
    copy_gpt2_tokenizer(out)
    return model


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_save_pretrained_checkpoint_greedy_equals_transformers_generate(tmp_path, dtype):
    hf = save_pretrained_gpt2(tmp_path / "ck", dtype)
    export_checkpoint(tmp_path / "ck", tmp_path / "md")
    loaded = load(tmp_path / "md", device="cpu")
    hf = hf.float()  # fp16 weights computed in fp32, as gptedge does
    for prompt in PROMPTS:
        ids = loaded.encode(prompt)
        with torch.no_grad():
            want = hf.generate(torch.tensor([ids]), max_new_tokens=64, do_sample=False, min_new_tokens=64,
                               pad_token_id=50256, eos_token_id=None)[0, len(ids):].tolist()
        got = loaded.generate(prompt, max_new_tokens=64, greedy=True)
        assert got.ids == want
        assert got.text == loaded.decode(want)


@pytest.fixture(scope="module")
def optimum_ort():
    return pytest.importorskip("optimum.onnxruntime")


def test_optimum_loads_a_gptedge_model_dir(tmp_path, optimum_ort):
    save_pretrained_gpt2(tmp_path / "ck", seed=1)
    export_checkpoint(tmp_path / "ck", tmp_path / "md")
    ort_model = optimum_ort.ORTModelForCausalLM.from_pretrained(tmp_path / "md", provider="CPUExecutionProvider")
    loaded = load(tmp_path / "md", device="cpu")
    for prompt in PROMPTS:
        ids = loaded.encode(prompt)
        out = ort_model.generate(torch.tensor([ids]), max_new_tokens=32, min_new_tokens=32, do_sample=False,
                                 pad_token_id=50256)
        assert out[0, len(ids):].tolist() == loaded.generate(prompt, max_new_tokens=32, greedy=True).ids


def test_gptedge_runs_a_model_dir_exported_by_optimum(tmp_path, optimum_ort):
    from optimum.exporters.onnx import main_export

    hf = save_pretrained_gpt2(tmp_path / "ck", seed=2)
    shutil.copyfile(tmp_path / "ck" / "encoder.json", tmp_path / "ck" / "vocab.json")
    shutil.copyfile(tmp_path / "ck" / "vocab.bpe", tmp_path / "ck" / "merges.txt")
    main_export(str(tmp_path / "ck"), output=str(tmp_path / "opt"), task="text-generation-with-past",
                no_post_process=False)
    loaded = load(tmp_path / "opt", device="cpu")
    assert loaded.manifest.shape.n_layer == 3
    for prompt in PROMPTS:
        ids = loaded.encode(prompt)
        with torch.no_grad():
            want = hf.generate(torch.tensor([ids]), max_new_tokens=32, min_new_tokens=32, do_sample=False,
                               pad_token_id=50256)[0, len(ids):].tolist()
        assert loaded.generate(prompt, max_new_tokens=32, greedy=True).ids == want
