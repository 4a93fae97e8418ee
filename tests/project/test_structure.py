"""The package's shape, read from its source: no import cycle, and no import inside a function to break one.

An import inside a function is allowed only to defer a dependency a caller may not have or need: an
optional extra (torch, onnx, matplotlib, starlette, a peer's package), directly or through the gptedge
module that imports it at its top, and, in the CLI's command modules, numpy too, so `gptedge --help`
stays light. A gptedge module imported inside a function that pulls none of these is an import moved
there to break a cycle, and fails. No import graph has a cycle, annotation-only imports (under
TYPE_CHECKING) included: they never run, but a cycle among them is still two modules that each need the
other to be understood.

Above modules, the rooms: gptedge.runtime is the torch-free core, in layers (RUNTIME_LAYERS; a room
imports only its own layer and those before it), and it imports nothing of measurement (gptedge.measure),
of the torch / onnx side (gptedge.export, gptedge.quantize) or of the app layer (gptedge.cli, serve, pack).
Rooms and packages, taken as nodes, make no cycle either.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {"gptedge": ROOT / "gptedge", "gptedge.export": ROOT / "export", "gptedge.quantize": ROOT / "quantize",
            "gptedge.runtime": ROOT / "runtime"}
OPTIONAL = {"torch", "onnx", "onnxruntime", "matplotlib", "starlette", "uvicorn", "jinja2", "safetensors",
            "huggingface_hub",
            "transformers", "optimum", "ctranslate2", "llama_cpp", "onnxruntime_genai"}
LIGHT_CLI = OPTIONAL | {"numpy"}  # the CLI defers numpy too: --help loads every command module
# `import gptedge.runtime` stays free of numpy (the CLI imports it at --help): its load() defers the model module.
DEFERRED = {("gptedge.runtime", "gptedge.runtime.model"), ("gptedge.runtime", "gptedge.runtime.classify")}


def modules() -> dict[str, Path]:
    """Every gptedge module name -> its file (the folders mapped into gptedge.* included)."""
    out = {}
    for package, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            parts = path.relative_to(folder).with_suffix("").parts
            if package == "gptedge" and parts[0] in ("export", "quantize", "runtime"):
                continue
            name = ".".join((package, *parts))
            out[name.removesuffix(".__init__")] = path
    return out


def _absolute(module: str, path: Path, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for _ in range(node.level - 1):
        package = package.rpartition(".")[0]
    return f"{package}.{node.module}" if node.module else package


def _imported(module: str, path: Path, node: ast.AST, known: dict[str, Path]) -> list[str]:
    """The gptedge modules an import statement loads (`from pkg import sub` loads pkg.sub)."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        base = _absolute(module, path, node)
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
    return sorted({n for n in names if n in known})


def _is_type_checking(node: ast.If) -> bool:
    return isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"


def import_sites(known: dict[str, Path], third_party: dict[str, set[str]] | None = None, annotations: bool = False
                 ) -> tuple[dict[str, set[str]], list[tuple[str, str]]]:
    """-> (module -> gptedge modules it imports at module level, [(module, gptedge module imported in a function)]);
    `third_party`, when given, gets each module's top-level imports of other packages (their first name);
    `annotations`: count the imports under TYPE_CHECKING as module-level ones."""
    top: dict[str, set[str]] = {m: set() for m in known}
    inside: list[tuple[str, str]] = []
    for module, path in known.items():
        def visit(node: ast.AST, in_function: bool, module: str = module, path: Path = path) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.If) and _is_type_checking(child) and not annotations:
                    continue
                if isinstance(child, (ast.Import, ast.ImportFrom)):
                    for target in _imported(module, path, child, known):
                        if in_function:
                            inside.append((module, target))
                        else:
                            top[module].add(target)
                    if third_party is not None and not in_function:
                        names = ([a.name for a in child.names] if isinstance(child, ast.Import)
                                 else [] if child.level else [child.module or ""])
                        third_party.setdefault(module, set()).update(
                            n.split(".")[0] for n in names if not n.startswith("gptedge"))
                visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

        visit(ast.parse(path.read_text(encoding="utf-8")), False)
    return top, inside


