"""One pipeline of a model dir's checks, every problem found (issue #35): what `gptedge verify` lists, and what
`pack` and `serve` refuse on before doing anything (`check_model_dir` raises the first). load() runs the same
checks in its own order (integrity.py: sizes before ONNX Runtime reads the graph, hashes while it builds the
session, claims once the graph's facts are read) and raises the first too.

In order: the manifest parses; model_file lies inside the dir and exists; the files are recorded (a format-2
manifest without `files` is refused: it was edited, as gptedge has always written them since format 2) and each
has its recorded size and SHA-256; every claim agrees with the graph and the files beside it (model_claims.py,
with recipe_claims, companion_files and task_claims). A run of the graph is not part of it (graph_check.py and
fingerprint.py, which verify and load add).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ModelDirError
from ..modeldir.manifest import Manifest, read_manifest
from ..modeldir.model_files import hash_problems, record_problems
from .integrity import graph_facts, load_dir_tokenizer, model_path, raise_first, unrecorded
from .model_claims import claim_problems
from .ort_facts import unchecked

MANIFEST, FILES, CLAIMS = "manifest", "files", "claims"


@dataclass
class DirCheck:
    """What the pipeline found: the manifest and graph (None where they could not be read), every problem as
    (check, line), and what it could not check (notes, said rather than passed)."""

    manifest: Manifest | None = None
    graph: Path | None = None
    problems: list[tuple[str, str]] = field(default_factory=list)
    notes: list[tuple[str, str]] = field(default_factory=list)
    facts_read: bool = False


def check_dir(model_dir: str | Path) -> DirCheck:
    """Every static check of model_dir (nothing is run) -> what it found."""
    model_dir = Path(model_dir)
    found = DirCheck()
    if not model_dir.is_dir():
        found.problems.append((MANIFEST, f"{model_dir}: no such model directory"))
        return found
    try:
        found.manifest = manifest = read_manifest(model_dir)
        found.graph = model_path(model_dir, manifest)
    except ModelDirError as e:
        found.problems.append((MANIFEST, str(e)))
        return found
    if not manifest.files:
        found.problems.append((FILES, unrecorded(manifest)))
    else:
        files = record_problems(model_dir, manifest.files) or hash_problems(model_dir, manifest.files)
        found.problems += [(FILES, p) for p in files]
    try:
        facts, ort_format = graph_facts(found.graph)
        tokenizer = load_dir_tokenizer(model_dir)
    except ModelDirError as e:
        found.problems.append((CLAIMS, str(e)))
        return found
    found.facts_read = True
    if ort_format:
        found.notes.append((CLAIMS, f"{manifest.model_file} is an ORT-format graph: {unchecked()}"))
    found.problems += [(CLAIMS, p) for p in claim_problems(model_dir, manifest, facts, tokenizer,
                                                           ort_format=ort_format)]
    return found


def check_model_dir(model_dir: str | Path) -> Manifest:
    """check_dir, raising the first problem in one line (ModelDirError naming the dir, how many more there are and
    `gptedge verify`) -> the manifest, checked. What pack and serve run before anything else."""
    found = check_dir(model_dir)
    lines = [line.removeprefix(f"{model_dir}: ") for _, line in found.problems]
    raise_first(Path(model_dir), lines)
    return found.manifest
