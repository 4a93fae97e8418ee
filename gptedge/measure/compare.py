"""gptedge compare: several model dirs against a reference on one text, one row each.

Per position: top-1 agreement and KL(ref || model) over the same sliding windows as
perplexity; greedy agreement over N prompts x M new tokens; decode tokens/s; size on disk.

Peer engines (CTranslate2, llama.cpp, Optimum: gptedge.measure.peers) join the same table as `Scorer`s
(gptedge.measure.peers.base): they give full per-position logits for a window's ids and a greedy continuation
timed the way gptedge's generation times its own (tokens after the first over the time from the first
to the last, `Generation.tokens_per_s`), and are scored on the same windows against the same reference.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from gptedge.runtime.errors import InvalidArgumentError, PeerError
from gptedge.runtime.generation.evaluate import Progress, Window, log_softmax, sliding_windows, window_logits
from gptedge.runtime.modeldir.manifest import Manifest

from .frontier import dominators

if TYPE_CHECKING:  # the protocol only: the runtime imports nothing of the peers
    from gptedge.measure.peers.base import Scorer

log = logging.getLogger(__name__)


@dataclass
class CompareRow:
    model: str
    precision: str
    method: str
    size_bytes: int
    perplexity: float
    delta_ppl_pct: float
    top1_agreement: float
    kl: float
    greedy_agreement: float
    tokens_per_s: float
    engine: str = "gptedge"  # a peer's engine and version, e.g. "llama-cpp-python 0.3.36"
    peer: bool = False
    dominated_by: list[str] = field(default_factory=list)  # rows at least as faithful and as fast (frontier)

    def to_dict(self) -> dict:
        return asdict(self)


def graph_size(model_dir: Path, manifest: Manifest) -> int:
    """Bytes of the graph and its external data, as shipped (tokenizer and JSON not counted): the manifest's
    records (load has checked them against the files); an older manifest records none, so its graph and a
    `.data` beside it are measured on disk."""
    if manifest.graph_bytes is not None:
        return manifest.graph_bytes
    main = Path(model_dir) / manifest.model_file
    data = main.with_name(main.name + ".data")
    return main.stat().st_size + (data.stat().st_size if data.exists() else 0)


def greedy_prompts(ids: list[int], n: int, length: int) -> list[list[int]]:
    """n prompts of `length` tokens at evenly spaced places in the text."""
    if len(ids) < length + 1:
        raise InvalidArgumentError(f"text has {len(ids)} tokens; greedy prompts of {length} need more")
    starts = np.linspace(0, len(ids) - length - 1, num=n).astype(int)
    return [ids[s:s + length] for s in starts]


def matching_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def check_comparable(models: list, prompts: int = 8, new_tokens: int = 32, peers: Sequence[Scorer] = ()) -> None:
    """Refuse, before any work, what compare cannot do: models over different vocabularies (the ids of
    one text and the per-position distributions must mean the same for all), counts below 1."""
    for name, value in (("prompts", prompts), ("new_tokens", new_tokens)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise InvalidArgumentError(f"{name} must be an integer >= 1, got {value!r}")
    ref = models[0]
    vocab = ref.manifest.shape.vocab_size
    others = [(str(m.model_dir), m.manifest.shape.vocab_size) for m in models[1:]]
    for name, size in others + [(p.info.name, p.vocab_size) for p in peers]:
        if size != vocab:
            raise InvalidArgumentError(
                f"{name} has a vocabulary of {size} tokens, the reference {ref.model_dir} {vocab}: only models "
                "over one vocabulary can be compared")


def peer_window_logits(peer: Scorer, ids: list[int], window: Window) -> np.ndarray:
    """A peer's logits (n, V) predicting each target scored in `window` (as evaluate.window_logits)."""
    x = np.asarray(ids[window.begin:window.end], dtype=np.int64)  # (L,)
    logits = np.asarray(peer.logits(x))
    if logits.shape != (len(x), peer.vocab_size):
        raise PeerError(f"{peer.info.name} returned logits of shape {logits.shape} for {len(x)} ids, "
                        f"expected ({len(x)}, {peer.vocab_size})")
    first = window.first_target - window.begin
    return logits[first - 1:-1]


