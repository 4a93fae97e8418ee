"""gptedge compare: several model dirs against a reference on one text, one row each.

Per position: top-1 agreement and KL(ref || model) over the same sliding windows as
perplexity; greedy agreement over N prompts x M new tokens; decode tokens/s; size on disk.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from .errors import InvalidArgumentError
from .evaluate import Progress, log_softmax, sliding_windows, window_logits

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

    def to_dict(self) -> dict:
        return asdict(self)


def graph_size(model_dir: Path, model_file: str) -> int:
    """Bytes of the graph and its external data, as shipped (tokenizer and JSON not counted)."""
    main = Path(model_dir) / model_file
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
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def check_comparable(models: list, prompts: int = 8, new_tokens: int = 32) -> None:
    """Refuse, before any work, what compare cannot do: models over different vocabularies (the ids of
    one text and the per-position distributions must mean the same for all), counts below 1."""
    for name, value in (("prompts", prompts), ("new_tokens", new_tokens)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise InvalidArgumentError(f"{name} must be an integer >= 1, got {value!r}")
    ref = models[0]
    for m in models[1:]:
        if m.manifest.shape.vocab_size != ref.manifest.shape.vocab_size:
            raise InvalidArgumentError(
                f"{m.model_dir} has a vocabulary of {m.manifest.shape.vocab_size} tokens, the reference "
                f"{ref.model_dir} {ref.manifest.shape.vocab_size}: only models over one vocabulary can be compared")


def compare(models: list, text_ids: list[int], prompts: int = 8, new_tokens: int = 32, prompt_length: int = 32,
            stride: int | None = None, progress: Progress | None = None) -> list[CompareRow]:
    """models[0] is the reference; every model, the reference included, gets a row."""
    check_comparable(models, prompts, new_tokens)
    ref = models[0]
    context = min(m.manifest.shape.context_length for m in models)
    windows = sliding_windows(len(text_ids), context, stride)
    nll = np.zeros(len(models))
    kl = np.zeros(len(models))
    agree = np.zeros(len(models))
    count = 0
    for w in windows:
        ref_logits, targets = window_logits(ref, text_ids, w)
        ref_logp = log_softmax(ref_logits)
        ref_top1 = ref_logits.argmax(-1)
        ref_p = np.exp(ref_logp)
        rows = np.arange(len(targets))
        for i, m in enumerate(models):
            logits = ref_logits if i == 0 else window_logits(m, text_ids, w)[0]
            logp = ref_logp if i == 0 else log_softmax(logits)
            nll[i] -= logp[rows, targets].sum()
            kl[i] += (ref_p * (ref_logp - logp)).sum()
            agree[i] += (logits.argmax(-1) == ref_top1).sum()
        count += len(targets)
        if progress:
            progress(w.end - 1, len(text_ids) - 1)
    greedy = greedy_prompts(text_ids, prompts, min(prompt_length, context - new_tokens - 1))
    ref_out = [ref.generate(p, max_new_tokens=new_tokens, greedy=True) for p in greedy]
    result = []
    ref_ppl = math.exp(nll[0] / count)
    for i, m in enumerate(models):
        outs = ref_out if i == 0 else [m.generate(p, max_new_tokens=new_tokens, greedy=True) for p in greedy]
        greedy_agree = float(np.mean([matching_prefix(r.ids, o.ids) / max(1, len(r.ids)) for r, o in zip(ref_out, outs)]))
        ppl = math.exp(nll[i] / count)
        q = m.manifest.quantization
        result.append(CompareRow(
            model=str(m.model_dir), precision=m.manifest.precision,
            method=q.label if q else ("imported" if m.manifest.source.imported_from else m.manifest.precision),
            size_bytes=graph_size(m.model_dir, m.manifest.model_file), perplexity=ppl, delta_ppl_pct=100.0 * (ppl / ref_ppl - 1.0),
            top1_agreement=float(agree[i] / count), kl=float(kl[i] / count), greedy_agreement=greedy_agree,
            tokens_per_s=float(np.mean([o.tokens_per_s for o in outs]))))
    return result


def markdown_table(rows: list[CompareRow], tokens: int, text_name: str) -> str:
    lines = [f"Compared on {text_name} ({tokens:,} tokens); reference: {Path(rows[0].model).name}", "",
             "| model | method | size MB | perplexity | Δ ppl % | top-1 agree | KL(ref‖model) | greedy agree | decode tok/s |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {Path(r.model).name} | {r.method} | {r.size_bytes / 1e6:.2f} | {r.perplexity:.3f} | "
                     f"{r.delta_ppl_pct:+.3f} | {100 * r.top1_agreement:.2f} % | {r.kl:.3g} | "
                     f"{100 * r.greedy_agreement:.1f} % | {r.tokens_per_s:.1f} |")
    return "\n".join(lines) + "\n"
