"""compare --peers llama.cpp: where the converter is found, and (where llama_cpp is installed) the GGUF
peer's logits, figures and greedy ids against llama.cpp's own API and PyTorch's reference.

The llama.cpp rows need llama-cpp-python (built from source, docs/performance.md#building-llama-cpp-python) and its
sdist's converter ($GPTEDGE_LLAMA_CPP_SOURCE); they are skipped only where `llama_cpp` is not importable.
"""

from __future__ import annotations

import io
import json
import math
import sys
import tarfile
import types

import numpy as np
import pytest
from click.testing import CliRunner

from gptedge.cli import main
from gptedge.measure.compare import compare
from gptedge.measure.peers.llama_cpp import (CONVERTER, SOURCE_ENV, convert_to_gguf, converter_source, unpack_converter,
                                             with_n_ctx)
from gptedge.measure.peers.score import open_peers, unavailable
from gptedge.runtime.errors import PeerError

from ..support.checkpoints import EXCERPT, ROOT, tiny_reference, write_checkpoint

# --- finding the converter (no llama_cpp needed) -----------------------------------------------------------


def test_converter_source_in_each_layout(tmp_path, monkeypatch):
    monkeypatch.delenv(SOURCE_ENV, raising=False)
    assert converter_source() is None
    script = tmp_path / "checkout" / CONVERTER  # a llama.cpp checkout
    sdist = tmp_path / "unpacked" / "llama_cpp_python-0.3.36" / "vendor" / "llama.cpp" / CONVERTER
    for f in (script, sdist):
        f.parent.mkdir(parents=True)
        f.write_text("# converter\n")
    archive = tmp_path / "llama_cpp_python-0.3.36.tar.gz"
    archive.write_bytes(b"")
    for where, found in [(script, script), (script.parent, script), (sdist.parents[2], sdist),
                         (sdist.parents[3], sdist), (archive, archive), (tmp_path / "nowhere", None),
                         (tmp_path / "unpacked" / "llama_cpp_python-0.3.36" / "vendor", None)]:
        monkeypatch.setenv(SOURCE_ENV, str(where))
        assert converter_source() == found, where


def _tar(path, names: list[str]) -> None:
    with tarfile.open(path, "w:gz") as tar:
        for name in names:
            data = f"# {name}\n".encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def test_unpack_converter_takes_the_converter_and_its_packages_only(tmp_path):
    top = "llama_cpp_python-0.3.36"
    _tar(tmp_path / "s.tar.gz", [f"{top}/vendor/llama.cpp/{CONVERTER}", f"{top}/vendor/llama.cpp/conversion/base.py",
                                 f"{top}/vendor/llama.cpp/gguf-py/gguf/__init__.py",
                                 f"{top}/vendor/llama.cpp/src/llama.cpp",
                                 f"{top}/llama_cpp/llama.py", f"{top}/README.md"])
    got = unpack_converter(tmp_path / "s.tar.gz", tmp_path / "work")
    assert got == tmp_path / "work" / "llama.cpp" / CONVERTER
    assert got.read_text() == f"# {top}/vendor/llama.cpp/{CONVERTER}\n"
    files = sorted(str(p.relative_to(got.parent)) for p in got.parent.rglob("*") if p.is_file())
    assert files == sorted([CONVERTER, "conversion/base.py", "gguf-py/gguf/__init__.py"])
    _tar(tmp_path / "other.tar.gz", [f"{top}/README.md"])
    with pytest.raises(PeerError, match="holds no vendor/llama.cpp/convert_hf_to_gguf.py"):
        unpack_converter(tmp_path / "other.tar.gz", tmp_path / "work2")


def test_with_n_ctx_adds_gpt2s_context_key(tmp_path, gpt2_checkpoint):
    out = with_n_ctx(gpt2_checkpoint, tmp_path)
    config = json.loads((out / "config.json").read_text())
    assert out == tmp_path / "llama-source" and config["n_ctx"] == config["n_positions"] == 128
    assert (out / "model.safetensors").resolve() == (gpt2_checkpoint / "model.safetensors").resolve()
    assert "n_ctx" not in json.loads((gpt2_checkpoint / "config.json").read_text())
    assert with_n_ctx(out, tmp_path / "again") == out  # has it already


def test_llama_cpp_without_its_converter_names_where_to_get_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "llama_cpp", types.ModuleType("llama_cpp"))
    monkeypatch.delenv(SOURCE_ENV, raising=False)
    why = unavailable("llama.cpp")
    assert "convert_hf_to_gguf.py was not found" in why and SOURCE_ENV in why and "pip download" in why


