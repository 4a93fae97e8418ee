"""The manifest's claims against hand-made graph facts (runtime/checks/model_claims.py): each claim's line as verify
prints it, naming both values, and the limits on both sides (an id at vocab - 1 and at vocab, a table of exactly the
context and one row more). The facts are what onnx_wire reads from a graph (ops, integer attributes, initializers'
dims and types, input types), written by hand here: a two-layer GPT-2 of vocabulary 100 and context 64. No model is
built or run."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace

import pytest

from gptedge.runtime import contract as C
from gptedge.runtime.checks.model_claims import claim_problems, graph_float_type, graph_method, position_table_rows
from gptedge.runtime.modeldir.manifest import Manifest, ModelShape, Quantization
from gptedge.runtime.modeldir.model_files import FileRecord
from gptedge.runtime.modeldir.onnx_wire import GraphFacts, Initializer, Node
from gptedge.runtime.registry import FAMILIES, FamilyEntry

SHAPE = ModelShape("gpt2", 2, 4, 8, 100, 64)
SAYS = "gptedge.json says"


def node(op: str, *inputs: str, **ints) -> Node:
    return Node(op, "com.microsoft" if op in ("MatMulNBits", "GroupQueryAttention") else "", inputs, ints)


def facts(*extra: Node, layers: int = 2, norms: int = 5, rows: int = 64, cache: str = "float32",
          init_type: str = "float32", inits: dict | None = None) -> GraphFacts:
    """A float GPT-2's facts: its position table, `norms` LayerNorms and `layers` layers of past inputs."""
    nodes = [node("Gather", "wpe", C.POSITION_IDS)] + [node("LayerNormalization", "x") for _ in range(norms)]
    initializers = {"wpe": Initializer("wpe", (rows, 32), init_type, None), **(inits or {})}
    types = {"input_ids": "int64", C.POSITION_IDS: "int64", C.ATTENTION_MASK: "int64"}
    types.update({name(i): cache for i in range(layers) for name in (C.past_key, C.past_value)})
    return GraphFacts("test", nodes + list(extra), initializers, types, {})


def claims(m: Manifest, f: GraphFacts | None, d, tokenizer=None, **kw) -> list[str]:
    return claim_problems(d, m, f, tokenizer, **kw)


def test_a_float_language_model_as_claimed_has_no_problem(tmp_path):
    assert claims(Manifest(SHAPE), facts(), tmp_path) == []
    assert claims(Manifest(SHAPE, precision="fp16"), facts(cache="float16", init_type="float16"), tmp_path) == []


# -- context ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("rows", [63, 65, 128])
def test_a_position_table_of_other_rows_than_the_context(tmp_path, rows):
    assert claims(Manifest(SHAPE), facts(rows=rows), tmp_path) == [
        f"{SAYS} context_length 64, the graph's position table holds {rows} positions"]


def test_the_position_table_is_the_initializer_gather_reads_with_position_ids():
    f = facts()
    assert position_table_rows(f) == 64
    f.nodes[0] = node("Gather", "wpe", "input_ids")  # the token table: not the positions'
    assert position_table_rows(f) is None
    f.nodes[0] = node("Gather", "computed", C.POSITION_IDS)  # not an initializer
    assert position_table_rows(f) is None
    f.nodes[0] = node("Gather", "wpe", C.POSITION_IDS)
    f.initializers["wpe"] = Initializer("wpe", (), "float32", None)
    assert position_table_rows(f) is None
    f.nodes.insert(0, node("Slice", "wpe", C.POSITION_IDS))
    f.initializers["wpe"] = Initializer("wpe", (70, 32), "float32", None)
    assert position_table_rows(f) == 70


# -- float type, precision and method -----------------------------------------------------------------------------

def test_the_graphs_float_type_from_its_initializers_else_its_cache():
    m = Manifest(SHAPE)
    assert graph_float_type(m, facts()) == "float32"
    assert graph_float_type(m, facts(init_type="float16")) == "float16"
    mixed = facts(inits={"b": Initializer("b", (3,), "float16", None)})
    assert graph_float_type(m, mixed) == "float16"
    bare = GraphFacts(input_types={C.past_key(0): "float16"})
    assert graph_float_type(m, bare) == "float16"
    assert graph_float_type(m, GraphFacts(input_types={C.past_key(0): "int8"})) == "float32"
    assert graph_float_type(m, GraphFacts()) == "float32"
    ints_only = GraphFacts(initializers={"q": Initializer("q", (3,), "int8", None)},
                           input_types={C.past_key(0): "float16"})
    assert graph_float_type(m, ints_only) == "float16"


