"""quantize --kv-cache's pieces on plain data: the cache table, the option's checks, the calibration windows, the
scales and the graph rewrite (a synthetic two-layer graph). No export and no model run: milliseconds, so these
are the tests the mutation runs pair with quantize/kv_cache.py and runtime/modeldir/kv_cache.py (test_kv_cache.py
checks the same code end to end, slowly)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from gptedge.quantize import kv_cache as kv
from gptedge.runtime import contract as C
from gptedge.runtime.errors import InvalidArgumentError, QuantizationError
from gptedge.runtime.modeldir.kv_cache import KV_CACHES, cache_onnx_type, kv_cache_kind

N_HEAD, HEAD_DIM = 2, 8


@pytest.mark.parametrize("name, onnx_type, width, bits, qmax, quantized, per_position", [
    # bytes per position, 3 layers x 2 heads x head_dim 8: 2 (key and value) x 3 x 2 x width x itemsize
    ("fp32", "float32", 8, 0, 0, False, 384),
    ("fp16", "float16", 8, 0, 0, False, 192),
    ("int8", "int8", 8, 8, 127, True, 96),
    ("int4", "uint8", 4, 4, 7, True, 48),  # two 4-bit values a byte: half the width
])
def test_the_cache_table(name, onnx_type, width, bits, qmax, quantized, per_position):
    kind = kv_cache_kind(name)
    assert (kind.name, kind.onnx_type, kind.width(HEAD_DIM), kind.bits, kind.qmax, kind.quantized) == (
        name, onnx_type, width, bits, qmax, quantized)
    assert kind.bytes_per_position(3, N_HEAD, HEAD_DIM) == per_position
    assert kv_cache_kind(name, QuantizationError) is KV_CACHES[name]


def test_an_unknown_cache_is_one_line_naming_the_choices():
    with pytest.raises(InvalidArgumentError, match=r"^kv cache 'int2' is not one of fp32, fp16, int8, int4$"):
        kv_cache_kind("int2")
    with pytest.raises(QuantizationError, match="kv cache 'fp8'"):
        kv_cache_kind("fp8", QuantizationError)


def test_the_graphs_cache_type():
    assert cache_onnx_type("fp32", "float16") == "float16"  # fp32 means "as the graph computes"
    assert cache_onnx_type("fp32", "float32") == "float32"
    assert cache_onnx_type("int4", "float32") == "uint8"
    assert cache_onnx_type("fp16", "float32") == "float16"


def test_check_kv_cache_takes_what_quantize_can_store():
    assert kv.check_kv_cache("fp32", C.GRAPH_STANDARD, True) is KV_CACHES["fp32"]  # the default: any graph
    assert kv.check_kv_cache("int4", C.GRAPH_KV_BUFFER, False) is KV_CACHES["int4"]
    with pytest.raises(InvalidArgumentError, match=r"^--kv-cache int8 needs a kv_buffer graph .*this one is standard$"):
        kv.check_kv_cache("int8", C.GRAPH_STANDARD, False)
    with pytest.raises(InvalidArgumentError, match="^--kv-cache fp16 applies to graphs that compute in fp32"):
        kv.check_kv_cache("fp16", C.GRAPH_KV_BUFFER, True)


@pytest.fixture()
def ids_of(monkeypatch):
    """calibration_ids over a text whose ids are 0, 1, ..., len(text) - 1 (one per character)."""
    monkeypatch.setattr(kv, "load_tokenizer", lambda model_dir: None)
    monkeypatch.setattr(kv, "encode", lambda tokenizer, text: list(range(len(text))))
    monkeypatch.setattr(kv, "read_manifest", lambda model_dir: ModelManifestStub())


class ModelManifestStub:
    """What calibration_ids reads of a manifest: a tokenizer that adds no bos (GPT-2's)."""
    add_bos, bos_id = False, None


@pytest.mark.parametrize("tokens, budget, context, starts, length", [
    (100, 40, 20, [0, 80], 20),  # 2 windows of the context: the first and the last 20 tokens
    (100, 41, 20, [0, 40, 80], 20),  # one token past 2 windows: a third
    (100, 10_000, 20, [0, 20, 40, 60, 80], 20),  # never more than the text holds without overlap
    (100, 1, 20, [0], 20),  # at least one window
    (10, 40, 20, [0], 10),  # a text shorter than the context: one window of all of it
    (2, 40, 20, [0], 2),  # the shortest text that has a scale
    (3000, 2048, 4096, [0, 1976], 1024),  # windows capped at MAX_WINDOW
])
def test_calibration_windows(ids_of, tokens, budget, context, starts, length):
    windows = kv.calibration_ids(None, "x" * tokens, budget, context)
    assert [int(w[0, 0]) for w in windows] == starts
    assert all(w.shape == (1, length) and w.dtype == np.int64 for w in windows)
    assert windows[-1][0, -1] == tokens - 1 or len(windows) == 1 and length < tokens  # the last reaches the end
    assert all(np.array_equal(w[0], np.arange(w[0, 0], w[0, 0] + length)) for w in windows)


def test_calibration_needs_a_text_of_two_tokens(ids_of):
    with pytest.raises(QuantizationError, match="needs --calibration TEXT_FILE"):
        kv.calibration_ids(None, None, 10, 10)
    with pytest.raises(QuantizationError, match="needs --calibration TEXT_FILE"):
        kv.calibration_ids(None, "", 10, 10)
    with pytest.raises(QuantizationError, match="^calibration text has 1 tokens; the KV cache scales need at least 2$"):
        kv.calibration_ids(None, "x", 10, 10)


def test_absmax_is_the_largest_magnitude_per_head_and_channel_over_windows(monkeypatch):
    rng = np.random.default_rng(0)
    presents = {L: [rng.normal(size=(1, N_HEAD, L, HEAD_DIM)).astype(np.float32) for _ in range(4)]
                for L in (3, 5)}
    seen = []

    class Model:
        def empty_past(self, batch):
            return "past"

        def forward(self, ids, mask, pos, past):
            assert past == "past" and np.array_equal(pos[0], np.arange(ids.shape[1])) and mask.sum() == ids.size
            return None, presents[ids.shape[1]]

    def load(model_dir, device):
        assert device == "cpu"  # calibration runs the fp32 source on the CPU, whatever the machine has
        return Model()

    monkeypatch.setattr(kv.runtime, "load", load)
    windows = [np.zeros((1, 3), np.int64), np.zeros((1, 5), np.int64)]
    amax = kv.measure_absmax(None, windows, progress=lambda done, total: seen.append((done, total)))
    assert seen == [(1, 2), (2, 2)]
    for i, a in enumerate(amax):
        want = np.maximum(np.abs(presents[3][i]).max(axis=2), np.abs(presents[5][i]).max(axis=2))
        assert a.shape == (1, N_HEAD, 1, HEAD_DIM)
        np.testing.assert_array_equal(a[:, :, 0], want)


@pytest.mark.parametrize("name, qmax, margin", [("int8", 127, 1.2), ("int4", 7, 0.8)])
def test_scales_map_the_widened_max_to_qmax(name, qmax, margin):
    amax = np.array([[[[0.0, 1e-9, 1.0, 70.0]]]], np.float32)  # (1, nh=1, 1, hs=4)
    (scale,) = kv.scales_from_absmax([amax], KV_CACHES[name])
    assert scale.dtype == np.float32 and scale.shape == amax.shape
    # a channel that is always 0 (or nearly) gets the floor, never a scale 0 that would divide by zero
    np.testing.assert_allclose(scale[0, 0, 0], [1e-6 / qmax, 1e-6 / qmax, margin / qmax, 70 * margin / qmax],
                               rtol=1e-6)


def _graph(n_layer: int = 2, gqa_nodes: int | None = None, gqa_inputs: int = 9) -> onnx.ModelProto:
    """A kv_buffer-shaped graph: past/present (B, nh, T, hs) float per layer, one GroupQueryAttention each
    (inputs q, k, v, past_key, past_value, seqlens_k, total, cos, sin), plus a stale value_info."""
    shape = ["B", N_HEAD, "T", HEAD_DIM]
    inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["B", "S"])]
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["B", "S", 5])]
    nodes = []
    for i in range(n_layer):
        inputs += [helper.make_tensor_value_info(C.past_key(i), TensorProto.FLOAT, shape),
                   helper.make_tensor_value_info(C.past_value(i), TensorProto.FLOAT, shape)]
        outputs += [helper.make_tensor_value_info(C.present_key(i), TensorProto.FLOAT, shape),
                    helper.make_tensor_value_info(C.present_value(i), TensorProto.FLOAT, shape)]
    for i in range(n_layer if gqa_nodes is None else gqa_nodes):
        nodes.append(helper.make_node(
            "GroupQueryAttention",
            ["q", "k", "v", C.past_key(i), C.past_value(i), "seqlens", "total", "cos", "sin"][:gqa_inputs],
            [f"attn{i}", C.present_key(i), C.present_value(i)], domain="com.microsoft", num_heads=N_HEAD))
    nodes.append(helper.make_node("MatMul", ["a", "b"], ["c"]))  # not attention: left alone
    graph = helper.make_graph(nodes, "g", inputs, outputs)
    graph.value_info.extend([helper.make_tensor_value_info(C.present_key(0), TensorProto.FLOAT, shape),
                             helper.make_tensor_value_info("c", TensorProto.FLOAT, [1])])
    return helper.make_model(graph)