def _failing_converter(tmp_path, monkeypatch, message: str):
    """A stand-in convert_hf_to_gguf.py whose main() raises what llama.cpp's raises on a Gemma dir without
    tokenizer.model; the checkpoint dir holds a tokenizer.json only."""
    script = tmp_path / "llama.cpp" / CONVERTER
    script.parent.mkdir()
    script.write_text(f"def main():\n    raise FileNotFoundError({message!r})\n")
    monkeypatch.setenv(SOURCE_ENV, str(script))
    source = tmp_path / "ckpt"
    source.mkdir()
    (source / "config.json").write_text("{}")
    (source / "tokenizer.json").write_text("{}")
    work = tmp_path / "work"
    work.mkdir()
    return source, work


def test_a_converter_wanting_tokenizer_model_says_to_put_it_beside_tokenizer_json(tmp_path, monkeypatch):
    source, work = _failing_converter(tmp_path, monkeypatch, "File not found: ckpt/tokenizer.model")
    with pytest.raises(PeerError) as caught:
        convert_to_gguf(source, work)
    why = str(caught.value)
    assert "\n" not in why and "FileNotFoundError: File not found: ckpt/tokenizer.model" in why
    assert why.endswith("put it beside tokenizer.json)")
    (source / "tokenizer.model").write_bytes(b"")  # present, so the failure is something else: no hint
    with pytest.raises(PeerError) as caught:
        convert_to_gguf(source, work)
    assert "put it beside" not in str(caught.value)


# --- the peer itself (llama_cpp installed) -------------------------------------------------------------------


@pytest.fixture(scope="module")
def llama():
    llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (README: building it)")
    assert converter_source() is not None, f"llama_cpp is installed: set {SOURCE_ENV} to its sdist (README)"
    return llama_cpp


@pytest.fixture(scope="module")
def llama_run(llama, gpt2_loaded, gpt2_checkpoint, gpt2_model_dir):
    ids = gpt2_loaded.encode(EXCERPT.read_text(encoding="utf-8")[:3000])
    with open_peers(["llama.cpp"], gpt2_checkpoint, gpt2_model_dir, threads=2,
                    recipes={"llama.cpp": ("F32", "Q8_0", "Q4_0")}) as (scorers, skipped):
        rows = compare([gpt2_loaded], ids, prompts=3, new_tokens=8, peers=scorers)
        yield {r.model: r for r in rows}, {s.info.name: s for s in scorers}, ids


def test_f32_gguf_agrees_with_the_reference(llama_run, gpt2_loaded):
    rows, scorers, ids = llama_run
    r = rows["llama.cpp F32"]
    assert 0 <= r.kl < 1e-8 and r.top1_agreement == 1.0 and r.greedy_agreement == 1.0 and r.precision == "fp32"
    x = np.asarray(ids[:100], dtype=np.int64)
    want = gpt2_loaded.forward(x[None], np.ones_like(x[None]), np.arange(100)[None], gpt2_loaded.empty_past(1))[0][0]
    assert np.abs(scorers["llama.cpp F32"].logits(x) - want).max() < 1e-3  # every position, in order


def test_q8_0_differs_from_f32_by_a_small_finite_kl(llama_run):
    rows, scorers, ids = llama_run
    r = rows["llama.cpp Q8_0"]
    assert math.isfinite(r.kl) and 1e-8 < r.kl < 1e-4 and 0.9 < r.top1_agreement < 1.0, r
    assert r.peer and r.engine.startswith("llama-cpp-python ")
    assert r.method == "llama.cpp Q8_0" and r.precision == "int8"
    assert r.size_bytes < 0.5 * rows["llama.cpp F32"].size_bytes
    x = np.asarray(ids[:64], dtype=np.int64)
    assert np.abs(scorers["llama.cpp Q8_0"].logits(x) - scorers["llama.cpp F32"].logits(x)).max() > 1e-3


