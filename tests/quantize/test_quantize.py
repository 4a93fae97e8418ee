"""INT8 variants: structure (what is quantized, the tied weight stored once, sizes) and bad input."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import onnx
import pytest
from click.testing import CliRunner

from gptedge.cli import main
from gptedge.quantize import int8_math as qm
from gptedge.quantize.quantizer import QuantizeRecipe, quantize_model_dir
from gptedge.runtime import load
from gptedge.runtime.errors import InvalidArgumentError, ModelDirError, QuantizationError

from ..support.checkpoints import EXCERPT
METHODS = ["dynamic", "static", "weight-only"]


@pytest.fixture(scope="module")
def quantized_dirs(tmp_path_factory, gpt2_model_dir):
    text = EXCERPT.read_text(encoding="utf-8")[:20000]
    base = tmp_path_factory.mktemp("q")
    return {m: (quantize_model_dir(gpt2_model_dir, base / m, QuantizeRecipe(m, calibration_sequences=4),
                                   calibration_text=text), base / m) for m in METHODS}


def graph(model_dir):
    return onnx.load(str(model_dir / "model.onnx"))


def test_int8_math_round_trips():
    rng = np.random.default_rng(0)
    w = rng.normal(size=(64, 48)).astype(np.float32)
    q, s = qm.quantize_columns(w)
    assert q.dtype == np.int8 and s.shape == (48,) and np.abs(q).max() == 127
    assert np.abs(q * s - w).max() <= s.max() / 2 + 1e-7
    qb, sb = qm.quantize_blocks_u8(w.T, 32)
    assert qb.shape == (48, 2, 32) and sb.shape == (48, 2)
    assert np.abs(qm.dequantize_blocks_u8(qb, sb) - w.T).max() <= sb.max() / 2 + 1e-7
    _, s_tensor = qm.quantize_columns(w, per_channel=False)
    assert np.unique(s_tensor).size == 1


@pytest.mark.parametrize("method", METHODS)
def test_manifest_records_recipe(quantized_dirs, method):
    manifest, out = quantized_dirs[method]
    on_disk = json.loads((out / "gptedge.json").read_text())
    assert on_disk["precision"] == "int8" and on_disk["quantization"]["method"] == method
    assert "stored once" in on_disk["quantization"]["embedding_and_lm_head"]
    assert on_disk["quantization"]["attention_products"] == "float"
    assert on_disk["parity"]["vs_fp32"]["top1_agreement"] > 0.85
    assert {p.name for p in out.iterdir()} >= {"model.onnx", "tokenizer.json", "config.json", "gptedge.json"}
    assert manifest.quantization.recipe == QuantizeRecipe(method, calibration_sequences=4)  # the one record


@pytest.mark.parametrize("method", METHODS)
def test_attention_stays_one_float_op_per_layer(quantized_dirs, method):
    """Attention (QK^T, softmax, PV) stays one float MultiHeadAttention per layer; no integer MatMul there."""
    ops = Counter(n.op_type for n in graph(quantized_dirs[method][1]).graph.node)
    assert ops["MultiHeadAttention"] == 2 and ops["MatMulInteger"] == 0


def test_every_linear_and_the_tied_weight_quantized(quantized_dirs):
    n_layer = 2
    ops = {m: Counter(n.op_type for n in graph(out).graph.node) for m, (_, out) in quantized_dirs.items()}
    # 4 linears per layer + the LM head; per-row activation scales: one QuantizeLinear per linear
    assert ops["dynamic"]["MatMulIntegerToFloat"] == ops["dynamic"]["QuantizeLinear"] == 4 * n_layer + 1
    assert ops["dynamic"]["DynamicQuantizeMatMul"] == 0
    assert ops["weight-only"]["MatMulNBits"] == 4 * n_layer + 1
    static = graph(quantized_dirs["static"][1])
    dq_weights = [n.input[0] for n in static.graph.node if n.op_type == "DequantizeLinear"
                  and n.input[0].endswith("_quantized")]
    assert len(dq_weights) == 4 * n_layer + 1
    # ... and every linear's activation passes through a calibrated Quantize/Dequantize pair.
    producer = {o: n for n in static.graph.node for o in n.output}
    matmuls = [n for n in static.graph.node if n.op_type == "MatMul"]
    assert len(matmuls) == 4 * n_layer + 1
    for m in matmuls:
        dq = producer[m.input[0]]
        assert dq.op_type == "DequantizeLinear" and producer[dq.input[0]].op_type == "QuantizeLinear", m.name


@pytest.mark.parametrize("method", METHODS)
def test_no_float_weight_left_and_tied_weight_stored_once(quantized_dirs, method):
    model = graph(quantized_dirs[method][1])
    vocab_sized = [t for t in model.graph.initializer if 50257 in t.dims]
    big = [t for t in vocab_sized if np.prod(t.dims) >= 50257 * 32]
    assert len(big) == 1, [t.name for t in big]  # the one embedding / LM head weight
    assert big[0].data_type in (onnx.TensorProto.INT8, onnx.TensorProto.UINT8)
    users = [n.op_type for n in model.graph.node if big[0].name in n.input]
    lm_head = {"dynamic": "MatMulIntegerToFloat", "weight-only": "MatMulNBits", "static": "DequantizeLinear"}[method]
    assert sorted(users) == sorted(["Gather", lm_head])
    float_weights = [t.name for t in model.graph.initializer
                     if t.data_type == onnx.TensorProto.FLOAT and len(t.dims) == 2 and min(t.dims) >= 32]
    assert float_weights == ["wpe.weight"]  # positions stay float: 0.6 % of GPT-2 small, read one row per token


@pytest.mark.parametrize("method", METHODS)
def test_sizes_shrink(quantized_dirs, gpt2_model_dir, method):
    fp32 = (gpt2_model_dir / "model.onnx").stat().st_size
    size = (quantized_dirs[method][1] / "model.onnx").stat().st_size
    assert 0.24 * fp32 < size < 0.34 * fp32, size / fp32


def test_dynamic_per_tensor_folds_biases_into_one_kernel(gpt2_model_dir, tmp_path):
    """--activation-scale per-tensor: each linear is one DynamicQuantizeMatMul with its bias inside."""
    n_layer = 2
    quantize_model_dir(gpt2_model_dir, tmp_path / "d", QuantizeRecipe("dynamic", activation_scale="per-tensor"))
    dynamic = graph(tmp_path / "d")
    assert Counter(n.op_type for n in dynamic.graph.node)["DynamicQuantizeMatMul"] == 4 * n_layer + 1
    # the two c_proj biases of each layer ride in DynamicQuantizeMatMul's bias input, not in an Add after it
    with_bias = [n for n in dynamic.graph.node if n.op_type == "DynamicQuantizeMatMul" and len(n.input) == 5]
    assert len(with_bias) == 2 * n_layer
    producer = {o: n for n in dynamic.graph.node for o in n.output}
    consts = {t.name for t in dynamic.graph.initializer}
    assert not [n for n in dynamic.graph.node if n.op_type == "Add" and any(i in consts for i in n.input)
                and any(producer.get(i) is not None and producer[i].op_type == "DynamicQuantizeMatMul"
                        for i in n.input)]


def test_reduced_range_weights_stay_within_7_bits(quantized_dirs, gpt2_model_dir, tmp_path):
    """The default dynamic recipe stores weights in -63..63 (no int16 saturation on AVX2); --full-range uses
    -127..127."""
    def int8_extremes(model_dir):
        return max(int(np.abs(onnx.numpy_helper.to_array(t).astype(np.int32)).max())
                   for t in graph(model_dir).graph.initializer if t.data_type == onnx.TensorProto.INT8)

    assert int8_extremes(quantized_dirs["dynamic"][1]) == 63
    quantize_model_dir(gpt2_model_dir, tmp_path / "full", QuantizeRecipe("dynamic", reduce_range=False))
    assert int8_extremes(tmp_path / "full") == 127


def _batched_vs_solo(model, prompts):
    """-> (max |logit diff| between a row prefilled in a left-padded batch and alone, rows whose greedy ids agree)."""
    from gptedge.runtime.generation.generation import left_pad, prefill

    def last(batch):
        ids, mask = left_pad(batch, 0)
        return prefill(model.variant.start(len(batch), ids.shape[1] + 1), ids, mask, chunk=None).copy()

    diff = float(np.abs(last(prompts) - np.concatenate([last([p]) for p in prompts])).max())
    together = model.generate_batch(prompts, max_new_tokens=6, greedy=True, ignore_eos=True)
    same = sum(t.ids == model.generate(p, max_new_tokens=6, greedy=True, ignore_eos=True).ids
               for t, p in zip(together, prompts, strict=True))
    return diff, same


def test_dynamic_rows_do_not_depend_on_their_batch(quantized_dirs, gpt2_model_dir, tmp_path):
    """Per-row activation scales: a row's logits are (nearly) its solo logits; per tensor they are not."""
    rng = np.random.default_rng(1)
    prompts = [rng.integers(0, 50257, int(n)).tolist() for n in rng.integers(3, 30, 12)]
    per_row = load(quantized_dirs["dynamic"][1], device="cpu")
    quantize_model_dir(gpt2_model_dir, tmp_path / "t", QuantizeRecipe("dynamic", activation_scale="per-tensor"))
    per_tensor = load(tmp_path / "t", device="cpu")
    row_diff, row_same = _batched_vs_solo(per_row, prompts)
    tensor_diff, _ = _batched_vs_solo(per_tensor, prompts)
    assert row_same == len(prompts)
    assert row_diff < 1e-3 < tensor_diff, (row_diff, tensor_diff)


