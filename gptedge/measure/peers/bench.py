"""`gptedge bench --peers`: each asked engine's rows, on the same prompt ids, in the same process.

Each engine (torch, optimum, ctranslate2 on the HF checkpoint; genai on the benchmarked model dir
itself) plans its rows from one BenchJob; a row whose package is not installed becomes a 'not run'
note (`errors.install_hint('peers')`), not an error.
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

from gptedge.measure.bench import BenchRow, peak_rss_mb
from gptedge.runtime.errors import install_hint

from . import engine_for
from .base import BenchJob, with_hf_tokenizer

log = logging.getLogger(__name__)


def bench_peers(names: list[str], source: Path | None, model_dir: Path, prompts, new_tokens: int, threads: int,
                repeat: int) -> list[BenchRow]:
    engines = [engine_for(name, "bench") for name in names]
    rows = []
    with tempfile.TemporaryDirectory(prefix="gptedge-peers-") as tmp:
        work = Path(tmp)
        source = with_hf_tokenizer(source, model_dir, work) if source else None
        job = BenchJob(source, Path(model_dir), prompts, new_tokens, threads, repeat, work)
        for label, run in [row for engine in engines for row in engine.bench(job)]:
            try:
                rows.append(run())
            except ImportError as e:
                rows.append(BenchRow(label, 0, 0, 0, peak_rss_mb(),
                                     f"not run: {e.name} not installed ({install_hint('peers')})"))
            log.info("bench %s done", label)
    return rows
