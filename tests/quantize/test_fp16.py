"""fp16 graphs (quantize --method fp16, weight-only --float16, export --precision fp16) and the device-side
greedy pick, on the CPU: structure, manifest and parity. The same on a GPU is tests/cuda/test_cuda.py."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import onnx
import pytest

from gptedge.quantize.quantizer import QuantizeRecipe, quantize_model_dir
from gptedge.runtime import load
from gptedge.runtime.errors import InvalidArgumentError
from gptedge.runtime.generation.generation import left_pad, positions
from gptedge.runtime.graphs.argmax_graph import argmax_model

pytestmark = pytest.mark.slow  # fp16 exports and quantizations of both graphs


@pytest.fixture(scope="module")
def kv_fp32(gpt2_kv_buffer_loaded):
    return gpt2_kv_buffer_loaded.model_dir


@pytest.fixture(scope="module")
def kv_fp16(tmp_path_factory, kv_fp32):
    out = tmp_path_factory.mktemp("fp16") / "kv16"
    quantize_model_dir(kv_fp32, out, QuantizeRecipe(method="fp16"))
    return out


def _float_types(model: onnx.ModelProto) -> set[int]:
    return {i.data_type for i in model.graph.initializer if i.data_type in (onnx.TensorProto.FLOAT,
                                                                              onnx.TensorProto.FLOAT16)}


def test_fp16_halves_every_float_but_the_logits(kv_fp32, kv_fp16):
    half = onnx.load(str(kv_fp16 / "model.onnx"))
    assert _float_types(half) == {onnx.TensorProto.FLOAT16}
    types = {v.name: v.type.tensor_type.elem_type for v in (*half.graph.input, *half.graph.output)}
    assert types["logits"] == onnx.TensorProto.FLOAT
    assert types["past_key_values.0.key"] == types["present.0.value"] == onnx.TensorProto.FLOAT16
    size = lambda d: (d / "model.onnx").stat().st_size  # noqa: E731 - a one-line local helper
    assert size(kv_fp16) < 0.6 * size(kv_fp32)
    manifest = json.loads((kv_fp16 / "gptedge.json").read_text())
    assert manifest["precision"] == "fp16" and manifest["quantization"]["method"] == "fp16"
    assert load(kv_fp16, device="cpu").manifest.quantization.label == "fp16"
    check = manifest["parity"]["vs_fp32"]
    # measured here: max |diff| ~0.01 on tiny logits, identical top-1 and greedy tokens
    assert check["device"] == "cpu" and check["max_abs_logit_diff"] < 0.05
    assert check["top1_agreement"] >= 0.98 and check["greedy_agreement"] >= 0.9


def test_fp16_generates_what_fp32_does(kv_fp32, kv_fp16):
    a, b = load(kv_fp32, device="cpu"), load(kv_fp16, device="cpu")
    assert b.variant.kv_dtype == np.float16
    prompts = [[5, 17, 300, 2], [9, 8]]  # left-padded batch
    x = a.generate_batch(prompts, 12, greedy=True, ignore_eos=True, with_text=False)
    y = b.generate_batch(prompts, 12, greedy=True, ignore_eos=True, with_text=False)
    assert [r.ids for r in x] == [r.ids for r in y]


def test_weight_only_float16_keeps_blocks_and_halves_the_rest(tmp_path, kv_fp32):
    out = tmp_path / "wo16"
    m = quantize_model_dir(kv_fp32, out, QuantizeRecipe(method="weight-only", float16=True))
    graph = onnx.load(str(out / "model.onnx"))
    nbits = [n for n in graph.graph.node if n.op_type == "MatMulNBits"]
    assert nbits and _float_types(graph) == {onnx.TensorProto.FLOAT16}
    assert m.precision == "int8" and m.quantization.float16 and "float16" in m.quantization.activations
    assert m.quantization.label == "weight-only, fp16 activations"  # compare's method column
    assert m.parity.vs_fp32.top1_agreement >= 0.9


def test_float16_is_refused_for_integer_activation_methods():
    with pytest.raises(InvalidArgumentError, match="float16 applies to weight-only"):
        QuantizeRecipe(method="dynamic", float16=True)


def test_export_precision_fp16_leaves_one_dir(tmp_path, gpt2_checkpoint):
    out = tmp_path / "e16"
    r = subprocess.run([sys.executable, "-m", "gptedge.cli", "export", str(gpt2_checkpoint), "-o", str(out),
                        "--graph", "kv_buffer", "--precision", "fp16"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "(fp16)" in r.stderr and sorted(p.name for p in tmp_path.iterdir()) == ["e16"]  # the scratch fp32 is gone
    manifest = json.loads((out / "gptedge.json").read_text())
    assert manifest["precision"] == "fp16" and manifest["source"]["quantized_from"] is None
    assert manifest["source"]["fp32_source"]["path"] == str(gpt2_checkpoint.resolve())


def test_failed_fp16_export_leaves_no_folders(tmp_path):
    (tmp_path / "src").mkdir()  # no config, no weights: the fp32 export fails
    r = subprocess.run([sys.executable, "-m", "gptedge.cli", "export", str(tmp_path / "src"), "-o",
                        str(tmp_path / "a" / "b" / "out"), "--precision", "fp16"], capture_output=True, text=True)
    assert r.returncode == 1 and r.stderr.count("Error:") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]  # neither the scratch dir nor a/b


def test_argmax_graph_is_valid_onnx_and_matches_numpy():
    import onnxruntime as ort

    rng = np.random.default_rng(0)
    for half in (False, True):
        blob = argmax_model(half)
        onnx.checker.check_model(onnx.load_from_string(blob), full_check=True)
        logits = rng.standard_normal((3, 2, 97)).astype(np.float16 if half else np.float32)
        logits[1, 0, [4, 60]] = 50  # a tie: the first index, as numpy
        got = ort.InferenceSession(blob, providers=["CPUExecutionProvider"]).run(None, {"logits": logits})[0]
        np.testing.assert_array_equal(got, logits.argmax(-1))


@pytest.mark.parametrize("graph", ["kv_buffer", "standard"])
def test_device_pick_is_the_argmax_of_the_logits(kv_fp32, gpt2_model_dir, graph):
    """run_argmax through the one-node ArgMax session bound to the logits buffer (what a GPU does), forced on
    the CPU for the kv_buffer graph, equals numpy's argmax of run() for 6 greedy steps; the standard graph's is
    numpy's."""
    model = load(kv_fp32 if graph == "kv_buffer" else gpt2_model_dir, device="cpu")
    model.variant.pick_on_device = graph == "kv_buffer"
    ids, mask = left_pad([[3, 4, 5, 6], [7, 8]], 0)
    a, b = model.variant.start(2, 12), model.variant.start(2, 12)
    pos = positions(mask)
    for _ in range(6):
        tok = a.run_argmax(ids, mask, pos).copy()
        np.testing.assert_array_equal(tok, b.run(ids, mask, pos).argmax(-1))
        ids, mask = tok[:, None], np.concatenate([mask, np.ones((2, 1), np.int64)], axis=1)
        pos = mask.sum(axis=1, keepdims=True) - 1
    if graph == "kv_buffer":
        assert a._pick is not None  # the ArgMax session ran, not numpy


def test_info_reports_provider_options(kv_fp16):
    r = subprocess.run([sys.executable, "-m", "gptedge.cli", "info", str(kv_fp16), "--device", "cpu"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["providers_used"] == ["CPUExecutionProvider"] and "CPUExecutionProvider" in info["provider_options"]
    assert info["manifest"]["precision"] == "fp16" and "gpus" not in info
