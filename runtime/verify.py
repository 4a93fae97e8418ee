"""`gptedge verify DIR`: everything load() checks, every problem listed rather than the first, plus the
short parity run the manifest's fingerprint records.

Findings, in order: the manifest parses; model_file and every recorded path lie inside the dir; every
recorded file has its size and SHA-256 (a manifest that records none is a failure: nothing can be
verified); every claim agrees with the graph and the files beside it (model_claims.py); the graph
loads and runs at the claimed context (graph_check.py); the fingerprint's greedy run repeats within
its tolerance (fingerprint.py). A dir with no fingerprint (exported without validation, or by an
older gptedge), or one recorded on another device than this machine offers, gets a warning instead.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from .checks.fingerprint import fingerprint_problems, record_fingerprint
from .checks.graph_check import check_graph
from .checks.integrity import graph_facts, load_dir_tokenizer, model_path
from .checks.model_claims import claim_problems
from .classify import check_head_graph
from .errors import GptEdgeError, ModelDirError
from .graphs.graph_variant import variant_for
from .graphs.session import CUDA_PROVIDER, SessionConfig, available_providers, import_onnxruntime, make_session
from .model import LoadedModel
from .modeldir.manifest import MANIFEST_NAME, Manifest, read_manifest
from .modeldir.model_files import hash_problems, record_problems

OK, FAIL, WARN = "ok", "FAIL", "warn"


@dataclass(frozen=True)
class Finding:
    status: str  # ok | FAIL | warn
    check: str  # manifest | files | claims | graph | parity
    line: str

    def to_dict(self) -> dict:
        return {"status": self.status, "check": self.check, "line": self.line}


def _file_findings(model_dir: Path, manifest: Manifest) -> list[Finding]:
    if not manifest.files:
        return [Finding(FAIL, "files", f"{MANIFEST_NAME} records no file sizes or hashes (an older gptedge wrote it): "
                                       "the files cannot be verified; export / quantize it again")]
    problems = record_problems(model_dir, manifest.files) or hash_problems(model_dir, manifest.files)
    if problems:
        return [Finding(FAIL, "files", p) for p in problems]
    total = sum(r.size for r in manifest.files)
    names = ", ".join(r.path for r in manifest.files)
    return [Finding(OK, "files", f"{len(manifest.files)} files ({names}; {total / 1e6:,.1f} MB): sizes and SHA-256 "
                                 "as recorded")]


def _run_findings(model_dir: Path, manifest: Manifest, graph: Path, device: str, threads: int | None) -> list[Finding]:
    recorded = manifest.parity.fingerprint
    if recorded is not None and device == "auto":
        device = "cuda" if recorded.device == "cuda" and CUDA_PROVIDER in available_providers() else "cpu"
    started = time.perf_counter()
    try:
        session = make_session(str(graph), device=device, config=SessionConfig(threads=threads))
    except Exception as e:  # ONNX Runtime's own types
        if isinstance(e, GptEdgeError):  # no such device: the command line is wrong
            raise
        return [Finding(FAIL, "graph", f"ONNX Runtime cannot load {graph.name} ({str(e).splitlines()[0][:200]})")]
    if manifest.task is not None:
        return _head_findings(session, manifest, graph)
    variant = variant_for(session, import_onnxruntime(), manifest, device)
    try:
        check_graph(variant, manifest, graph)
    except ModelDirError as e:
        return [Finding(FAIL, "graph", str(e).split(": ", 1)[-1])]
    found = [Finding(OK, "graph", f"loads on {session.get_providers()[0]} and runs at position "
                                  f"{manifest.shape.context_length - 1} (context {manifest.shape.context_length})")]
    if recorded is None:
        return found + [Finding(WARN, "parity", "no fingerprint recorded (exported without validation, or by an older "
                                                "gptedge): the parity run was not checked")]
    if recorded.device != variant.kv_device:
        return found + [Finding(WARN, "parity", f"the fingerprint was recorded on {recorded.device}; this run is on "
                                                f"{variant.kv_device}: not compared")]
    loaded = LoadedModel(model_dir, manifest, session, variant, device, time.perf_counter() - started)
    measured = record_fingerprint(loaded)
    problems = fingerprint_problems(recorded, measured, manifest.precision)
    if problems:
        return found + [Finding(FAIL, "parity", p) for p in problems]
    return found + [Finding(OK, "parity", f"{len(recorded.ids)} greedy tokens after {len(recorded.prompt_ids)} seeded "
                                          "ids as recorded, logits within tolerance")]


def _head_findings(session, manifest: Manifest, graph: Path) -> list[Finding]:
    """A task head's graph (no KV cache, no generation): its I/O names, special ids and a probe run of the
    task's output shape, as load_classifier checks them. No greedy fingerprint exists for a head, so the
    parity recorded at export / quantize is reported, not repeated."""
    try:
        check_head_graph(session, manifest, graph)
    except ModelDirError as e:
        return [Finding(FAIL, "graph", str(e).split(": ", 1)[-1])]
    task = manifest.task
    found = [Finding(OK, "graph", f"loads on {session.get_providers()[0]}; a {task.name} head: I/O, special ids and "
                                  "output shape as the manifest says")]
    return found + [Finding(WARN, "parity", "a classifier dir records no greedy fingerprint: the head's parity "
                                            "figures recorded at export / quantize were not re-run")]


def verify_model_dir(model_dir: str | Path, device: str = "cpu", threads: int | None = None) -> list[Finding]:
    """Every check of a model dir -> its findings (a FAIL among them: the dir is not as its manifest says)."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        return [Finding(FAIL, "manifest", f"{model_dir}: no such model directory")]
    try:
        manifest = read_manifest(model_dir)
        graph = model_path(model_dir, manifest)
    except ModelDirError as e:
        return [Finding(FAIL, "manifest", str(e))]
    findings = [Finding(OK, "manifest", f"{MANIFEST_NAME} parses; model_file {manifest.model_file} is inside the dir")]
    findings += _file_findings(model_dir, manifest)
    try:
        facts = graph_facts(graph)
        tokenizer = load_dir_tokenizer(model_dir)
    except ModelDirError as e:
        return findings + [Finding(FAIL, "claims", str(e))]
    claims = claim_problems(model_dir, manifest, facts, tokenizer)
    findings += [Finding(FAIL, "claims", p) for p in claims] or [
        Finding(OK, "claims", f"precision {manifest.precision}, graph {manifest.graph}, arch {manifest.shape.arch}, "
                              f"context {manifest.shape.context_length}, special ids and tokenizer agree with the "
                              "graph and the files beside it")]
    if any(f.status == FAIL for f in findings):
        return findings  # running a graph that is not what the manifest says proves nothing more
    return findings + _run_findings(model_dir, manifest, graph, device, threads)
