"""Mutation testing of gptedge's core modules: each module against the tests paired with it in pyproject.toml
([tool.gptedge.mutation.modules]), one module at a time, and the score per module.

    .venv/bin/python benchmarks/mutation.py [--module runtime/generation/sampling.py ...] [--json OUT.json]
        [--survivors-of EARLIER.json] [--sample N] [--max-mutants N] [--list]

Mutants are mutmut's (2.5.x): its operators, and its mutant ids (a source line and an index within it). They run
here rather than through `mutmut run` for speed and safety: the tree (git's tracked and unignored files) is
copied to a temporary folder and mutated there, never in the worktree; the heavy third-party packages (numpy,
onnxruntime, torch, transformers, ...) are imported once, and each mutant's tests run in a forked child that
imports gptedge afresh from the copy (a session of its own, so a hung server or child process dies with it).
The tiny seeded test models are exported once per run into a cache (GPTEDGE_TEST_CACHE, tests/support/checkpoints.py) by
the unmutated baseline run, so a mutant costs its tests, not an export.

A mutant is killed when its tests fail (or exceed the time limit: the baseline's time x 4 + 30 s), survives when
they pass. Survivors listed in benchmarks/mutation_equivalent.toml (the mutated line and why no input can tell
it from the original) are `equivalent` and left out of the score: killed / (mutants - equivalent).
`--survivors-of` re-runs only the mutants that survived in an earlier run's JSON (same module, line and
mutation) and carries the others over as killed: valid when the code is unchanged and tests were only added.

Not in CI (a full run takes an hour or more on 2 busy cores). Run it under `nice -n 10` on a shared machine.
"""

from __future__ import annotations

import argparse
import datetime
import difflib
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EQUIVALENTS = ROOT / "benchmarks" / "mutation_equivalent.toml"
# setuptools' package-dir mapping (pyproject): in the copy, gptedge.runtime etc. are reached through links.
SUBPACKAGES = {"export": "export", "runtime": "runtime", "quantize": "quantize"}
PRELOAD = ("numpy", "onnxruntime", "tokenizers", "click", "pytest", "hypothesis", "torch", "onnx", "safetensors",
           "transformers", "starlette", "httpx", "uvicorn", "openai", "ray.serve")


def load_config() -> dict[str, list[str]]:
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return cfg["tool"]["gptedge"]["mutation"]["modules"]


def load_equivalents() -> dict[tuple[str, str, str], str]:
    if not EQUIVALENTS.is_file():
        return {}
    entries = tomllib.loads(EQUIVALENTS.read_text()).get("equivalent", [])
    return {(e["module"], e["line"].strip(), e["mutant"].strip()): e["reason"] for e in entries}


def preload() -> None:
    """Import the heavy packages once, before any fork (never gptedge: each child imports it from the copy)."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    for name in PRELOAD:
        try:
            __import__(name)
        except ImportError:
            pass
    if "gptedge" in sys.modules:
        raise SystemExit("Error: gptedge was imported before the fork; mutants would not be seen")


def copy_tree(dst: Path) -> None:
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                           capture_output=True).stdout.decode().split("\0")
    for rel in filter(None, files):
        src = ROOT / rel
        if src.is_file():
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst / rel)
    for name, folder in SUBPACKAGES.items():
        (dst / "gptedge" / name).symlink_to(Path("..") / folder)


def mutants(module: str, source: str) -> list[tuple[object, str]]:
    """Every mutmut mutant of `source` -> (its id, the mutated source)."""
    from mutmut import Context, list_mutations, mutate

    out = []
    for mid in list_mutations(Context(source=source, filename=module)):
        mutated, _ = mutate(Context(source=source, mutation_id=mid, filename=module))
        out.append((mid, mutated))
    return out


def describe(source: str, mutated: str) -> tuple[int, str, str]:
    """-> (first changed line number, 1-based; the original lines; the mutated lines)."""
    a, b = source.splitlines(), mutated.splitlines()
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if tag != "equal":
            return i1 + 1, "\n".join(x.strip() for x in a[i1:i2]), "\n".join(x.strip() for x in b[j1:j2])
    return 0, "", ""


def run_tests(copy: Path, tests: list[str], timeout: float, log: Path) -> tuple[int | None, float]:
    """The tests in a forked child inside the copy -> (pytest's exit code, None on timeout; seconds)."""
    start = time.perf_counter()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        code = 99
        try:
            os.setsid()
            os.chdir(copy)
            fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            sys.path[:] = [str(copy)] + [p for p in sys.path if Path(p or ".").resolve() != ROOT]
            import pytest

            code = int(pytest.main([*tests, "-x", "-q", "-p", "no:cacheprovider", "-o", "addopts=", "--no-header"]))
        finally:
            os._exit(code)
    deadline = start + timeout
    status = None
    while status is None:
        done, raw = os.waitpid(pid, os.WNOHANG)
        if done:
            status = os.waitstatus_to_exitcode(raw)
        elif time.perf_counter() > deadline:
            os.killpg(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            break
        else:
            time.sleep(0.02)
    try:
        os.killpg(pid, signal.SIGKILL)  # whatever the tests left running (a server, a CLI child)
    except ProcessLookupError:
        pass
    return status, time.perf_counter() - start


def run_module(module: str, tests: list[str], copy: Path, equivalents, earlier: dict, sample: int,
               max_mutants: int | None, log_dir: Path) -> dict:
    path = copy / module
    source = path.read_text()
    found = mutants(module, source)[::sample][:max_mutants]
    code, base = run_tests(copy, tests, 3600, log_dir / "baseline.log")
    if code != 0:
        raise SystemExit(f"Error: {module}: its tests fail before any mutation (exit {code}); see "
                         f"{log_dir / 'baseline.log'}:\n" + (log_dir / "baseline.log").read_text()[-3000:])
    timeout = base * 4 + 30
    print(f"{module}: {len(found)} mutants, tests {base:.1f} s clean", file=sys.stderr, flush=True)
    rows, start = [], time.perf_counter()
    try:
        for n, (mid, mutated) in enumerate(found, 1):
            line_no, original, changed = describe(source, mutated)
            row = {"line_number": line_no, "index": mid.index, "original": original, "mutated": changed}
            key = (module, original, changed)
            if earlier.get(key) in ("killed", "timeout"):
                row.update(status="killed", note="in the earlier run", seconds=0.0)
            else:
                path.write_text(mutated)
                code, secs = run_tests(copy, tests, timeout, log_dir / "mutant.log")
                status = "timeout" if code is None else "survived" if code == 0 else "killed"
                if status == "survived" and key in equivalents:
                    status = "equivalent"
                    row["reason"] = equivalents[key]
                row.update(status=status, exit=code, seconds=round(secs, 2))
            rows.append(row)
            if row["status"] == "survived":
                print(f"  survived {module}:{line_no}: {original!r} -> {changed!r}", file=sys.stderr, flush=True)
            if n % 20 == 0:
                print(f"  {n}/{len(found)}", file=sys.stderr, flush=True)
    finally:
        path.write_text(source)
    return summary(module, tests, rows, time.perf_counter() - start)


def summary(module: str, tests: list[str], rows: list[dict], seconds: float) -> dict:
    count = {s: sum(r["status"] == s for r in rows) for s in ("killed", "timeout", "survived", "equivalent")}
    scored = len(rows) - count["equivalent"]
    score = (count["killed"] + count["timeout"]) / scored if scored else 1.0
    return {"module": module, "tests": tests, "mutants": len(rows), **count, "score": round(score, 4),
            "seconds": round(seconds, 1), "rows": rows}


def machine() -> dict:
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").is_file() else ""
    model = next((ln.split(":", 1)[1].strip() for ln in info.splitlines() if ln.startswith("model name")), "")
    flags = next((ln.split(":", 1)[1].split() for ln in info.splitlines() if ln.startswith("flags")), [])
    isa = [f for f in ("avx2", "avx512f", "avx512_vnni", "amx_tile") if f in flags]
    versions = {}
    for pkg in ("mutmut", "pytest", "numpy", "onnxruntime", "torch", "transformers", "hypothesis"):
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            pass
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "-uno"], cwd=ROOT, capture_output=True, text=True)
    return {"cpu": model, "isa": isa, "cores": os.cpu_count(), "python": platform.python_version(),
            "versions": versions, "commit": commit.stdout.strip() + ("+changes" if dirty.stdout.strip() else "")}


