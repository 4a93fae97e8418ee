"""Every model dir gptedge writes runs unchanged in ONNX Runtime GenAI, with the same greedy ids.

Standard and kv_buffer graphs x fp32 / dynamic / static / weight-only: GenAI's own C++ loop, reading
only genai_config.json, tokenizer_config.json and the graph, must give the ids `gptedge generate`
gives on 3 prompts x 32 tokens and on a batch of 4 left-padded prompts. The tiny model's weights are
drawn with std 0.3 (not GPT-2's 0.02) so greedy continuations vary instead of repeating one token,
which would let a wrong position or cache slip through.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from ..support.checkpoints import ROOT, tiny_config, write_checkpoint

og = pytest.importorskip("onnxruntime_genai")  # the `test` extra installs it; only a bare install skips
pytestmark = pytest.mark.interop  # another engine (ONNX Runtime GenAI) on gptedge's dirs

PROMPTS = ["It is a truth universally acknowledged", "Hello", "The quick brown fox jumps over the lazy"]
BATCH = ["Sir Walter Elliot", "Hello", "of Kellynch Hall, in Somersetshire, was a man", "who"]
NEW = 32
EOS = 50256
VARIANTS = [(g, p) for g in ("standard", "kv_buffer") for p in ("fp32", "dynamic", "static", "weight-only")]


@pytest.fixture(scope="module")
def genai_dirs(tmp_path_factory):
    """One fp32 dir per graph and its three INT8 variants, written by gptedge's own export / quantize."""
    from gptedge.export.exporter import export_checkpoint
    from gptedge.export.reference import GPT
    from gptedge.quantize.quantizer import QuantizeRecipe, quantize_model_dir

    root = tmp_path_factory.mktemp("genai")
    ck = write_checkpoint(GPT(tiny_config()).init_weights(3, std=0.3).eval(), root / "ck")
    calibration = (ROOT / "samples" / "calibration" / "emma_ch1-4.txt").read_text(encoding="utf-8")[:20000]
    dirs = {}
    for graph in ("standard", "kv_buffer"):
        fp32 = dirs[graph, "fp32"] = root / f"{graph}-fp32"
        export_checkpoint(ck, fp32, graph_variant=graph)
        for method in ("dynamic", "static", "weight-only"):
            recipe = QuantizeRecipe(method, calibration_sequences=4, calibration_length=32)
            dirs[graph, method] = root / f"{graph}-{method}"
            quantize_model_dir(fp32, dirs[graph, method], recipe, calibration_text=calibration)
    return dirs


def genai_greedy(model_dir, prompts: list[list[int]], new_tokens: int, pad: int = EOS) -> list[list[int]]:
    """GenAI's loop on a batch -> each row's new ids, cut at the first eos (GenAI pads after it).

    GenAI pads a batch on the right, as its own tokenizer.encode_batch does (trailing pad ids get mask 0
    and the next token goes after the padded width); leading pad ids would be read as prompt tokens."""
    model = og.Model(str(model_dir))
    width = max(len(p) for p in prompts)
    ids = np.full((len(prompts), width), pad, dtype=np.int32)
    for row, p in enumerate(prompts):
        ids[row, :len(p)] = p
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=width + new_tokens, batch_size=len(prompts))
    generator = og.Generator(model, params)
    generator.append_tokens(ids)
    while not generator.is_done():
        generator.generate_next_token()
    return [_cut_at_eos(list(map(int, generator.get_sequence(row)))[width:]) for row in range(len(prompts))]


def _cut_at_eos(ids: list[int]) -> list[int]:
    return ids[:ids.index(EOS) + 1] if EOS in ids else ids