@pytest.mark.parametrize("method", METHODS)
def test_quantized_generation_matches_fp32(quantized_dirs, gpt2_loaded, method):
    """The runtime runs an INT8 dir unchanged, and on the tiny model every recipe keeps the fp32 greedy ids
    (measured: 24 of 24 tokens on four prompts for each method)."""
    loaded = load(quantized_dirs[method][1], device="cpu")
    assert loaded.manifest.precision == "int8" and loaded.variant.name == gpt2_loaded.variant.name
    for prompt in ("It is a truth", "Hello world"):
        want = gpt2_loaded.generate(prompt, max_new_tokens=8, greedy=True)
        got = loaded.generate(prompt, max_new_tokens=8, greedy=True)
        assert got.ids == want.ids and got.text == want.text, (method, prompt)


def test_quantized_attention_option(tmp_path):
    """On a plain-ops graph QK^T and PV are MatMuls, which --quantize-attention turns into int8 products."""
    from gptedge.export.exporter import export_model

    from ..support.checkpoints import tiny_reference

    export_model(tiny_reference("gpt2", seed=21), tmp_path / "plain", fused=False, validate=False)
    plain = Counter(n.op_type for n in graph(tmp_path / "plain").graph.node)
    assert plain["MultiHeadAttention"] == 0 and plain["MatMul"] == 4 * 2 + 2 * 2
    m = quantize_model_dir(tmp_path / "plain", tmp_path / "qa", QuantizeRecipe("dynamic", quantize_attention=True))
    ops = Counter(n.op_type for n in graph(tmp_path / "qa").graph.node)
    assert ops["MatMulInteger"] == 4 and m.quantization.attention_products == "int8"
    float_attention = quantize_model_dir(tmp_path / "plain", tmp_path / "qf", QuantizeRecipe("dynamic"))
    assert float_attention.quantization.attention_products == "float"