def test_graph_method_names_the_method_and_op():
    from collections import Counter

    assert graph_method(Counter()) == (None, None)
    assert graph_method(Counter({"MatMulInteger": 2})) == ("dynamic", "MatMulInteger")
    assert graph_method(Counter({"QLinearMatMul": 1, "MatMul": 3})) == ("static", "QLinearMatMul")
    assert graph_method(Counter({"MatMulNBits": 9})) == ("weight-only", "MatMulNBits")
    assert graph_method(Counter({"MatMulNBits": 0})) == (None, None)


def test_a_float_claim_over_a_quantized_graph(tmp_path):
    f = facts(node("MatMulIntegerToFloat", "x", "w"))
    assert claims(Manifest(SHAPE), f, tmp_path) == [
        f"{SAYS} the model is not quantized (fp32), the graph is dynamic-quantized (it holds MatMulIntegerToFloat)",
        f"{SAYS} precision fp32, the graph's is int8 (MatMulIntegerToFloat, float32 cache)"]


def test_a_quantized_claim_over_a_float_graph(tmp_path):
    m = Manifest(SHAPE, precision="int8", quantization=Quantization(method="dynamic"))
    assert claims(m, facts(), tmp_path) == [
        f"{SAYS} quantization method dynamic, the graph holds none of its ops (MatMulIntegerToFloat, "
        "DynamicQuantizeMatMul, MatMulInteger): it is not quantized",
        f"{SAYS} precision int8, the graph's is fp32 (no quantized op, float32 cache)"]


def test_one_method_claimed_over_anothers_graph(tmp_path):
    m = Manifest(SHAPE, precision="int8", quantization=Quantization(method="static"))
    assert claims(m, facts(node("MatMulInteger", "x", "w")), tmp_path) == [
        f"{SAYS} quantization method static, the graph is dynamic-quantized (it holds MatMulInteger)"]
    assert claims(m, facts(node("DequantizeLinear", "w", "s"), node("MatMulInteger", "x", "w")), tmp_path) == []


def test_fp16_is_a_float_precision(tmp_path):
    m = Manifest(SHAPE, precision="fp16", quantization=Quantization(method="fp16"))
    assert claims(m, facts(init_type="float16", cache="float16"), tmp_path) == []
    assert claims(m, facts(), tmp_path) == [
        f"{SAYS} precision fp16, the graph's is fp32 (no quantized op, float32 cache)"]
    assert claims(Manifest(SHAPE), facts(init_type="float16", cache="float16"), tmp_path) == [
        f"{SAYS} precision fp32, the graph's is fp16 (no quantized op, float16 cache)"]


def mnb(name: str, **ints) -> Node:
    """A MatMulNBits at the recipe's default accuracy level (recipe_claims compares it)."""
    return node("MatMulNBits", "x", name, **{"accuracy_level": 4, **ints})


def nbits(n4: int = 8, n8: int = 1, block: int = 32) -> list[Node]:
    return ([mnb(f"w{i}", bits=4, block_size=block) for i in range(n4)]
            + [mnb(f"e{i}", bits=8, block_size=block) for i in range(n8)])


def w4(**recipe) -> Manifest:
    return Manifest(SHAPE, precision="int4", quantization=Quantization(**{"method": "weight-only", "bits": 4,
                                                                          **recipe}))


def test_a_4_bit_weight_only_graph_as_claimed(tmp_path):
    assert claims(w4(), facts(*nbits()), tmp_path) == []
    # bits absent from a node: MatMulNBits' default, 4
    plain = [mnb(f"w{i}", block_size=32) for i in range(8)] + nbits(0, 1)
    assert claims(w4(), facts(*plain), tmp_path) == []
    m8 = Manifest(SHAPE, precision="int8", quantization=Quantization(method="weight-only", bits=8))
    assert claims(m8, facts(*nbits(0, 9)), tmp_path) == []


def test_weight_only_bits_claims(tmp_path):
    m8 = Manifest(SHAPE, precision="int8", quantization=Quantization(method="weight-only", bits=8))
    assert claims(m8, facts(*nbits()), tmp_path) == [
        f"{SAYS} bits 8, the graph's MatMulNBits linears are 4-bit",
        f"{SAYS} precision int8, the graph's is int4 (MatMulNBits, float32 cache)"]
    assert claims(w4(), facts(*nbits(9, 0)), tmp_path) == [
        f"{SAYS} embedding_bits 8, the graph's MatMulNBits are 4-bit",
        f"{SAYS} 0 linears kept at 8 bits (keep_8bit []) and a 8-bit LM head, the graph has 0 8-bit MatMulNBits"]
    assert claims(w4(embedding_bits=4), facts(*nbits(9, 0)), tmp_path) == []
    assert claims(w4(), facts(*nbits(7, 2)), tmp_path) == [
        f"{SAYS} 0 linears kept at 8 bits (keep_8bit []) and a 8-bit LM head, the graph has 2 8-bit MatMulNBits"]


