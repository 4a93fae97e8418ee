"""quantize on a mobile pack (an ORT-format model.ort, a flatbuffer onnx cannot parse): one line naming the
graph and what to do, for every method and for a KV-cache-only recipe, no output written (was protobuf's
DecodeError, "unexpected" with a hint to run --debug)."""

from __future__ import annotations

import pytest

from gptedge.cli import main
from gptedge.pack.mobile import write_mobile_model


@pytest.fixture(scope="module")
def mobile_dir(gpt2_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("mobile-pack")
    write_mobile_model(gpt2_model_dir, out)
    assert (out / "model.ort").read_bytes()[4:8] == b"ORTM"
    return out


@pytest.mark.parametrize("options", [["--method", "dynamic"], ["--method", "weight-only", "--bits", "4"],
                                     ["--method", "fp16"]], ids=["dynamic", "w4", "fp16"])
def test_quantize_refuses_an_ort_format_dir_in_one_line(runner, mobile_dir, tmp_path, options):
    before = sorted((p.name, p.stat().st_size) for p in mobile_dir.iterdir())
    result = runner.invoke(main, ["quantize", str(mobile_dir), "-o", str(tmp_path / "q"), *options])
    assert result.exit_code == 1, result.output
    lines = [line for line in result.output.splitlines() if line.startswith("Error: ")]
    assert lines == [f"Error: {mobile_dir}: its graph model.ort is in the ORT format (a mobile pack), which quantize "
                     "cannot read: quantize the model dir it was made from"], result.output
    assert "Traceback" not in result.output and not (tmp_path / "q").exists()
    assert sorted((p.name, p.stat().st_size) for p in mobile_dir.iterdir()) == before
