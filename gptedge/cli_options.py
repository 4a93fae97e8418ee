"""Options and checks shared by the `gptedge` commands; every check here runs before any work.

Choices where the issue left them open (README's CLI reference says the same):
- A count is never 0: every option that counts tokens, prompts, runs, threads or a stride
  refuses 0 (and negatives) with its allowed range, shown in --help. The sampling values
  keep their documented meanings (`--top-k 0`: no top-k filter, `--temperature 0`: greedy).
- `--device` is auto | cpu | cuda, default auto, in every command.
- `--threads` defaults to the CPUs this process may use, in every command (bench gives the
  same number to its peers and records it).
- Text given on the command line (`-p`, `--stop`) must be valid UTF-8: anything else is
  refused in one line (a shell can pass any bytes; they would be decoded differently by
  different tokenizers). Text files (`--text`, `--calibration`) must be UTF-8 too.
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

import click

from gptedge.runtime.errors import missing_extra
from gptedge.runtime.session import DEVICES, MAX_THREADS


def default_threads() -> int:
    """The CPUs this process may run on (its affinity mask), within what SessionConfig accepts."""
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        n = os.cpu_count() or 1
    return max(1, min(n, MAX_THREADS))


def count(minimum: int = 1, maximum: int | None = None) -> click.IntRange:
    return click.IntRange(minimum, maximum)


def device_option(fn):
    return click.option("--device", type=click.Choice(list(DEVICES)), default="auto", show_default=True,
                        help="Where to run: auto is cuda when this onnxruntime has it, else cpu.")(fn)


def threads_option(fn):
    return click.option("--threads", type=count(1, MAX_THREADS), default=default_threads(), show_default=True,
                        help="ONNX Runtime intra-op threads (default: the CPUs this process may use).")(fn)


def _bad_utf8(text: str) -> str | None:
    """Why `text` (from argv, decoded with surrogateescape) is not valid UTF-8, or None."""
    try:
        text.encode("utf-8")
        return None
    except UnicodeEncodeError:
        pass
    try:
        raw = os.fsencode(text)
        raw.decode("utf-8")
    except UnicodeDecodeError as e:
        return f"not valid UTF-8 (byte 0x{raw[e.start]:02x} at offset {e.start}); pass UTF-8 text"
    except UnicodeEncodeError:
        pass
    return "not valid UTF-8 (it holds a lone surrogate); pass UTF-8 text"


def utf8_text(ctx, param, value):
    """click callback: refuse command-line text that is not valid UTF-8."""
    for text in value if isinstance(value, tuple) else (value,):
        if text is not None and (why := _bad_utf8(text)):
            raise click.BadParameter(why, ctx=ctx, param=param)
    return value


class CommaChoice(click.ParamType):
    """A comma-separated list of names from a closed set -> list[str] (empty string: [])."""

    name = "list"

    def __init__(self, choices: tuple[str, ...]):
        self.choices = choices

    def get_metavar(self, param, *args, **kwargs) -> str:  # click >= 8.2 passes ctx= by keyword
        return ",".join(self.choices)

    def convert(self, value, param, ctx):
        if isinstance(value, list):
            return value
        names = [p.strip() for p in str(value).split(",") if p.strip()]
        unknown = [n for n in names if n not in self.choices]
        if unknown:
            self.fail(f"unknown {', '.join(map(repr, unknown))}: choose from {', '.join(self.choices)}", param, ctx)
        return list(dict.fromkeys(names))


def import_extra(module: str, extra: str):
    """Import a part that needs an extra (torch, onnx, matplotlib); a one-line hint when it is missing."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise missing_extra(e.name, extra) from None


def read_text(path: str) -> str:
    """A UTF-8 text file; one line naming it when it cannot be read or decoded."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise click.ClickException(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except OSError as e:
        raise click.ClickException(f"{path}: {e.strerror}") from None


def diag(message: str) -> None:
    click.echo(message, err=True)


def progress(label: str):
    """A progress bar on stderr, driven by the library's (done, total) callbacks."""
    state = {}

    def update(done: int, total: int) -> None:
        if "bar" not in state:
            state["bar"] = click.progressbar(length=total, label=label, file=sys.stderr)
            state["bar"].__enter__()
            state["seen"] = 0
        state["bar"].update(done - state["seen"])
        state["seen"] = done
        if done >= total:
            state.pop("bar").__exit__(None, None, None)

    return update


CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}
FORCE_HELP = ("Replace OUT if gptedge wrote it (or it is empty), once the new one is complete. Never the "
              "input, a folder holding it, or the current directory.")
