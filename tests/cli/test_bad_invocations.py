"""Bad invocations through the real `gptedge` command in a subprocess (docs/design.md#failures-and-bad-input, issue #11).

Each row runs in its own folder holding copies of what it reads (the source checkpoint, the input
model, a text), and asserts: the exit code (2: the command line is wrong, 1: the work failed),
exactly one `Error:` line on stderr saying what it should, no traceback, and that folder (the
source, the input model and OUT's parent) byte for byte as it was.

Root ignores file modes, so when the tests run as root the rows about read-only folders run the
command without the capabilities that let root do so (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from .conftest import EXCERPT, tiny_reference, write_checkpoint

AS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0
GPTEDGE = Path(sys.executable).with_name("gptedge")
COMMAND = [str(GPTEDGE)] if GPTEDGE.exists() else [sys.executable, "-m", "gptedge.cli"]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, gpt2_checkpoint, gpt2_model_dir) -> dict[str, Path]:
    """What rows copy from: the checkpoint, the fp32 model, an int8 one, a model over another vocabulary."""
    from gptedge.export.exporter import export_model
    from gptedge.quantize.quantizer import QuantizeRecipe, quantize_model_dir

    base = tmp_path_factory.mktemp("bad-inputs")
    quantize_model_dir(gpt2_model_dir, base / "int8", QuantizeRecipe("dynamic"))
    # its own eos inside its vocabulary: load refuses a manifest whose eos no token can reach
    export_model(tiny_reference("gpt2", vocab_size=1000, bos_token_id=999, eos_token_id=999), base / "v1000",
                 validate=False)
    text = base / "text.txt"
    text.write_text(EXCERPT.read_text(encoding="utf-8")[:1500], encoding="utf-8")
    return {"ck": gpt2_checkpoint, "m": gpt2_model_dir, "q": base / "int8", "v": base / "v1000", "text.txt": text}


@pytest.fixture
def work(inputs):
    folder = Path(tempfile.mkdtemp(prefix="gptedge-bad-"))
    yield folder
    for p in [folder, *folder.rglob("*")]:  # read-only folders must be writable again to be removed
        if p.is_dir() and not p.is_symlink():
            p.chmod(0o755)
    shutil.rmtree(folder)


def place(work: Path, inputs: dict[str, Path], *names: str) -> None:
    for name in names:
        src = inputs[name]
        shutil.copytree(src, work / name) if src.is_dir() else shutil.copyfile(src, work / name)


def snapshot(folder: Path) -> dict[str, str]:
    """Every path under `folder` with its bytes' sha256 (folders: 'dir')."""
    out = {}
    for p in sorted(folder.rglob("*")):
        rel = str(p.relative_to(folder))
        out[rel] = "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def _modes_bind_root() -> None:
    """In the child, before exec: drop root's power to ignore file modes from the bounding set."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (1, 2):  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH
        if libc.prctl(24, cap, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


HOME = Path(tempfile.mkdtemp(prefix="gptedge-bad-home-"))  # ONNX Runtime keeps a cache under $HOME


def run_cli(args: list[str], cwd: Path, env: dict | None = None, modes_bind: bool = False, **kw):
    full_env = {k: v for k, v in os.environ.items() if k != "GPTEDGE_DEBUG"}
    full_env.update({"HOME": str(HOME), "GPTEDGE_CACHE": str(cwd / "cache"), **(env or {})})
    return subprocess.run([*COMMAND, *args], cwd=cwd, env=full_env, capture_output=True, text=True, timeout=300,
                          preexec_fn=_modes_bind_root if modes_bind and AS_ROOT else None, **kw)


def error_line(result) -> str:
    """The one `Error:` line on stderr; nothing looks like a traceback."""
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, result.stderr
    assert "Traceback" not in result.stderr + result.stdout, result.stderr
    return errors[0]


def read_only(path: Path) -> Callable[[Path], None]:
    def make(work: Path) -> None:
        (work / path).mkdir(parents=True, exist_ok=True)
        (work / path).chmod(0o555)
    return make


def _edit_manifest(path: Path, **shape) -> None:
    data = json.loads(path.read_text())
    data["shape"].update(shape)
    if "n_layer" in shape:
        data["inputs"] = data["outputs"] = []
    path.write_text(json.dumps(data))


def _drop_records(path: Path) -> None:
    """As a manifest an older gptedge wrote: format 1, no file sizes or hashes (a format-2 manifest without them is
    refused at load: test_dir_pipeline.py)."""
    data = json.loads(path.read_text())
    data.pop("files", None)
    data["parity"].pop("fingerprint", None)
    data["format_version"] = 1
    path.write_text(json.dumps(data))


def _bad_checkpoint(work: Path, breakage: str) -> None:
    ck = work / "ck"
    if breakage == "no_config":
        (ck / "config.json").unlink()
    elif breakage == "bad_json":
        (ck / "config.json").write_text("{")
    elif breakage == "model_type":
        (ck / "config.json").write_text(json.dumps({**json.loads((ck / "config.json").read_text()),
                                                    "model_type": "mamba"}))
    elif breakage == "no_weights":
        (ck / "model.safetensors").unlink()
    else:
        (ck / "model.safetensors").write_bytes(b"\x00" * 64)


@dataclass
class Row:
    id: str
    args: list[str]
    code: int
    says: str
    uses: tuple[str, ...] = ()  # copied into the row's folder from `inputs`
    setup: Callable[[Path], None] | None = None  # then this breaks / prepares something
    cwd: str = "."
    env: dict[str, str] = field(default_factory=dict)
    modes: bool = False  # about file modes: as root, run without the capabilities that ignore them
    skip: Callable[[], str | None] | None = None


def _cuda_present() -> str | None:
    from gptedge.runtime.graphs.session import CUDA_PROVIDER, available_providers

    return "this machine has the CUDA provider" if CUDA_PROVIDER in available_providers() else None


def _rm(rel: str) -> Callable[[Path], None]:
    return lambda work: (work / rel).unlink()


ROWS = [
    # --- issue #11 -------------------------------------------------------------------------------------------
    Row("1-export-onto-its-source", ["export", "ck", "-o", "ck", "--force"], 2, "ck is the input ck", ("ck",)),
    Row("2-export-onto-the-folder-holding-it", ["export", "proj/ckpt", "-o", "proj", "--force"], 2,
        "proj holds the input proj/ckpt", ("ck",), lambda w: shutil.copytree(w / "ck", w / "proj" / "ckpt")),
    Row("3-quantize-onto-its-input", ["quantize", "m", "-o", "m", "--force", "--method", "dynamic"], 2,
        "m is the input m", ("m",)),
    Row("4-prompt-not-utf8", ["generate", "m", "-p", os.fsdecode(b"a\xff")], 2,
        "'--prompt': not valid UTF-8 (byte 0xff at offset 1)", ("m",)),
    Row("4-stop-not-utf8", ["generate", "m", "-p", "Hi", "--stop", os.fsdecode(b"\xc3(")], 2,
        "'--stop': not valid UTF-8 (byte 0xc3 at offset 0)", ("m",)),
    Row("5-export-under-read-only-parent", ["export", "ck", "-o", "ro/out"], 1, "ro is not writable", ("ck",),
        read_only(Path("ro")), modes=True),
    Row("5-quantize-under-read-only-parent", ["quantize", "m", "-o", "ro/sub/q", "--method", "dynamic"], 1,
        "ro is not writable", ("m",), read_only(Path("ro")), modes=True),
    Row("5-export-onto-cwd", ["export", "../ck", "-o", ".", "--force"], 2, ". is the current directory",
        ("ck", "m"), cwd="m"),
    Row("5-export-onto-parent-of-cwd", ["export", "../../ck", "-o", "..", "--force"], 2,
        ".. holds the current directory", ("ck",), lambda w: (w / "proj" / "sub").mkdir(parents=True),
        cwd="proj/sub"),
    Row("5-force-onto-a-folder-gptedge-did-not-write", ["export", "ck", "-o", "mine", "--force"], 2,
        "mine is not empty and gptedge did not write it", ("ck",),
        lambda w: (w / "mine").mkdir() or (w / "mine" / "notes.txt").write_text("keep")),
    Row("5-markdown-into-read-only-dir", ["compare", "m", "--text", "text.txt", "--markdown", "ro/t.md"], 1,
        "ro is not writable", ("m", "text.txt"), read_only(Path("ro")), modes=True),
    Row("5-plot-into-read-only-dir", ["compare", "m", "--text", "text.txt", "--plot", "ro/c.png"], 1,
        "ro is not writable", ("m", "text.txt"), read_only(Path("ro")), modes=True),
    Row("5-markdown-under-a-file", ["compare", "m", "--text", "text.txt", "--markdown", "text.txt/t.md"], 1,
        "text.txt is not a directory", ("m", "text.txt")),
    Row("5-markdown-onto-a-folder", ["compare", "m", "--text", "text.txt", "--markdown", "m"], 2,
        "'m' is a directory", ("m", "text.txt")),
    Row("6-read-only-cache", ["generate", "-p", "Hi"], 1, "GPTEDGE_CACHE", (), read_only(Path("cache")),
        modes=True),
    Row("7-compare-other-vocabulary", ["compare", "m", "v", "--text", "text.txt"], 2,
        "has a vocabulary of 1000 tokens, the reference m 50257", ("m", "v", "text.txt")),
    Row("11-threads-negative", ["generate", "m", "-p", "Hi", "--threads", "-3"], 2,
        "'--threads': -3 is not in the range 1<=x<=", ("m",)),
    Row("11-threads-too-many", ["generate", "m", "-p", "Hi", "--threads", "1000"], 2,
        "'--threads': 1000 is not in the range 1<=x<=", ("m",)),
    Row("13-eval-stride-0", ["eval", "m", "--text", "text.txt", "--stride", "0"], 2,
        "'--stride': 0 is not in the range x>=1", ("m", "text.txt")),
    Row("13-eval-stride-past-context", ["eval", "m", "--text", "text.txt", "--stride", "129"], 2,
        "stride must be in 1..128, got 129", ("m", "text.txt")),
    Row("13-compare-max-tokens-0", ["compare", "m", "--text", "text.txt", "--max-tokens", "0"], 2,
        "'--max-tokens': 0 is not in the range x>=2", ("m", "text.txt")),
    Row("13-compare-prompts-0", ["compare", "m", "--text", "text.txt", "--prompts", "0"], 2,
        "'--prompts': 0 is not in the range x>=1", ("m", "text.txt")),
    Row("13-bench-context-0", ["bench", "m", "--context", "0"], 2, "'--context': 0 is not in the range x>=2", ("m",)),
    Row("13-bench-context-too-small", ["bench", "m", "--context", "100", "--new", "128"], 2,
        "prompt -28 + new 128 tokens do not fit the context of 128", ("m",)),
    Row("14-int8-without-manifest", ["info", "q"], 1, "no gptedge.json, yet gptedge wrote this graph", ("q",),
        _rm("q/gptedge.json")),
    # --- closed sets and required pairs ---------------------------------------------------------------------
    Row("quantize-unknown-method", ["quantize", "m", "-o", "x", "--method", "fp4"], 2, "'fp4' is not one of", ("m",)),
    Row("quantize-static-without-calibration", ["quantize", "m", "-o", "x", "--method", "static"], 2,
        "--method static needs --calibration", ("m",)),
    Row("bench-unknown-peer", ["bench", "m", "--peers", "torch,jax"], 2, "unknown 'jax': choose from", ("m",)),
    Row("compare-unknown-peer", ["compare", "m", "--text", "text.txt", "--peers", "ctranslate2,jax"], 2,
        "unknown 'jax': choose from ctranslate2, llama.cpp, optimum", ("m", "text.txt")),
    Row("compare-peers-source-not-a-checkpoint", ["compare", "m", "--text", "text.txt", "--peers", "ctranslate2",
                                                  "--source", "empty"], 2,
        "empty has no config.json: not a Hugging Face checkpoint dir", ("m", "text.txt"),
        lambda w: (w / "empty").mkdir()),
    Row("compare-peers-no-checkpoint-recorded", ["compare", "v", "--text", "text.txt", "--peers", "optimum"], 1,
        "v: no HF checkpoint recorded for the peers; pass --source DIR", ("v", "text.txt")),
    Row("compare-peers-source-other-vocabulary", ["compare", "m", "--text", "text.txt", "--peers", "ctranslate2",
                                                  "--source", "ck1000"], 2,
        "ck1000 has a vocabulary of 1000 tokens, the reference m 50257: the peers must quantize the reference's own",
        ("m", "text.txt"), lambda w: write_checkpoint(tiny_reference("gpt2", vocab_size=1000), w / "ck1000")),
    Row("export-unknown-graph", ["export", "ck", "-o", "x", "--graph", "paged"], 2, "'paged' is not one of", ("ck",)),
    Row("unknown-option", ["generate", "m", "-p", "Hi", "--temp", "0.5"], 2, "No such option '--temp'", ("m",)),
    # --- the bad-input rows test_cli.py had (docs/design.md#failures-and-bad-input) ------------------------------------------------------
    Row("missing-model-dir", ["generate", "nope", "-p", "x"], 1, "no such model directory"),
    Row("dir-without-manifest-or-config", ["info", "."], 1, "no gptedge.json and no config.json"),
    Row("corrupt-manifest", ["info", "m"], 1, "corrupt manifest", ("m",),
        lambda w: (w / "m" / "gptedge.json").write_text("{ not json")),
    Row("corrupt-graph", ["info", "m"], 1, "model.onnx is 700 bytes, gptedge.json records", ("m",),
        lambda w: (w / "m" / "model.onnx").write_bytes(b"garbage" * 100)),
    Row("corrupt-graph-old-manifest", ["info", "m"], 1, "ONNX Runtime cannot load it", ("m",),  # no sizes recorded
        lambda w: ((w / "m" / "model.onnx").write_bytes(b"garbage" * 100), _drop_records(w / "m" / "gptedge.json"))),
    Row("missing-graph", ["info", "m"], 1, "no model.onnx", ("m",), _rm("m/model.onnx")),
    *[Row(f"manifest-graph-mismatch-{k}", ["info", "m"], 1, says, ("m",),
          lambda w, k=k, v=v: _edit_manifest(w / "m" / "gptedge.json", **{k: v}))
      for k, v, says in [
          ("n_layer", 3, "gptedge.json says n_layer 3, config.json says n_layer 2"),
          ("n_head", 2, "gptedge.json says n_head 2, config.json says n_head 4"),
          ("head_dim", 16, "gptedge.json says n_embd 64, config.json says n_embd 32"),
          ("vocab_size", 50000, "gptedge.json says vocab_size 50000, config.json says vocab_size 50257"),
          ("context_length", 1024, "gptedge.json says context_length 1024, the graph's position table holds 128")]],
    # without config.json the graph itself is what disagrees
    *[Row(f"manifest-graph-mismatch-{k}-no-config", ["info", "m"], 1, says, ("m",),
          lambda w, k=k, v=v: (_edit_manifest(w / "m" / "gptedge.json", **{k: v}), _rm("m/config.json")(w),
                               _rm("m/generation_config.json")(w)))
      for k, v, says in [
          ("n_layer", 3, "says n_layer 3, the graph has 2 layers"),
          ("n_head", 2, "says n_head 2, the graph has 4"),
          ("head_dim", 16, "says head_dim 16, the graph has 8")]],
    Row("manifest-names-graph-mismatch", ["info", "m"], 1, "graph does not match gptedge.json", ("m",),
        lambda w: (w / "m" / "gptedge.json").write_text(json.dumps(
            {**(d := json.loads((w / "m" / "gptedge.json").read_text())),
             "inputs": d["inputs"] + ["past_key_values.2.key"]}))),
    Row("missing-tokenizer", ["generate", "m", "-p", "Hi"], 1, "tokenizer.json is missing (gptedge.json records", ("m",),
        _rm("m/tokenizer.json")),
    Row("missing-tokenizer-old-manifest", ["generate", "m", "-p", "Hi"], 1, "no tokenizer.json", ("m",),
        lambda w: (_rm("m/tokenizer.json")(w), _drop_records(w / "m" / "gptedge.json"))),
    Row("unknown-device", ["generate", "m", "-p", "x", "--device", "tpu"], 2, "'tpu' is not one of", ("m",)),
    Row("missing-cuda-provider", ["generate", "m", "-p", "x", "--device", "cuda"], 1,
        "needs the CUDA execution provider", ("m",), skip=_cuda_present),
    Row("prompt-longer-than-context", ["generate", "m", "-p", "word " * 200], 2, "context holds 128", ("m",)),
    *[Row(f"bad-sampling{args[0]}", ["generate", "m", "-p", "Hi", *args], 2, says, ("m",)) for args, says in [
        (["--top-p", "0"], "top_p must be in (0, 1], got 0.0"),
        (["--temperature", "-1"], "temperature must be a finite number >= 0"),
        (["--top-k", "-1"], "'--top-k': -1 is not in the range x>=0"),
        (["--repetition-penalty", "0"], "repetition_penalty must be a number > 0"),
        (["-n", "0"], "'--max-new-tokens': 0 is not in the range x>=1")]],
    Row("export-existing-output", ["export", "ck", "-o", "out"], 2, "out exists; pass --force", ("ck",),
        lambda w: (w / "out").mkdir() or (w / "out" / "precious.txt").write_text("keep me")),
    *[Row(f"export-bad-checkpoint-{b}", ["export", "ck", "-o", "out"], 1, says, ("ck",),
          lambda w, b=b: _bad_checkpoint(w, b))
      for b, says in [("no_config", "no config.json"), ("bad_json", "not valid JSON"),
                      ("model_type", "model_type 'mamba'"), ("no_weights", "no model.safetensors or pytorch_model.bin"),
                      ("corrupt_weights", "cannot read weights")]],
    Row("compare-text-not-utf8", ["compare", "m", "--text", "bad.txt"], 1, "bad.txt: not UTF-8 text", ("m",),
        lambda w: (w / "bad.txt").write_bytes(b"\xff\xfe\x00bad")),
    Row("text-missing", ["eval", "m", "--text", "none.txt"], 1, "none.txt: No such file or directory", ("m",)),
]


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_bad_invocation(row: Row, inputs, work):
    if row.skip and (why := row.skip()):
        pytest.skip(why)
    place(work, inputs, *row.uses)
    if row.setup:
        row.setup(work)
    before = snapshot(work)
    result = run_cli(row.args, work / row.cwd, row.env, row.modes)
    assert result.returncode == row.code, (result.returncode, result.stderr)
    line = error_line(result)
    assert row.says in line, line
    assert snapshot(work) == before


def test_debug_shows_the_traceback(inputs, work):
    place(work, inputs, "m")
    (work / "m" / "model.onnx").write_bytes(b"garbage")
    for args, env in ((["--debug", "info", "m"], {}), (["info", "m"], {"GPTEDGE_DEBUG": "1"})):
        result = run_cli(args, work, env)
        assert result.returncode == 1 and "Traceback" in result.stderr
        assert result.stderr.strip().splitlines()[-1].startswith("Error: ")


def _start_export(work: Path, out: str) -> tuple[subprocess.Popen, Path]:
    """An export running in the background, once its partial dir exists and is marked (it then builds and
    validates)."""
    env = {**os.environ, "HOME": str(HOME)}
    proc = subprocess.Popen([*COMMAND, "export", "ck", "-o", out], cwd=work, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        partial = next(work.glob(f".{out}.partial-*"), None)
        if partial is not None and (partial / ".gptedge-partial").is_file():
            return proc, partial
        time.sleep(0.01)
    proc.kill()
    pytest.fail(f"no partial dir appeared: {proc.communicate(timeout=60)}")


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_interrupted_export_leaves_nothing(inputs, work, sig, code):
    place(work, inputs, "ck")
    before = snapshot(work)
    proc, _ = _start_export(work, "out")
    proc.send_signal(sig)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == code, stderr
    errors = [line for line in stderr.splitlines() if line.startswith("Error:")]
    assert errors == [f"Error: {'terminated (SIGTERM)' if sig == signal.SIGTERM else 'interrupted'}; "
                      "partial output removed"] and "Traceback" not in stderr
    assert snapshot(work) == before


def test_killed_export_is_swept_by_the_next_run(inputs, work):
    place(work, inputs, "ck", "m")
    proc, partial = _start_export(work, "out")
    proc.kill()
    proc.communicate(timeout=60)
    assert partial.is_dir() and json.loads((partial / ".gptedge-partial").read_text())["pid"] == proc.pid
    result = run_cli(["quantize", "m", "-o", "out", "--method", "dynamic"], work)  # the next run writing `out`
    assert result.returncode == 0, result.stderr
    assert not partial.exists() and not list(work.glob(".out.*"))
    assert not (work / "out" / ".gptedge-partial").exists()


# --- gptedge.atomic directly ----------------------------------------------------------------------------------


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


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
