"""The model-dir pipeline's order and lines (runtime/checks/pipeline.py, integrity.py's raise_first and
unrecorded) on copies of the session's tiny GPT-2 dir, one thing broken each: what is reported under which check,
where the pipeline stops, and check_model_dir's one line. Static checks only, so each case is a copy and a read
(test_dir_pipeline.py runs verify, pack and serve on the same breakages)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from gptedge.runtime.checks.integrity import raise_first, unrecorded
from gptedge.runtime.checks.pipeline import CLAIMS, FILES, MANIFEST, check_dir, check_model_dir
from gptedge.runtime.errors import ModelDirError
from gptedge.runtime.modeldir.manifest import MANIFEST_NAME, Manifest, ModelShape


@pytest.fixture()
def d(gpt2_model_dir, tmp_path) -> Path:
    out = tmp_path / "d"
    shutil.copytree(gpt2_model_dir, out)
    return out


def _edit(d: Path, change) -> None:
    data = json.loads((d / MANIFEST_NAME).read_text())
    change(data)
    (d / MANIFEST_NAME).write_text(json.dumps(data))


def test_a_sound_dir_has_no_problem_and_its_manifest_comes_back(d):
    found = check_dir(d)
    assert (found.problems, found.notes, found.facts_read) == ([], [], True)
    assert found.graph == d / "model.onnx" and found.manifest.model_file == "model.onnx"
    assert check_model_dir(d) == found.manifest


def test_no_dir_and_no_manifest_stop_at_the_manifest(d, tmp_path):
    found = check_dir(tmp_path / "absent")
    assert found.problems == [(MANIFEST, f"{tmp_path / 'absent'}: no such model directory")]
    assert (found.manifest, found.facts_read) == (None, False)
    (d / MANIFEST_NAME).write_text("{")
    found = check_dir(d)
    assert [c for c, _ in found.problems] == [MANIFEST] and (found.manifest, found.facts_read) == (None, False)


@pytest.mark.parametrize("model_file, says", [("../model.onnx", "outside"), ("absent.onnx", "no absent.onnx")])
def test_a_graph_outside_the_dir_or_missing_stops_at_the_manifest(d, model_file, says):
    _edit(d, lambda m: m.update(model_file=model_file))
    found = check_dir(d)
    assert len(found.problems) == 1 and found.problems[0][0] == MANIFEST and says in found.problems[0][1]
    assert found.graph is None and not found.facts_read


def test_a_format_2_manifest_without_files_is_a_files_problem_and_claims_still_run(d):
    _edit(d, lambda m: m.pop("files"))
    found = check_dir(d)
    assert found.problems == [(FILES, unrecorded(found.manifest))] and found.facts_read
    assert "(format_version 2) has no `files` list" in found.problems[0][1]
    with pytest.raises(ModelDirError, match=r"has no `files` list.*export / quantize it again$"):
        check_model_dir(d)


def test_unrecorded_lines_by_format_version():
    shape = ModelShape("gpt2", 2, 4, 8, 100, 64)
    assert unrecorded(Manifest(shape, format_version=1)).startswith(
        f"{MANIFEST_NAME} records no file sizes or hashes (an older gptedge wrote it)")
    assert unrecorded(Manifest(shape, format_version=2)).startswith(
        f"its {MANIFEST_NAME} (format_version 2) has no `files` list")
    assert "(format_version 3)" in unrecorded(Manifest(shape, format_version=3))


def test_a_changed_size_is_reported_before_hashes_are_read(d):
    with open(d / "tokenizer.json", "ab") as f:
        f.write(b" ")
    found = check_dir(d)
    assert [c for c, _ in found.problems] == [FILES] and "tokenizer.json" in found.problems[0][1]
    assert "SHA-256" not in found.problems[0][1]  # sizes first: no hash read for a file of the wrong size


def test_a_flipped_byte_is_a_hash_problem(d):
    raw = bytearray((d / "model.onnx").read_bytes())
    raw[-5000] ^= 0x40
    (d / "model.onnx").write_bytes(bytes(raw))
    found = check_dir(d)
    assert found.problems[0][0] == FILES and found.problems[0][1].startswith("model.onnx: its SHA-256 is ")


def test_a_claim_the_graph_contradicts_is_a_claims_problem_and_check_model_dir_raises_the_first(d):
    _edit(d, lambda m: m["shape"].update(n_head=2 * m["shape"]["n_head"]))
    _edit(d, lambda m: m.update(eos_id=m["shape"]["vocab_size"] + 5))
    found = check_dir(d)
    assert found.problems and all(c == CLAIMS for c, _ in found.problems) and found.facts_read
    n = len(found.problems)
    with pytest.raises(ModelDirError) as caught:
        check_model_dir(d)
    more = f" (and {n - 1} more: gptedge verify {d} lists them)" if n > 1 else ""
    assert str(caught.value) == f"{d}: {found.problems[0][1].removeprefix(f'{d}: ')}{more}"


def test_the_check_names_verify_prints():
    assert (MANIFEST, FILES, CLAIMS) == ("manifest", "files", "claims")


def test_raise_first_names_how_many_more():
    raise_first(Path("m"), [])  # nothing: no error
    with pytest.raises(ModelDirError, match=r"^m: one$"):
        raise_first(Path("m"), ["one"])
    with pytest.raises(ModelDirError, match=r"^m: one \(and 1 more: gptedge verify m lists them\)$"):
        raise_first(Path("m"), ["one", "two"])
    with pytest.raises(ModelDirError, match=r"^m: one \(and 2 more: gptedge verify m lists them\)$"):
        raise_first(Path("m"), ["one", "two", "three"])
