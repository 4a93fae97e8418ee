"""Peer engines: other runtimes run on the same checkpoint, side by side with gptedge.

`gptedge bench --peers` times their generation on the same prompt ids in the same process (bench.py);
`gptedge compare --peers` has them quantize the same checkpoint their own way and scores them on the
same windows against the same reference (score.py). One module per engine implements base.py's
protocols; the registry below lists them by name, one line each, with what each offers, so the CLI
has its choices without importing any engine (nor numpy, nor the engines' packages).

A new peer engine is its module (ending with `ENGINE = PeerEngine(...)`) plus one line here.
"""

from __future__ import annotations

from dataclasses import dataclass

from gptedge.runtime.errors import InvalidArgumentError
from gptedge.runtime.registry import Entry, Registry

from .base import PeerEngine


@dataclass(frozen=True)
class PeerEntry(Entry):
    bench: bool = False  # adds rows to `gptedge bench --peers`
    compare: bool = False  # adds rows to `gptedge compare --peers`
    checkpoint: bool = True  # bench: converts the HF checkpoint (else it runs the gptedge model dir itself)


# One line a peer, in the order the CLI lists them.
PEERS: Registry[PeerEntry, PeerEngine] = Registry("peer engine", "ENGINE", {
    "torch": PeerEntry("gptedge.measure.peers.torch", bench=True),
    "ctranslate2": PeerEntry("gptedge.measure.peers.ctranslate2", bench=True, compare=True),
    "llama.cpp": PeerEntry("gptedge.measure.peers.llama_cpp", compare=True),
    "optimum": PeerEntry("gptedge.measure.peers.optimum", bench=True, compare=True),
    "genai": PeerEntry("gptedge.measure.peers.genai", bench=True, checkpoint=False),
})


def bench_names() -> tuple[str, ...]:
    return PEERS.names(lambda e: e.bench)


def compare_names() -> tuple[str, ...]:
    return PEERS.names(lambda e: e.compare)


def engine_for(name: str, role: str) -> PeerEngine:
    """The engine `name` for role "bench" or "compare"; one line when it is unknown or does not offer it."""
    PEERS.check(name)
    if not getattr(PEERS.entry(name), role):
        offered = PEERS.names(lambda e: getattr(e, role))
        raise InvalidArgumentError(f"peer {name!r} has no {role} rows: choose from {', '.join(offered)}")
    return PEERS.load(name)
