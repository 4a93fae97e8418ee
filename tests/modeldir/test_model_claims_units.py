"""The manifest's claims against hand-made graph facts (runtime/checks/model_claims.py): each claim's line as verify
prints it, naming both values, and the limits on both sides (an id at vocab - 1 and at vocab, a table of exactly the
context and one row more). The facts are what onnx_wire reads from a graph, written by hand
(tests/support/claim_facts.py: a two-layer GPT-2 of vocabulary 100 and context 64). The arch, config.json, special-id
and tokenizer claims: test_model_claims_arch_units.py. No model is built or run."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gptedge.runtime import contract as C
from gptedge.runtime.checks.model_claims import graph_float_type, graph_method, position_table_rows
from gptedge.runtime.modeldir.manifest import Manifest, Quantization
from gptedge.runtime.modeldir.model_files import FileRecord
from gptedge.runtime.modeldir.onnx_wire import GraphFacts, Initializer, Node

from ..support.claim_facts import SAYS, SHAPE, Tokenizer, claims, facts, node, write


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
        f"{SAYS} 0 linears kept at 8 bits (keep_8bit []) and a 8-bit LM head, the graph's 8-bit MatMulNBits hold 0"]
    assert claims(w4(embedding_bits=4), facts(*nbits(9, 0)), tmp_path) == []
    assert claims(w4(), facts(*nbits(7, 2)), tmp_path) == [
        f"{SAYS} 0 linears kept at 8 bits (keep_8bit []) and a 8-bit LM head, the graph's 8-bit MatMulNBits hold 2"]


def test_linears_kept_at_8_bits_are_counted(tmp_path):
    kept = w4(keep_8bit=("h.0.*",))  # 4 linears of block 0, and the 8-bit LM head: 5 8-bit MatMulNBits
    assert claims(kept, facts(*nbits(4, 5)), tmp_path) == []  # more 8-bit than 4-bit: still int4 linears
    assert claims(kept, facts(*nbits(5, 4)), tmp_path) == [
        f"{SAYS} 4 linears kept at 8 bits (keep_8bit ['h.0.*']) and a 8-bit LM head, the graph's 8-bit "
        "MatMulNBits hold 4"]
    assert claims(kept, facts(*nbits(3, 6)), tmp_path)[0].endswith("the graph's 8-bit MatMulNBits hold 6")
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
