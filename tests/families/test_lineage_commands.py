"""The Llama-style family through the commands and the tokenizer as checkpoints ship it: `gptedge export`
(with its own rungs 3-4) + `generate` + weight-only `quantize`, add_bos and special tokens, several
end-of-sequence ids (generation_config.json's eos_token_id as a list)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from gptedge import runtime
from gptedge.cli import main
from gptedge.export.exporter import export_checkpoint
from gptedge.export.tokenizer_config import adds_bos

from ..support.lineage_checkpoints import variant_model, write_tokenizer, write_variant_checkpoint

PROMPT = "hello world, it is the end"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_variant_checkpoint(tmp_path_factory.mktemp("llama_cli") / "ckpt", "gqa2-linear")


@pytest.fixture(scope="module")
def cli_model(checkpoint, tmp_path_factory):
    out = tmp_path_factory.mktemp("llama_cli_out") / "model"
    result = CliRunner().invoke(main, ["export", str(checkpoint), "-o", str(out), "--graph", "kv_buffer"])
    assert result.exit_code == 0, result.output
    return out


def hf_tokenizer(checkpoint):
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_file=str(checkpoint / "tokenizer.json"), bos_token="<s>",
                                   eos_token="</s>", unk_token="<unk>")


def hf_greedy(ids: list[int], new_tokens: int, eos=2) -> list[int]:
    hf = variant_model("gqa2-linear")
    out = hf.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long), do_sample=False,
                      max_new_tokens=new_tokens, eos_token_id=eos, pad_token_id=2)
    return out[0, len(ids):].tolist()


def test_export_records_parity_kv_heads_and_add_bos(cli_model):
    manifest = json.loads((cli_model / "gptedge.json").read_text())
    assert manifest["shape"]["arch"] == "llama" and manifest["shape"]["n_kv_head"] == 2
    assert manifest["add_bos"] is True and manifest["bos_id"] == 1 and manifest["eos_id"] == 2
    assert manifest["parity"]["graph_vs_reference"]["max_abs_diff"] <= 1e-4
    assert manifest["parity"]["greedy_vs_reference"]["identical"] is True
    assert "RotaryEmbedding" in manifest["source"]["contrib_ops"]
    assert "GroupQueryAttention" in manifest["source"]["contrib_ops"]
    info = CliRunner().invoke(main, ["verify", str(cli_model)])
    assert info.exit_code == 0, info.output


def test_generate_cli_continues_as_transformers(checkpoint, cli_model):
    tok = hf_tokenizer(checkpoint)
    ids = tok(PROMPT)["input_ids"]
    assert ids[0] == 1  # transformers' tokenizer puts <s> first: gptedge must too
    want = hf_greedy(ids, 12)
    result = CliRunner().invoke(main, ["generate", str(cli_model), "-p", PROMPT, "--greedy", "-n", "12",
                                       "--device", "cpu", "--json"])
    assert result.exit_code == 0, result.output
    got = json.loads(result.stdout)
    assert got["prompt_ids"] == ids and got["ids"] == want
    assert got["text"] == tok.decode(want, skip_special_tokens=True)


def test_prompt_ids_as_the_checkpoints_tokenizer_makes_them(checkpoint, cli_model):
    loaded = runtime.load(cli_model, device="cpu")
    tok = hf_tokenizer(checkpoint)
    for text in (PROMPT, "héllo </s> wörld", "<s>the"):
        assert loaded.encode_prompt(text) == tok(text)["input_ids"]
    ids = loaded.encode_prompt("héllo </s> wörld")
    assert ids.count(2) == 1  # "</s>" is one special token, never split into pieces
    assert any(3 <= i < 259 for i in ids)  # é and ö come as byte-fallback tokens
    assert loaded.decode(loaded.encode("héllo wörld")) == "héllo wörld" == tok.decode(tok("héllo wörld")["input_ids"],
                                                                                    skip_special_tokens=True)


def test_add_bos_read_from_config_or_post_processor(tmp_path):
    write_tokenizer(tmp_path, add_bos=False)
    assert adds_bos(tmp_path) is False
    write_tokenizer(tmp_path, add_bos=True)
    assert adds_bos(tmp_path) is True
    (tmp_path / "tokenizer_config.json").unlink()  # only the post-processor says it
    assert adds_bos(tmp_path) is True
    write_tokenizer(tmp_path, add_bos=False)
    (tmp_path / "tokenizer_config.json").unlink()
    assert adds_bos(tmp_path) is False


def test_several_eos_ids_each_end_a_sequence(tmp_path):
    prompt = [5, 77, 140, 9, 300]
    free = hf_greedy(prompt, 20, eos=None)  # where greedy goes when nothing stops it
    stop = next(t for t in free[3:] if t != 2 and free.index(t) >= 3)
    end = free.index(stop) + 1
    source = write_variant_checkpoint(tmp_path / "ckpt", "gqa2-linear", tokenizer=False, eos=[2, stop])
    manifest = export_checkpoint(source, tmp_path / "model", graph_variant="kv_buffer")
    assert manifest.eos_id == 2 and manifest.eos_ids == (2, stop)
    assert json.loads((tmp_path / "model" / "generation_config.json").read_text())["eos_token_id"] == [2, stop]
    loaded = runtime.load(tmp_path / "model", device="cpu")
    got = loaded.generate(prompt, max_new_tokens=20, greedy=True)
    assert got.ids == free[:end] == hf_greedy(prompt, 20, eos=[2, stop]) and got.stop == "eos"
    beams = loaded.beam_search([prompt], max_new_tokens=20, num_beams=1)[0]
    assert beams.sequences[0] == free[:end]
    assert loaded.generate(prompt, max_new_tokens=20, greedy=True, ignore_eos=True).ids == free


def test_weight_only_8bit_quantize_runs(cli_model, tmp_path):
    out = tmp_path / "int8"
    result = CliRunner().invoke(main, ["quantize", str(cli_model), "-o", str(out), "--method", "weight-only",
                                       "--bits", "8"])
    assert result.exit_code == 0, result.output
    manifest = json.loads((out / "gptedge.json").read_text())
    assert manifest["precision"] == "int8" and manifest["shape"]["n_kv_head"] == 2
    fp32, int8 = runtime.load(cli_model, device="cpu"), runtime.load(out, device="cpu")
    a = fp32.generate(PROMPT, max_new_tokens=8, greedy=True).ids
    b = int8.generate(PROMPT, max_new_tokens=8, greedy=True).ids
    assert len(b) == 8 and b[:2] == a[:2]  # 8-bit weights keep the first greedy tokens of a tiny random model


def test_neox_through_export_generate_and_quantize(tmp_path):
    """GPT-NeoX (Pythia's family) through the same commands: export validates it (rungs 3-4), generate's ids are
    transformers', and weight-only 8-bit takes its untied embed_out."""
    source = write_variant_checkpoint(tmp_path / "ckpt", "neox-parallel", tokenizer=False)
    runner = CliRunner()
    result = runner.invoke(main, ["export", str(source), "-o", str(tmp_path / "m"), "--graph", "kv_buffer"])
    assert result.exit_code == 0, result.output
    manifest = json.loads((tmp_path / "m" / "gptedge.json").read_text())
    assert manifest["shape"]["arch"] == "gpt_neox" and "n_kv_head" not in manifest["shape"]
    assert manifest["parity"]["graph_vs_reference"]["max_abs_diff"] <= 1e-4
    prompt = [5, 77, 140, 9, 300]
    hf = variant_model("neox-parallel")
    want = hf.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, 5, dtype=torch.long), do_sample=False,
                       max_new_tokens=16, pad_token_id=2)[0, 5:].tolist()
    assert runtime.load(tmp_path / "m", device="cpu").generate(prompt, max_new_tokens=16, greedy=True).ids == want
    result = runner.invoke(main, ["quantize", str(tmp_path / "m"), "-o", str(tmp_path / "q"), "--method", "weight-only"])
    assert result.exit_code == 0, result.output
    assert len(runtime.load(tmp_path / "q", device="cpu").generate(prompt, max_new_tokens=8, greedy=True).ids) >= 1


