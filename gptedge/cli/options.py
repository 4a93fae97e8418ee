"""Options and checks shared by the `gptedge` commands; every check here runs before any work.

Nothing here imports numpy, onnx or torch: `gptedge --help` loads every command module.

Choices where the issue left them open (docs/cli.md says the same):
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

import functools
import importlib
import os
import sys
from collections.abc import Callable
from pathlib import Path

import click

from gptedge.runtime.errors import missing_extra
from gptedge.runtime.modeldir.manifest import read_manifest
from gptedge.runtime.registry import Registry
from gptedge.runtime.graphs.session import DEVICES, MAX_THREADS


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


class RegistryChoice(click.Choice):
    """One name a registry holds (runtime/registry.py), read when the command line is: a member registered
    after the option was made (a plugin's, a test's) is a choice too."""

    def __init__(self, names: Callable[[], tuple[str, ...]]):
        self._names = names
        super().__init__(())

    @property
    def choices(self) -> tuple[str, ...]:
        return self._names()

    @choices.setter
    def choices(self, value) -> None:  # click.Choice.__init__ sets it: the registry is the list
        pass


def registry_choice(registry: Registry, where=None) -> RegistryChoice:
    return RegistryChoice(lambda: registry.names(where))


class CommaChoice(click.ParamType):
    """A comma-separated list of names from a closed set -> list[str] (empty string: []). `choices`: the
    names, or a function giving them when the command line is read (a registry's)."""

    name = "list"

    def __init__(self, choices: tuple[str, ...] | Callable[[], tuple[str, ...]]):
        self._choices = choices

    @property
    def choices(self) -> tuple[str, ...]:
        return self._choices() if callable(self._choices) else self._choices

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


def grouped(into: str, build: Callable[..., object], *options):
    """Options that make one record: the command gets `into=build(**their values)` in their place (a
    SamplingParams, say), built before the command body runs, so the record's own checks (InvalidArgumentError,
    exit 2) refuse a bad value before anything is loaded."""

    def decorator(fn):
        @functools.wraps(fn)
        def wrapper(**kwargs):
            kwargs[into] = build(**{name: kwargs.pop(name) for name in names})
            return fn(**kwargs)

        before = len(getattr(wrapper, "__click_params__", ()))
        for option in reversed(options):
            option(wrapper)
        names = [p.name for p in wrapper.__click_params__[before:]]
        return wrapper

    return decorator


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


def peer_source(model_dir: str, source: str | None) -> Path:
    """The HF checkpoint the peers load (compare, bench): --source, or what MODEL_DIR's manifest says it came from."""
    if source:
        if not Path(source, "config.json").is_file():
            raise click.BadParameter(f"{source} has no config.json: not a Hugging Face checkpoint dir",
                                     param_hint="'--source'")
        return Path(source)
    path = read_manifest(model_dir).source.checkpoint
    if not path or not Path(path, "config.json").is_file():
        raise click.ClickException(f"{model_dir}: no HF checkpoint recorded for the peers; pass --source DIR")
    return Path(path)


CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}
FORCE_HELP = ("Replace OUT if gptedge wrote it (or it is empty), once the new one is complete. Never the "
              "input, a folder holding it, or the current directory.")
