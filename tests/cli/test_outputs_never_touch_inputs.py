"""No output of any command replaces or lands inside one of its inputs, through the real
`gptedge` command: exit 2, one `Error:` line, before any work, and the row's folder byte for byte as it was.
`--force` replaces only a dir whose gptedge.json parses as a gptedge manifest; stale dirs are swept by their
exact names, never by a glob built from OUT's name."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ..support.cli import error_line, run_cli
from ..support.invocations import Row, place, snapshot

pytestmark = pytest.mark.slow  # each row runs the real command in a subprocess


def _calibration_inside_out(w: Path) -> None:
    (w / "out").mkdir()
    (w / "out" / "calib.txt").write_text((w / "text.txt").read_text())


def _copy_manifest_into(name: str):
    def make(w: Path) -> None:
        (w / name).mkdir()
        (w / name / "gptedge.json").write_text((w / "m" / "gptedge.json").read_text())
    return make


ROWS = [
    # the five ways data was lost
    Row("markdown-onto-the-reference-graph", ["compare", "m", "--text", "text.txt", "--markdown", "m/model.onnx"], 2,
        "m/model.onnx lies inside the input m", ("m", "text.txt")),
    Row("markdown-onto-the-text", ["compare", "m", "--text", "text.txt", "--markdown", "text.txt"], 2,
        "text.txt is the input text.txt", ("m", "text.txt")),
    Row("calibration-inside-the-replaced-out", ["quantize", "m", "-o", "out", "--method", "static", "--calibration",
                                                "out/calib.txt", "--force"], 2,
        "out holds the input out/calib.txt", ("m", "text.txt"), _calibration_inside_out),
    Row("force-onto-a-dir-whose-manifest-is-{}", ["export", "ck", "-o", "mine", "--force"], 2,
        "mine/gptedge.json is not a gptedge manifest, so gptedge did not write mine", ("ck",),
        lambda w: (w / "mine").mkdir() or (w / "mine" / "gptedge.json").write_text("{}")
        or (w / "mine" / "thesis.tex").write_text("keep")),
    # kin: every output option, every way of landing inside an input
    Row("markdown-into-another-model", ["compare", "m", "q", "--text", "text.txt", "--markdown", "q/table.md"], 2,
        "q/table.md lies inside the input q", ("m", "q", "text.txt")),
    Row("plot-into-the-reference", ["compare", "m", "--text", "text.txt", "--plot", "m/chart.png"], 2,
        "m/chart.png lies inside the input m", ("m", "text.txt")),
    Row("markdown-through-a-symlink-to-the-text", ["compare", "m", "--text", "text.txt", "--markdown", "link.md"], 2,
        "link.md is the input text.txt", ("m", "text.txt"), lambda w: (w / "link.md").symlink_to(w / "text.txt")),
    Row("markdown-and-plot-the-same-file", ["compare", "m", "--text", "text.txt", "--markdown", "t.md", "--plot",
                                            "t.md"], 2, "--markdown and --plot name the same file", ("m", "text.txt")),
    Row("export-into-its-source", ["export", "ck", "-o", "ck/onnx"], 2, "ck/onnx lies inside the input ck", ("ck",)),
    Row("quantize-into-its-input", ["quantize", "m", "-o", "m/int8", "--method", "dynamic"], 2,
        "m/int8 lies inside the input m", ("m",)),
    Row("quantize-onto-its-calibration-text", ["quantize", "m", "-o", "text.txt", "--method", "static",
                                               "--calibration", "text.txt"], 2, "text.txt is the input text.txt",
        ("m", "text.txt")),
    Row("force-onto-a-dir-whose-manifest-is-not-json", ["quantize", "m", "-o", "mine", "--method", "dynamic",
                                                        "--force"], 2, "is not a gptedge manifest", ("m",),
        lambda w: (w / "mine").mkdir() or (w / "mine" / "gptedge.json").write_text("my notes")),
    Row("force-onto-a-dir-whose-manifest-is-another-format", ["quantize", "m", "-o", "mine", "--method", "dynamic",
                                                              "--force"], 2, "is not a gptedge manifest", ("m",),
        lambda w: (w / "mine").mkdir() or (w / "mine" / "gptedge.json").write_text(
            json.dumps({"format_version": 99, "shape": {}}))),
]


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_output_never_touches_an_input(row: Row, inputs, work):
    place(work, inputs, *row.uses)
    if row.setup:
        row.setup(work)
    before = snapshot(work)
    result = run_cli(row.args, work / row.cwd, row.env)
    assert result.returncode == row.code, (result.returncode, result.stderr)
    assert row.says in error_line(result)
    assert snapshot(work) == before


def test_force_still_replaces_what_gptedge_wrote(inputs, work):
    """The guard is not a refusal of every --force: a dir holding a real manifest is replaced."""
    place(work, inputs, "m")
    _copy_manifest_into("old")(work)
    (work / "old" / "stale.txt").write_text("from the old run")
    result = run_cli(["quantize", "m", "-o", "old", "--method", "dynamic", "--force"], work)
    assert result.returncode == 0, result.stderr
    assert not (work / "old" / "stale.txt").exists() and (work / "old" / "model.onnx").is_file()


def test_sweep_matches_exact_names_not_a_glob_of_out(tmp_path):
    """OUT named `a*` (or `a[b]`): a dead run's leftovers of another output `ab` are not OUT's to sweep
    (`.a*.old-*` would match `.ab.old-*`, and the restore step would move its contents to OUT)."""
    from gptedge.atomic import MARKER, sweep_stale

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    gone = json.dumps({"pid": dead.pid, "host": os.uname().nodename})
    for name in (".ab.old-k2j4h6g8", ".ab.partial-x1y2z3w4", ".ac.old-abcdefgh"):
        (tmp_path / name).mkdir()
        (tmp_path / name / MARKER).write_text(gone)
    (tmp_path / ".ab.old-k2j4h6g8" / "ab").mkdir()  # another output's interrupted replacement
    (tmp_path / ".ab.old-k2j4h6g8" / "ab" / "gptedge.json").write_text("{}")
    for out in ("a*", "a?", "a[bc]"):
        assert sweep_stale(tmp_path / out) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == [".ab.old-k2j4h6g8", ".ab.partial-x1y2z3w4",
                                                          ".ac.old-abcdefgh"]
    (tmp_path / ".a*.partial-q1w2e3r4").mkdir()  # OUT's own leftover is still swept
    (tmp_path / ".a*.partial-q1w2e3r4" / MARKER).write_text(gone)
    assert [p.name for p in sweep_stale(tmp_path / "a*")] == [".a*.partial-q1w2e3r4"]
    assert sweep_stale(tmp_path / "ab") and not (tmp_path / ".ab.partial-x1y2z3w4").exists()
