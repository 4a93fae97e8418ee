"""A loaded classifier dir (a task head, runtime/modeldir/tasks.py): examples -> labels and probabilities.

    clf = gptedge.runtime.load_classifier("out/entail")
    clf.classify(("A man sleeps.", "Nobody is awake.")).label        # "contradiction"
    clf.classify_batch([{"premise": ..., "hypothesis": ...}, ...])   # batched

The manifest's task says how an example becomes token rows (its transformation) and how the rows'
logits combine: one row; similarity's two orders added; one logit per choice, a softmax across them.
Load checks what it can before handing the model out, as load() does for a language model: file sizes
and hashes, the manifest's claims against the graph (runtime/checks/model_claims.py), the I/O names, the
special tokens inside the vocabulary, and one probe run whose output shape must be the task's.
Like LoadedModel, a Classifier holds no per-call state: concurrent calls are safe.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .generation.arguments import check_text
from .errors import InvalidArgumentError, ModelDirError
from .checks.integrity import open_checked_session
from .graphs.heap_trim import trim_heap
from .modeldir.manifest import MANIFEST_NAME, Manifest, read_manifest
from .graphs.session import SessionConfig
from .modeldir.tasks import (CHOICE, CHOICES, COMBINE_CHOICES, COMBINE_ONE, COMBINE_SUM, SPECIAL_ROLES, Task,
                    example_fields, rows)
from .modeldir.tokenizer import encode

DEFAULT_BATCH = 32  # rows per run (batch 1 and 32 are what compare measures)


@dataclass(frozen=True)
class Classification:
    """One example's result: the labels (a sequence head's id2label, or the choices), their logits and
    probabilities (softmax over the labels), and the best one."""

    labels: tuple[str, ...]
    logits: tuple[float, ...]
    probabilities: tuple[float, ...]
    choices: bool = False  # multiple choice: labels are the answers given (they may repeat)

    @property
    def index(self) -> int:
        return int(np.argmax(self.logits))

    @property
    def label(self) -> str:
        return self.labels[self.index]

    def to_dict(self) -> dict:
        return {"label": self.label, "index": self.index,
                "probabilities": list(self.probabilities) if self.choices else dict(zip(self.labels,
                                                                                         self.probabilities,
                                                                                        strict=True)),
                "labels": list(self.labels), "logits": list(self.logits)}


def softmax(logits: np.ndarray) -> np.ndarray:
    """Over the last axis, in float64."""
    z = logits.astype(np.float64) - logits.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


def pad_rows(token_rows: Sequence[Sequence[int]], pad_id: int, width: int | None = None
             ) -> tuple[np.ndarray, np.ndarray]:
    """Rows -> right-padded ids and attention mask (R, S) int64: each row's last real token (the extract token)
    is its last attended position, where the graph reads the state."""
    width = width or max(len(r) for r in token_rows)
    ids = np.full((len(token_rows), width), pad_id, dtype=np.int64)
    mask = np.zeros((len(token_rows), width), dtype=np.int64)
    for i, r in enumerate(token_rows):
        ids[i, :len(r)] = r
        mask[i, :len(r)] = 1
    return ids, mask


class Classifier:
    def __init__(self, model_dir: Path, manifest: Manifest, session, device: str, load_s: float, tokenizer):
        self.model_dir, self.manifest, self.session = model_dir, manifest, session
        self.task: Task = manifest.task
        self.device, self.load_s, self._tokenizer = device, load_s, tokenizer
        self.output = manifest.outputs[0]

    @property
    def providers(self) -> list[str]:
        return self.session.get_providers()

    @property
    def choice(self) -> bool:
        return self.task.transformation.combine == COMBINE_CHOICES

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            raise ModelDirError(f"{self.model_dir}: no tokenizer.json (needed to turn text into tokens)")
        return self._tokenizer

    # -- the graph -----------------------------------------------------------------------------------
    def logits(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        """One run: (B, S) -> (B, num_labels), or multiple choice (B, N, S) -> (B, N); float32."""
        out = self.session.run([self.output], {"input_ids": input_ids, "attention_mask": attention_mask})[0]
        return out.astype(np.float32, copy=False)

    # -- examples ------------------------------------------------------------------------------------
    def example_rows(self, example) -> list[list[int]]:
        """An example (text, a pair, (context, choices) or a mapping of the task's fields) -> its token rows."""
        return self._rows(example_fields(self.task, example))

    def _rows(self, fields: dict) -> list[list[int]]:
        encoded = {k: ([encode(self.tokenizer, check_text(c, k)) for c in v] if k == CHOICES
                       else encode(self.tokenizer, check_text(v, k))) for k, v in fields.items()}
        return rows(self.task, encoded, self.manifest.shape.context_length)

    def classify(self, example) -> Classification:
        return self.classify_batch([example])[0]

    def classify_batch(self, examples: Sequence, batch_size: int = DEFAULT_BATCH) -> list[Classification]:
        """Examples -> one Classification each; batch_size: token rows per run (similarity: 2 rows an example;
        multiple choice: examples with the same number of choices N run together, batch_size // N a run, at
        least one)."""
        if isinstance(examples, (str, bytes)) or not isinstance(examples, Sequence):
            raise TypeError(f"classify_batch() takes a list of examples, got {type(examples).__name__}")
        if isinstance(batch_size, bool) or not (isinstance(batch_size, int) and batch_size >= 1):
            raise InvalidArgumentError(f"batch_size must be an integer >= 1, got {batch_size!r}")
        fields = [example_fields(self.task, e) for e in examples]
        choices = [f[CHOICES] for f in fields] if self.choice else None
        return self.classify_rows([self._rows(f) for f in fields], batch_size, choices)

    def classify_rows(self, example_rows: Sequence[list[list[int]]], batch_size: int = DEFAULT_BATCH,
                      choices: Sequence | None = None) -> list[Classification]:
        """Each example's token rows (example_rows) -> its Classification; choices: the choice texts (labels)."""
        logits = self._choice_logits(example_rows, batch_size) if self.choice else self._row_logits(example_rows,
                                                                                                    batch_size)
        out = []
        for i, lg in enumerate(logits):
            labels = tuple(choices[i]) if choices is not None else (
                tuple(self.task.labels()) if not self.choice else tuple(f"choice {k}" for k in range(len(lg))))
            out.append(Classification(labels, tuple(float(x) for x in lg), tuple(float(p) for p in softmax(lg)),
                                      self.choice))
        return out

    def _row_logits(self, example_rows: Sequence[list[list[int]]], batch_size: int) -> list[np.ndarray]:
        """Sequence head: every example's rows run in batches of rows; similarity adds its two rows' logits
        (the head is linear without bias: the sum of the heads is the head of the summed states)."""
        flat = [r for ex in example_rows for r in ex]
        per_row = np.concatenate([self.logits(*pad_rows(flat[i:i + batch_size], self.task.pad_id))
                                  for i in range(0, len(flat), batch_size)]) if flat else np.zeros((0, 0))
        out, at = [], 0
        for ex in example_rows:
            part = per_row[at:at + len(ex)]  # (rows, L)
            at += len(ex)
            out.append(part.sum(axis=0) if self.task.transformation.combine == COMBINE_SUM else part[0])
        return out

    def _choice_logits(self, example_rows: Sequence[list[list[int]]], batch_size: int) -> list[np.ndarray]:
        """Multiple choice: examples with the same number of choices as one (b, N, S) run -> (N,) each."""
        out: list[np.ndarray | None] = [None] * len(example_rows)
        by_n: dict[int, list[int]] = {}
        for i, ex in enumerate(example_rows):
            by_n.setdefault(len(ex), []).append(i)
        for n, members in by_n.items():
            per_run = max(1, batch_size // n)  # batch_size counts token rows: one example is n rows
            for j in range(0, len(members), per_run):
                part = members[j:j + per_run]
                ids, mask = pad_rows([r for i in part for r in example_rows[i]], self.task.pad_id)
                lg = self.logits(ids.reshape(len(part), n, -1), mask.reshape(len(part), n, -1))  # (b, N)
                for i, row in zip(part, lg, strict=True):
                    out[i] = row
        return out  # type: ignore[return-value]


class HeadFeeds:
    """Calibration feeds (static quantization) for a task head's graph: a window of text (1, L) as one row
    ending with the extract token, so the head's input is calibrated on the state it reads."""

    def __init__(self, task: Task):
        self.task = task

    def calibration_feeds(self, input_ids: np.ndarray, shape) -> dict[str, np.ndarray]:
        ids = input_ids.copy()
        if self.task.special_tokens.extract is not None:
            ids[:, -1] = self.task.special_tokens.extract
        if self.task.transformation.combine == COMBINE_CHOICES:
            ids = ids[:, None, :]  # (1, 1, L): one example, one choice
        return {"input_ids": ids, "attention_mask": np.ones_like(ids)}


def check_head_graph(session, manifest: Manifest, graph: Path) -> None:
    """I/O names as the manifest says, special ids inside the vocabulary, and a probe run of the task's shape."""
    task = manifest.task
    for kind, declared, actual in (("input", manifest.inputs, [i.name for i in session.get_inputs()]),
                                   ("output", manifest.outputs, [o.name for o in session.get_outputs()])):
        if sorted(declared) != sorted(actual):
            raise ModelDirError(f"{graph}: graph does not match {MANIFEST_NAME}: its {kind}s are {actual}, "
                                f"the manifest says {list(declared)}")
    tr = task.transformation
    if tr.combine not in (COMBINE_ONE, COMBINE_SUM, COMBINE_CHOICES):
        raise ModelDirError(f"{graph.parent}: {MANIFEST_NAME}'s task combines rows as {tr.combine!r}, not one of "
                            f"{COMBINE_ONE}, {COMBINE_SUM}, {COMBINE_CHOICES}")
    unknown = [p for seq in tr.sequences for p in seq if p not in (*SPECIAL_ROLES, *tr.fields, CHOICE)]
    if unknown:
        raise ModelDirError(f"{graph.parent}: {MANIFEST_NAME}'s task template names {unknown[0]!r}, neither a field "
                            f"({', '.join(tr.fields)}) nor a special token")
    missing = [r for r in tr.special_roles() if getattr(task.special_tokens, r) is None]
    if missing:
        raise ModelDirError(f"{graph.parent}: {MANIFEST_NAME}'s task uses the {missing[0]} token but records no id "
                            "for it")
    vocab = manifest.shape.vocab_size
    for role in SPECIAL_ROLES:
        tid = getattr(task.special_tokens, role)
        if tid is not None and not 0 <= tid < vocab:
            raise ModelDirError(f"{graph.parent}: {MANIFEST_NAME} says the {role} token is {tid}, outside the "
                                f"model's vocabulary (0..{vocab - 1})")
    choice = task.transformation.combine == COMBINE_CHOICES
    shape = (1, 1, 2) if choice else (1, 2)
    try:
        out = session.run(None, {"input_ids": np.zeros(shape, np.int64), "attention_mask": np.ones(shape, np.int64)})[0]
    except Exception as e:  # ONNX Runtime raises its own types; the first line says what broke
        raise ModelDirError(f"{graph}: the graph does not run ({str(e).splitlines()[0][:160]})") from None
    want = (1, 1) if choice else (1, len(task.id2label))
    if tuple(out.shape) != want:
        raise ModelDirError(f"{graph}: {MANIFEST_NAME} says task {task.name} with {want[-1]} outputs, the graph "
                            f"gives {list(out.shape)}")


def load_classifier(model_dir: str | Path, device: str = "auto", session: SessionConfig | None = None) -> Classifier:
    """Load a classifier dir (one gptedge export --task wrote, or quantize made from one) -> Classifier."""
    if not isinstance(model_dir, (str, os.PathLike)):
        raise TypeError(f"load_classifier() takes a model directory path, got {type(model_dir).__name__}")
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise ModelDirError(f"{model_dir}: no such model directory")
    started = time.perf_counter()
    manifest = read_manifest(model_dir)
    if manifest.task is None:
        raise ModelDirError(f"{model_dir} is a language model, not a classifier (its {MANIFEST_NAME} names no task): "
                            "use gptedge generate / gptedge.runtime.load")
    ort_session, graph, tokenizer = open_checked_session(model_dir, manifest, False, device, session)
    check_head_graph(ort_session, manifest, graph)
    if (session or SessionConfig()).trim_heap:
        trim_heap()  # what the load freed leaves the process (runtime/graphs/heap_trim.py)
    return Classifier(model_dir, manifest, ort_session, device, time.perf_counter() - started, tokenizer)
