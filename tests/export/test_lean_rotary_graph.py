"""The rotary families' graphs are written lean (export/graph_rotary.py, export/llama.py): one packed q | k | v
MatMul per block on both graphs; on kv_buffer (contrib ops) RMSNorm as one SimplifiedLayerNormalization and each
residual add fused with the norm after it (SkipSimplifiedLayerNormalization, whose sum output is the next
residual), SiLU as QuickGelu. Written from tiny seeded transformers checkpoints; the packed rows are checked
against the checkpoint's q / k / v (the logits are the parity ladder's, tests/families/test_lineage_parity.py)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from gptedge.export.exporter import export_checkpoint

from ..support.lineage_checkpoints import variant_model, write_variant_checkpoint


def _graph(tmp_path, variant: str, graph: str) -> onnx.ModelProto:
    checkpoint = write_variant_checkpoint(tmp_path / variant, variant, tokenizer=False)
    out = tmp_path / f"{variant}-{graph}"
    # the numbers are the parity ladder's (tests/families/test_lineage_parity.py): here, the graph's structure
    export_checkpoint(checkpoint, out, graph_variant=graph, validate=False)
    return onnx.load(str(out / "model.onnx"))


def _linears(model: onnx.ModelProto) -> list[str]:
    """The MatMuls whose weight is an initializer (not attention's QK^T and PV), by weight name."""
    weights = {i.name for i in model.graph.initializer}
    return [n.input[1] for n in model.graph.node if n.op_type == "MatMul" and n.input[1] in weights]


def _attrs(node: onnx.NodeProto) -> dict:
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def _initializer(model: onnx.ModelProto, name: str) -> np.ndarray:
    return numpy_helper.to_array(next(i for i in model.graph.initializer if i.name == name))


@pytest.mark.parametrize("graph", ["kv_buffer", "standard"])
def test_llama_blocks_are_packed_and_fused(tmp_path, graph):
    model = _graph(tmp_path, "qwen2-qkv-bias", graph)  # GQA 2, q / k / v biases: the packed bias too
    ops = Counter(n.op_type for n in model.graph.node)
    n_layer = 2
    # per block: packed qkv, o, gate, up, down (the LM head is a Gemm)
    assert sorted(_linears(model)) == sorted(f"h.{i}.{n}.weight" for i in range(n_layer) for n in (
        "self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"))
    if graph == "kv_buffer":  # contrib ops: every residual add but the last fused with the RMSNorm after it
        assert ops["SkipSimplifiedLayerNormalization"] == 2 * n_layer - 1
        assert ops["SimplifiedLayerNormalization"] == 2  # h.0's input norm and ln_f
        assert not ops["Pow"] and not ops["Sqrt"] and not ops["ReduceMean"]
        # the rotary inside the attention: the packed projection straight in, no Split, no RotaryEmbedding
        assert not ops["RotaryEmbedding"] and not ops["Split"] and ops["GroupQueryAttention"] == n_layer
        for node in (n for n in model.graph.node if n.op_type == "GroupQueryAttention"):
            assert _attrs(node)["do_rotary"] == 1 and list(node.input[1:3]) == ["", ""]
            assert node.input[9] == "position_ids" and node.input[16] == "gqa.query_seqlens_out"
        assert ops["QuickGelu"] == n_layer and not ops["Sigmoid"]  # SiLU, x sigmoid(1 x)
    else:  # standard ONNX ops only (the web pack's and --plain-ops' graph): six per RMSNorm
        assert all(n.domain in ("", "ai.onnx") for n in model.graph.node)
        assert ops["Pow"] == ops["Sqrt"] == 2 * n_layer + 1 and not ops["SimplifiedLayerNormalization"]
        assert ops["Sigmoid"] == n_layer
    # the packed rows are q_proj, k_proj, v_proj stacked ([in, out] in the graph), biases likewise
    hf = variant_model("qwen2-qkv-bias").model.layers[1].self_attn
    want = np.concatenate([hf.q_proj.weight.detach().numpy(), hf.k_proj.weight.detach().numpy(),
                           hf.v_proj.weight.detach().numpy()]).T
    np.testing.assert_array_equal(_initializer(model, "h.1.self_attn.qkv_proj.weight"), want)
    bias = np.concatenate([hf.q_proj.bias.detach().numpy(), hf.k_proj.bias.detach().numpy(),
                           hf.v_proj.bias.detach().numpy()])
    np.testing.assert_array_equal(_initializer(model, "h.1.self_attn.qkv_proj.bias"), bias)


def test_neox_query_key_value_is_one_packed_linear(tmp_path):
    model = _graph(tmp_path, "neox-sequential-tied", "kv_buffer")
    assert len(_linears(model)) == 4 * 2 and "h.0.attention.qkv.weight" in _linears(model)  # qkv, dense, 2 MLP
    # NeoX's rows are per head [q | k | v]; the packed ones are all q heads, then all k, then all v
    hf = variant_model("neox-sequential-tied").gpt_neox.layers[0].attention.query_key_value
    heads, head_dim = 4, 16
    rows = hf.weight.detach().numpy().reshape(heads, 3, head_dim, -1)
    packed = _initializer(model, "h.0.attention.qkv.weight").T  # [out, in]
    for j in range(3):  # q, k, v
        np.testing.assert_array_equal(packed[j * heads * head_dim:(j + 1) * heads * head_dim],
                                      rows[:, j].reshape(heads * head_dim, -1))



@pytest.mark.parametrize("variant,inside", [("neox-partial-wide", True), ("neox-parallel", False),
                                            ("neox-sequential-tied", False)])
def test_rotary_goes_inside_the_attention_where_the_op_takes_it(tmp_path, variant, inside):
    """GroupQueryAttention's own rotary wants cos_cache's width (rotary_dim / 2) a multiple of 8: a head of 32 with
    16 rotary channels goes inside, 16 with 4 or 8 stays in RotaryEmbedding (the partial form)."""
    ops = Counter(n.op_type for n in _graph(tmp_path, variant, "kv_buffer").graph.node)
    assert (ops["RotaryEmbedding"], ops["GroupQueryAttention"]) == ((0, 2) if inside else (4, 2))


def test_rotary_stays_outside_where_onnx_runtime_lacks_query_seqlens(tmp_path, monkeypatch):
    """Without query_seqlens (ONNX Runtime < 1.32) the op rotates a prompt at position_ids[0, 0] + s for every
    row: a left-padded row would be rotated at another position than its own, so the graph keeps RotaryEmbedding."""
    from gptedge.export import graph_rotary

    monkeypatch.setattr(graph_rotary, "gqa_takes_query_seqlens", lambda: False)  # as imported there
    model = _graph(tmp_path, "gqa2-linear", "kv_buffer")
    ops = Counter(n.op_type for n in model.graph.node)
    assert ops["RotaryEmbedding"] == 4 and ops["Split"] == 2
    assert all("do_rotary" not in _attrs(n) for n in model.graph.node if n.op_type == "GroupQueryAttention")
