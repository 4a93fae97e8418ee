"""load()'s checks in their order (runtime/checks/integrity.py) on copies of the session's tiny GPT-2 dir: the graph
confined to the dir, sizes before ONNX Runtime reads anything, hashes while the session builds (a changed file
explains a failed build best), claims last; the warning for an old manifest once per dir; an imported dir's
exemptions. Each case is a copy and one open_checked_session call (test_model_integrity.py runs load on every kind
of dir)."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest

from gptedge.runtime.checks import integrity
from gptedge.runtime.checks.integrity import graph_facts, model_path, open_checked_session, start_file_checks
from gptedge.runtime.errors import ModelDirError
from gptedge.runtime.modeldir.manifest import MANIFEST_NAME, read_manifest


@pytest.fixture()
def d(gpt2_model_dir, tmp_path) -> Path:
    out = tmp_path / "d"
    shutil.copytree(gpt2_model_dir, out)
    return out


def edit(d: Path, change) -> None:
    data = json.loads((d / MANIFEST_NAME).read_text())
    change(data)
    (d / MANIFEST_NAME).write_text(json.dumps(data))


def opened(d: Path, imported: bool = False):
    return open_checked_session(d, read_manifest(d), imported, "cpu", None)


def test_a_sound_dir_opens_with_its_graph_and_tokenizer(d):
    session, graph, tokenizer = opened(d)
    assert graph == d / "model.onnx" and tokenizer is not None
    assert "input_ids" in [i.name for i in session.get_inputs()]


def test_the_graph_must_be_a_file_inside_the_dir(d):
    m = read_manifest(d)
    assert model_path(d, m) == d / "model.onnx"
    (d / "model.onnx").rename(d / "moved.onnx")
    with pytest.raises(ModelDirError) as caught:
        model_path(d, m)
    assert str(caught.value) == f"{d}: no model.onnx"
    (d / "model.onnx").mkdir()  # a folder of that name is not the graph either
    with pytest.raises(ModelDirError, match=r": no model.onnx$"):
        model_path(d, m)
    with pytest.raises(ModelDirError, match=r"model_file '\.\./model\.onnx' is not a plain path inside the model "):
        model_path(d, m.replace(model_file="../model.onnx"))


def test_a_graph_onnx_runtime_cannot_load_is_one_line(d):
    edit(d, lambda m: m.pop("files"))
    edit(d, lambda m: m.update(format_version=1))
    (d / "model.onnx").write_bytes(b"not a graph" * 10)
    with pytest.raises(ModelDirError) as caught:
        opened(d)
    line = str(caught.value)
    assert line.startswith(f"{d / 'model.onnx'}: ONNX Runtime cannot load it (") and "\n" not in line
    assert len(line) <= len(str(d / "model.onnx")) + len(": ONNX Runtime cannot load it ()") + 200


def test_a_changed_graph_is_named_before_the_failed_build(d):
    raw = bytearray((d / "model.onnx").read_bytes())
    raw[:16] = b"\xff" * 16  # same size, other bytes: ONNX Runtime fails to parse it, the hash says why
    (d / "model.onnx").write_bytes(bytes(raw))
    with pytest.raises(ModelDirError) as caught:
        opened(d)
    assert str(caught.value).startswith(f"{d}: model.onnx: its SHA-256 is ")


def test_a_flipped_weight_that_still_loads_is_a_hash_problem(d):
    raw = bytearray((d / "model.onnx").read_bytes())
    raw[-5000] ^= 0x40
    (d / "model.onnx").write_bytes(bytes(raw))
    with pytest.raises(ModelDirError, match=r"model.onnx: its SHA-256 is "):
        opened(d)


def test_a_wrong_size_is_refused_before_the_session_builds(d, monkeypatch):
    with open(d / "tokenizer.json", "ab") as f:
        f.write(b" ")
    monkeypatch.setattr(integrity, "make_session", lambda *a, **k: pytest.fail("the session was built"))
    with pytest.raises(ModelDirError, match="tokenizer.json"):
        opened(d)


def test_a_claim_the_graph_contradicts_is_raised_after_the_files(d):
    edit(d, lambda m: m.update(eos_id=m["shape"]["vocab_size"] + 5))
    with pytest.raises(ModelDirError) as caught:
        opened(d)
    assert "eos_id" in str(caught.value) and "outside the model's vocabulary" in str(caught.value)


def test_a_format_2_manifest_without_files_is_refused_unless_imported(d, caplog):
    edit(d, lambda m: m.pop("files"))
    with pytest.raises(ModelDirError, match=r"\(format_version 2\) has no `files` list"):
        start_file_checks(d, read_manifest(d), imported=False)
    start_file_checks(d, read_manifest(d), imported=True).problems()
    assert "records no file sizes" not in caplog.text  # an imported dir is not warned about either


def test_a_format_1_manifest_warns_once_per_dir(d, caplog):
    edit(d, lambda m: m.pop("files"))
    edit(d, lambda m: m.update(format_version=1))
    integrity._warned.discard(d.resolve())
    with caplog.at_level(logging.WARNING, logger="gptedge.runtime.checks.integrity"):
        assert start_file_checks(d, read_manifest(d), imported=False).problems() == []
        start_file_checks(d, read_manifest(d), imported=False)
    warned = [r for r in caplog.records if "records no file sizes or hashes" in r.getMessage()]
    assert len(warned) == 1 and str(d) in warned[0].getMessage()
    assert "export / quantize it again to record them" in warned[0].getMessage()


def test_graph_facts_say_whether_the_graph_is_in_the_ort_format(d):
    facts, ort_format = graph_facts(d / "model.onnx")
    assert ort_format is False and facts.ops["Gather"] >= 1
    (d / "model.ort").write_bytes(b"\x08\x00\x00\x00ORTM" + b"\x00" * 4)
    with pytest.raises(ModelDirError, match="not a readable ORT-format model"):
        graph_facts(d / "model.ort")


def test_onnx_runtimes_error_is_cut_to_its_first_200_characters(d, monkeypatch):
    def fails(*args, **kwargs):
        raise RuntimeError("y" * 300 + "\nsecond line")

    monkeypatch.setattr(integrity, "make_session", fails)
    with pytest.raises(ModelDirError) as caught:
        opened(d)
    assert str(caught.value) == f"{d / 'model.onnx'}: ONNX Runtime cannot load it ({'y' * 200})"


def test_gptedges_own_session_errors_pass_through(d, monkeypatch):
    from gptedge.runtime.errors import DeviceError

    def fails(*args, **kwargs):
        raise DeviceError("no CUDA here")

    monkeypatch.setattr(integrity, "make_session", fails)
    with pytest.raises(DeviceError, match="^no CUDA here$"):
        opened(d)