def test_quantized_attention_refused_on_fused_attention(gpt2_model_dir, gpt2_kv_buffer_loaded, tmp_path):
    for source, op in ((gpt2_model_dir, "MultiHeadAttention"),
                       (gpt2_kv_buffer_loaded.model_dir, "GroupQueryAttention")):
        with pytest.raises(QuantizationError, match=f"needs a graph exported with --plain-ops.*{op}"):
            quantize_model_dir(source, tmp_path / "qa", QuantizeRecipe("dynamic", quantize_attention=True))
        assert not (tmp_path / "qa").exists()


def test_per_tensor_option(gpt2_model_dir, tmp_path):
    quantize_model_dir(gpt2_model_dir, tmp_path / "pt", QuantizeRecipe("dynamic", per_channel=False))
    scales = [t for t in graph(tmp_path / "pt").graph.initializer if t.name.endswith("c_fc.weight.scale")]
    assert np.unique(onnx.numpy_helper.to_array(scales[0])).size == 1


# --- bad input: one line, nothing written ----------------------------------------------------------


def test_already_quantized(quantized_dirs, tmp_path):
    with pytest.raises(QuantizationError, match="already quantized"):
        quantize_model_dir(quantized_dirs["dynamic"][1], tmp_path / "again", QuantizeRecipe("dynamic"))
    assert not (tmp_path / "again").exists()


def test_calibration_text_too_short(gpt2_model_dir, tmp_path):
    with pytest.raises(QuantizationError, match="calibration text has 3 tokens"):
        quantize_model_dir(gpt2_model_dir, tmp_path / "s", QuantizeRecipe("static"), calibration_text="Hello world!")
    with pytest.raises(QuantizationError, match="needs --calibration"):
        quantize_model_dir(gpt2_model_dir, tmp_path / "s", QuantizeRecipe("static"))
    assert list(tmp_path.iterdir()) == []


def test_calibration_length_beyond_context_refused_before_any_work(gpt2_model_dir, tmp_path):
    """A calibration length beyond the context is refused, never clamped while the manifest records the value asked."""
    text = EXCERPT.read_text(encoding="utf-8")[:20000]
    with pytest.raises(InvalidArgumentError, match=r"--calibration-length 1000 is out of range: choose 2\.\.128"):
        quantize_model_dir(gpt2_model_dir, tmp_path / "s", QuantizeRecipe("static", calibration_length=1000),
                           calibration_text=text, progress=lambda i, n: pytest.fail("calibration started"))
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow  # static calibration on the text
def test_static_records_the_windows_it_used(gpt2_model_dir, gpt2_loaded, tmp_path):
    text = EXCERPT.read_text(encoding="utf-8")[:300]
    tokens = len(gpt2_loaded.encode(text))
    windows = tokens - 64 + 1  # every start position: the text is too short for 50 windows
    assert 2 <= windows < 50
    calls = []
    m = quantize_model_dir(gpt2_model_dir, tmp_path / "s", QuantizeRecipe("static", calibration_sequences=50,
                                                                          calibration_length=64),
                           calibration_text=text, progress=lambda i, n: calls.append(n))
    assert m.quantization.calibration_sequences == windows == len(calls) and m.quantization.calibration_length == 64
    assert json.loads((tmp_path / "s" / "gptedge.json").read_text())["quantization"]["calibration_sequences"] == windows


