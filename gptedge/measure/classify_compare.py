"""gptedge compare for classifier dirs: every dir on one labelled JSONL set, one row each.

    rows = compare_classifiers([load_classifier(d) for d in dirs], examples, gold)

Per dir: accuracy against the gold labels; agreement with the first dir (the reference, normally fp32) in
argmax label; mean KL(reference || dir) over the label distribution (softmax over the labels, or over the
choices for multiple choice); the confusion matrix (rows gold, columns predicted); size on disk; and speed in
examples per second at batch 1 and 32.

A labelled line is what `gptedge classify --jsonl` reads (the task's fields) plus "label": the gold label's
name for a sequence task (one of the manifest's id2label), or the gold choice's index for multiple choice.

Speed: each example's token rows are built once per dir (tokenization is the same work for every dir and is
not timed); then one warm-up run of the first batch, then `repeats` timed passes over every example; the
figure is examples / the median pass time. Batch B is B examples a run: B rows for classification and
entailment, 2B for similarity (its two orders), B examples of N choices for multiple choice.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from gptedge.runtime.classify import Classifier
from gptedge.runtime.errors import InvalidArgumentError
from gptedge.runtime.modeldir.manifest import Manifest
from gptedge.runtime.modeldir.tasks import CHOICES, COMBINE_CHOICES, Task, example_fields, read_jsonl

from .compare import graph_size

log = logging.getLogger(__name__)

LABEL = "label"  # the gold field of a labelled line
SPEED_BATCHES = (1, 32)  # examples a run, as the issue asks
Progress = Callable[[int, int], None]


@dataclass
class ClassifierRow:
    model: str
    task: str
    precision: str
    method: str
    size_bytes: int
    examples: int
    accuracy: float  # argmax == gold, over the examples
    agreement: float  # argmax == the reference's argmax (the first row is the reference: 1.0)
    kl: float  # mean over examples of KL(reference || this) over the labels, nats (the reference: 0.0)
    examples_per_s_batch1: float  # median of the timed passes (module doc)
    examples_per_s_batch32: float
    labels: list[str]  # the confusion matrix's row and column names (multiple choice: "choice k")
    confusion: list[list[int]]  # [gold][predicted] counts

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class LabelledSet:
    examples: list[dict]  # the task's fields only
    gold: list[int]  # the gold label's index (sequence task) or the gold choice's index (multiple choice)


def check_classifier_dirs(manifests: Sequence[tuple[str, Manifest]]) -> Task:
    """Refuse, before any work, dirs compare cannot put in one table: a language model among classifiers,
    different tasks, or different label sets (the columns of the confusion matrix must mean the same)."""
    ref_name, ref = manifests[0]
    for name, m in manifests:
        if m.task is None:
            classifier = next(n for n, x in manifests if x.task is not None)
            raise InvalidArgumentError(f"{name} is a language model and {classifier} a classifier: compare takes "
                                       "language-model dirs (--text) or classifier dirs (--labelled), not both")
    task = ref.task
    for name, m in manifests[1:]:
        if m.task.name != task.name:
            raise InvalidArgumentError(f"{name} is a classifier for task {m.task.name}, the reference {ref_name} for "
                                       f"{task.name}: only dirs of one task can be compared")
        if m.task.labels() != task.labels():
            raise InvalidArgumentError(f"{name} has the labels {m.task.labels()}, the reference {ref_name} "
                                       f"{task.labels()}: only dirs with one label set can be compared")
    return task


def read_labelled(task: Task, text: str, what: str = "JSONL") -> LabelledSet:
    """The JSONL text -> the examples and their gold indices; a line without a valid label is refused in one
    line naming it (line numbers count blank lines, as read_jsonl's do)."""
    numbers = [n for n, line in enumerate(text.split("\n"), 1) if line.strip()]
    objects = read_jsonl(text, what)
    labels = task.labels()
    choice = task.transformation.combine == COMBINE_CHOICES
    examples, gold = [], []
    for n, obj in zip(numbers, objects, strict=True):
        try:
            fields = example_fields(task, obj)
        except InvalidArgumentError as e:
            raise InvalidArgumentError(f"{what} line {n}: {e}") from None
        if LABEL not in obj:
            raise InvalidArgumentError(f"{what} line {n}: no {LABEL!r} (the gold "
                                       + ("choice's index)" if choice else f"label, one of {labels})"))
        value = obj[LABEL]
        if choice:
            n_choices = len(fields[CHOICES])
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < n_choices:
                raise InvalidArgumentError(f"{what} line {n}: label {value!r} is not a choice index "
                                           f"(0..{n_choices - 1})")
            gold.append(value)
        else:
            if not isinstance(value, str) or value not in labels:
                raise InvalidArgumentError(f"{what} line {n}: label {value!r} is not one of the model's "
                                           f"labels {labels}")
            gold.append(labels.index(value))
        examples.append(fields)
    return LabelledSet(examples, gold)


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """(N,) -> (N,) in float64."""
    z = logits.astype(np.float64) - logits.max()
    return z - np.log(np.exp(z).sum())


def examples_per_s(clf: Classifier, example_rows: list[list[list[int]]], batch: int, repeats: int) -> float:
    """Examples a second at `batch` examples a run: one warm-up run, then the median of `repeats` timed passes."""
    # classify_rows counts token rows a run: an example is one row a template (similarity 2), or one a choice
    per_example = max(len(r) for r in example_rows) if clf.choice else len(clf.task.transformation.sequences)
    rows_per_run = batch * per_example
    clf.classify_rows(example_rows[:batch], rows_per_run)  # warm-up: ONNX Runtime's first run of a shape
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        clf.classify_rows(example_rows, rows_per_run)
        times.append(time.perf_counter() - started)
    return len(example_rows) / max(statistics.median(times), 1e-9)


def compare_classifiers(classifiers: Sequence[Classifier], labelled: LabelledSet, repeats: int = 3,
                        progress: Progress | None = None) -> list[ClassifierRow]:
    """classifiers[0] is the reference; each, the reference included, gets a row, in order."""
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise InvalidArgumentError(f"repeats must be an integer >= 1, got {repeats!r}")
    check_classifier_dirs([(str(c.model_dir), c.manifest) for c in classifiers])
    gold = np.asarray(labelled.gold)  # (E,)
    choice = classifiers[0].choice
    n_classes = (max(len(e[CHOICES]) for e in labelled.examples) if choice
                 else len(classifiers[0].task.labels()))
    names = [f"choice {k}" for k in range(n_classes)] if choice else classifiers[0].task.labels()
    ref_logp: list[np.ndarray] = []
    ref_top: np.ndarray | None = None
    rows = []
    for i, clf in enumerate(classifiers):
        example_rows = [clf.example_rows(e) for e in labelled.examples]
        results = clf.classify_rows(example_rows, SPEED_BATCHES[-1] if choice else
                                    SPEED_BATCHES[-1] * len(clf.task.transformation.sequences))
        logp = [log_softmax(np.asarray(r.logits)) for r in results]  # (labels,) or (choices,) each
        top = np.array([r.index for r in results])  # (E,)
        if i == 0:
            ref_logp, ref_top = logp, top
        kl = [float((np.exp(p) * (p - q)).sum()) for p, q in zip(ref_logp, logp, strict=True)]
        confusion = np.zeros((n_classes, n_classes), dtype=np.int64)
        np.add.at(confusion, (gold, top), 1)
        speeds = [examples_per_s(clf, example_rows, b, repeats) for b in SPEED_BATCHES]
        m = clf.manifest
        q = m.quantization
        rows.append(ClassifierRow(
            model=str(clf.model_dir), task=m.task.name, precision=m.precision, method=q.label if q else m.precision,
            size_bytes=graph_size(clf.model_dir, m), examples=len(gold),
            accuracy=float((top == gold).mean()), agreement=float((top == ref_top).mean()),
            kl=float(np.mean(kl)), examples_per_s_batch1=speeds[0], examples_per_s_batch32=speeds[1],
            labels=list(names), confusion=confusion.tolist()))
        log.info("%s: accuracy %.4f, agreement %.4f, KL %.3g", clf.model_dir, rows[-1].accuracy,
                 rows[-1].agreement, rows[-1].kl)
        if progress:
            progress(i + 1, len(classifiers))
    return rows