def pulls(known: dict[str, Path]) -> dict[str, set[str]]:
    """module -> every other package its import loads, through its top-level gptedge imports."""
    third: dict[str, set[str]] = {}
    top, _ = import_sites(known, third)
    closed: dict[str, set[str]] = {}

    def walk(module: str, seen: set[str]) -> set[str]:
        if module not in closed:
            out = set(third.get(module, ()))
            for target in top[module] - seen:
                out |= walk(target, seen | {module})
            closed[module] = out
        return closed[module]

    return {m: walk(m, {m}) for m in known}


def test_no_gptedge_import_inside_a_function_but_to_defer_a_heavy_dependency():
    known = modules()
    _, inside = import_sites(known)
    heavy = pulls(known)
    cycle_breakers = [(m, t) for m, t in inside if (m, t) not in DEFERRED
                      and not heavy[t] & (LIGHT_CLI if m.startswith("gptedge.cli.") else OPTIONAL)]
    assert not cycle_breakers, "imports inside functions that defer nothing heavy: " + ", ".join(
        f"{m} -> {t}" for m, t in cycle_breakers)


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """The first cycle of a directed graph (its nodes, the first repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the path, 2: done

    def walk(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for target in sorted(edges.get(node, ())):
            if state.get(target) == 1:
                return path[path.index(target):] + [target]
            if target not in state and (found := walk(target, path + [target])):
                return found
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state and (found := walk(node, [node])):
            return found
    return None


def test_module_imports_make_no_cycle():
    """Annotation-only imports included (export's base <-> config <-> families <-> graph_attention <-> graph_ops
    was such a circle: the Weights alias and the family lookup now live where their users point)."""
    known = modules()
    top, _ = import_sites(known, annotations=True)
    cycle = find_cycle(top)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


# The torch-free core's rooms, in layers: a room may import its own layer and the ones before it, never one after.
RUNTIME_LAYERS = [
    {"gptedge.runtime.errors", "gptedge.runtime.contract", "gptedge.runtime.registry"},
    {"gptedge.runtime.modeldir"},
    {"gptedge.runtime.graphs"},
    {"gptedge.runtime.generation"},
    {"gptedge.runtime.checks"},
    {"gptedge.runtime.model", "gptedge.runtime.classify"},
    {"gptedge.runtime.verify", "gptedge.runtime.serving"},
    {"gptedge.runtime"},  # __init__: the public API re-exports from the rooms
]
CORE = "gptedge.runtime"
NOT_FROM_CORE = ("gptedge.measure", "gptedge.export", "gptedge.quantize", "gptedge.cli", "gptedge.serve",
                 "gptedge.pack")


def node(module: str, known: dict[str, Path]) -> str:
    """A module's room: the package it sits in, except that a plain module beside sub-packages (gptedge.runtime.model,
    gptedge.atomic, gptedge.measure.bench) is a room of its own."""
    package = module if known[module].name == "__init__.py" else module.rpartition(".")[0]
    if module != package and any(k.startswith(package + ".") and known[k].name == "__init__.py" for k in known):
        return module
    return package


def room_edges(known: dict[str, Path]) -> dict[str, set[str]]:
    """room -> the rooms its modules import, at the top, in a function or for annotations (everything that runs or
    is read)."""
    top, inside = import_sites(known, annotations=True)
    pairs = [(m, t) for m, ts in top.items() for t in ts] + inside
    edges: dict[str, set[str]] = {}
    for m, t in pairs:
        a, b = node(m, known), node(t, known)
        if a != b:
            edges.setdefault(a, set()).add(b)
    return edges


def test_rooms_make_no_cycle():
    cycle = find_cycle(room_edges(modules()))
    assert cycle is None, "rooms import each other in a cycle: " + " -> ".join(cycle)


def test_the_core_imports_only_earlier_layers_and_nothing_outside_it():
    known = modules()
    layer = {room: i for i, rooms in enumerate(RUNTIME_LAYERS) for room in rooms}
    core_rooms = {node(m, known) for m in known if m == CORE or m.startswith(CORE + ".")}
    assert core_rooms == set(layer), f"a room without a layer, or a layer's room missing: {core_rooms ^ set(layer)}"
    wrong = []
    for room, targets in room_edges(known).items():
        if room not in layer:
            continue
        for target in sorted(targets):
            if target.startswith(NOT_FROM_CORE):
                wrong.append(f"{room} -> {target} (outside the core)")
            elif target in layer and layer[target] > layer[room]:
                wrong.append(f"{room} (layer {layer[room]}) -> {target} (layer {layer[target]})")
    assert not wrong, "the core's arrows go the wrong way: " + "; ".join(wrong)


def test_the_reference_model_imports_nothing_of_the_runtime():
    """export/reference.py is the parity oracle: it must not borrow the code it is the oracle for."""
    known = modules()
    top, inside = import_sites(known, annotations=True)
    used = top["gptedge.export.reference"] | {t for m, t in inside if m == "gptedge.export.reference"}
    assert not {t for t in used if t.startswith(CORE + ".")}, used


def test_the_checks_see_a_cycle_and_a_deferred_import(tmp_path):
    """The scanner itself: a function-level import and a two-module cycle are found."""
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("from .b import f\n\ndef g():\n    from .b import h\n")
    b.write_text("from .a import g\n")
    known = {"gptedge.x.a": a, "gptedge.x.b": b}
    top, inside = import_sites(known)
    assert top == {"gptedge.x.a": {"gptedge.x.b"}, "gptedge.x.b": {"gptedge.x.a"}}
    assert inside == [("gptedge.x.a", "gptedge.x.b")]


def test_help_imports_no_numpy_onnx_or_torch():
    """`gptedge --help` and every command's -h load the CLI, every registry and every option: nothing heavy."""
    code = ("import sys; from gptedge.cli import main; from click.testing import CliRunner\n"
            "for name in ['', *main.commands]:\n"
            "    assert CliRunner().invoke(main, [name, '-h'] if name else ['-h']).exit_code == 0, name\n"
            "print(sorted(m for m in ('numpy', 'onnx', 'torch', 'onnxruntime', 'tokenizers', 'starlette') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_the_public_api_is_gptedge_runtime_and_light():
    """User code imports from gptedge.runtime (the rooms below it may move): every name in __all__ resolves, and
    `import gptedge.runtime` alone loads no numpy (the names needing it are imported on first use)."""
    code = ("import sys, gptedge.runtime as rt\n"
            "light = 'numpy' not in sys.modules\n"
            "missing = [n for n in rt.__all__ if getattr(rt, n, None) is None]\n"
            "from gptedge.runtime import LoadedModel, SamplingParams, Engine\n"
            "print(light, missing, LoadedModel.__module__, SamplingParams.__module__, Engine.__module__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "[]", "gptedge.runtime.model",
                                  "gptedge.runtime.generation.generation_options", "gptedge.runtime.serving.engine"]


# A path of this repository cited in a comment, docstring or message: `runtime/graphs/session.py`, `tests/conftest.py`.
CITED = re.compile(r"(?<![\w./-])((?:runtime|export|quantize|gptedge|tests|benchmarks|scripts|samples|deploy)/"
                   r"[\w./-]*\w\.(?:py|sh|toml|json|jsonl|yml|yaml|js|html))(?![\w.])")
NOT_A_FILE = {"samples/sample-model/e.jsonl"}  # test_sample_classifier's overlapping --out, a path it never writes


def test_every_path_cited_in_the_source_exists():
    """After a move, a comment naming the old path misleads the next reader (argmax_graph.py once cited a test file
    that never existed): every repository path the code, tests and benchmarks cite is a file."""
    sources = [p for folder in ("runtime", "export", "quantize", "gptedge", "tests", "benchmarks", "samples", "scripts")
               for p in (ROOT / folder).rglob("*") if p.suffix in (".py", ".sh", ".toml") and ".venv" not in p.parts]
    missing = [f"{path.relative_to(ROOT)}:{n}: {cited}" for path in [*sources, ROOT / "pyproject.toml"]
               for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
               for cited in CITED.findall(line) if cited not in NOT_A_FILE and not (ROOT / cited).exists()]
    assert not missing, "cited paths that do not exist: " + "; ".join(missing)
