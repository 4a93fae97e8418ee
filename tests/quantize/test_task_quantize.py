"""Classifier dirs quantized with every method: they load, keep their task, quantize the embedding (the head's
linear only when asked: it stays fp32 by default), and agree with fp32 on real text (entailment pairs and
multiple-choice examples cut from the eval excerpt).

Measured on these tiny seeded models (2026-11-25, onnxruntime 1.32, AVX2; 40 examples each), label agreement /
mean KL(fp32 || quantized) over the labels:
    entailment       dynamic 1.00 / 6.6e-4, static 0.90 / 1.1e-2, weight-only 8 1.00 / 1.0e-4, 4-bit 0.90 / 1.1e-2,
                     fp16 1.00 / 1.1e-7
    multiple choice  dynamic 1.00 / 1.4e-4, static 0.95 / 1.4e-2, weight-only 8 1.00 / 5.9e-5, 4-bit 0.875 / 3.5e-3,
                     fp16 1.00 / 5.3e-8
Random weights give near-even label distributions (mean top probability 0.62 and 0.46), so a small logit change
flips a label more often than on a trained classifier; the bounds sit about 3x above the measured KL."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from gptedge.quantize.quantizer import QuantizeRecipe, quantize_model_dir
from gptedge.runtime import load_classifier

from ..support.checkpoints import EXCERPT

pytest.importorskip("transformers")

pytestmark = pytest.mark.interop

RECIPES = {"dynamic": QuantizeRecipe("dynamic"),
           "static": QuantizeRecipe("static", calibration_length=32, calibration_sequences=16),
           "weight-only": QuantizeRecipe("weight-only"), "int4": QuantizeRecipe("weight-only", bits=4),
           "fp16": QuantizeRecipe("fp16")}
# recipe -> (min label agreement, max mean KL)
BOUNDS = {"dynamic": (0.9, 3e-3), "static": (0.8, 0.05), "weight-only": (0.95, 1e-3), "int4": (0.75, 0.04),
          "fp16": (1.0, 1e-5)}
QUANTIZED_OP = {"dynamic": "MatMulIntegerToFloat", "static": "QuantizeLinear", "weight-only": "MatMulNBits",
                "int4": "MatMulNBits"}


def sentences() -> list[str]:
    text = EXCERPT.read_text(encoding="utf-8")
    return [s.strip() for s in re.split(r"(?<=[.!?])\s+", text) if 20 < len(s.strip()) < 90]


EXAMPLES = {"gpt2-seq": lambda s: [(s[i], s[i + 1]) for i in range(0, 80, 2)],
            "gpt2-mc": lambda s: [(s[i], s[i + 1:i + 4]) for i in range(0, 160, 4)]}


@pytest.fixture(scope="module")
def quantized(task_dirs, tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("task-quantized")
    text = EXCERPT.read_text(encoding="utf-8")
    out = {}
    for name in EXAMPLES:
        for recipe_name, recipe in RECIPES.items():
            out[name, recipe_name] = root / f"{name}-{recipe_name}"
            quantize_model_dir(task_dirs[name], out[name, recipe_name], recipe, calibration_text=text)
    return out


@pytest.mark.parametrize("recipe", list(RECIPES))
@pytest.mark.parametrize("name", list(EXAMPLES))
def test_every_method_keeps_the_task_and_agrees_with_fp32(task_dirs, quantized, name, recipe):
    fp32 = load_classifier(task_dirs[name], device="cpu")
    q = load_classifier(quantized[name, recipe], device="cpu")
    assert q.manifest.task == fp32.manifest.task
    assert q.manifest.quantization.method == RECIPES[recipe].method
    nodes = q.manifest.quantization.quantized_nodes
    if recipe in QUANTIZED_OP:
        graph = onnx.load(str(quantized[name, recipe] / "model.onnx"))
        assert QUANTIZED_OP[recipe] in {n.op_type for n in graph.graph.node}
        assert float_head(graph)  # by default the head's linear stays fp32 (quantize_head=False)
        assert "head's linear" in q.manifest.quantization.kept_float
        storage = q.manifest.quantization.embedding_and_lm_head
        assert "; LM head" not in storage and "no LM head" in storage  # a classifier graph has none
        if recipe != "static":  # the token embedding is quantized with the blocks
            assert "wte.weight" not in {t.name for t in graph.graph.initializer}  # stored quantized only
            assert "kept as float" not in storage and "token embedding" not in q.manifest.quantization.kept_float
        else:  # static's QDQ pass quantizes MatMuls only: the manifest says the table stayed float, as it did
            assert "wte.weight" in {t.name for t in graph.graph.initializer}
            assert "kept as float" in storage and "token embedding" in q.manifest.quantization.kept_float
        assert sum(nodes.values()) >= 8  # 2 layers x 4 linears at least
    examples = EXAMPLES[name](sentences())
    p = np.array([r.probabilities for r in fp32.classify_batch(examples)])
    r = np.array([r.probabilities for r in q.classify_batch(examples)])
    agreement = float((p.argmax(-1) == r.argmax(-1)).mean())
    kl = float((p * np.log(p / r)).sum(-1).mean())
    low, high = BOUNDS[recipe]
    assert agreement >= low and kl <= high, (agreement, kl)


def float_head(graph: onnx.ModelProto) -> bool:
    """The head's linear is a float MatMul on its fp32 (C, L) initializer (no QDQ, no integer kernel)."""
    head = next(n for n in graph.graph.node if n.name == "head.MatMul")
    inits = {t.name: t for t in graph.graph.initializer}
    return (head.op_type == "MatMul" and head.input[1] in inits
            and inits[head.input[1]].data_type == onnx.TensorProto.FLOAT)


