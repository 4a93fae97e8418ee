"""A model dir is not trusted blindly: each way it can give silently wrong results (a manifest, config or graph
that disagree) fails at load in one line naming both values, and `gptedge verify` lists every problem, hashes every file
and repeats the recorded parity run. Each case copies a freshly exported tiny dir, breaks one thing, and loads it."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gptedge.runtime import load
from gptedge.runtime.errors import ModelDirError
from gptedge.runtime.modeldir.manifest import MANIFEST_NAME, read_manifest, write_manifest
from gptedge.runtime.modeldir.model_files import FileRecord, check_records, record_problems

from ..support.checkpoints import ROOT, tiny_reference, write_checkpoint

SAMPLE_TOKENIZER = ROOT / "samples" / "sample-model" / "tokenizer.json"  # 8,192 tokens


@pytest.fixture(scope="module")
def dirs(tmp_path_factory, gpt2_checkpoint, gpt2_model_dir, gpt2_kv_buffer_loaded):
    """Every kind of dir the cases copy: fp32 (standard, kv_buffer), int4, dynamic, fp16, one whose weights live in
    model.onnx.data, one over an 8,192-token vocabulary with its own tokenizer."""
    from gptedge.export.exporter import export_checkpoint, export_model
    from gptedge.quantize.quantizer import QuantizeRecipe, quantize_model_dir

    base = tmp_path_factory.mktemp("integrity")
    for name, recipe in (("int4", QuantizeRecipe("weight-only", bits=4)), ("dynamic", QuantizeRecipe("dynamic")),
                         ("fp16", QuantizeRecipe("fp16"))):
        quantize_model_dir(gpt2_model_dir, base / name, recipe)
    with pytest.MonkeyPatch.context() as mp:  # a tiny model's weights in model.onnx.data, as GPT-2 small's are
        import gptedge.onnx_files

        mp.setattr(gptedge.onnx_files, "EXTERNAL_DATA_THRESHOLD", 1024)
        export_checkpoint(gpt2_checkpoint, base / "external")
    ck = write_checkpoint(tiny_reference("gpt2", vocab_size=8192, bos_token_id=0, eos_token_id=0), base / "ck8k",
                          tokenizer=False)
    shutil.copyfile(SAMPLE_TOKENIZER, ck / "tokenizer.json")
    export_checkpoint(ck, base / "v8192")
    export_model(tiny_reference("gpt2", seed=5), base / "unvalidated", validate=False)
    # the fp32 dir's shape with other weights: a graph that passes every claim check
    export_model(tiny_reference("gpt2", seed=9), base / "other_seed", validate=False)
    return {"fp32": gpt2_model_dir, "kv_buffer": gpt2_kv_buffer_loaded.model_dir, "int4": base / "int4",
            "dynamic": base / "dynamic", "fp16": base / "fp16", "external": base / "external", "v8192": base / "v8192",
            "unvalidated": base / "unvalidated", "other_seed": base / "other_seed"}


def copy(dirs, kind: str, tmp_path: Path) -> Path:
    out = tmp_path / kind
    shutil.copytree(dirs[kind], out)
    return out


def edit(model_dir: Path, change) -> None:
    path = model_dir / MANIFEST_NAME
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def no_records(data: dict) -> None:
    """As a manifest written before gptedge recorded sizes and hashes (format 1)."""
    data.pop("files", None)
    data["parity"].pop("fingerprint", None)
    data["format_version"] = 1


def _random_bytes_into_data(d: Path) -> None:
    """2 MB of random bytes written over the middle of the weights: the file keeps its size."""
    data = d / "model.onnx.data"
    raw = bytearray(data.read_bytes())
    n = min(2 * 10**6, len(raw) // 2)
    raw[len(raw) // 4:len(raw) // 4 + n] = os.urandom(n)
    data.write_bytes(bytes(raw))


# (id, dir kind, how to break it, what the one line must say)
CASES = [
    ("model_file-absolute", "fp32", lambda d,
     dirs: edit(d, lambda m: m.update(model_file=str(dirs["dynamic"] / "model.onnx"))),
     "is not a plain path inside the model directory"),
    ("model_file-dotdot", "fp32", lambda d, dirs: (shutil.copytree(dirs["dynamic"], d.parent / "other"),
                                                   edit(d, lambda m: m.update(model_file="../other/model.onnx"))),
     "model_file '../other/model.onnx' is not a plain path inside the model directory"),
    ("model_file-symlink-out", "fp32", lambda d, dirs: ((d / "model.onnx").unlink(),
                                                        (d / "model.onnx").symlink_to(dirs["dynamic"] / "model.onnx")),
     "model_file 'model.onnx' leads outside the model directory"),
    ("eos_id", "fp32", lambda d, dirs: edit(d, lambda m: m.update(eos_id=5)),
     "gptedge.json says eos_id 5, config.json says eos_token_id 50256"),
    ("bos_id", "fp32", lambda d, dirs: edit(d, lambda m: m.update(bos_id=7)),
     "gptedge.json says bos_id 7, config.json says bos_token_id 50256"),
    ("context_length", "fp32", lambda d, dirs: edit(d, lambda m: m["shape"].update(context_length=16)),
     "gptedge.json says context_length 16, the graph's position table holds 128 positions"),
    ("precision", "fp32", lambda d, dirs: edit(d, lambda m: m.update(precision="int8")),
     "gptedge.json says precision int8, the graph's is fp32"),
    ("quantization-method", "int4", lambda d, dirs: edit(d, lambda m: (  # a recipe valid for dynamic
        m["quantization"].update(method="dynamic", bits=8, symmetric=True), m.update(precision="int8"))),
     "gptedge.json says quantization method dynamic, the graph is weight-only-quantized (it holds MatMulNBits)"),
    ("quantization-bits", "int4", lambda d, dirs: edit(d, lambda m: (m["quantization"].update(bits=8, symmetric=True),
                                                                     m.update(precision="int8"))),
     "gptedge.json says bits 8, the graph's MatMulNBits linears are 4-bit"),
    ("arch", "fp32", lambda d, dirs: edit(d, lambda m: m["shape"].update(arch="openai-gpt")),
     "gptedge.json says arch openai-gpt, the graph is gpt2's (5 LayerNorms for 2 layers; openai-gpt has 4)"),
    ("graph-standard-said-kv_buffer", "fp32", lambda d, dirs: edit(d, lambda m: m.update(graph="kv_buffer")),
     "gptedge.json says graph kv_buffer, the graph's I/O contract is standard's"),
    ("graph-kv_buffer-said-standard", "kv_buffer", lambda d, dirs: edit(d, lambda m: m.update(graph="standard")),
     "gptedge.json says graph standard, the graph's I/O contract is kv_buffer's"),
    ("dynamic-graph-copied-in", "fp32", lambda d,
     dirs: shutil.copyfile(dirs["dynamic"] / "model.onnx", d / "model.onnx"),
     "model.onnx is"),
    ("dynamic-graph-copied-in-old-manifest", "fp32",
     lambda d, dirs: (shutil.copyfile(dirs["dynamic"] / "model.onnx", d / "model.onnx"), edit(d, no_records)),
     "gptedge.json says the model is not quantized (fp32), the graph is dynamic-quantized (it holds "
     "MatMulIntegerToFloat)"),
    ("fp16-graph-copied-in-old-manifest", "fp32",
     lambda d, dirs: (shutil.copyfile(dirs["fp16"] / "model.onnx", d / "model.onnx"), edit(d, no_records)),
     "gptedge.json says precision fp32, the graph's is fp16 (no quantized op, float16 cache)"),
    ("random-bytes-in-model.onnx.data", "external", lambda d, dirs: _random_bytes_into_data(d),
     "model.onnx.data: its SHA-256 is"),
    ("other-tokenizer", "v8192", lambda d, dirs: shutil.copyfile(dirs["fp32"] / "tokenizer.json", d / "tokenizer.json"),
     "tokenizer.json is 3,557,685 bytes, gptedge.json records 553,398"),
    ("other-tokenizer-old-manifest", "v8192",
     lambda d, dirs: (shutil.copyfile(dirs["fp32"] / "tokenizer.json", d / "tokenizer.json"), edit(d, no_records)),
     "tokenizer.json has 50,257 tokens, the model's vocabulary is 8,192"),
]


@pytest.mark.parametrize("case, kind, breakage, says", CASES, ids=[c[0] for c in CASES])
def test_a_dir_that_is_not_what_its_manifest_says_fails_at_load(dirs, tmp_path, case, kind, breakage, says):
    d = copy(dirs, kind, tmp_path)
    load(d, device="cpu")  # as exported, it loads
    breakage(d, dirs)
    with pytest.raises(ModelDirError) as caught:
        load(d, device="cpu")
    line = str(caught.value)
    assert says in line and "\n" not in line, line


def test_hashes_are_checked_at_load_for_inline_graphs_too(dirs, tmp_path):
    """A byte changed inside model.onnx's weights, size unchanged: ONNX Runtime loads it happily, the hash does not."""
    d = copy(dirs, "fp32", tmp_path)
    raw = bytearray((d / "model.onnx").read_bytes())
    raw[-5000] ^= 0x40  # a float of the last initializers
    (d / "model.onnx").write_bytes(bytes(raw))
    with pytest.raises(ModelDirError, match=r"model.onnx: its SHA-256 is [0-9a-f]{16}\.\.\., gptedge.json records"):
        load(d, device="cpu")


