"""Output directories: each --force guard given the output it must refuse, and the sweep of partial
dirs given each kind of owner marker, another machine's included. The README: "--force replaces OUT only if
gptedge wrote it ... or it is empty ... never the input, a folder holding it, or the current directory or a
parent of it"; a partial dir "left by a killed run is removed by the next run that writes OUT"."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from gptedge.runtime.modeldir.manifest import Manifest, ModelShape
from gptedge.atomic import (MARKER, atomic_output_dir, atomic_output_file, check_output, check_output_file,
                            scratch_dir, sweep_stale, writable_dir_for)
from gptedge.runtime.errors import OutputExistsError, OutputNotWritableError

# What gptedge writes as gptedge.json (a parseable manifest): `--force` replaces only a dir holding one.
OURS = json.dumps(Manifest(ModelShape("gpt2", 1, 1, 1, 2, 2), inputs=("input_ids",)).to_dict())


def dead_pid() -> int:
    """The pid of a process that has ended."""
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def partial(parent: Path, name: str, owner) -> Path:
    """A leftover dir with a marker holding `owner` (a dict, or raw text), and a file in it. Names end in 8 characters
    of [a-z0-9_], as tempfile.mkdtemp makes them: sweeping matches exactly that, never a pattern."""
    d = parent / name
    d.mkdir()
    (d / "model.onnx").write_text("half")
    if owner is not None:
        (d / MARKER).write_text(owner if isinstance(owner, str) else json.dumps(owner))
    return d


def test_only_partials_of_a_dead_process_on_this_machine_are_swept(tmp_path):
    here, gone = socket.gethostname(), dead_pid()
    out = tmp_path / "out"
    dead = partial(tmp_path, ".out.partial-dead0000", {"pid": gone, "host": here})
    kept = [
        partial(tmp_path, ".out.partial-elsewher", {"pid": gone, "host": here + "-another-machine"}),
        partial(tmp_path, ".out.partial-live0000", {"pid": os.getpid(), "host": here}),
        partial(tmp_path, ".out.partial-unmarked", None),
        partial(tmp_path, ".out.partial-emptymrk", ""),
        partial(tmp_path, ".out.partial-nohost00", {"pid": gone}),
        partial(tmp_path, ".out.partial-badpid00", {"pid": "x", "host": here}),
        partial(tmp_path, ".out.partial-list0000", "[1]"),
        partial(tmp_path, ".other.partial-dead0000", {"pid": gone, "host": here}),  # another OUT's
        partial(tmp_path, "out.partial-dead0000", {"pid": gone, "host": here}),  # not hidden: not gptedge's name
    ]
    assert sweep_stale(out) == [dead]
    assert not dead.exists() and all((k / "model.onnx").is_file() for k in kept)
    assert sweep_stale(out) == []
    assert sweep_stale(tmp_path / "no" / "such" / "out") == []


def test_an_interrupted_replacement_is_put_back_and_a_finished_one_cleared(tmp_path):
    here, gone = socket.gethostname(), dead_pid()
    out = tmp_path / "out"
    old = partial(tmp_path, ".out.old-old_0001", {"pid": gone, "host": here})
    (old / "out").mkdir()
    (old / "out" / "gptedge.json").write_text(OURS)
    assert sweep_stale(out) == [old]
    assert (out / "gptedge.json").is_file() and not old.exists()  # OUT was missing: the old one is restored
    old = partial(tmp_path, ".out.old-old_0002", {"pid": gone, "host": here})
    (old / "out").mkdir()
    (old / "out" / "stale.txt").write_text("old")
    assert sweep_stale(out) == [old]
    assert not (out / "stale.txt").exists() and (out / "gptedge.json").is_file()  # OUT exists: it stays
    other = partial(tmp_path, ".out.old-old_0003", {"pid": gone, "host": "elsewhere"})
    (other / "out").mkdir()
    assert sweep_stale(out) == [] and other.exists()


@pytest.fixture()
def places(tmp_path, monkeypatch):
    """work/ (the cwd) holding src/ (an input); a gptedge dir, an empty dir, a foreign dir and a file beside."""
    work = tmp_path / "work"
    (work / "src").mkdir(parents=True)
    (work / "src" / "config.json").write_text(OURS)
    (tmp_path / "ours").mkdir()
    (tmp_path / "ours" / "gptedge.json").write_text(OURS)
    (tmp_path / "empty").mkdir()
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    (tmp_path / "file").write_text("x")
    (tmp_path / "src2").mkdir()  # a name the input's starts with: not the input
    (tmp_path / "src2" / "gptedge.json").write_text(OURS)
    monkeypatch.chdir(work)
    return tmp_path


@pytest.mark.parametrize("out, says", [
    ("ours", "exists; pass --force"), ("file", "exists and is not a directory"),
    ("work/src", "is the input"), ("work", "holds the input"), (".", "holds the input"),
    ("mine", "is not empty and gptedge did not write it"),
])
def test_force_guards_refuse(places, out, says):
    inputs = [places / "work" / "src"]
    force = says != "exists; pass --force"
    with pytest.raises(OutputExistsError, match=says) as e:
        check_output(places / out, force, inputs)
    assert str(e.value).startswith(f"{places / out} ")  # the message names OUT first


def test_force_guards_keep_the_current_directory_and_its_parents(places, monkeypatch):
    monkeypatch.chdir(places / "ours")
    with pytest.raises(OutputExistsError) as e:
        check_output(places / "ours", True)
    assert str(e.value) == f"{places / 'ours'} is the current directory; refusing to replace it"
    (places / "ours" / "sub").mkdir()
    monkeypatch.chdir(places / "ours" / "sub")
    with pytest.raises(OutputExistsError) as e:
        check_output(places / "ours", True)
    assert str(e.value) == f"{places / 'ours'} holds the current directory; refusing to replace it"


def test_force_replaces_what_it_may(places):
    inputs = [places / "work" / "src"]
    for out in ("ours", "empty", "src2", "new", "new/deeper/out"):
        check_output(places / out, True, inputs)
    check_output(places / "new", False, inputs)


def test_an_output_under_a_file_is_not_writable(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(OutputNotWritableError) as e:
        check_output(tmp_path / "f" / "out", False)
    assert str(e.value) == f"cannot write {tmp_path / 'f' / 'out'}: {tmp_path / 'f'} is not a directory"
    assert writable_dir_for(tmp_path / "a" / "b" / "c") == tmp_path
    with pytest.raises(OutputExistsError) as e:
        check_output_file(tmp_path)
    assert str(e.value) == f"{tmp_path} is a directory; name a file"
    with pytest.raises(OutputNotWritableError):
        check_output_file(tmp_path / "f" / "table.md")


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_a_new_output_appears_whole_unmarked_and_with_ordinary_modes(tmp_path):
    out = tmp_path / "a" / "b" / "out"
    with atomic_output_dir(out) as tmp:
        assert tmp.parent == out.parent and tmp.name.startswith(".out.partial-") and not out.exists()
        owner = json.loads((tmp / MARKER).read_text())
        assert owner == {"pid": os.getpid(), "host": socket.gethostname()}
        (tmp / "gptedge.json").write_text(OURS)
    assert sorted(p.name for p in out.iterdir()) == ["gptedge.json"]
    assert stat.S_IMODE(out.stat().st_mode) == 0o777 & ~_umask()
    assert [p.name for p in out.parent.iterdir()] == ["out"]


def test_a_failed_output_leaves_nothing_and_keeps_what_was_there(tmp_path):
    (tmp_path / "keep").mkdir()
    with pytest.raises(RuntimeError):
        with atomic_output_dir(tmp_path / "keep" / "x" / "y" / "out") as tmp:
            (tmp / "gptedge.json").write_text(OURS)
            raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == [tmp_path / "keep"] and not any((tmp_path / "keep").iterdir())
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "gptedge.json").write_text(OURS)
    with pytest.raises(RuntimeError):
        with atomic_output_dir(tmp_path / "old", force=True) as tmp:
            raise RuntimeError("boom")
    assert (tmp_path / "old" / "gptedge.json").read_text() == OURS
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep", "old"]


def test_force_replaces_an_existing_output_once_the_new_one_is_complete(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "gptedge.json").write_text(OURS)
    (out / "extra.bin").write_text("old")
    with atomic_output_dir(out, force=True) as tmp:
        assert (out / "gptedge.json").read_text() == OURS  # untouched while the new one is built
        (tmp / "gptedge.json").write_text("new")
    assert sorted(p.name for p in out.iterdir()) == ["gptedge.json"] and (out / "gptedge.json").read_text() == "new"
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # no .out.old-* or partial left


def test_an_output_that_appears_while_working_is_not_replaced(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(OutputExistsError, match="exists; pass --force"):
        with atomic_output_dir(out) as tmp:
            (tmp / "gptedge.json").write_text(OURS)
            out.mkdir()
            (out / "theirs.txt").write_text("theirs")
    assert [p.name for p in out.iterdir()] == ["theirs.txt"]
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_writing_an_output_sweeps_its_stale_partials(tmp_path):
    stale = partial(tmp_path, ".out.partial-oldleft0", {"pid": dead_pid(), "host": socket.gethostname()})
    elsewhere = partial(tmp_path, ".out.partial-elsewher", {"pid": dead_pid(), "host": "another-machine"})
    with atomic_output_dir(tmp_path / "out") as tmp:
        (tmp / "gptedge.json").write_text(OURS)
    assert not stale.exists() and elsewhere.exists()


def test_a_file_output_is_replaced_whole_or_not_at_all(tmp_path):
    path = tmp_path / "d" / "table.md"
    with atomic_output_file(path) as tmp:
        assert tmp.parent == path.parent and tmp.suffix == ".md" and tmp.name.startswith(".table.partial-")
        tmp.write_text("one")
    assert path.read_text() == "one" and stat.S_IMODE(path.stat().st_mode) == 0o666 & ~_umask()
    with pytest.raises(RuntimeError):
        with atomic_output_file(path) as tmp:
            tmp.write_text("two")
            raise RuntimeError("boom")
    assert path.read_text() == "one" and [p.name for p in path.parent.iterdir()] == ["table.md"]


def test_a_scratch_dir_is_marked_and_always_removed(tmp_path):
    out = tmp_path / "a" / "b" / "out"
    with scratch_dir(out) as tmp:
        assert json.loads((tmp / MARKER).read_text())["pid"] == os.getpid()
        assert tmp.parent == out.parent and tmp.name.startswith(".out.partial-")
    assert not tmp.exists() and not (tmp_path / "a").exists()  # the folder made for it goes too
    (tmp_path / "b").mkdir()
    with pytest.raises(RuntimeError):
        with scratch_dir(tmp_path / "b" / "out") as tmp:
            raise RuntimeError("boom")
    assert not tmp.exists() and (tmp_path / "b").is_dir()


# --- gptedge.atomic on its own: the sweep, a failed output, --force ---------------------------------------


def test_sweep_keeps_live_and_unmarked_partials_and_restores_an_interrupted_replace(tmp_path):
    from gptedge.atomic import MARKER, sweep_stale

    out = tmp_path / "out"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait(60)
    mine = {"pid": os.getpid(), "host": os.uname().nodename}
    gone = {"pid": dead.pid, "host": os.uname().nodename}
    # names as tempfile.mkdtemp makes them: the prefix, then 8 random characters
    for name, owner in ((".out.partial-live0000", mine), (".out.partial-dead0000", gone), (".out.old-dead0000", gone)):
        (tmp_path / name).mkdir()
        (tmp_path / name / MARKER).write_text(json.dumps(owner))
    (tmp_path / ".out.partial-unmarked").mkdir()
    (tmp_path / ".out.old-dead0000" / "out").mkdir()  # killed between renaming OUT aside and the new one in
    (tmp_path / ".out.old-dead0000" / "out" / "gptedge.json").write_text("{}")
    swept = sweep_stale(out)
    assert sorted(p.name for p in swept) == [".out.old-dead0000", ".out.partial-dead0000"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [".out.partial-live0000", ".out.partial-unmarked", "out"]
    assert (out / "gptedge.json").read_text() == "{}"


def test_failed_output_removes_the_folders_made_for_it(tmp_path):
    from gptedge.atomic import atomic_output_dir

    with pytest.raises(RuntimeError), atomic_output_dir(tmp_path / "a" / "b" / "out") as tmp:
        (tmp / "model.onnx").write_bytes(b"x")
        raise RuntimeError("validation failed")
    assert list(tmp_path.iterdir()) == []


def test_force_replaces_a_gptedge_dir_or_an_empty_one(tmp_path, monkeypatch):
    from gptedge.atomic import atomic_output_dir
    from gptedge.runtime.modeldir.manifest import Manifest, ModelShape

    monkeypatch.chdir(tmp_path)
    for existing in ("empty", "model"):
        out = tmp_path / existing
        out.mkdir()
        if existing == "model":  # a manifest that parses (a file named gptedge.json alone is not enough)
            (out / "gptedge.json").write_text(json.dumps(Manifest(shape=ModelShape("gpt2", 1, 1, 1, 1, 1)).to_dict()))
        with atomic_output_dir(out, force=True) as tmp:
            (tmp / "new.txt").write_text("new")
        assert sorted(p.name for p in out.iterdir()) == ["new.txt"]
        assert stat.S_IMODE(out.stat().st_mode) == 0o777 & ~_umask()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "model"]