@pytest.mark.parametrize("recipe", list(QUANTIZED_OP))
@pytest.mark.parametrize("name", list(EXAMPLES))
def test_quantize_head_quantizes_the_heads_linear_with_the_blocks(task_dirs, quantized, tmp_path, name, recipe):
    out = tmp_path / "q"
    given = dataclasses.replace(RECIPES[recipe], quantize_head=True)
    quantize_model_dir(task_dirs[name], out, given, calibration_text=EXCERPT.read_text(encoding="utf-8"))
    graph = onnx.load(str(out / "model.onnx"))
    head = next(n for n in graph.graph.node if n.name == "head.MatMul")
    if recipe == "static":  # QDQ: the MatMul stays, its weight comes through a DequantizeLinear
        producers = {o: n.op_type for n in graph.graph.node for o in n.output}
        assert producers.get(head.input[1]) == "DequantizeLinear"
    else:
        assert head.op_type == QUANTIZED_OP[recipe]
    assert not float_head(graph)
    q = load_classifier(out, device="cpu").manifest.quantization
    default = load_classifier(quantized[name, recipe], device="cpu").manifest.quantization
    assert q.quantize_head and not default.quantize_head and "head" not in q.kept_float
    assert sum(q.quantized_nodes.values()) > sum(default.quantized_nodes.values())


@pytest.mark.parametrize("name", list(EXAMPLES))
def test_the_recorded_vs_fp32_figures_are_recomputed_from_the_graphs(task_dirs, quantized, name):
    """quantize records max |logit diff| and label agreement on seeded rows; recomputed here with plain ONNX Runtime
    sessions on the rows its docstring describes (4 rows of up to 32 random ids, right-padded)."""
    for recipe in ("dynamic", "int4"):
        vs = load_classifier(quantized[name, recipe], device="cpu").manifest.parity.vs_fp32
        rng = np.random.default_rng(0)
        ids = rng.integers(0, 50260, size=(4, 32), dtype=np.int64)
        mask = (np.arange(32) < np.array([32, 29, 16, 2])[:, None]).astype(np.int64)
        if name.endswith("-mc"):
            ids, mask = ids.reshape(2, 2, 32), mask.reshape(2, 2, 32)
        a, b = (ort.InferenceSession(str(d / "model.onnx"), providers=["CPUExecutionProvider"]).run(
            None, {"input_ids": ids, "attention_mask": mask})[0] for d in (task_dirs[name], quantized[name, recipe]))
        assert vs.max_abs_logit_diff == pytest.approx(float(np.abs(a - b).max()), rel=1e-5)
        assert vs.top1_agreement == float((a.argmax(-1) == b.argmax(-1)).mean())
        assert vs.greedy_agreement is None and vs.max_abs_logit_diff > 0


def test_a_manifest_written_before_quantize_head_reads_as_head_quantized(task_dirs, quantized):
    """A manifest without the quantize_head field (written before it existed) reads as head quantized, as it was."""
    from gptedge.runtime.modeldir.manifest import Quantization, typed

    recorded = dataclasses.asdict(load_classifier(quantized["gpt2-seq", "dynamic"], device="cpu")
                                  .manifest.quantization)
    assert recorded.pop("quantize_head") is False
    assert typed(Quantization, recorded, "manifest.quantization").quantize_head is True
