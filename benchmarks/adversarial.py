"""The adversarial pass of issue #35, re-runnable: several hundred hostile and careful inputs across every command,
the server and the Python API, each judged against what it must give. Cases are data (adversarial_cases.py: the
commands and tampered dirs; adversarial_http.py: the server and the Python API); this file builds the tiny seeded
models they run on, runs each case with a time limit, judges it and prints the table by verdict and command.

    python benchmarks/adversarial.py [--only SUBSTRING] [--json FILE] [--keep DIR]

Verdicts: ok (what the case expects: a one-line `Error:` with its exit code, a 4xx in OpenAI's error shape, or a
result that matches its oracle), silent-wrong (exit 0 / 200 where a refusal is due, or a result its oracle
rejects), traceback (a traceback or an "unexpected" error reached the user, or a 500), data-loss (an input or an
earlier output changed or vanished), hang (past its time limit), unclear (a refusal with the wrong exit code or
not one line). The commands run in process through click's CliRunner (one import for the whole pass); `serve`
runs as a real server in a subprocess. Exit status 0 when every case is ok.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import signal
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

VERDICTS = ("ok", "silent-wrong", "traceback", "data-loss", "hang", "unclear")
EXIT_USAGE, EXIT_FAILURE = 2, 1


@dataclass
class Case:
    """One adversarial input. kind: cli (args for `gptedge`), http (a request to the server), api (a call).
    expect: usage (exit 2), fail (exit 1), refuse (1 or 2), ok (exit 0 / 200 / a return), raises (an exception
    of the API's own kinds), 4xx (a status in `statuses`). oracle(outcome, ctx) -> None when right, else why."""

    id: str
    command: str
    kind: str
    what: object
    expect: str
    oracle: Callable | None = None
    statuses: tuple[int, ...] = (400,)
    timeout_s: int = 60
    extra: dict = field(default_factory=dict)


class Hang(BaseException):
    """Raised by SIGALRM inside a case that ran past its time limit."""


ALARMED = []  # set when a case's time ran out: the CLI's handler may have turned the Hang into an error line


def _alarm(signum, frame):
    ALARMED.append(True)
    raise Hang()


@dataclass
class Outcome:
    verdict: str
    detail: str = ""


def snapshot(paths: list[Path]) -> dict[str, tuple[int, int]]:
    """Every file under the inputs -> (size, mtime): what a data-loss check compares before and after a case."""
    seen = {}
    for root in paths:
        for p in [root] if root.is_file() else root.rglob("*"):
            if p.is_file():
                st = p.stat()
                seen[str(p)] = (st.st_size, st.st_mtime_ns)
    return seen


def one_error_line(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("Error: ")]


def judge_cli(case: Case, code: int, stderr: str, stdout: str, exc, ctx) -> Outcome:
    errors = one_error_line(stderr)
    if exc is not None and not isinstance(exc, SystemExit):
        return Outcome("traceback", f"{type(exc).__name__}: {str(exc)[:150]}")
    # the CLI's handler words an exception it has no line for as "unexpected TYPE: ... (gptedge --debug ...)"
    if "Traceback (most recent call last)" in stderr or any("--debug COMMAND" in e for e in errors):
        return Outcome("traceback", (errors or [stderr[-200:]])[0][:200])
    if case.expect == "ok":
        if code != 0:
            return Outcome("silent-wrong" if not errors else "unclear", f"exit {code}: {(errors or [''])[0][:160]}")
        why = case.oracle(Result(code, stdout, stderr), ctx) if case.oracle else None
        return Outcome("silent-wrong", why) if why else Outcome("ok")
    if code == 0:
        return Outcome("silent-wrong", "exit 0: " + (stdout.strip().splitlines() or [""])[-1][:120])
    fails = [line for line in stdout.splitlines() if line.startswith("FAIL")]
    if case.command == "verify" and code == EXIT_FAILURE and fails and not errors:
        return Outcome("ok", fails[0][:160])  # verify's refusal is its report: every problem a FAIL line, exit 1
    want = {"usage": (EXIT_USAGE,), "fail": (EXIT_FAILURE,), "refuse": (EXIT_USAGE, EXIT_FAILURE)}[case.expect]
    if code not in want or len(errors) != 1:
        return Outcome("unclear", f"exit {code}, {len(errors)} Error lines: {(errors or [stderr[-120:]])[0][:140]}")
    if case.oracle:
        why = case.oracle(Result(code, stdout, stderr), ctx)
        if why:
            return Outcome("unclear", why)
    return Outcome("ok", errors[0][:160])


@dataclass
class Result:
    code: int
    stdout: str
    stderr: str


def run_cli(case: Case, ctx) -> Outcome:
    from click.testing import CliRunner

    from gptedge.cli import main

    args = [a.format(**ctx.paths) if isinstance(a, str) else a for a in case.what]
    runner = CliRunner()
    result = runner.invoke(main, args, catch_exceptions=True, prog_name="gptedge")
    return judge_cli(case, result.exit_code, result.stderr, result.stdout, result.exception, ctx)


def run_api(case: Case, ctx) -> Outcome:
    from gptedge.runtime.errors import GptEdgeError

    try:
        value = case.what(ctx)
    except (TypeError, ValueError, GptEdgeError) as e:
        own = isinstance(e, GptEdgeError) or type(e) is TypeError
        if case.expect != "raises":
            return Outcome("unclear", f"raised {type(e).__name__}: {str(e)[:150]}")
        if not own or "\n" in str(e) or not str(e).strip():
            return Outcome("unclear", f"{type(e).__name__}: {str(e)[:150]}")
        return Outcome("ok", f"{type(e).__name__}: {str(e)[:150]}")
    except Hang:
        raise
    except Exception as e:  # anything else escaping the API is a traceback a caller sees
        return Outcome("traceback", f"{type(e).__name__}: {str(e)[:150]}")
    if case.expect == "raises":
        return Outcome("silent-wrong", f"returned {str(value)[:120]}")
    why = case.oracle(value, ctx) if case.oracle else None
    return Outcome("silent-wrong", why) if why else Outcome("ok")


def run_http(case: Case, ctx) -> Outcome:
    import httpx

    server = ctx.servers[case.extra.get("server", "gpt2")]
    method, path, body = case.what
    headers = {"Content-Type": "application/json", **case.extra.get("headers", {})}
    if callable(body):
        return body(server, ctx, case)  # a scripted exchange judges itself
    content = body if isinstance(body, (bytes, str)) else json.dumps(body)
    response = httpx.request(method, f"{server.url}{path}", content=content, headers=headers, timeout=case.timeout_s)
    return judge_http(case, response, ctx)


def judge_http(case: Case, response, ctx) -> Outcome:
    status = response.status_code
    if status >= 500:
        return Outcome("traceback", f"{status}: {response.text[:150]}")
    if case.expect == "ok":
        if status != 200:
            return Outcome("unclear", f"{status}: {response.text[:150]}")
        why = case.oracle(response, ctx) if case.oracle else None
        return Outcome("silent-wrong", why) if why else Outcome("ok")
    if status == 200:
        return Outcome("silent-wrong", f"200: {response.text[:120]}")
    try:
        error = response.json()["error"]
        shaped = set(error) == {"message", "type", "param", "code"} and "\n" not in error["message"]
    except (ValueError, KeyError, TypeError):
        shaped = False
    if status not in case.statuses or not shaped:
        return Outcome("unclear", f"{status}: {response.text[:150]}")
    return Outcome("ok", f"{status}: {error['message'][:140]}")


def run_tampered(case: Case, ctx) -> Outcome:
    ctx.tampered(case.extra["source"], case.extra["breakage"])
    return run_cli(case, ctx)


RUNNERS = {"cli": run_cli, "api": run_api, "http": run_http, "tampered": run_tampered}


def run_case(case: Case, ctx) -> Outcome:
    ctx.new_case_dir(case)
    before = snapshot(ctx.protected)
    signal.signal(signal.SIGALRM, _alarm)
    ALARMED.clear()
    signal.alarm(case.timeout_s)
    try:
        outcome = RUNNERS[case.kind](case, ctx)
    except Hang:
        outcome = Outcome("hang", f"past {case.timeout_s} s")
    except Exception as e:  # the harness's own failure in a case: a traceback to look at, never a pass
        outcome = Outcome("traceback", f"harness: {type(e).__name__}: {e}"[:200])
        traceback.print_exc()
    finally:
        signal.alarm(0)
    if ALARMED:
        outcome = Outcome("hang", f"past {case.timeout_s} s")
    if outcome.verdict != "hang":
        after = snapshot(ctx.protected)
        if after != before:
            changed = sorted(set(before) ^ set(after) | {k for k in before if after.get(k) != before[k]})
            outcome = Outcome("data-loss", f"changed: {', '.join(changed[:3])}")
    return outcome


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", default=None, help="run the cases whose id or command holds this")
    p.add_argument("--json", type=Path, default=None, help="write the record here (default: under "
                   "benchmarks/results/)")
    p.add_argument("--keep", type=Path, default=None, help="build the models and the work here, and keep them")
    a = p.parse_args()
    from adversarial_setup import Context

    work = a.keep or Path(tempfile.mkdtemp(prefix="gptedge-adversarial-"))
    started = time.perf_counter()
    try:
        ctx = Context(work)
        ctx.build()
        from adversarial_cases import cli_cases, dir_cases
        from adversarial_http import api_cases, http_cases

        cases = [*cli_cases(), *dir_cases(), *api_cases(), *http_cases()]
        if a.only:
            cases = [c for c in cases if a.only in c.id or a.only == c.command]
        ctx.start_servers(any(c.kind == "http" for c in cases))
        rows = []
        for case in cases:
            t0 = time.perf_counter()
            outcome = run_case(case, ctx)
            rows.append(dict(id=case.id, command=case.command, expect=case.expect, verdict=outcome.verdict,
                             detail=outcome.detail, seconds=round(time.perf_counter() - t0, 2)))
            mark = "" if outcome.verdict == "ok" else f"  <-- {outcome.verdict}"
            print(f"{outcome.verdict:12s} {case.command:10s} {case.id}: {outcome.detail[:110]}{mark}", flush=True)
        rows += ctx.stop_servers()
    finally:
        if a.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    print_table(rows)
    record = dict(date=datetime.date.today().isoformat(), machine=f"{platform.node()} ({os.cpu_count()} CPUs, "
                  f"{platform.machine()})", command="python benchmarks/adversarial.py" + (
                      f" --only {a.only}" if a.only else ""), seconds=round(time.perf_counter() - started, 1),
                  counts=dict(Counter(r["verdict"] for r in rows)), cases=rows)
    out = a.json or ROOT / "benchmarks" / "results" / f"adversarial-{record['date']}.json"
    tmp = out.with_suffix(".json.partial")
    tmp.write_text(json.dumps(record, indent=1) + "\n")
    os.replace(tmp, out)
    print(f"\n{len(rows)} cases in {record['seconds']} s; record: {out}")
    return 0 if all(r["verdict"] == "ok" for r in rows) else 1


def print_table(rows: list[dict]) -> None:
    commands = sorted({r["command"] for r in rows})
    by = Counter((r["verdict"], r["command"]) for r in rows)
    print("\n| command | " + " | ".join(VERDICTS) + " | total |")
    print("|---|" + "---|" * (len(VERDICTS) + 1))
    for c in commands:
        counts = [by[(v, c)] for v in VERDICTS]
        print(f"| {c} | " + " | ".join(str(n) for n in counts) + f" | {sum(counts)} |")
    totals = [sum(by[(v, c)] for c in commands) for v in VERDICTS]
    print("| **all** | " + " | ".join(str(n) for n in totals) + f" | {sum(totals)} |")


if __name__ == "__main__":
    sys.exit(main())
