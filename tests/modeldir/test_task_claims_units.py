"""A classifier manifest's task claims against the registry and tokenizer_config.json (runtime/checks/task_claims.py),
on hand-made manifests and a stand-in tokenizer: each line as verify prints it, and the limits of the vocabulary on
both sides (0 and vocab - 1 pass, -1 and vocab fail). No model is built: plain objects only."""

from __future__ import annotations

import dataclasses

import pytest

from gptedge.runtime.checks.task_claims import task_problems
from gptedge.runtime.modeldir.manifest import Manifest, ModelShape
from gptedge.runtime.modeldir.tasks import SpecialTokens, Task, Transformation, plain_transformation, transformation

VOCAB = 100
SHAPE = ModelShape("gpt2", 2, 4, 8, VOCAB, 64)
SAYS = "gptedge.json says"


class Tokenizer:
    """The two lookups task_claims makes of a tokenizers.Tokenizer."""

    tokens = {7: "<s>", 8: "<sep>", 9: "<cls>", 50: "word"}

    def id_to_token(self, i):
        return self.tokens.get(i)

    def token_to_id(self, t):
        return next((i for i, s in self.tokens.items() if s == t), None)


DECLARED = {"bos_token": "<s>", "sep_token": "<sep>", "cls_token": "<cls>"}


def task(name="entailment", **change) -> Task:
    head = "multiple-choice" if name == "multiple-choice" else "sequence-classification"
    t = Task(name, head, transformation(name), SpecialTokens(start=7, delimiter=8, extract=9), pad_id=0)
    return dataclasses.replace(t, **change)


def problems(t: Task | None, tokenizer=None, declared=None) -> list[str]:
    return task_problems(Manifest(SHAPE, task=t), tokenizer, declared)


@pytest.mark.parametrize("name", ["classification", "entailment", "similarity", "multiple-choice"])
def test_each_tasks_line_and_its_plain_templates_pass(name):
    assert problems(task(name), Tokenizer(), DECLARED) == []
    for pad_declared in (True, False):
        assert problems(task(name, transformation=plain_transformation(name, pad_declared),
                             special_tokens=SpecialTokens()), Tokenizer(), DECLARED) == []


def test_a_language_model_has_no_task_problem():
    assert problems(None) == []


def test_an_unknown_task_is_one_line_and_nothing_else():
    assert problems(dataclasses.replace(task(), name="summarize")) == [
        f"{SAYS} task 'summarize', which is not one of classification, entailment, similarity, multiple-choice: "
        "no runtime knows how to feed it"]


def test_an_unknown_combine_is_named():
    t = task(transformation=dataclasses.replace(transformation("entailment"), combine="max"))
    assert problems(t) == ["gptedge.json's task combines rows as 'max', not one of one, sum, choices"]


def test_a_template_part_that_is_neither_field_nor_special_token_is_named():
    line = transformation("entailment")
    t = task(transformation=dataclasses.replace(line, sequences=(("start", "premise", "delimiter", "hypthesis",
                                                                  "extract"),)))
    assert problems(t) == ["gptedge.json's task template names 'hypthesis', neither a field (premise, hypothesis) "
                           "nor a special token"]
    # multiple choice's "choice" stands for each choice: not unknown
    assert problems(task("multiple-choice")) == []


def test_a_special_token_the_template_uses_without_an_id():
    assert problems(task(special_tokens=SpecialTokens(start=7, delimiter=8))) == [
        "gptedge.json's task uses the extract token but records no id for it"]
    assert problems(task(special_tokens=SpecialTokens(extract=9))) == [
        "gptedge.json's task uses the start token but records no id for it"]


def test_a_head_that_reads_an_unknown_token():
    t = task(transformation=dataclasses.replace(transformation("entailment"), reads="first"))
    assert problems(t) == [f"{SAYS} the head reads the 'first' token, not one of last, last-non-pad"]


def test_a_template_that_lost_its_extract_step_is_neither_line():
    line = transformation("entailment")
    t = task(transformation=dataclasses.replace(line, sequences=(("start", "premise", "delimiter", "hypothesis"),)))
    assert problems(t) == [
        f"{SAYS} task entailment with the template start premise delimiter hypothesis (one), which is neither "
        "entailment's (start premise delimiter hypothesis extract) nor its plain one (premise hypothesis)"]
    # another task's line under this name; the line with another combine
    similar = dataclasses.replace(line, fields=("a", "b"), sequences=transformation("similarity").sequences)
    assert len(problems(task(transformation=similar))) == 1
    t = task("similarity", transformation=dataclasses.replace(transformation("similarity"), combine="one"))
    assert problems(t)[0].startswith(f"{SAYS} task similarity with the template ")