def test_manifests_are_written_as_format_2_and_format_1_still_reads(dirs, tmp_path):
    assert json.loads((dirs["fp32"] / MANIFEST_NAME).read_text())["format_version"] == 2
    d = copy(dirs, "fp32", tmp_path)
    edit(d, no_records)
    assert read_manifest(d).format_version == 1 and read_manifest(d).files == ()
    edit(d, lambda m: m.update(format_version=4))  # 3: a dir whose KV cache is not fp32 (test_kv_cache.py)
    with pytest.raises(ModelDirError, match="format_version 4 is not supported .this gptedge reads 1, 2 and 3."):
        read_manifest(d)


def test_every_recorded_file_is_hashed(dirs):
    from gptedge.runtime.modeldir.model_files import sha256_file

    m = read_manifest(dirs["external"])
    assert [r.path for r in m.files] == ["model.onnx", "model.onnx.data", "tokenizer.json"]
    for r in m.files:
        path = dirs["external"] / r.path
        assert r.size == path.stat().st_size
        assert r.sha256 == hashlib.sha256(path.read_bytes()).hexdigest() == sha256_file(path)


def test_an_old_manifest_loads_with_a_warning(dirs, tmp_path, caplog):
    d = copy(dirs, "fp32", tmp_path)
    edit(d, no_records)
    with caplog.at_level(logging.WARNING, logger="gptedge.runtime.checks.integrity"):
        model = load(d, device="cpu")
    assert "records no file sizes or hashes" in caplog.text
    assert len(model.generate("Hello", max_new_tokens=3).ids) == 3