def test_q4_0_figures_and_greedy_against_llama_cpps_own_api(llama_run, llama, gpt2_checkpoint, tmp_path):
    """Q4_0 (Q8_0's KL on this tiny model is too small to tell the two directions apart): KL(ref‖q) and top-1 from
    PyTorch's reference and a Llama of the same GGUF evaluated here; greedy ids by recomputing the whole sequence and
    taking the argmax of its last position."""
    import torch

    from gptedge.export.checkpoint import load_checkpoint

    rows, scorers, ids = llama_run
    gguf = scorers["llama.cpp Q4_0"].decoding.model_path
    engine = llama.Llama(gguf, n_ctx=256, n_batch=256, n_ubatch=256, logits_all=True, verbose=False)
    model, _ = load_checkpoint(gpt2_checkpoint)
    forward = backward = agree = 0.0
    n, begin, scored = 0, 0, 1
    while scored < len(ids):
        end = min(begin + 128, len(ids))
        first = scored - begin
        with torch.no_grad():
            lp = torch.log_softmax(model(torch.tensor([ids[begin:end]]))[0][0].double(), -1)[first - 1:-1]
        engine.reset()
        engine.eval(ids[begin:end])
        lq = torch.log_softmax(torch.tensor(np.array(engine.scores[:end - begin])).double(), -1)[first - 1:-1]
        forward += (lp.exp() * (lp - lq)).sum().item()
        backward += (lq.exp() * (lq - lp)).sum().item()
        agree += (lp.argmax(-1) == lq.argmax(-1)).sum().item()
        n += end - scored
        scored, begin = end, max(0, min(end - 64, end - 1))
    row = rows["llama.cpp Q4_0"]
    # Near-uniform tiny-model distributions: the two directions differ by ~1e-6 relative; the row must sit at least
    # 5x closer to KL(ref‖q) than KL(q‖ref) is (PyTorch vs ONNX Runtime's reference logits differ by ~1e-5).
    assert abs(row.kl - forward / n) < abs(backward - forward) / n / 5, (row.kl, forward / n, backward / n)
    assert row.top1_agreement == pytest.approx(agree / n, abs=1e-12)
    prompt, want = ids[100:124], []
    for _ in range(10):
        engine.reset()
        engine.eval(prompt + want)
        want.append(int(np.argmax(engine.scores[len(prompt) + len(want) - 1])))
    assert scorers["llama.cpp Q4_0"].greedy(prompt, 10, None).ids == want


def test_a_tokenizer_llama_cpp_does_not_know_still_converts(llama, tmp_path):
    """The sample model's own BPE (8,192 tokens): its pre-tokenizer is unknown to the converter, which would refuse
    it; the peer writes it as gpt-2 (ids are fed, never text) and the F32 GGUF matches gptedge's export."""
    import shutil

    from gptedge.export.exporter import export_checkpoint
    from gptedge.runtime import load

    ck = write_checkpoint(tiny_reference("gpt2", vocab_size=8192, eos_token_id=0, bos_token_id=0), tmp_path / "ck",
                          tokenizer=False)
    shutil.copyfile(ROOT / "samples" / "sample-model" / "tokenizer.json", ck / "tokenizer.json")
    export_checkpoint(ck, tmp_path / "md")
    ref = load(tmp_path / "md", device="cpu")
    ids = ref.encode(EXCERPT.read_text(encoding="utf-8")[:1500])
    with open_peers(["llama.cpp"], ck, tmp_path / "md", threads=2, recipes={"llama.cpp": ("F32",)}) as (scorers, _):
        rows = compare([ref], ids, prompts=2, new_tokens=6, peers=scorers)
    assert rows[1].model == "llama.cpp F32" and rows[1].kl < 1e-8 and rows[1].top1_agreement == 1.0


def test_compare_cli_llama_cpp_rows_and_a_quiet_stderr(llama, gpt2_model_dir, tmp_path):
    text = tmp_path / "t.txt"
    text.write_text(EXCERPT.read_text(encoding="utf-8")[:1500], encoding="utf-8")
    result = CliRunner().invoke(main, ["compare", str(gpt2_model_dir), "--text", str(text), "--prompts", "2",
                                       "--new-tokens", "6", "--json", "--peers", "llama.cpp", "--threads", "1"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert [r["model"] for r in rows[1:]] == ["llama.cpp Q8_0", "llama.cpp Q4_K_M", "llama.cpp Q4_0"]
    assert all(r["peer"] and 0 < r["kl"] < 1e-3 for r in rows[1:])
    assert rows[1]["kl"] < rows[3]["kl"]  # 8-bit closer than 4-bit
    # llama.cpp's own log (fallback quantizations of the 32-wide tiny model, context notes) goes to INFO, not stderr
    assert "llama_" not in result.stderr