def test_methods_that_need_a_tied_head_refuse_an_untied_one_in_one_line(cli_model, tmp_path):
    result = CliRunner().invoke(main, ["quantize", str(cli_model), "-o", str(tmp_path / "q"), "--method", "dynamic"])
    assert result.exit_code == 1 and "untied" in result.output and "unexpected" not in result.output, result.output
    assert not (tmp_path / "q").exists()


def test_sliding_windows_shorter_than_the_context_are_refused_by_name():
    from gptedge.export.families import read_hf_config
    from gptedge.runtime.errors import CheckpointError

    base = {"hidden_size": 64, "num_attention_heads": 4, "max_position_embeddings": 64}
    with pytest.raises(CheckpointError, match="sliding_window=16 is shorter than the context"):
        read_hf_config({"model_type": "mistral", **base, "sliding_window": 16})
    assert read_hf_config({"model_type": "mistral", **base, "sliding_window": None}).arch == "mistral"
    with pytest.raises(CheckpointError, match="use_sliding_window=true is not supported"):
        read_hf_config({"model_type": "qwen2", **base, "use_sliding_window": True})
    with pytest.raises(CheckpointError, match="rope_scaling type 'dynamic' is not supported"):
        read_hf_config({"model_type": "llama", **base, "rope_scaling": {"type": "dynamic", "factor": 2.0}})


def test_continuous_batch_rows_moving_along_the_buffer_keep_their_positions(cli_model):
    """The server's engine on a kv_buffer graph: rows share one timeline and move along the buffer (context 64 here,
    so it compacts). Rotary positions come from each row's own position ids, not the buffer index: every request
    gets the ids it gets alone."""
    from gptedge.runtime.serving.engine import CompletionRequest, Engine
    from gptedge.runtime.generation.sampling import SamplingParams

    from ..support.engine import Collector

    model = runtime.load(cli_model, device="cpu")
    rng = np.random.default_rng(4)
    requests = [CompletionRequest(tuple(int(t) for t in rng.integers(3, 300, n)), new, SamplingParams(greedy=True),
                                  ignore_eos=True) for n, new in ((3, 40), (17, 30), (9, 45), (25, 20), (5, 50))]
    solo = [model.generate(list(r.prompt_ids), r.max_new_tokens, greedy=True, ignore_eos=True).ids for r in requests]
    engine = Engine(model, max_batch=2, max_queue=8, prefill_chunk=4).start()
    got = []
    for r in requests:
        got.append(Collector())
        engine.submit(r, got[-1])
    assert all(c.finished() for c in got)
    engine.stop(grace_s=1)
    assert [c.last.generation.ids for c in got] == solo