def test_linears_kept_at_8_bits_are_counted(tmp_path):
    kept = w4(keep_8bit=("h.0.*",))  # 4 linears of block 0, and the 8-bit LM head: 5 8-bit MatMulNBits
    assert claims(kept, facts(*nbits(4, 5)), tmp_path) == []  # more 8-bit than 4-bit: still int4 linears
    assert claims(kept, facts(*nbits(5, 4)), tmp_path) == [
        f"{SAYS} 4 linears kept at 8 bits (keep_8bit ['h.0.*']) and a 8-bit LM head, the graph has 4 8-bit "
        "MatMulNBits"]
    assert claims(kept, facts(*nbits(3, 6)), tmp_path)[0].endswith("the graph has 6 8-bit MatMulNBits")
    one = w4(keep_8bit=("*.mlp.c_proj",), embedding_bits=4)
    assert claims(one, facts(*nbits(7, 2)), tmp_path) == []


def test_block_sizes_are_the_claimed_one(tmp_path):
    assert claims(w4(), facts(*nbits(block=16)), tmp_path) == [
        f"{SAYS} block_size 32, the graph's MatMulNBits use 16"]
    mixed = nbits(8, 0) + [mnb("e", bits=8, block_size=128)]
    assert claims(w4(), facts(*mixed), tmp_path) == [f"{SAYS} block_size 32, the graph's MatMulNBits use 32, 128"]
    unsaid = [mnb(f"w{i}", bits=4) for i in range(8)] + [mnb("e", bits=8)]
    assert claims(w4(), facts(*unsaid), tmp_path) == []


def test_a_classifiers_weight_only_graph_has_no_lm_head_to_count(tmp_path):
    from gptedge.runtime.modeldir.tasks import SpecialTokens, Task, transformation

    task = Task("classification", "sequence-classification", transformation("classification"),
                SpecialTokens(start=1, extract=2))
    assert claims(replace(w4(), task=task), facts(*nbits(8, 0)), tmp_path) == []
    assert claims(w4(), facts(*nbits(8, 0)), tmp_path) != []


def test_half_precision_claims_of_a_quantized_graph(tmp_path):
    half = w4(float16=True)
    assert claims(half, facts(*nbits(), init_type="float16", cache="float16"), tmp_path) == []
    assert claims(half, facts(*nbits()), tmp_path) == [
        f"{SAYS} float16 true, the graph computes in float32 (its cache inputs are float32)"]
    assert claims(w4(), facts(*nbits(), init_type="float16", cache="float16"), tmp_path) == [
        f"{SAYS} float16 false, the graph computes in float16 (its cache inputs are float16)"]


# -- graph variant, KV cache, wide mask ---------------------------------------------------------------------------

def gqa(**ints) -> Node:
    return node("GroupQueryAttention", "q", **ints)


def test_the_graph_variant_is_its_io_contract(tmp_path):
    assert claims(Manifest(SHAPE, graph="kv_buffer"), facts(), tmp_path) == [
        f"{SAYS} graph kv_buffer, the graph's I/O contract is standard's: past and present are separate tensors "
        "(no GroupQueryAttention)"]
    assert claims(Manifest(SHAPE), facts(gqa()), tmp_path) == [
        f"{SAYS} graph standard, the graph's I/O contract is kv_buffer's: past and present share one buffer "
        "(GroupQueryAttention)"]
    assert claims(Manifest(SHAPE, graph="kv_buffer"), facts(gqa()), tmp_path) == []


@pytest.mark.parametrize("kv, cache, bits, line", [
    ("int8", "int8", 8, None),
    ("int4", "uint8", 4, None),
    ("fp16", "float16", None, None),
    ("int8", "float32", 8, "kv_cache int8, the graph's cache is float32 (int8 expected)"),
    ("fp32", "float16", None, "kv_cache fp32, the graph's cache is float16 (float32 expected)"),
    ("int8", "int8", 4, "kv_cache int8, the graph's GroupQueryAttention stores 4-bit values"),
    ("int4", "uint8", 8, "kv_cache int4, the graph's GroupQueryAttention stores 8-bit values"),
])
def test_the_kv_cache_claim_against_the_cache_type_and_bit_width(tmp_path, kv, cache, bits, line):
    g = gqa() if bits is None else gqa(kv_cache_bit_width=bits)
    m = Manifest(SHAPE, graph="kv_buffer", kv_cache=kv)
    assert claims(m, facts(g, cache=cache), tmp_path) == ([] if line is None else [f"{SAYS} {line}"])


