"""The original GPT's fine-tuned tasks as data: a head on the extract token's state plus an input transformation.

The GPT paper (§3.3) turns structured inputs into token rows the one decoder reads:

    classification   start text extract
    entailment       start premise delimiter hypothesis extract
    similarity       start a delimiter b extract  +  start b delimiter a extract   (both orders, summed)
    multiple choice  start context delimiter choice_k extract, one row per choice   (softmax across choices)

A task's transformation is its line in runtime/registry.py (TASKS), copied into the manifest at export
(`Task`), so the runtime builds rows from the manifest alone and a future task is one more line. The
graph reads the extract token's state at each row's last attended position (rows are right-padded), so
every template ends with "extract".

Similarity sums the two orders' states before the head (the paper). The sequence-classification head is
transformers' `score`, a linear map without bias, so score(h_ab + h_ba) = score(h_ab) + score(h_ba): the
graph outputs per-row logits and the runtime adds the two rows' logits, which is the same sum taken after
the head (export refuses a head with a bias for similarity).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ..errors import InvalidArgumentError, PromptTooLongError
from ..registry import TASKS

START, DELIMITER, EXTRACT = "start", "delimiter", "extract"
SPECIAL_ROLES = (START, DELIMITER, EXTRACT)
# role -> the transformers special-token attribute a checkpoint (and a classifier dir's tokenizer_config.json)
# declares it as; transformers' own DoubleHeads example adds its extract token as `cls_token`
DECLARED_AS = {START: "bos_token", DELIMITER: "sep_token", EXTRACT: "cls_token"}
CHOICES, CHOICE = "choices", "choice"  # the multiple-choice field, and the template's stand-in for one of them
HEAD_SEQUENCE = "sequence-classification"  # transformers' *ForSequenceClassification `score` (num_labels)
HEAD_CHOICE = "multiple-choice"  # transformers' *DoubleHeadsModel `multiple_choice_head` (one logit a row)
COMBINE_ONE, COMBINE_SUM, COMBINE_CHOICES = "one", "sum", "choices"
# Which token of a row the head reads. "last": the row's last token (the paper's extract token, or the text's last
# token); "last-non-pad": the last token that is not the pad id, as transformers' *ForSequenceClassification pools
# (a text ending in its pad token, often end-of-text, is read before it).
READS_LAST, READS_LAST_NON_PAD = "last", "last-non-pad"
READS = (READS_LAST, READS_LAST_NON_PAD)


@dataclass(frozen=True)
class Transformation:
    fields: tuple[str, ...]  # what a caller gives for one example
    sequences: tuple[tuple[str, ...], ...]  # token templates: a special role or a field ("choice": each choice)
    combine: str  # "one" row; "sum" of the rows' logits; "choices": one row and one logit per choice
    reads: str = READS_LAST  # READS: the token whose state the head reads

    def special_roles(self) -> tuple[str, ...]:
        """The special tokens the templates use, in SPECIAL_ROLES order."""
        used = {part for seq in self.sequences for part in seq}
        return tuple(r for r in SPECIAL_ROLES if r in used)


@dataclass(frozen=True)
class SpecialTokens:
    """The ids of the special tokens the checkpoint declares (None: not declared)."""

    start: int | None = None
    delimiter: int | None = None
    extract: int | None = None


@dataclass(frozen=True)
class Task:
    """The manifest's `task` (absent: the dir is a language model)."""

    name: str  # a TASKS member
    head: str  # HEAD_SEQUENCE or HEAD_CHOICE
    transformation: Transformation
    special_tokens: SpecialTokens = field(default_factory=SpecialTokens)
    id2label: dict[str, str] = field(default_factory=dict)  # class index (as a string, JSON's keys) -> label
    pad_id: int = 0  # what right padding holds (masked, never read)

    def labels(self) -> list[str]:
        """The label of each logit of the sequence head, in index order (LABEL_i where id2label is silent)."""
        n = len(self.id2label)
        return [self.id2label.get(str(i), f"LABEL_{i}") for i in range(n)]


def article(word: str) -> str:
    """'an' before a task name that starts with a vowel ('an entailment classifier'), else 'a' (an empty word too:
    '' is in every string, so the first letter is looked up among the vowels, not as a substring)."""
    return "an" if word[:1].lower() in tuple("aeiou") else "a"


def transformation(name: str) -> Transformation:
    """A task's line (runtime/registry.py) as the manifest records it."""
    TASKS.check(name)
    e = TASKS.entry(name)
    return Transformation(fields=e.fields, sequences=e.sequences, combine=e.combine)