def test_file_records_list_every_problem_and_load_raises_the_first(tmp_path):
    """One pass over the records for both sides: verify lists every line, load's check_records raises the first."""
    (tmp_path / "a.bin").write_bytes(b"abc")
    (tmp_path / "ok.bin").write_bytes(b"ab")
    records = (FileRecord("ok.bin", 2, "0" * 64), FileRecord("a.bin", 4, "0" * 64), FileRecord("gone.bin", 2, "0" * 64),
               FileRecord("../up.bin", 1, "0" * 64))
    problems = record_problems(tmp_path, records)
    assert problems == ["a.bin is 3 bytes, gptedge.json records 4 (the file changed after gptedge wrote it)",
                        "gone.bin is missing (gptedge.json records 2 bytes)",
                        "file '../up.bin' is not a plain path inside the model directory (absolute, or with '..'): "
                        "refused"]
    with pytest.raises(ModelDirError) as caught:
        check_records(tmp_path, records)
    assert str(caught.value) == f"{tmp_path}: {problems[0]}"
    assert record_problems(tmp_path, records[:1]) == [] and check_records(tmp_path, records[:1]) is None


def verify(d: Path, *args: str):
    return subprocess.run([sys.executable, "-m", "gptedge.cli", "verify", str(d), "--device", "cpu", *args],
                          capture_output=True, text=True, timeout=300)


@pytest.mark.slow  # verify hashes every file and repeats the recorded parity run
def test_verify_passes_a_dir_as_written(dirs):
    for kind in ("fp32", "int4", "external"):
        result = verify(dirs[kind])
        assert result.returncode == 0, result.stdout + result.stderr
        lines = result.stdout.splitlines()
        assert [line.split()[0] for line in lines[:-1]] == ["ok"] * 5, lines
        assert "sizes and SHA-256 as recorded" in result.stdout and "parity: 8 greedy tokens" in result.stdout
        assert lines[-1].endswith("verified")


