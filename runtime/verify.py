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
from .checks.pipeline import CLAIMS, FILES, MANIFEST, check_dir
from .classify import check_head_graph
from .errors import GptEdgeError, ModelDirError
from .graphs.graph_variant import variant_for
from .graphs.session import CUDA_PROVIDER, SessionConfig, available_providers, import_onnxruntime, make_session
from .model import LoadedModel
from .modeldir.manifest import MANIFEST_NAME, Manifest

OK, FAIL, WARN = "ok", "FAIL", "warn"


@dataclass(frozen=True)
class Finding:
    status: str  # ok | FAIL | warn
    check: str  # manifest | files | claims | graph | parity
    line: str

    def to_dict(self) -> dict:
        return {"status": self.status, "check": self.check, "line": self.line}


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
    """Every check of a model dir -> its findings (a FAIL among them: the dir is not as its manifest says). The
    static checks are the pipeline's (checks/pipeline.py), every problem listed; then the graph is run."""
    model_dir = Path(model_dir)
    found = check_dir(model_dir)
    manifest, failed = found.manifest, {check for check, _ in found.problems}
    findings = [Finding(FAIL, check, line) for check, line in found.problems if check == MANIFEST]
    if manifest is None or found.graph is None:
        return findings
    findings.insert(0, Finding(OK, MANIFEST, f"{MANIFEST_NAME} parses; model_file {manifest.model_file} is inside "
                                             "the dir"))
    findings += [Finding(FAIL, check, line) for check, line in found.problems if check == FILES] or [
        Finding(OK, FILES, f"{len(manifest.files)} files ({', '.join(r.path for r in manifest.files)}; "
                           f"{sum(r.size for r in manifest.files) / 1e6:,.1f} MB): sizes and SHA-256 as recorded")]
    findings += [Finding(FAIL, check, line) for check, line in found.problems if check == CLAIMS]
    if found.facts_read and CLAIMS not in failed:
        findings.append(Finding(OK, CLAIMS, f"precision {manifest.precision}, graph {manifest.graph}, arch "
                                            f"{manifest.shape.arch}, context {manifest.shape.context_length}, "
                                            "special ids, tokenizer and the files other engines read agree with "
                                            "the graph"))
    findings += [Finding(WARN, check, line) for check, line in found.notes]
    if any(f.status == FAIL for f in findings):
        return findings  # running a graph that is not what the manifest says proves nothing more
    return findings + _run_findings(model_dir, manifest, found.graph, device, threads)