def plain_transformation(name: str, pad_declared: bool = True) -> Transformation:
    """A task's plain template: its line without the special tokens (the text alone; a pair's fields one after the
    other), the head on the last non-padding token. What transformers' GPT2ForSequenceClassification runs on a
    checkpoint fine-tuned with no added tokens (pad_declared False: its config names no pad_token_id, and
    transformers then reads each row's last token)."""
    line = transformation(name)
    sequences = tuple(tuple(p for p in seq if p not in SPECIAL_ROLES) for seq in line.sequences)
    return Transformation(fields=line.fields, sequences=sequences, combine=line.combine,
                          reads=READS_LAST_NON_PAD if pad_declared else READS_LAST)


def is_plain(t: Transformation) -> bool:
    return not t.special_roles()


TASK = transformation  # what the registry's lines name (TASKS.load(name)(name))


def example_fields(task: Task, example: Mapping | str | Sequence) -> dict:
    """An example as text, a pair / (context, choices), or a mapping of the task's fields -> that mapping,
    refused in one line when a field is missing or of the wrong kind."""
    fields = task.transformation.fields
    if isinstance(example, str):
        example = {fields[0]: example} if len(fields) == 1 else example
    if isinstance(example, (list, tuple)) and not isinstance(example, str):
        if len(example) != len(fields):
            raise InvalidArgumentError(f"{task.name} takes {len(fields)} fields ({', '.join(fields)}), "
                                       f"got {len(example)}")
        example = dict(zip(fields, example, strict=False))
    if not isinstance(example, Mapping):
        raise InvalidArgumentError(f"{task.name} takes {len(fields)} fields ({', '.join(fields)}) as a list or a "
                                   f"mapping, got {type(example).__name__}"
                                   + (" (on the command line: --pair A B, or TEXT --choice ...)"
                                      if isinstance(example, str) else ""))
    for name in fields:
        value = example.get(name)
        if name == CHOICES:
            ok = isinstance(value, (list, tuple)) and len(value) >= 1 and all(isinstance(v, str) for v in value)
            if not ok:
                raise InvalidArgumentError(f"{task.name}: {CHOICES!r} must be a non-empty list of strings")
        elif not isinstance(value, str):
            raise InvalidArgumentError(f"{task.name}: field {name!r} must be a string, got {value!r}")
    return {name: example[name] for name in fields}


def rows(task: Task, encoded: Mapping[str, list[int] | list[list[int]]], context_length: int) -> list[list[int]]:
    """One example's fields as token ids (choices: one list per choice) -> its token rows, per the templates."""
    special = {r: getattr(task.special_tokens, r) for r in SPECIAL_ROLES}
    choices = encoded.get(CHOICES) if task.transformation.combine == COMBINE_CHOICES else [None]
    out = []
    for template in task.transformation.sequences:
        for choice in choices:
            row: list[int] = []
            for part in template:
                if part in special:
                    row.append(special[part])
                else:
                    row.extend(choice if part == CHOICE else encoded[part])
            if task.transformation.reads == READS_LAST_NON_PAD:
                row = _before_trailing_pad(row, task.pad_id)
            if len(row) > context_length:
                raise PromptTooLongError(f"{task.name}: an input of {len(row)} tokens (with its special tokens) "
                                         f"does not fit the model's {context_length} positions")
            out.append(row)
    return out


def _before_trailing_pad(row: list[int], pad_id: int) -> list[int]:
    """The row up to its last token that is not pad_id (transformers reads that token's state; what follows it is
    padding to transformers, so it is left out here); a row of pad ids only keeps its first token (transformers'
    argmax over no non-pad token is position 0)."""
    end = len(row)
    while end > 1 and row[end - 1] == pad_id:
        end -= 1
    return row[:end]


def read_jsonl(text: str, what: str = "JSONL") -> list[dict]:
    """One JSON object a line (blank lines skipped) -> the objects; a line that is not one is refused in one line
    naming it. Each object holds a task's fields (and, for compare, a "label"). Lines end at "\n" only (JSON Lines'
    rule): str.splitlines would also split at U+2028, U+2029 or U+0085 inside a valid JSON string."""
    out = []
    for n, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except ValueError as e:
            raise InvalidArgumentError(f"{what} line {n}: not JSON ({str(e).splitlines()[0][:80]})") from None
        except RecursionError:  # json's C decoder nests one frame per [ or {: an example is never this deep
            raise InvalidArgumentError(f"{what} line {n}: JSON nested too deeply to be an example") from None
        if not isinstance(value, dict):
            raise InvalidArgumentError(f"{what} line {n}: not a JSON object")
        out.append(value)
    if not out:
        raise InvalidArgumentError(f"{what}: no examples")
    return out