@pytest.mark.slow  # verify hashes every file and repeats the recorded parity run
def test_verify_lists_every_problem(dirs, tmp_path):
    d = copy(dirs, "fp32", tmp_path)
    edit(d, lambda m: m.update(eos_id=5))
    result = verify(d)
    assert result.returncode == 1
    fails = [line for line in result.stdout.splitlines() if line.startswith("FAIL")]
    assert fails == ["FAIL  claims: gptedge.json says eos_id 5, config.json says eos_token_id 50256",
                     "FAIL  claims: gptedge.json says eos_id 5, generation_config.json says eos_token_id 50256",
                     "FAIL  claims: gptedge.json says eos_id 5, which is '&' in tokenizer.json, not one of its special "
                     "tokens ('<|endoftext|>' = 50256)",
                     "FAIL  claims: gptedge.json says eos_id 5, genai_config.json says model.eos_token_id 50256"]
    data = json.loads(verify(d, "--json").stdout)
    assert data["ok"] is False and sum(f["status"] == "FAIL" for f in data["findings"]) == 4


@pytest.mark.slow  # verify hashes every file and repeats the recorded parity run
def test_verify_reports_an_old_manifest_and_a_missing_fingerprint(dirs, tmp_path):
    d = copy(dirs, "fp32", tmp_path)
    edit(d, no_records)
    result = verify(d)
    assert result.returncode == 1
    assert "FAIL  files: gptedge.json records no file sizes or hashes" in result.stdout
    result = verify(dirs["unvalidated"])
    assert result.returncode == 0 and "warn  parity: no fingerprint recorded" in result.stdout


@pytest.mark.slow  # verify hashes every file and repeats the recorded parity run
def test_verify_repeats_the_recorded_parity_run(dirs, tmp_path):
    """Another graph of the same shape, its files re-recorded so that sizes, hashes and claims all agree: only the
    parity run can tell it is not the model that was exported."""
    d = copy(dirs, "fp32", tmp_path)
    shutil.copyfile(dirs["other_seed"] / "model.onnx", d / "model.onnx")
    write_manifest(d, read_manifest(d))  # new records, the old fingerprint
    load(d, device="cpu")
    result = verify(d)
    assert result.returncode == 1, result.stdout
    assert any(line.startswith("FAIL  parity: ") and "the manifest records" in line
               for line in result.stdout.splitlines()), result.stdout


def test_fingerprint_comparison_tolerates_near_ties_only():
    from gptedge.runtime.checks.fingerprint import fingerprint_problems
    from gptedge.runtime.modeldir.manifest import Fingerprint

    recorded = Fingerprint((1, 2), (5, 6, 7), (3.0, 2.0, 1.0), (0.5, 1e-4, 0.5))
    same = Fingerprint((1, 2), (5, 6, 7), (3.0005, 2.0, 1.0), (0.5, 1e-4, 0.5))
    tie_flips = Fingerprint((1, 2), (5, 9, 8), (3.0, 2.0, 1.0), (0.5, 1e-4, 0.5))
    assert fingerprint_problems(recorded, same, "fp32") == []
    assert fingerprint_problems(recorded, tie_flips, "fp32") == []  # step 2 was a near tie: the runs part there
    wrong_token = Fingerprint((1, 2), (4, 6, 7), (3.0, 2.0, 1.0), (0.5, 1e-4, 0.5))
    assert fingerprint_problems(recorded, wrong_token, "fp32") == [
        "parity: greedy token 1 is 4, the manifest records 5 (recorded margin over the runner-up 0.5, tolerance 0.004)"]
    drifted = Fingerprint((1, 2), (5, 6, 7), (3.1, 2.0, 1.0), (0.5, 1e-4, 0.5))
    assert fingerprint_problems(recorded, drifted, "fp32") == [
        "parity: logit of greedy token 1 is 3.1, the manifest records 3 (tolerance 0.004)"]
    assert fingerprint_problems(recorded, drifted, "int8") == []  # within the quantized tolerance