def test_a_quantized_cache_needs_group_query_attention(tmp_path):
    m = Manifest(SHAPE, graph="kv_buffer", kv_cache="int8")
    assert claims(m, facts(gqa(kv_cache_bit_width=8), gqa(), cache="int8"), tmp_path) == [
        f"{SAYS} kv_cache int8, the graph's GroupQueryAttention stores float, 8-bit values"]
    m = Manifest(SHAPE, kv_cache="fp16")
    assert claims(m, facts(cache="float16"), tmp_path) == [
        f"{SAYS} kv_cache fp16, which only a kv_buffer graph (GroupQueryAttention) can store"]
    no_cache = facts(layers=0)  # a classifier's graph: no past inputs, nothing to compare
    assert claims(Manifest(SHAPE, kv_cache="int8", graph="kv_buffer"), replace(no_cache, nodes=no_cache.nodes
                                                                               + [gqa()]), tmp_path) == []


def test_wide_mask_needs_a_kv_buffer_graph_reading_the_masks_content(tmp_path):
    reads = [gqa(), node("Mul", "x", C.ATTENTION_MASK), node("ReduceMax", "m")]
    wide = Manifest(SHAPE, graph="kv_buffer", wide_mask=True)
    assert claims(wide, facts(*reads), tmp_path) == []
    line = [f"{SAYS} wide_mask, but the graph reads its timeline from the attention mask's width"]
    assert claims(wide, facts(*reads[:2]), tmp_path) == line
    assert claims(wide, facts(reads[0], node("Mul", "x", "other"), reads[2]), tmp_path) == line
    assert claims(replace(wide, graph="standard"), facts(*reads[1:]), tmp_path) == line
    assert claims(replace(wide, wide_mask=False), facts(*reads), tmp_path) == []


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


def write(d, name: str, data) -> None:
    (d / name).write_text(data if isinstance(data, str) else json.dumps(data))


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


@dataclass
class Added:
    content: str
    special: bool


class Tokenizer:
    """The lookups model_claims makes of a tokenizers.Tokenizer: 100 tokens, 98 and 99 added (99 special)."""

    def __init__(self, size=100, specials=True):
        self.size, self.specials = size, specials

    def get_added_tokens_decoder(self):
        return {98: Added("<pad>", False), 99: Added("<|endoftext|>", True)} if self.specials else {}

    def id_to_token(self, i):
        return f"t{i}" if 0 <= i < 98 else {98: "<pad>", 99: "<|endoftext|>"}.get(i)

    def token_to_id(self, t):
        return {"<pad>": 98, "<|endoftext|>": 99}.get(t, int(t[1:]) if t[:1] == "t" and t[1:].isdigit() else None)

    def get_vocab_size(self, with_added_tokens=True):
        return self.size if with_added_tokens else self.size - 2  # 98 and 99 are added tokens


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


# -- external data, imported dirs, ORT format, no graph -----------------------------------------------------------

def test_external_data_must_be_recorded(tmp_path):
    ext = facts(inits={"w": Initializer("w", (3,), "float32", "model.onnx.data")})
    rec = (FileRecord("model.onnx", 1, "a"), FileRecord("model.onnx.data", 1, "b"))
    assert claims(Manifest(SHAPE, files=rec), ext, tmp_path) == []
    assert claims(Manifest(SHAPE, files=rec[:1]), ext, tmp_path) == [
        "the graph reads weights from model.onnx.data, which gptedge.json does not record"]
    assert claims(Manifest(SHAPE), ext, tmp_path) == []  # no files recorded: the files check says so
    sub = (FileRecord("onnx/model.onnx", 1, "a"), FileRecord("onnx/model.onnx.data", 1, "b"))
    assert claims(Manifest(SHAPE, files=sub, model_file="onnx/model.onnx"), ext, tmp_path) == []
    assert claims(Manifest(SHAPE, files=rec, model_file="onnx/model.onnx"), ext, tmp_path) == [
        "the graph reads weights from model.onnx.data, which gptedge.json does not record"]


