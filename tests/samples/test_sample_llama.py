"""The shipped Llama sample (samples/sample-llama: GQA, untied head, its own Metaspace BPE with byte fallback, a
ChatML template, two end-of-sequence ids) through export, generate, the tokenizer and the chat template, each
against transformers; and its held-out quality after weight-only quantization."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

from gptedge.cli import main
from gptedge.export.exporter import export_checkpoint
from gptedge.measure.compare import compare
from gptedge.quantize.quantizer import QuantizeRecipe, quantize_model_dir
from gptedge.runtime import load
from gptedge.runtime.generation.evaluate import perplexity
from gptedge.runtime.modeldir.chat_template import find_chat_template, render_chat, special_tokens

from ..support.checkpoints import EXCERPT, ROOT

# The 4.7M-parameter sample exported and quantized end to end: a minute or two on 2 cores, so slow (CI runs it).
pytestmark = pytest.mark.slow

SAMPLE = ROOT / "samples" / "sample-llama"
CALIBRATION = ROOT / "samples" / "calibration" / "emma_ch1-4.txt"
EVAL_TOKENS = 8_000  # of the held-out excerpt
PROMPTS = ("It is a truth universally acknowledged, that", "Emma Woodhouse, handsome, clever, and rich,",
           "\"My dear Mr. Bennet,\" said his lady to him one day,", "Captain Wentworth")
UNK, BOS, EOS, IM_START, IM_END = 0, 1, 2, 3, 4
CHAT = [{"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Will you walk with me to Highbury this morning?"}]
# Thresholds on the first 8,000 tokens of the excerpt at about 2.5x the cost measured on the whole excerpt when the
# sample was made (2026-11-26, onnxruntime 1.32.0, AMD EPYC with AVX2; benchmarks/results/llama-sample-2026-11-26.md):
#   weight-only 8-bit  KL 4.4e-05  top-1 99.33 %      4-bit  KL 9.8e-04  top-1 96.99 %
THRESHOLDS = {  # name: (recipe, max mean KL, min top-1 agreement)
    "weight-only": (QuantizeRecipe("weight-only"), 0.00015, 0.98),
    "int4": (QuantizeRecipe("weight-only", bits=4), 0.0025, 0.95),
}


@pytest.fixture(scope="module")
def hf_model():
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM.from_pretrained(SAMPLE, torch_dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def hf_tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(SAMPLE)


@pytest.fixture(scope="module")
def sample_dirs(tmp_path_factory):
    base = tmp_path_factory.mktemp("sample_llama")
    result = CliRunner().invoke(main, ["export", str(SAMPLE), "-o", str(base / "fp32")])
    assert result.exit_code == 0, result.output
    calibration = CALIBRATION.read_text(encoding="utf-8")
    for name, (recipe, _, _) in THRESHOLDS.items():
        quantize_model_dir(base / "fp32", base / name, recipe, calibration_text=calibration)
    return base


@pytest.fixture(scope="module")
def fp32(sample_dirs):
    return load(sample_dirs / "fp32", device="cpu")


def hf_greedy(hf_model, ids: list[int], new_tokens: int) -> list[int]:
    out = hf_model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                            do_sample=False, max_new_tokens=new_tokens, eos_token_id=[EOS, IM_END], pad_token_id=EOS)
    return out[0, len(ids):].tolist()


def test_shipped_files_say_what_the_readme_says():
    config = json.loads((SAMPLE / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["tie_word_embeddings"] is False
    assert config["num_attention_heads"] == 6 and config["num_key_value_heads"] == 2
    assert config["eos_token_id"] == [EOS, IM_END]
    assert json.loads((SAMPLE / "generation_config.json").read_text())["eos_token_id"] == [EOS, IM_END]
    tokenizer_config = json.loads((SAMPLE / "tokenizer_config.json").read_text())
    assert tokenizer_config["add_bos_token"] is True and "add_generation_prompt" in tokenizer_config["chat_template"]
    assert (SAMPLE / "model.safetensors").stat().st_size < 20_000_000


def test_export_records_the_parity_ladder(sample_dirs):
    manifest = json.loads((sample_dirs / "fp32" / "gptedge.json").read_text())
    assert manifest["shape"]["arch"] == "llama" and manifest["shape"]["n_kv_head"] == 2
    assert manifest["add_bos"] is True and manifest["eos_ids"] == [EOS, IM_END]
    parity = manifest["parity"]
    assert parity["graph_vs_reference"]["max_abs_diff"] <= 1e-4
    assert parity["graph_vs_reference"]["top1_agreement"] == 1.0
    assert parity["greedy_vs_reference"]["identical"] and parity["greedy_vs_reference"]["tokens_compared"] >= 100


def test_greedy_equals_transformers_on_several_prompts(fp32, hf_model, hf_tokenizer):
    for prompt in PROMPTS:
        ids = hf_tokenizer(prompt)["input_ids"]
        assert fp32.encode_prompt(prompt) == ids and ids[0] == BOS
        got = fp32.generate(prompt, max_new_tokens=24, greedy=True)
        assert got.ids == hf_greedy(hf_model, ids, 24), prompt
        assert got.text == hf_tokenizer.decode(got.ids, skip_special_tokens=True)


def test_characters_outside_the_vocab_round_trip_through_byte_tokens(fp32, hf_tokenizer):
    text = "Anne wrote ☃ and €5 to Mr. Elliot"
    ids = fp32.encode(text)
    pieces = [fp32.tokenizer.id_to_token(i) for i in ids]
    # ☃ is U+2603 (bytes E2 98 83), € is U+20AC (E2 82 AC): neither is a piece, so each is spelt byte by byte
    assert ["<0xE2>", "<0x98>", "<0x83>"] == pieces[pieces.index("<0xE2>"):pieces.index("<0xE2>") + 3]
    assert "<0xAC>" in pieces and UNK not in ids
    assert ids == hf_tokenizer(text, add_special_tokens=False)["input_ids"]
    assert fp32.decode(ids) == text


def test_special_tokens_are_never_split(fp32, hf_tokenizer):
    text = "<|im_start|>user\nHello</s><|im_end|><s>"
    ids = fp32.encode(text)
    assert ids[0] == IM_START and ids[-3:] == [EOS, IM_END, BOS]
    assert ids == hf_tokenizer(text, add_special_tokens=False)["input_ids"]
    for token, token_id in (("<|im_start|>", IM_START), ("<|im_end|>", IM_END), ("</s>", EOS)):
        assert fp32.encode(f"a{token}b").count(token_id) == 1


def test_chat_template_ids_equal_transformers_apply_chat_template(sample_dirs, fp32, hf_tokenizer):
    template = find_chat_template(sample_dirs / "fp32")
    assert template is not None
    for generation_prompt in (True, False):
        text = render_chat(template, CHAT, generation_prompt, special_tokens(sample_dirs / "fp32"))
        ids = fp32.tokenizer.encode(text, add_special_tokens=False).ids
        want = hf_tokenizer.apply_chat_template(CHAT, add_generation_prompt=generation_prompt, tokenize=True)
        assert ids == list(want) and ids[0] == BOS


def test_a_chat_reply_stops_at_im_end_as_transformers_does(fp32, hf_model, hf_tokenizer):
    ids = list(hf_tokenizer.apply_chat_template(CHAT[1:], add_generation_prompt=True, tokenize=True))
    reply = fp32.generate(ids, max_new_tokens=120, greedy=True)
    assert reply.stop == "eos" and reply.ids[-1] == IM_END and len(reply.ids) < 120, reply
    assert reply.ids == hf_greedy(hf_model, ids, 120)  # transformers with eos_token_id [</s>, <|im_end|>]
    free = fp32.generate(ids, max_new_tokens=len(reply.ids) + 4, greedy=True, ignore_eos=True).ids
    assert free[:len(reply.ids)] == reply.ids and len(free) > len(reply.ids)  # the eos list stopped it
    for seed in range(3):  # sampled replies end their turn too
        sampled = fp32.generate(ids, max_new_tokens=120, top_k=40, temperature=0.8, seed=seed)
        assert sampled.stop == "eos" and sampled.ids[-1] in (EOS, IM_END), sampled


def test_held_out_perplexity_equals_transformers(fp32, hf_model):
    ids = fp32.encode_prompt(EXCERPT.read_text(encoding="utf-8"))[:2_000]
    got = perplexity(fp32, ids)
    with torch.no_grad():  # one window per context length, as gptedge eval's default stride scores them
        want = _hf_perplexity(hf_model, ids, hf_model.config.max_position_embeddings)
    assert abs(got.perplexity / want - 1) <= 1e-4, (got.perplexity, want)
    assert 10 < got.perplexity < 400  # trained (a random model: ~4096)


def _hf_perplexity(hf_model, ids: list[int], context: int) -> float:
    import math

    from gptedge.runtime.generation.evaluate import sliding_windows

    nll, count = 0.0, 0
    for w in sliding_windows(len(ids), context, None):
        logp = torch.log_softmax(hf_model(torch.tensor([ids[w.begin:w.end]])).logits[0].double(), dim=-1)
        first = w.first_target - w.begin
        targets = torch.tensor(ids[w.first_target:w.end])
        nll -= logp[first - 1:-1].gather(1, targets[:, None]).sum().item()
        count += len(targets)
    return math.exp(nll / count)


def test_weight_only_recipes_within_thresholds(sample_dirs, fp32):
    ids = fp32.encode(EXCERPT.read_text(encoding="utf-8"))[:EVAL_TOKENS]
    models = [fp32, *(load(sample_dirs / name, device="cpu") for name in THRESHOLDS)]
    rows = compare(models, ids, prompts=2, new_tokens=8)
    for (name, (_, max_kl, min_top1)), row in zip(THRESHOLDS.items(), rows[1:], strict=True):
        assert row.kl <= max_kl and row.top1_agreement >= min_top1, (name, row)
        assert row.size_bytes < 0.45 * rows[0].size_bytes, (name, row)


def test_compare_cli_on_the_sample(sample_dirs, tmp_path):
    text = tmp_path / "excerpt.txt"
    text.write_text(EXCERPT.read_text(encoding="utf-8")[:8000], encoding="utf-8")
    result = CliRunner().invoke(main, ["compare", str(sample_dirs / "fp32"), str(sample_dirs / "weight-only"),
                                       "--text", str(text), "--prompts", "2", "--new-tokens", "8", "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert rows[1]["method"] == "weight-only" and rows[1]["top1_agreement"] > 0.97


def test_greedy_and_seeded_sampling_are_pinned(fp32):
    greedy = fp32.generate(PROMPTS[0], max_new_tokens=24, greedy=True)
    assert greedy.ids == PINNED_GREEDY_IDS, (greedy.ids, greedy.text)
    words = greedy.text.split()
    assert len(words) >= 10 and sum(w.strip(".,;:!?'\"-").isalpha() for w in words) >= 0.8 * len(words)
    sampled = fp32.generate(PROMPTS[3], max_new_tokens=16, top_k=40, temperature=0.8, seed=0)
    assert sampled.ids == PINNED_SAMPLED_IDS, (sampled.ids, sampled.text)


def test_kv_buffer_export_generates_as_the_standard_graph(fp32, tmp_path):
    export_checkpoint(SAMPLE, tmp_path / "kv", graph_variant="kv_buffer")
    kv = load(tmp_path / "kv", device="cpu")
    for prompt in PROMPTS[:2]:
        assert kv.generate(prompt, max_new_tokens=16, greedy=True).ids == \
            fp32.generate(prompt, max_new_tokens=16, greedy=True).ids


# "he was not to be so much\nof the same time of the same time of the same time of the same\n" (a small model's greedy
# loop: readable words, repeated)
PINNED_GREEDY_IDS = [365, 390, 399, 357, 371, 443, 582, 261, 3708, 351, 1077, 729, 366, 351, 1077, 729, 366, 351, 1077,
                     729, 366, 351, 1077, 261]
# "y of a bustic in an interest which had\nappoints which her"
PINNED_SAMPLED_IDS = [338, 366, 343, 354, 1451, 524, 377, 430, 1238, 508, 1053, 314, 1581, 332, 508, 383]