def compare(models: list, text_ids: list[int], prompts: int = 8, new_tokens: int = 32, prompt_length: int = 32,
            stride: int | None = None, progress: Progress | None = None,
            peers: Sequence[Scorer] = ()) -> list[CompareRow]:
    """models[0] is the reference; every model, the reference included, gets a row, then every peer."""
    check_comparable(models, prompts, new_tokens, peers)
    ref = models[0]
    n_models = len(models)
    context = min([m.manifest.shape.context_length for m in models] + [p.context_length for p in peers])
    windows = sliding_windows(len(text_ids), context, stride)
    n = n_models + len(peers)
    nll = np.zeros(n)
    kl = np.zeros(n)
    agree = np.zeros(n)
    count = 0
    for w in windows:
        ref_logits, targets = window_logits(ref, text_ids, w)
        ref_logp = log_softmax(ref_logits)
        ref_top1 = ref_logits.argmax(-1)
        ref_p = np.exp(ref_logp)
        rows = np.arange(len(targets))
        for i in range(n):
            if i == 0:
                logits, logp = ref_logits, ref_logp
            else:
                logits = (window_logits(models[i], text_ids, w)[0] if i < n_models
                          else peer_window_logits(peers[i - n_models], text_ids, w))
                logp = log_softmax(logits)
            nll[i] -= logp[rows, targets].sum()
            kl[i] += (ref_p * (ref_logp - logp)).sum()
            agree[i] += (logits.argmax(-1) == ref_top1).sum()
        count += len(targets)
        if progress:
            progress(w.end - 1, len(text_ids) - 1)
    greedy = greedy_prompts(text_ids, prompts, min(prompt_length, context - new_tokens - 1))
    # Every row's tok/s is timed the same way: one untimed warm-up run, then the timed prompts. Without it the first
    # row (the reference, timed right after the windows' pass) read 13-15 % below a dir computing the same function
    # timed later in the run (SmolLM2 shape, 896 + 128, three runs), where interleaved runs of the two put them level.
    # Ids only (with_text=False): the peers' loops decode no text either, so the tok/s columns time the same work.
    warm_up = min(8, new_tokens)

    def timed_greedy(m) -> list:
        m.generate(greedy[0], max_new_tokens=warm_up, greedy=True, with_text=False)
        return [m.generate(p, max_new_tokens=new_tokens, greedy=True, with_text=False) for p in greedy]

    ref_out = timed_greedy(ref)  # the reference's ids for every row's agreement, and its own row's tok/s
    result = []
    ref_ppl = math.exp(nll[0] / count)

    def figures(i: int, outs) -> dict:
        ppl = math.exp(nll[i] / count)
        greedy_agree = float(np.mean([matching_prefix(r.ids, o.ids) / max(1, len(r.ids))
                                      for r, o in zip(ref_out, outs, strict=True)]))
        return dict(perplexity=ppl, delta_ppl_pct=100.0 * (ppl / ref_ppl - 1.0), top1_agreement=float(agree[i] / count),
                    kl=float(kl[i] / count), greedy_agreement=greedy_agree,
                    tokens_per_s=float(np.mean([o.tokens_per_s for o in outs])))

    for i, m in enumerate(models):
        outs = ref_out if i == 0 else timed_greedy(m)
        q = m.manifest.quantization
        result.append(CompareRow(
            model=str(m.model_dir), precision=m.manifest.precision,
            method=q.label if q else ("imported" if m.manifest.source.imported_from else m.manifest.precision),
            size_bytes=graph_size(m.model_dir, m.manifest), **figures(i, outs)))
    for i, p in enumerate(peers, start=n_models):
        p.greedy(list(greedy[0]), warm_up, ref.manifest.eos_id)
        outs = [p.greedy(list(g), new_tokens, ref.manifest.eos_id) for g in greedy]
        info = p.info
        result.append(CompareRow(model=info.name, precision=info.precision, method=info.method,
                                 size_bytes=info.size_bytes, engine=info.engine, peer=True, **figures(i, outs)))
    mark_dominated(result)
    return result


def mark_dominated(rows: list[CompareRow]) -> None:
    """Each row's `dominated_by`: the rows (by `model`) with KL no higher and tok/s no lower, one strictly."""
    for row, by in zip(rows, dominators([(r.kl, r.tokens_per_s) for r in rows]), strict=True):
        row.dominated_by = [rows[j].model for j in by]


def markdown_table(rows: list[CompareRow], tokens: int, text_name: str, greedy: str = "") -> str:
    """The table (peers marked in the engine column), and which rows the frontier leaves dominated; `greedy`
    says what the greedy columns ran (e.g. "8 prompts x (896 + 128) tokens")."""
    lines = [f"Compared on {text_name} ({tokens:,} tokens); reference: {Path(rows[0].model).name}"
             + (f"; greedy agreement and decode tok/s over {greedy}" if greedy else ""), "",
             "| model | method | size MB | perplexity | Δ ppl % | top-1 agree | KL(ref‖model) | greedy agree | "
             "decode tok/s "
             "| engine | dominated by |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    short = {r.model: r.model if r.peer else Path(r.model).name for r in rows}  # a dir's name; a peer's own
    for r in rows:
        engine = f"peer: {r.engine}" if r.peer else r.engine
        by = ", ".join(short[m] for m in r.dominated_by) or "none (on the front)"
        lines.append(f"| {short[r.model]} | {r.method} | {r.size_bytes / 1e6:.2f} | {r.perplexity:.3f} | "
                     f"{r.delta_ppl_pct:+.3f} | {100 * r.top1_agreement:.2f} % | {r.kl:.3g} | "
                     f"{100 * r.greedy_agreement:.1f} % | {r.tokens_per_s:.1f} | {engine} | {by} |")
    lines += ["", "dominated by: rows with KL(ref‖model) no higher and decode tok/s no lower (one of them strictly)."]
    return "\n".join(lines) + "\n"