def test_the_plain_template_compared_with_its_own_reads():
    # a plain template read at the last token where the pad is declared (and the reverse) is still the plain line
    for reads in ("last", "last-non-pad"):
        plain = dataclasses.replace(plain_transformation("classification"), reads=reads)
        assert problems(task("classification", transformation=plain, special_tokens=SpecialTokens())) == []
    # the paper's line read at the last non-pad token is not the paper's line's fields/sequences: still allowed
    t = task(transformation=dataclasses.replace(transformation("entailment"), reads="last-non-pad"))
    assert problems(t) == []


def test_the_head_must_be_the_tasks():
    assert problems(task(head="multiple-choice")) == [
        f"{SAYS} task entailment on a multiple-choice head; entailment runs on a sequence-classification head"]


@pytest.mark.parametrize("pad, ok", [(0, True), (VOCAB - 1, True), (-1, False), (VOCAB, False)])
def test_the_pad_id_inside_the_vocabulary_on_both_sides(pad, ok):
    found = problems(task(pad_id=pad))
    assert found == ([] if ok else [f"{SAYS} the task's pad id {pad}, outside the model's vocabulary (0..99)"])


@pytest.mark.parametrize("tid, ok", [(0, True), (VOCAB - 1, True), (-1, False), (VOCAB, False)])
def test_each_special_id_inside_the_vocabulary_on_both_sides(tid, ok):
    found = problems(task(special_tokens=SpecialTokens(start=7, delimiter=tid, extract=9)))
    assert found == ([] if ok else [f"{SAYS} the delimiter token is {tid}, outside the model's vocabulary (0..99)"])


def test_a_special_id_that_is_not_the_token_tokenizer_config_declares():
    t = task(special_tokens=SpecialTokens(start=7, delimiter=8, extract=50))
    assert problems(t, Tokenizer(), DECLARED) == [
        f"{SAYS} the extract token is 50, which is 'word' in tokenizer.json; tokenizer_config.json declares "
        "'<cls>' (cls_token) = 9"]
    t = task(special_tokens=SpecialTokens(start=8, delimiter=7, extract=9))
    found = problems(t, Tokenizer(), DECLARED)
    assert found == [f"{SAYS} the start token is 8, which is '<sep>' in tokenizer.json; tokenizer_config.json "
                     "declares '<s>' (bos_token) = 7",
                     f"{SAYS} the delimiter token is 7, which is '<s>' in tokenizer.json; tokenizer_config.json "
                     "declares '<sep>' (sep_token) = 8"]


def test_the_declared_tokens_are_compared_only_when_there_is_something_to_compare():
    t = task(special_tokens=SpecialTokens(start=7, delimiter=8, extract=50))
    assert problems(t, None, DECLARED) == []  # no tokenizer
    assert problems(t, Tokenizer(), None) == []  # no tokenizer_config.json
    assert problems(t, Tokenizer(), ["cls_token"]) == []  # not a JSON object
    assert problems(t, Tokenizer(), {"cls_token": {"content": "<cls>"}}) == []  # an AddedToken dict: not a string
    assert problems(t, Tokenizer(), {"bos_token": "<s>"}) == []  # the extract role not declared
    # an id outside the vocabulary is that line only, not also a declared-token line
    t = task(special_tokens=SpecialTokens(start=7, delimiter=8, extract=VOCAB))
    assert problems(t, Tokenizer(), DECLARED) == [
        f"{SAYS} the extract token is {VOCAB}, outside the model's vocabulary (0..99)"]


def test_every_problem_is_listed_in_order():
    line = transformation("entailment")
    t = task(transformation=Transformation(line.fields, (("start", "premise", "x", "extract"),), "max", "first"),
             special_tokens=SpecialTokens(start=7), head="multiple-choice", pad_id=-1)
    assert [p.split(" ", 3)[:3] for p in problems(t)] == [
        ["gptedge.json's", "task", "combines"], ["gptedge.json's", "task", "template"],
        ["gptedge.json's", "task", "uses"], ["gptedge.json", "says", "the"], ["gptedge.json", "says", "task"],
        ["gptedge.json", "says", "the"]]


def test_a_recorded_id_after_an_unrecorded_role_is_still_checked():
    """A plain template records no start token; an extract id it does record is still checked."""
    t = task("classification", transformation=plain_transformation("classification"),
             special_tokens=SpecialTokens(extract=VOCAB))
    assert problems(t) == [f"{SAYS} the extract token is {VOCAB}, outside the model's vocabulary (0..99)"]
