"""The gptedge command through click's CliRunner: output streams and one-line errors."""

from __future__ import annotations

import json
import shutil

import pytest
from click.testing import CliRunner

from gptedge import __version__
from gptedge.cli import main


@pytest.fixture
def runner():
    return CliRunner()


def one_line_error(result) -> str:
    assert result.exit_code != 0
    lines = [line for line in result.output.strip().splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("Error: ")]
    # Exactly one error line, last; before it at most the load diagnostic, never a traceback.
    assert len(errors) == 1 and lines[-1] == errors[0] and len(lines) <= 2, result.output
    assert "Traceback" not in result.output
    return errors[0]


def test_help_and_version(runner):
    for flag in ("-h", "--help"):
        result = runner.invoke(main, [flag])
        assert result.exit_code == 0 and "export" in result.output and "generate" in result.output
    result = runner.invoke(main, ["--version"])
    assert result.exit_code == 0 and __version__ in result.output


def test_export_command(runner, gpt2_checkpoint, tmp_path):
    result = runner.invoke(main, ["export", str(gpt2_checkpoint), "-o", str(tmp_path / "m")])
    assert result.exit_code == 0, result.output
    assert "graph vs reference max |diff|" in result.stderr and result.stdout == ""
    manifest = json.loads((tmp_path / "m" / "gptedge.json").read_text())
    assert manifest["parity"]["greedy_vs_reference"]["identical"]


def test_generate_streams_text_on_stdout_and_timings_on_stderr(runner, gpt2_model_dir, gpt2_loaded):
    result = runner.invoke(main, ["generate", str(gpt2_model_dir), "-p", "Hello world", "-n", "10", "--greedy",
                                  "--device", "cpu"])
    assert result.exit_code == 0, result.output
    want = gpt2_loaded.generate("Hello world", max_new_tokens=10, greedy=True).text
    assert result.stdout == want + "\n"
    assert "tok/s" in result.stderr and "loaded" in result.stderr and "CPUExecutionProvider" in result.stderr


