"""`gptedge pack --target mobile`: onnxruntime's converter writes model.ort and the required-operators config; the
onnxruntime Python package loads the .ort and, through gptedge's loop, gives the source dir's greedy ids."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from gptedge.runtime import load

pytestmark = pytest.mark.slow  # the sample model in four recipes, packed and run by real clients

PROMPTS = ["It is a truth universally acknowledged, that", "The", "Hello"]


@pytest.fixture(scope="module", params=["dynamic", "w4"])
def mobile(request, sample_recipe_dirs, tmp_path_factory):
    source = sample_recipe_dirs[request.param]
    out = tmp_path_factory.mktemp("mobile") / request.param
    done = subprocess.run([sys.executable, "-m", "gptedge.cli", "pack", str(source), "--target", "mobile", "-o",
                           str(out)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return source, out


def test_ort_format_and_operators_config(mobile):
    source, out = mobile
    assert not (out / "model.onnx").exists()
    assert (out / "model.ort").read_bytes()[4:8] == b"ORTM"  # the ORT format's flatbuffer identifier
    config = (out / "required_operators_and_types.config").read_text()
    assert "/" not in config.split("\n", 2)[1]  # its header names model.ort, not the scratch dir it was made in
    pack = json.loads((out / "gptedge-pack.json").read_text())
    quantized = {"dynamic": "com.microsoft:MatMulIntegerToFloat", "w4": "com.microsoft:MatMulNBits"}[source.name]
    assert quantized in pack["operators"] and "com.microsoft:MultiHeadAttention" in pack["operators"]
    assert quantized.split(":")[1] in config
    assert json.loads((out / "genai_config.json").read_text())["model"]["decoder"]["filename"] == "model.ort"
    assert json.loads((out / "gptedge.json").read_text())["model_file"] == "model.ort"
    # the golden self-test, for the app to replay: a phone's kernels quantize activations as the Python runtime's do
    golden = json.loads((out / "gptedge-selftest.json").read_text())["graphs"]
    assert [(g["file"], g["tolerance"], "caveat" in g) for g in golden] == [("model.ort", 0.06, False)]
    case = golden[0]["cases"][0]
    assert case["ids"] == load(out, device="cpu").generate(case["prompt"], max_new_tokens=8, greedy=True).ids


def test_onnxruntime_runs_the_ort_model_with_identical_greedy_ids(mobile):
    import onnxruntime as ort

    source, out = mobile
    session = ort.InferenceSession(str(out / "model.ort"), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()][:3] == ["input_ids", "attention_mask", "position_ids"]
    original, phone = load(source, device="cpu"), load(out, device="cpu")
    assert phone.session.get_providers() == ["CPUExecutionProvider"]
    for prompt in PROMPTS:
        want = original.generate(prompt, max_new_tokens=32, greedy=True)
        got = phone.generate(prompt, max_new_tokens=32, greedy=True)
        assert got.ids == want.ids and got.text == want.text, prompt
    ids = np.array([original.encode(PROMPTS[0])])
    np.testing.assert_allclose(phone.forward(ids, np.ones_like(ids), np.arange(ids.shape[1])[None],
                                             phone.empty_past(1))[0],
                               original.forward(ids, np.ones_like(ids), np.arange(ids.shape[1])[None],
                                                original.empty_past(1))[0], atol=1e-4)


def test_platform_option_reaches_the_converter(sample_recipe_dirs, tmp_path):
    """--platform amd64 (x86 hosts): recorded, and the converter is told (its NCHWc filter depends on it)."""
    out = tmp_path / "x86"
    done = subprocess.run([sys.executable, "-m", "gptedge.cli", "pack", str(sample_recipe_dirs["fp32"]), "--target",
                           "mobile", "-o", str(out), "--platform", "amd64"], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr
    assert json.loads((out / "gptedge-pack.json").read_text())["platform"] == "amd64"
    assert "amd64" in done.stderr


def test_genai_runs_the_mobile_folder(mobile):
    og = pytest.importorskip("onnxruntime_genai", reason="onnxruntime-genai is not installed (the test extra)")
    source, out = mobile
    want = load(source, device="cpu").generate(PROMPTS[0], max_new_tokens=16, greedy=True)
    model = og.Model(str(out))
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(want.prompt_ids) + 16, do_sample=False)
    generator = og.Generator(model, params)
    generator.append_tokens(want.prompt_ids)
    while not generator.is_done():
        generator.generate_next_token()
    assert list(generator.get_sequence(0))[len(want.prompt_ids):] == want.ids
