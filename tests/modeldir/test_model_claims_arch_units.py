"""The manifest's arch, config.json, special-id and tokenizer claims against hand-made graph facts
(runtime/checks/model_claims.py; the facts: tests/support/claim_facts.py): each claim's line as verify prints it,
naming both values, and the limits on both sides (an id at vocab - 1 and at vocab). No model is built or run."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gptedge.runtime.modeldir.manifest import Manifest
from gptedge.runtime.modeldir.onnx_wire import Node
from gptedge.runtime.registry import FAMILIES, FamilyEntry

from ..support.claim_facts import SAYS, SHAPE, Tokenizer, claims, facts, node, write


# -- arch and config.json -----------------------------------------------------------------------------------------

def test_the_layer_norm_count_names_the_family(tmp_path):
    assert claims(Manifest(SHAPE), facts(norms=4), tmp_path) == [
        f"{SAYS} arch gpt2, the graph is openai-gpt's (4 LayerNorms for 2 layers; gpt2 has 5)"]
    assert claims(Manifest(replace(SHAPE, arch="openai-gpt")), facts(norms=5), tmp_path) == [
        f"{SAYS} arch openai-gpt, the graph is gpt2's (5 LayerNorms for 2 layers; openai-gpt has 4)"]
    assert claims(Manifest(SHAPE), facts(norms=7), tmp_path) == [
        f"{SAYS} arch gpt2, the graph is no known family's (7 LayerNorms for 2 layers; gpt2 has 5)"]
    skip = facts(node("SkipLayerNormalization", "x"), norms=4)  # fused norms count too
    assert claims(Manifest(SHAPE), skip, tmp_path) == []
    assert claims(Manifest(SHAPE), facts(norms=0), tmp_path) == []  # a graph with no LayerNorm op read: not said
    assert claims(Manifest(replace(SHAPE, arch="gpt_neox")), facts(norms=9), tmp_path) == []  # gpt_neox does not say


def rms(count: int, first: int = 1) -> list[Node]:
    """A Llama-style kv_buffer graph's RMSNorms: `first` SimplifiedLayerNormalization, the rest fused with an Add."""
    return ([node("SimplifiedLayerNormalization", "x") for _ in range(first)]
            + [node("SkipSimplifiedLayerNormalization", "x", "y") for _ in range(count - first)])


@pytest.mark.parametrize("arch", ["llama", "qwen2", "mistral"])
def test_a_llama_style_graphs_rms_norms_are_counted(tmp_path, arch):
    llama = Manifest(replace(SHAPE, arch=arch))
    assert claims(llama, facts(*rms(5, first=2), norms=0), tmp_path) == []  # 2n + 1, as the export writes them
    assert claims(llama, facts(norms=0), tmp_path) == []  # a standard graph: RMSNorms as plain ops, not counted
    assert claims(llama, facts(*rms(4), norms=0), tmp_path) == [
        f"{SAYS} arch {arch}, the graph is no known family's (4 RMSNorms for 2 layers; {arch} has 5)"]
    assert claims(llama, facts(*rms(5), norms=0, layers=3), tmp_path) == []  # the layer count's own line says it


def test_norms_of_another_kind_than_the_familys(tmp_path):
    assert claims(Manifest(replace(SHAPE, arch="llama")), facts(norms=5), tmp_path) == [
        f"{SAYS} arch llama, the graph's norms are LayerNorms (5 LayerNormalization / SkipLayerNormalization); "
        "llama's are RMSNorms"]
    for arch in ("gpt2", "gpt_neox"):  # gpt_neox says no count, but its kind
        assert claims(Manifest(replace(SHAPE, arch=arch)), facts(*rms(5), norms=0), tmp_path) == [
            f"{SAYS} arch {arch}, the graph's norms are RMSNorms (5 SimplifiedLayerNormalization / "
            f"SkipSimplifiedLayerNormalization); {arch}'s are LayerNorms"]
    # one kind beside the other (a graph mixing them) is no family's kind to name: the count of the claimed kind speaks
    assert claims(Manifest(SHAPE), facts(*rms(2), norms=5), tmp_path) == []


def test_a_plugin_family_whose_line_says_no_norms_is_not_checked_for_them(tmp_path):
    FAMILIES.register("toy-rms", FamilyEntry("toy_rms_module"))  # neither `norm` nor `final_norm` said
    try:
        toy = Manifest(replace(SHAPE, arch="toy-rms"))
        assert claims(toy, facts(*rms(5), norms=0), tmp_path) == []
        assert claims(toy, facts(norms=7), tmp_path) == []
    finally:
        FAMILIES.unregister("toy-rms")


def test_the_norm_count_is_not_read_when_the_layer_count_disagrees(tmp_path):
    assert claims(Manifest(SHAPE), facts(norms=7, layers=3), tmp_path) == []
    assert claims(Manifest(SHAPE), facts(norms=3, layers=1), tmp_path) == []


