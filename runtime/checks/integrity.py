"""What load() checks of a model dir before it hands out a model, in the order it can: paths and sizes
(before ONNX Runtime reads anything), hashes (in a thread while the session builds), claims (once the
graph's facts and the tokenizer are read). The first problem raises ModelDirError in one line naming the
dir, how many more there are, and `gptedge verify`, which lists them all (verify.py).

Format-1 manifests (no `files`: written before gptedge recorded sizes and hashes) still load, with one
warning per dir and process; verify reports them as unverifiable. A format-2 (or later) manifest without
`files` is refused: every gptedge that wrote format 2 recorded them, so the list was deleted, and a flipped
weight would then run unnoticed.
"""

from __future__ import annotations

import logging
from pathlib import Path

from ..errors import ModelDirError
from ..graphs.session import SessionConfig, make_session
from ..modeldir.manifest import MANIFEST_NAME, Manifest
from ..modeldir.model_files import HashCheck, check_records, confined
from ..modeldir.onnx_wire import is_ort_format, read_graph_facts
from ..modeldir.tokenizer import has_tokenizer, load_tokenizer
from .model_claims import claim_problems
from .ort_facts import read_ort_facts

log = logging.getLogger(__name__)

_warned: set[Path] = set()


def raise_first(model_dir: Path, problems: list[str]) -> None:
    if not problems:
        return
    more = (f" (and {len(problems) - 1} more: gptedge verify {model_dir} lists them)" if len(problems) > 1 else "")
    raise ModelDirError(f"{model_dir}: {problems[0]}{more}")


def model_path(model_dir: Path, manifest: Manifest) -> Path:
    """The graph the manifest names, confined to the dir; one line when it is missing."""
    path = confined(model_dir, manifest.model_file, "model_file")
    if not path.is_file():
        raise ModelDirError(f"{model_dir}: no {manifest.model_file}")
    return path


def unrecorded(manifest: Manifest) -> str:
    """The one line for a manifest that records no files."""
    if manifest.format_version >= 2:
        return (f"its {MANIFEST_NAME} (format_version {manifest.format_version}) has no `files` list, which every "
                "gptedge writing that format records: the sizes and hashes were removed, so its files cannot be "
                "trusted; export / quantize it again")
    return (f"{MANIFEST_NAME} records no file sizes or hashes (an older gptedge wrote it): the files cannot be "
            "verified; export / quantize it again")


def start_file_checks(model_dir: Path, manifest: Manifest, imported: bool) -> HashCheck:
    """Paths and sizes now (raises), hashes in a thread (read its problems once the session is built)."""
    check_records(model_dir, manifest.files)
    if not manifest.files and not imported and manifest.format_version >= 2:
        raise_first(model_dir, [unrecorded(manifest)])
    if not manifest.files and not imported:
        key = model_dir.resolve()
        if key not in _warned:
            _warned.add(key)
            log.warning("%s: its %s records no file sizes or hashes (an older gptedge wrote it), so its files are "
                        "not checked; export / quantize it again to record them", model_dir, MANIFEST_NAME)
    return HashCheck(model_dir, manifest.files)


def load_dir_tokenizer(model_dir: Path):
    return load_tokenizer(model_dir) if has_tokenizer(model_dir) else None


def graph_facts(graph: Path):
    """-> (the graph's facts, whether it is an ORT-format graph (pack --target mobile), read by ort_facts)."""
    if is_ort_format(graph):
        return read_ort_facts(graph), True
    return read_graph_facts(graph), False


def check_claims(model_dir: Path, manifest: Manifest, graph: Path, tokenizer, imported: bool) -> None:
    facts, ort_format = graph_facts(graph)
    raise_first(model_dir, claim_problems(model_dir, manifest, facts, tokenizer, imported, ort_format=ort_format))


def open_checked_session(model_dir: Path, manifest: Manifest, imported: bool, device: str,
                         config: SessionConfig | None):
    """The dir's graph as an ONNX Runtime session, its files and claims checked -> (session, graph path, tokenizer).
    Sizes are checked now and hashes while the session builds; a file that changed explains a failed build
    best, so its problem is raised first."""
    graph = model_path(model_dir, manifest)  # confined to the dir
    hashing = start_file_checks(model_dir, manifest, imported)
    try:
        session = make_session(str(graph), device=device, config=config or SessionConfig())
    except Exception as e:
        raise_first(model_dir, hashing.problems())
        if type(e).__module__.startswith("gptedge"):
            raise
        raise ModelDirError(f"{graph}: ONNX Runtime cannot load it ({str(e).splitlines()[0][:200]})") from None
    raise_first(model_dir, hashing.problems())
    tokenizer = load_dir_tokenizer(model_dir)
    check_claims(model_dir, manifest, graph, tokenizer, imported)
    return session, graph, tokenizer