def test_an_imported_dir_checks_only_the_context_and_the_tokenizer(tmp_path):
    write(tmp_path, "config.json", {"n_layer": 9})
    f = facts(node("MatMulInteger", "x", "w"), norms=3, rows=65)
    assert claims(Manifest(SHAPE, eos_id=500), f, tmp_path, Tokenizer(size=101), imported=True) == [
        "config.json says context_length 64, the graph's position table holds 65 positions",
        "tokenizer.json has 101 tokens, the model's vocabulary is 100: its ids past the model's would be out of "
        "range (another model's tokenizer?)"]


def test_an_ort_format_graph_is_not_read_for_what_its_converter_rewrites(tmp_path):
    f = facts(norms=3, rows=65, inits={"w": Initializer("w", (3,), "float32", "x.data")})
    m = Manifest(SHAPE, files=(FileRecord("model.onnx", 1, "a"),), wide_mask=True, graph="kv_buffer")
    f.nodes.append(gqa())
    assert claims(m, f, tmp_path, ort_format=True) == []
    assert len(claims(m, f, tmp_path)) == 4  # the table, the norm count, the mask and the data file otherwise
    # its ops are still compared
    assert claims(Manifest(SHAPE), f, tmp_path, ort_format=True) == [
        f"{SAYS} graph standard, the graph's I/O contract is kv_buffer's: past and present share one buffer "
        "(GroupQueryAttention)"]


def test_without_graph_facts_only_the_files_beside_it_are_compared(tmp_path):
    write(tmp_path, "config.json", {"n_layer": 3})
    assert claims(Manifest(SHAPE, precision="int8", quantization=Quantization(method="dynamic")), None,
                  tmp_path) == [f"{SAYS} n_layer 2, config.json says n_layer 3"]


def test_a_plugins_method_and_graph_variant_say_nothing_to_check(tmp_path):
    from gptedge.runtime.registry import GRAPH_VARIANTS, QUANTIZATION_METHODS, GraphEntry, MethodEntry

    QUANTIZATION_METHODS.register("toy-int8", MethodEntry("tests.support.toy_members"))  # its line names no ops
    GRAPH_VARIANTS.register("toy_standard", GraphEntry("tests.support.toy_members"))
    try:
        m = Manifest(SHAPE, precision="int8", graph="toy_standard", quantization=Quantization(method="toy-int8"))
        assert claims(m, facts(gqa(), node("MatMulIntegerToFloat", "x", "w")), tmp_path) == []
        # a registered method that says its ops is still checked, whatever the variant
        m = replace(m, quantization=Quantization(method="dynamic"))
        assert claims(m, facts(gqa()), tmp_path)[0].startswith(f"{SAYS} quantization method dynamic, the graph holds")
    finally:
        QUANTIZATION_METHODS.unregister("toy-int8")
        GRAPH_VARIANTS.unregister("toy_standard")


def test_the_cache_type_is_read_from_the_first_layers_input(tmp_path):
    """A one-layer graph has past_key_values.0 only: its type is the cache's."""
    assert claims(Manifest(SHAPE), facts(layers=1, cache="float16"), tmp_path) == [
        f"{SAYS} kv_cache fp32, the graph's cache is float16 (float32 expected)"]


def test_an_ort_format_graphs_weights_are_not_read(tmp_path):
    """Its initializers were rewritten by the converter (and there is no model.onnx here to read): the recipe's
    per-weight claims are not compared, its ops are."""
    linear = node("MatMulIntegerToFloat", "xq", "w", "xs", "s")
    f = facts(linear, inits={"w": Initializer("w", (4, 3), "int8", None), "s": Initializer("s", (3,), "float32", None)})
    m = Manifest(SHAPE, precision="int8", quantization=Quantization(method="dynamic", per_channel=False))
    assert claims(m, f, tmp_path, ort_format=True) == []
    with pytest.raises(FileNotFoundError):  # a model.onnx's weights would be read
        claims(m, f, tmp_path)


def test_a_classifiers_special_tokens_are_read_against_its_tokenizer_config(tmp_path):
    from gptedge.runtime.modeldir.tasks import SpecialTokens, Task, transformation

    task = Task("classification", "sequence-classification", transformation("classification"),
                SpecialTokens(start=1, extract=2))
    m = Manifest(SHAPE, task=task)
    assert claims(m, facts(layers=0), tmp_path, Tokenizer()) == []
    write(tmp_path, "tokenizer_config.json", {"cls_token": "<|endoftext|>", "bos_token": "t1"})
    assert claims(m, facts(layers=0), tmp_path, Tokenizer()) == [
        f"{SAYS} the extract token is 2, which is 't2' in tokenizer.json; tokenizer_config.json declares "
        "'<|endoftext|>' (cls_token) = 99"]
