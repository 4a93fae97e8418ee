"""/v1/classify as data: parse and check a request body, build the response and the model card's task fields.

No HTTP and no model here (as openai_schema.py for completions). The shapes
(docs/serving.md#serving-a-classifier-post-v1classify):

    request   {"model": "entail", "input": EXAMPLE or [EXAMPLE, ...]}       model optional
    EXAMPLE   "text"                                   classification
              ["premise", "hypothesis"] or {"premise": .., "hypothesis": ..}   entailment
              ["a", "b"] or {"a": .., "b": ..}           similarity
              ["context", ["choice", ...]] or {"context": .., "choices": [..]}   multiple choice
    response  {"id", "object": "classification", "created", "model",
               "data": [{"index", "label", "label_index", "probabilities", "logits"}, ...],
               "usage": {"prompt_tokens", "total_tokens"}}

`input` is one example when it is a string or an object, or (tasks of two fields) a list whose first item
is a string: such a task's first field is always text, so a list of examples starts with a list or an
object. Otherwise `input` is a list of examples, and `data` has one entry each, in order (`index`).
`probabilities` maps each label to its probability (in label-index order) for a sequence head with
distinct labels, and is a list (in choice order) for multiple choice, whose labels are the example's own
choices (they may repeat). `logits` are the head's raw outputs in the same order.
"""

from __future__ import annotations

from dataclasses import dataclass

from gptedge.runtime.modeldir.tasks import COMBINE_CHOICES, Task

from .openai_schema import ApiError, bad, check_body_fields

KNOWN_FIELDS = frozenset({"model", "input", "user"})
TEXT_GENERATION = "text-generation"  # /v1/models' task of a language model
CLASSIFICATION = "classification"  # /v1/models' task of every classifier dir (task_name says which)


@dataclass(frozen=True)
class ClassifyParams:
    model: str | None
    examples: tuple  # each as the client sent it (a string, a list or an object); Classifier checks its fields


def parse_classify_request(body, task: Task, max_examples: int) -> ClassifyParams:
    """A decoded JSON body -> ClassifyParams, or ApiError (400 naming the bad parameter, 413 too many examples).
    Each example's fields are checked when it is tokenized (the caller), with the example's index."""
    check_body_fields(body, KNOWN_FIELDS)
    model = body.get("model")
    if model is not None and (not isinstance(model, str) or not model):
        raise bad("model", "model must be a non-empty string (see GET /v1/models) or absent")
    if body.get("user") is not None and not isinstance(body["user"], str):
        raise bad("user", "user must be a string")
    if "input" not in body:
        raise bad("input", f"input is required: one example or a list of them ({describe_example(task)})")
    value = body["input"]
    examples = (value,) if one_example(value, task) else tuple(value) if isinstance(value, list) else None
    if examples is None:
        raise bad("input", f"input must be one example or a list of them ({describe_example(task)})")
    if not examples:
        raise bad("input", "input is an empty list: send at least one example")
    if len(examples) > max_examples:
        raise ApiError(413, f"input holds {len(examples):,} examples; this server takes at most {max_examples:,} a "
                            "request (--max-examples)", param="input", code="too_many_examples")
    return ClassifyParams(model, examples)


def one_example(value, task: Task) -> bool:
    if isinstance(value, (str, dict)):
        return True
    return isinstance(value, list) and len(task.transformation.fields) > 1 and bool(value) and isinstance(
        value[0], str)


def describe_example(task: Task) -> str:
    """What one example of this task looks like, for error messages: 'an example is "text"', etc."""
    fields = task.transformation.fields
    if len(fields) == 1:
        return f'{task.name}: an example is a string or {{"{fields[0]}": ...}}'
    if task.transformation.combine == COMBINE_CHOICES:
        return (f'{task.name}: an example is ["{fields[0]}", ["choice", ...]] or '
                f'{{"{fields[0]}": ..., "{fields[1]}": [...]}}')
    return (f'{task.name}: an example is ["{fields[0]}", "{fields[1]}"] or '
            f'{{"{fields[0]}": ..., "{fields[1]}": ...}}')


def text_fields(fields: dict) -> list[str]:
    """An example's checked fields (example_fields) -> its texts (choices flattened), for the byte check."""
    return [t for v in fields.values() for t in (v if isinstance(v, list) else [v])]


def classification(index: int, result, keyed: bool) -> dict:
    """One data entry. keyed: probabilities as {label: p} (a sequence head with distinct labels), else a list."""
    probabilities = dict(zip(result.labels, result.probabilities, strict=True)) if keyed else list(result.probabilities)
    return {"index": index, "label": result.label, "label_index": result.index, "probabilities": probabilities,
            "logits": list(result.logits)}


def task_card(task: Task, context_length: int) -> dict:
    """/v1/models' fields for a classifier: what it does, what an example holds, which labels it answers."""
    choice = task.transformation.combine == COMBINE_CHOICES
    return {"task": CLASSIFICATION, "task_name": task.name, "endpoint": "/v1/classify",
            "input_fields": list(task.transformation.fields),
            "labels": None if choice else task.labels(),  # multiple choice: each example's own choices
            "context_length": context_length}


def generation_card(context_length: int) -> dict:
    return {"task": TEXT_GENERATION, "endpoint": "/v1/completions", "context_length": context_length}
