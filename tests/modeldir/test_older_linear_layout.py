"""A Llama / GPT-NeoX 4-bit dir written before q|k|v were packed into one linear still passes load's count of the
linears kept at 8 bits (runtime/checks/model_claims.py against the registry's older_linears); a count that fits
neither layout is still refused. Hand-written graph facts: no model is built."""

from __future__ import annotations

import pytest

from gptedge.runtime import contract as C
from gptedge.runtime.checks.model_claims import claim_problems
from gptedge.runtime.modeldir.manifest import Manifest, ModelShape, Quantization
from gptedge.runtime.modeldir.onnx_wire import GraphFacts, Node
from gptedge.runtime.modeldir.recipe import block_linears, older_block_linears


def kept_problems(arch: str, keep: tuple[str, ...], n4: int, n8: int, tmp_path) -> list[str]:
    shape = ModelShape(arch, 2, 4, 8, 100, 64, n_kv_head=2)
    m = Manifest(shape, precision="int4", quantization=Quantization(method="weight-only", bits=4, keep_8bit=keep))
    nodes = [Node("MatMulNBits", "com.microsoft", ("x", f"w{i}"), {"bits": b, "block_size": 32, "accuracy_level": 4})
             for i, b in enumerate([4] * n4 + [8] * n8)]
    types = {name(i): "float32" for i in range(2) for name in (C.past_key, C.past_value)}
    facts = GraphFacts("test", nodes, {}, types, {})
    return [p for p in claim_problems(tmp_path, m, facts, None) if "kept at 8 bits" in p]


@pytest.mark.parametrize("arch", ["llama", "qwen2", "mistral", "gpt_neox"])
def test_both_layouts_of_the_attention_linears_are_counted(arch, tmp_path):
    packed, older = block_linears(2, arch), older_block_linears(2, arch)
    assert "h.0.attention.qkv" in packed.values() and "h.0.attention.q" in older.values()
    keep = ("h.0.attention.*",)  # block 0's attention: 2 linears packed (qkv, o), 4 before (q, k, v, o)
    assert kept_problems(arch, keep, 8, 3, tmp_path) == []  # packed: 2 kept + the 8-bit LM head
    assert kept_problems(arch, keep, 10, 5, tmp_path) == []  # older: 4 kept + the LM head
    wrong = kept_problems(arch, keep, 11, 4, tmp_path)
    assert wrong and "says 2 linears kept at 8 bits" in wrong[0] and "MatMulNBits hold 4" in wrong[0]


def test_gpt2_has_one_layout():
    assert older_block_linears(2, "gpt2") is None and older_block_linears(2, "openai-gpt") is None