def table(results: list[dict]) -> str:
    lines = ["| module | mutants | killed | timeout | survived | equivalent | score | minutes |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        lines.append(f"| {r['module']} | {r['mutants']} | {r['killed']} | {r['timeout']} | {r['survived']} | "
                     f"{r['equivalent']} | {r['score']:.1%} | {r['seconds'] / 60:.1f} |")
    total = {k: sum(r[k] for r in results) for k in ("mutants", "killed", "timeout", "survived", "equivalent")}
    scored = total["mutants"] - total["equivalent"]
    score = (total["killed"] + total["timeout"]) / scored if scored else 1.0
    lines.append(f"| **all** | {total['mutants']} | {total['killed']} | {total['timeout']} | {total['survived']} | "
                 f"{total['equivalent']} | **{score:.1%}** | |")
    return "\n".join(lines)


def write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    tmp.replace(path)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--module", action="append", help="a module path as in pyproject (repeatable; default: all)")
    ap.add_argument("--json", type=Path, help="write every mutant's status here (default: print the table only)")
    ap.add_argument("--survivors-of", type=Path, action="append", default=[],
                    help="re-run only the survivors of this earlier --json (repeatable)")
    ap.add_argument("--sample", type=int, default=1, help="every Nth mutant only (an estimate; default 1: all)")
    ap.add_argument("--max-mutants", type=int, help="the first N mutants of each module only (a smoke run)")
    ap.add_argument("--list", action="store_true", help="count the mutants of each module and stop")
    args = ap.parse_args()
    config = load_config()
    modules = args.module or list(config)
    unknown = [m for m in modules if m not in config]
    if unknown:
        print(f"Error: {unknown[0]} is not in [tool.gptedge.mutation.modules] (pyproject.toml)", file=sys.stderr)
        return 2
    if args.list:
        for m in modules:
            print(f"{m}: {len(mutants(m, (ROOT / m).read_text()))} mutants; tests: {' '.join(config[m])}")
        return 0
    earlier = {}
    for path in args.survivors_of:
        for r in json.loads(path.read_text())["modules"]:
            earlier.update({(r["module"], row["original"], row["mutated"]): row["status"] for row in r["rows"]})
    equivalents = load_equivalents()
    preload()
    report = {"date": datetime.date.today().isoformat(), "command": " ".join([Path(sys.executable).name, *sys.argv]),
              "machine": machine(), "modules": []}
    with tempfile.TemporaryDirectory(prefix="gptedge-mutation-") as tmp:
        copy, logs = Path(tmp) / "tree", Path(tmp) / "logs"
        logs.mkdir()
        copy_tree(copy)
        os.environ.update(PYTHONPATH=str(copy), PYTHONDONTWRITEBYTECODE="1",
                          GPTEDGE_TEST_CACHE=str(Path(tmp) / "models"))
        sys.dont_write_bytecode = True
        for m in modules:
            report["modules"].append(run_module(m, config[m], copy, equivalents, earlier, args.sample,
                                                 args.max_mutants, logs))
            if args.json:
                write_json(args.json, report)
    print(table(report["modules"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