@pytest.mark.slow  # static calibration on the text
def test_static_temporary_files_stay_inside_the_partial_output(gpt2_model_dir, tmp_path, monkeypatch):
    """ONNX Runtime's augmented model and our own scratch files live in the partial output dir, so a killed
    run leaves nothing elsewhere; the finished dir holds none of them."""
    import tempfile

    system_tmp = tmp_path / "system-tmp"
    system_tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(system_tmp))
    out = tmp_path / "out" / "s"
    seen = []

    def during_calibration(i, n):
        partial = next((tmp_path / "out").glob(".s.partial-*"))
        seen.append((sorted(p.name for p in system_tmp.iterdir()), [p.name for p in partial.rglob("*.onnx")]))

    quantize_model_dir(gpt2_model_dir, out, QuantizeRecipe("static", calibration_sequences=2),
                       calibration_text=EXCERPT.read_text(encoding="utf-8")[:20000], progress=during_calibration)
    assert seen and all(outside == [] and "augmented_model.onnx" in inside for outside, inside in seen)
    assert tempfile.tempdir == str(system_tmp) and list(system_tmp.iterdir()) == []
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "genai_config.json", "generation_config.json",
                                                      "gptedge.json", "model.onnx", "tokenizer.json",
                                                      "tokenizer_config.json"]
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["s"]


def test_quantized_attention_refused_where_activations_stay_float(tmp_path):
    from gptedge.export.exporter import export_model

    from ..support.checkpoints import tiny_reference

    export_model(tiny_reference("gpt2", seed=21), tmp_path / "plain", fused=False, validate=False)
    with pytest.raises(QuantizationError, match="--quantize-attention does not apply to weight-only"):
        quantize_model_dir(tmp_path / "plain", tmp_path / "w", QuantizeRecipe("weight-only", quantize_attention=True))
    assert not (tmp_path / "w").exists()


def test_dir_without_manifest(tmp_path):
    with pytest.raises(ModelDirError, match="no gptedge.json"):
        quantize_model_dir(tmp_path, tmp_path / "out", QuantizeRecipe("dynamic"))


def test_unknown_method():
    with pytest.raises(InvalidArgumentError, match="unknown method 'int3'"):
        QuantizeRecipe("int3")


def test_cli_quantize_errors_are_one_line(gpt2_model_dir, quantized_dirs, tmp_path):
    runner = CliRunner()
    for args, message, code in [  # 2: the command line is wrong (tests/cli/test_bad_*.py)
        (["--method", "int3"], "'int3' is not one of", 2),
        (["--method", "static"], "needs --calibration", 2),
        (["--method", "weight-only", "--block-size", "24"], "power of two", 2),
        (["--method", "static", "--calibration", str(EXCERPT), "--calibration-length", "1000"], "choose 2..128", 2),
    ]:
        result = runner.invoke(main, ["quantize", str(gpt2_model_dir), "-o", str(tmp_path / "x"), *args])
        assert result.exit_code == code and result.output.strip().splitlines()[-1].startswith("Error: ")
        assert message in result.output
    result = runner.invoke(main, ["quantize", str(quantized_dirs["static"][1]), "-o", str(tmp_path / "x"),
                                  "--method", "dynamic"])
    assert "already quantized (static)" in result.output
    assert not (tmp_path / "x").exists()


def test_library_calls_never_replace_their_input(gpt2_model_dir, gpt2_checkpoint, tmp_path):
    """--force's guard is the library's, not only the CLI's: a call writing over its own input is refused."""
    import shutil

    from gptedge.export.exporter import export_checkpoint
    from gptedge.runtime.errors import OutputExistsError

    model = tmp_path / "m"
    shutil.copytree(gpt2_model_dir, model)
    before = sorted((p.name, p.stat().st_size) for p in model.iterdir())
    with pytest.raises(OutputExistsError, match="is the input"):
        quantize_model_dir(model, model, QuantizeRecipe("dynamic"), force=True)
    ck = tmp_path / "ck"
    shutil.copytree(gpt2_checkpoint, ck)
    with pytest.raises(OutputExistsError, match="is the input"):
        export_checkpoint(ck, ck, force=True)
    assert sorted((p.name, p.stat().st_size) for p in model.iterdir()) == before and (ck / "config.json").is_file()