def test_config_json_against_the_arch_and_shape(tmp_path):
    write(tmp_path, "config.json", {"model_type": "gpt2", "n_layer": 2, "n_head": 4, "n_embd": 32, "vocab_size": 100,
                                    "n_positions": 64})
    assert claims(Manifest(SHAPE), facts(), tmp_path) == []
    write(tmp_path, "config.json", {"model_type": "openai-gpt", "n_layer": 3, "n_head": 2, "n_embd": 16,
                                    "vocab_size": 99, "n_positions": 65})
    assert claims(Manifest(SHAPE), facts(), tmp_path) == [
        f"{SAYS} arch gpt2, config.json says model_type openai-gpt",
        f"{SAYS} n_layer 2, config.json says n_layer 3", f"{SAYS} n_head 4, config.json says n_head 2",
        f"{SAYS} n_embd 32, config.json says n_embd 16", f"{SAYS} vocab_size 100, config.json says vocab_size 99",
        f"{SAYS} context_length 64, config.json says n_positions 65"]


@pytest.mark.parametrize("name", ["config.json", "generation_config.json"])
def test_companion_json_that_cannot_be_read_is_one_line(tmp_path, name):
    write(tmp_path, name, "{nope")
    assert claims(Manifest(SHAPE), facts(), tmp_path) == [f"{name} cannot be read (JSONDecodeError)"]
    write(tmp_path, name, "[1]")
    assert claims(Manifest(SHAPE), facts(), tmp_path) == [f"{name} is not a JSON object"]


# -- special ids and the tokenizer --------------------------------------------------------------------------------

@pytest.mark.parametrize("value, ok", [(0, True), (99, True), (100, False), (-1, False)])
def test_special_ids_inside_the_vocabulary_on_both_sides(tmp_path, value, ok):
    for name in ("eos_id", "bos_id", "pad_id"):
        found = claims(Manifest(SHAPE, **{name: value}), facts(), tmp_path)
        assert found == ([] if ok else [f"{SAYS} {name} {value}, outside the model's vocabulary (0..99)"])


def test_special_ids_against_config_and_generation_config(tmp_path):
    m = Manifest(SHAPE, eos_id=50, bos_id=50, pad_id=0)
    write(tmp_path, "config.json", {"eos_token_id": 50, "bos_token_id": 50, "pad_token_id": 0})
    write(tmp_path, "generation_config.json", {"eos_token_id": [51, 50], "bos_token_id": 50})
    assert claims(m, facts(), tmp_path) == []
    write(tmp_path, "config.json", {"eos_token_id": 7, "bos_token_id": 50, "pad_token_id": 1})
    write(tmp_path, "generation_config.json", {"eos_token_id": [51, 52], "bos_token_id": 3})
    assert claims(m, facts(), tmp_path) == [
        f"{SAYS} eos_id 50, config.json says eos_token_id 7",
        f"{SAYS} eos_id 50, generation_config.json says eos_token_id [51, 52]",
        f"{SAYS} bos_id 50, generation_config.json says bos_token_id 3",
        f"{SAYS} pad_id 0, config.json says pad_token_id 1"]
    write(tmp_path, "config.json", {"pad_token_id": None})
    assert claims(replace(m, pad_id=None), facts(), tmp_path) == [
        f"{SAYS} eos_id 50, generation_config.json says eos_token_id [51, 52]",
        f"{SAYS} bos_id 50, generation_config.json says bos_token_id 3"]


def test_end_and_start_ids_are_special_tokens_of_the_tokenizer(tmp_path):
    assert claims(Manifest(SHAPE, eos_id=99, bos_id=99, pad_id=5), facts(), tmp_path, Tokenizer()) == []
    assert claims(Manifest(SHAPE, eos_id=5), facts(), tmp_path, Tokenizer()) == [
        f"{SAYS} eos_id 5, which is 't5' in tokenizer.json, not one of its special tokens ('<|endoftext|>' = 99)"]
    assert claims(Manifest(SHAPE, bos_id=98), facts(), tmp_path, Tokenizer()) == [
        f"{SAYS} bos_id 98, which is '<pad>' in tokenizer.json, not one of its special tokens ('<|endoftext|>' = 99)"]
    assert claims(Manifest(SHAPE, eos_id=5), facts(), tmp_path, Tokenizer(specials=False)) == []


def test_an_id_the_tokenizer_does_not_have(tmp_path):
    small = Tokenizer(size=1000)
    small.id_to_token = lambda i: None
    assert claims(Manifest(SHAPE, eos_id=50), facts(), tmp_path, small) == [
        "tokenizer.json has 1,000 tokens, the model's vocabulary is 100: its ids past the model's would be out of "
        "range (another model's tokenizer?)",
        f"{SAYS} eos_id 50, which tokenizer.json does not have (its 1,000 tokens)"]


@pytest.mark.parametrize("size, ok", [(100, True), (99, True), (101, False)])
def test_the_tokenizer_no_larger_than_the_vocabulary(tmp_path, size, ok):
    found = claims(Manifest(SHAPE), facts(), tmp_path, Tokenizer(size=size))
    assert found == ([] if ok else [f"tokenizer.json has {size:,} tokens, the model's vocabulary is 100: its ids "
                                    "past the model's would be out of range (another model's tokenizer?)"])