def _dims(value) -> list:
    return [d.dim_value or d.dim_param for d in value.type.tensor_type.shape.dim]


@pytest.mark.parametrize("name, elem, width", [("int8", TensorProto.INT8, 8), ("int4", TensorProto.UINT8, 4)])
def test_the_rewrite_retypes_every_cache_tensor_and_adds_two_scales_per_layer(name, elem, width):
    model = _graph()
    scales = [np.full((1, N_HEAD, 1, HEAD_DIM), s, np.float32) for s in (0.1, 0.2, 0.3, 0.4)]
    assert kv.rewrite_kv_cache(model, KV_CACHES[name], HEAD_DIM, scales) == 2
    g = model.graph
    cache = [v for v in (*g.input, *g.output) if v.name.startswith(("past", "present"))]
    assert len(cache) == 8
    assert all(v.type.tensor_type.elem_type == elem and _dims(v) == ["B", N_HEAD, "T", width] for v in cache)
    assert g.input[0].type.tensor_type.elem_type == TensorProto.INT64 and _dims(g.output[0]) == ["B", "S", 5]
    assert [v.name for v in g.value_info] == ["c"]  # the cache's stale float record goes, the rest stays
    init = {t.name: onnx.numpy_helper.to_array(t) for t in g.initializer}
    assert sorted(init) == ["kv_cache.0.key_scale", "kv_cache.0.value_scale", "kv_cache.1.key_scale",
                            "kv_cache.1.value_scale"]
    assert [float(init[f"kv_cache.{i}.{s}_scale"].flat[0]) for i in (0, 1) for s in ("key", "value")] == \
        pytest.approx([0.1, 0.2, 0.3, 0.4])
    for i, node in enumerate(g.node[:2]):
        assert len(node.input) == 14 and list(node.input[9:12]) == ["", "", ""]
        assert list(node.input[12:]) == [f"kv_cache.{i}.key_scale", f"kv_cache.{i}.value_scale"]
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        assert attrs == {"num_heads": N_HEAD, "kv_cache_bit_width": KV_CACHES[name].bits,
                         "k_quant_type": b"PER_CHANNEL", "v_quant_type": b"PER_CHANNEL"}
    assert list(g.node[2].input) == ["a", "b"] and not g.node[2].attribute