def test_generate_json(runner, gpt2_model_dir):
    result = runner.invoke(main, ["generate", str(gpt2_model_dir), "-p", "Hello world", "-n", "6", "--top-k", "5",
                                  "--top-p", "0.9", "--temperature", "0.7", "--repetition-penalty", "1.2",
                                  "--seed", "3", "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["prompt_ids"] == [15496, 995] and len(out["ids"]) == 6
    assert out["stop"] == "max_new_tokens" and out["tokens_per_s"] > 0 and isinstance(out["text"], str)


def test_info_shows_manifest_and_providers(runner, gpt2_model_dir):
    result = runner.invoke(main, ["info", str(gpt2_model_dir), "--device", "cpu"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["manifest"]["shape"]["n_layer"] == 2
    assert "CPUExecutionProvider" in out["providers_available"] and out["providers_used"] == ["CPUExecutionProvider"]


# --- bad input (DESIGN §8): one line, nothing written, nothing lost --------------------------------


def test_missing_model_dir(runner, tmp_path):
    line = one_line_error(runner.invoke(main, ["generate", str(tmp_path / "nope"), "-p", "x"]))
    assert "no such model directory" in line


def test_dir_without_manifest_or_config(runner, tmp_path):
    line = one_line_error(runner.invoke(main, ["info", str(tmp_path)]))
    assert "no gptedge.json and no config.json" in line


def test_corrupt_manifest(runner, gpt2_model_dir, tmp_path):
    bad = tmp_path / "m"
    shutil.copytree(gpt2_model_dir, bad)
    (bad / "gptedge.json").write_text("{ not json")
    assert "corrupt manifest" in one_line_error(runner.invoke(main, ["info", str(bad)]))


def test_corrupt_graph(runner, gpt2_model_dir, tmp_path):
    bad = tmp_path / "m"
    shutil.copytree(gpt2_model_dir, bad)
    (bad / "model.onnx").write_bytes(b"garbage" * 100)
    assert "ONNX Runtime cannot load it" in one_line_error(runner.invoke(main, ["info", str(bad)]))


def test_missing_graph(runner, gpt2_model_dir, tmp_path):
    bad = tmp_path / "m"
    shutil.copytree(gpt2_model_dir, bad)
    (bad / "model.onnx").unlink()
    assert "no model.onnx" in one_line_error(runner.invoke(main, ["info", str(bad)]))


@pytest.mark.parametrize("field, value, says", [
    ("n_layer", 3, "says n_layer 3, the graph has 2 layers"),
    ("n_head", 2, "says n_head 2, the graph has 4"),
    ("head_dim", 16, "says head_dim 16, the graph has 8"),
    ("vocab_size", 50000, "says vocab_size 50000, the graph has 50257"),
    ("context_length", 1024, "does not run at position 1023 (gptedge.json says context_length 1024)"),
])
def test_manifest_graph_mismatch(runner, gpt2_model_dir, tmp_path, field, value, says):
    bad = tmp_path / "m"
    shutil.copytree(gpt2_model_dir, bad)
    manifest = json.loads((bad / "gptedge.json").read_text())
    manifest["shape"][field] = value
    if field == "n_layer":
        manifest["inputs"] = manifest["outputs"] = []
    (bad / "gptedge.json").write_text(json.dumps(manifest))
    assert says in one_line_error(runner.invoke(main, ["info", str(bad)]))


def test_names_in_manifest_must_match_graph(runner, gpt2_model_dir, tmp_path):
    bad = tmp_path / "m"
    shutil.copytree(gpt2_model_dir, bad)
    manifest = json.loads((bad / "gptedge.json").read_text())
    manifest["inputs"] = manifest["inputs"] + ["past_key_values.2.key"]
    (bad / "gptedge.json").write_text(json.dumps(manifest))
    line = one_line_error(runner.invoke(main, ["info", str(bad)]))
    assert "graph does not match gptedge.json" in line and "past_key_values.2.key" in line


def test_missing_manifest_of_a_gptedge_dir(runner, gpt2_model_dir, tmp_path):
    bad = tmp_path / "m"
    shutil.copytree(gpt2_model_dir, bad)
    (bad / "gptedge.json").unlink()
    assert "no gptedge.json, yet gptedge wrote this graph" in one_line_error(runner.invoke(main, ["info", str(bad)]))


def test_missing_tokenizer(runner, gpt2_model_dir, tmp_path):
    bad = tmp_path / "m"
    shutil.copytree(gpt2_model_dir, bad)
    (bad / "tokenizer.json").unlink()
    assert "no tokenizer.json" in one_line_error(runner.invoke(main, ["generate", str(bad), "-p", "Hi"]))


def test_unknown_device(runner, gpt2_model_dir):
    line = one_line_error(runner.invoke(main, ["generate", str(gpt2_model_dir), "-p", "x", "--device", "tpu"]))
    assert "unknown device 'tpu'" in line


def test_missing_cuda_provider(runner, gpt2_model_dir):
    from gptedge.runtime.session import CUDA_PROVIDER, available_providers

    if CUDA_PROVIDER in available_providers():
        pytest.skip("this machine has the CUDA provider")
    line = one_line_error(runner.invoke(main, ["generate", str(gpt2_model_dir), "-p", "x", "--device", "cuda"]))
    assert "needs the CUDA execution provider" in line and "gptedge[gpu]" in line


def test_missing_onnxruntime_hint(monkeypatch):
    import builtins

    from gptedge.runtime.errors import MissingRuntimeError
    from gptedge.runtime.session import import_onnxruntime

    real_import = builtins.__import__

    def no_ort(name, *args, **kwargs):
        if name == "onnxruntime":
            raise ImportError("No module named 'onnxruntime'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_ort)
    with pytest.raises(MissingRuntimeError, match=r"pip install 'gptedge\[cpu\]' \(or 'gptedge\[gpu\]'"):
        import_onnxruntime()


def test_prompt_longer_than_context(runner, gpt2_model_dir):
    line = one_line_error(runner.invoke(main, ["generate", str(gpt2_model_dir), "-p", "word " * 200]))
    assert "context holds 128" in line


@pytest.mark.parametrize("args, word", [
    (["--top-p", "0"], "top_p"), (["--temperature", "-1"], "temperature"), (["--top-k", "-1"], "top_k"),
    (["--repetition-penalty", "0"], "repetition_penalty"), (["-n", "0"], "max_new_tokens"),
])
def test_bad_sampling_values(runner, gpt2_model_dir, args, word):
    line = one_line_error(runner.invoke(main, ["generate", str(gpt2_model_dir), "-p", "Hi", *args]))
    assert word in line


def test_export_refuses_existing_output_and_keeps_it(runner, gpt2_checkpoint, tmp_path):
    out = tmp_path / "m"
    out.mkdir()
    (out / "precious.txt").write_text("keep me")
    line = one_line_error(runner.invoke(main, ["export", str(gpt2_checkpoint), "-o", str(out)]))
    assert "exists; pass --force" in line
    assert (out / "precious.txt").read_text() == "keep me"


@pytest.mark.parametrize("breakage, message", [
    ("no_config", "no config.json"), ("bad_json", "not valid JSON"), ("model_type", "model_type 'llama'"),
    ("no_weights", "no model.safetensors or pytorch_model.bin"), ("corrupt_weights", "cannot read weights"),
])
def test_export_bad_checkpoint_writes_nothing(runner, gpt2_checkpoint, tmp_path, breakage, message):
    src = tmp_path / "src"
    shutil.copytree(gpt2_checkpoint, src)
    if breakage == "no_config":
        (src / "config.json").unlink()
    elif breakage == "bad_json":
        (src / "config.json").write_text("{")
    elif breakage == "model_type":
        cfg = json.loads((src / "config.json").read_text())
        (src / "config.json").write_text(json.dumps({**cfg, "model_type": "llama"}))
    elif breakage == "no_weights":
        (src / "model.safetensors").unlink()
    else:
        (src / "model.safetensors").write_bytes(b"\x00" * 64)
    line = one_line_error(runner.invoke(main, ["export", str(src), "-o", str(tmp_path / "out")]))
    assert message in line
    assert not (tmp_path / "out").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]