def gptedge_greedy(model_dir, prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
    from gptedge.runtime import load

    out = load(model_dir, device="cpu").generate_batch(prompts, max_new_tokens=new_tokens, greedy=True)
    return [list(g.ids) for g in out]


def encode(model_dir, texts: list[str]) -> list[list[int]]:
    from gptedge.runtime import load

    return [list(load(model_dir, device="cpu").tokenizer.encode(t).ids) for t in texts]


@pytest.mark.parametrize("graph,precision", VARIANTS)
def test_genai_greedy_ids_equal_gptedge(genai_dirs, graph, precision):
    model_dir = genai_dirs[graph, precision]
    for ids in encode(model_dir, PROMPTS):
        ours = gptedge_greedy(model_dir, [ids], NEW)[0]
        assert len(set(ours)) > 3, "the test model should not just repeat a token"
        assert genai_greedy(model_dir, [ids], NEW)[0] == ours


@pytest.mark.parametrize("graph,precision",
                         [(g, p) for g in ("standard", "kv_buffer") for p in ("fp32", "weight-only")])
def test_genai_batch_equals_gptedge_left_padded_batch(genai_dirs, graph, precision):
    """gptedge's left-padded batch of 4 against GenAI's (right-padded) batch of the same prompts.

    Not the dynamic and static variants: their activations are quantized with one scale per tensor, over
    the whole batch padding included, so a batch's ids may differ from one padded the other way."""
    model_dir = genai_dirs[graph, precision]
    prompts = encode(model_dir, BATCH)
    assert len({len(p) for p in prompts}) > 2, "the batch must need left padding"
    assert genai_greedy(model_dir, prompts, NEW) == gptedge_greedy(model_dir, prompts, NEW)


def test_genai_tokenizer_encodes_like_gptedge(genai_dirs):
    model_dir = genai_dirs["kv_buffer", "fp32"]
    tokenizer = og.Tokenizer(og.Model(str(model_dir)))
    for text, ours in zip(PROMPTS + BATCH, encode(model_dir, PROMPTS + BATCH), strict=True):
        assert list(map(int, tokenizer.encode(text))) == ours


def test_genai_prefill_logits_equal_gptedge(genai_dirs):
    """GenAI leaves logits_to_keep unfed: the default (every position) must give the runtime's logits."""
    from gptedge.runtime import load

    model_dir = genai_dirs["kv_buffer", "fp32"]
    ids = encode(model_dir, PROMPTS[:1])[0]
    model = og.Model(str(model_dir))
    generator = og.Generator(model, og.GeneratorParams(model))
    generator.append_tokens(np.array([ids], dtype=np.int32))
    theirs = np.asarray(generator.get_logits()).reshape(-1)
    loaded = load(model_dir, device="cpu")
    ours = loaded.generate_batch([ids], max_new_tokens=1, greedy=True)[0].ids[0]
    arr = np.array([ids])
    logits, _ = loaded.forward(arr, np.ones_like(arr), np.arange(len(ids))[None], loaded.empty_past(1))
    np.testing.assert_allclose(theirs, logits[0, -1], atol=1e-4)
    assert int(theirs.argmax()) == ours


def test_genai_seeded_top_k_sampling(genai_dirs):
    """Top-k 40 from genai_config.json's defaults: reproducible with a seed, and every token is one of
    the 40 most likely under gptedge's own logits for that position."""
    from gptedge.runtime import load

    model_dir = genai_dirs["standard", "fp32"]
    config = json.loads((model_dir / "genai_config.json").read_text())
    assert config["search"]["do_sample"] is True and config["search"]["top_k"] == 40
    ids = encode(model_dir, PROMPTS[:1])[0]

    def sample(seed: int) -> list[int]:
        model = og.Model(str(model_dir))
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=len(ids) + NEW, random_seed=seed)
        generator = og.Generator(model, params)
        generator.append_tokens(np.array([ids], dtype=np.int32))
        while not generator.is_done():
            generator.generate_next_token()
        return list(map(int, generator.get_sequence(0)))

    first, again, other = sample(7), sample(7), sample(8)
    assert first == again and first != other and len(first) == len(ids) + NEW
    loaded = load(model_dir, device="cpu")
    seq = np.array([first])
    logits, _ = loaded.forward(seq, np.ones_like(seq), np.arange(seq.shape[1])[None], loaded.empty_past(1))
    top40 = np.argsort(-logits[0], axis=-1)[:, :40]  # (T, 40)
    for t in range(len(ids), len(first)):
        assert first[t] in top40[t - 1]
    assert not all(first[t] == top40[t - 1][0] for t in range(len(ids), len(first))), "it sampled greedily"