def test_attention_with_exactly_the_cache_inputs_is_rewritten_and_fewer_is_not():
    """Inputs 3 and 4 are the cache: a node with exactly 5 inputs reads it (its optional ones padded as empty)."""
    model = _graph(gqa_inputs=5)
    scales = [np.ones((1, N_HEAD, 1, HEAD_DIM), np.float32)] * 4
    assert kv.rewrite_kv_cache(model, KV_CACHES["int8"], HEAD_DIM, scales) == 2
    assert list(model.graph.node[0].input[5:12]) == [""] * 7 and len(model.graph.node[0].input) == 14
    with pytest.raises(QuantizationError, match="0 GroupQueryAttention nodes read the cache of 2 layers"):
        kv.rewrite_kv_cache(_graph(gqa_inputs=4), KV_CACHES["int8"], HEAD_DIM, scales)


def test_an_fp16_rewrite_adds_no_scales():
    model = _graph()
    assert kv.rewrite_kv_cache(model, KV_CACHES["fp16"], HEAD_DIM) == 2
    assert not model.graph.initializer
    assert all(len(n.input) == 9 and len(n.attribute) == 1 for n in model.graph.node[:2])
    assert model.graph.input[1].type.tensor_type.elem_type == TensorProto.FLOAT16


def test_a_graph_whose_attention_does_not_read_every_layers_cache_is_refused():
    with pytest.raises(QuantizationError, match=r"^--kv-cache fp16: 1 GroupQueryAttention nodes read the cache of 2 "
                                                r"layers \(not a kv_buffer graph gptedge wrote\?\)$"):
        kv.rewrite_kv_cache(_graph(gqa_nodes=1), KV_CACHES["fp16"], HEAD_DIM)