def test_genai_config_fields(genai_dirs):
    for (graph, _precision), model_dir in genai_dirs.items():
        config = json.loads((model_dir / "genai_config.json").read_text())
        model, search = config["model"], config["search"]
        assert model["type"] == "decoder" and model["eos_token_id"] == EOS and model["pad_token_id"] == EOS
        assert search["past_present_share_buffer"] is (graph == "kv_buffer")
        assert search["max_length"] == model["context_length"] == 128
        decoder = model["decoder"]
        assert (decoder["head_size"], decoder["num_attention_heads"], decoder["num_hidden_layers"]) == (8, 4, 2)
        assert decoder["inputs"]["past_key_names"] == "past_key_values.%d.key"
        assert (model_dir / "tokenizer_config.json").is_file()


def test_genai_readiness(genai_dirs, tmp_path):
    from gptedge.runtime.modeldir.genai_config import genai_readiness
    from gptedge.runtime.modeldir.manifest import read_manifest

    for model_dir in genai_dirs.values():
        assert genai_readiness(model_dir, read_manifest(model_dir)).ready
    broken = tmp_path / "kvb"
    shutil.copytree(genai_dirs["kv_buffer", "fp32"], broken)
    manifest = read_manifest(broken)
    old = manifest.replace(inputs=manifest.inputs + ("logits_to_keep",))  # a dir from before the default
    assert "logits_to_keep" in genai_readiness(broken, old).reason and not genai_readiness(broken, old).ready
    config = json.loads((broken / "genai_config.json").read_text())
    config["search"]["past_present_share_buffer"] = False
    (broken / "genai_config.json").write_text(json.dumps(config))
    assert not genai_readiness(broken, manifest).ready
    (broken / "tokenizer_config.json").unlink()
    (broken / "genai_config.json").unlink()
    assert "genai_config.json" in genai_readiness(broken, manifest).reason


def test_info_says_whether_genai_ready(genai_dirs, tmp_path):
    from click.testing import CliRunner

    from gptedge.cli import main

    ready = json.loads(CliRunner().invoke(main, ["info", str(genai_dirs["kv_buffer", "weight-only"])]).output)
    assert ready["genai_ready"] is True and "shared" in ready["genai"]
    stale = tmp_path / "stale"
    shutil.copytree(genai_dirs["standard", "fp32"], stale)
    (stale / "genai_config.json").unlink()
    result = json.loads(CliRunner().invoke(main, ["info", str(stale)]).output)
    assert result["genai_ready"] is False and "genai_config.json" in result["genai"]


@pytest.mark.parametrize("graph", ["standard", "kv_buffer"])
def test_bench_genai_peer_runs_on_the_same_dir(genai_dirs, graph):
    """A peer row from GenAI's loop on the benchmarked dir (no HF checkpoint needed); speeds are not asserted."""
    from click.testing import CliRunner

    from gptedge.cli import main

    model_dir = genai_dirs[graph, "fp32"]
    result = CliRunner().invoke(main, ["bench", str(model_dir), "--peers", "genai", "--prompt", "4", "--new", "6",
                                       "--batch", "2", "--repeat", "1", "--threads", "1", "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)["rows"]
    assert [r["name"] for r in rows] == [f"gptedge {model_dir.name}", f"ONNX Runtime GenAI ({model_dir.name})"]
    assert rows[1]["notes"] == f"onnxruntime-genai {og.__version__}" and rows[1]["decode_tok_s"] > 0
