"""The engine's admission policy (runtime/serving/admission.py) on plain numbers: no model, no thread.

tests/serve/test_engine_prefill.py checks that the engine carries the plan out (the runs a real pool sees)."""

from __future__ import annotations

import itertools

import pytest

from gptedge.runtime.serving.admission import HOLD_GROUP, PrefillPlan, holds_newcomers, plan_prefill


@pytest.mark.parametrize("waiting, running, max_batch, budget, plan", [
    ([], 0, 8, 256, PrefillPlan()),  # nobody waits: no prefill
    ([5, 5, 5], 0, 8, 16, PrefillPlan(3)),  # 3 x 5 <= 16: one group run
    ([5, 5, 5, 5], 0, 8, 16, PrefillPlan(3)),  # a fourth would make 4 x 5 > 16
    ([2, 8, 1], 0, 8, 16, PrefillPlan(2)),  # padded to the longest: 2 x 8 fits, 3 x 8 does not
    ([8, 8], 0, 8, 16, PrefillPlan(2)),  # exactly the budget fits
    ([5, 5, 5], 6, 8, 256, PrefillPlan(2)),  # only two rows are free
    ([5, 5], 8, 8, 256, PrefillPlan()),  # no row free: nobody is admitted
    ([40, 1], 0, 8, 16, PrefillPlan(1, chunked=True)),  # longer than the budget alone: admitted alone, in chunks
    ([16, 1], 0, 8, 16, PrefillPlan(1)),  # as long as the budget: one run, not chunked
    ([3, 40], 0, 8, 16, PrefillPlan(1)),  # the long one waits at the head for the next turn; order is kept
    ([40, 30, 1], 0, 8, None, PrefillPlan(3)),  # no budget: everyone with a row, in one run
])
def test_the_plan_of_a_turn(waiting, running, max_batch, budget, plan):
    assert plan_prefill(False, waiting, running, max_batch, budget) == plan


def test_a_long_prompt_in_progress_admits_nobody_until_its_chunks_are_done():
    assert plan_prefill(True, [1, 1, 1], 0, 8, 16) == PrefillPlan(0, chunked=True)


def test_the_queue_is_read_only_as_far_as_admission_goes():
    """The engine passes its queue lazily under its lock: a long queue costs the rows it can fill, not its length."""
    read = []
    lengths = (read.append(n) or 4 for n in itertools.count())
    assert plan_prefill(False, lengths, 0, 3, 256) == PrefillPlan(3)
    assert len(read) == 3
    read.clear()
    assert plan_prefill(True, (read.append(n) or 4 for n in itertools.count()), 0, 3, 256).admit == 0
    assert read == []


@pytest.mark.parametrize("waiting, waited, running, held", [
    (1, 0.001, 4, True),  # one newcomer, rows running, little waited: it waits for company
    (HOLD_GROUP - 1, 0.009, 4, True),
    (HOLD_GROUP, 0.001, 4, False),  # a full group goes at once
    (3, 0.001, 61, False),  # as many as there are free rows (64 - 61)
    (2, 0.001, 61, True),
    (1, 0.010, 4, False),  # the head has waited the whole hold
    (1, 0.001, 0, False),  # nothing running: an idle engine prefills at once
    (0, 0.0, 4, False),
])
def test_newcomers_wait_for_company_only_while_rows_run_and_not_past_the_hold(waiting, waited, running, held):
    assert holds_newcomers(waiting, waited, running, 64, 0.010) is held


def test_no_hold_holds_nothing():
    assert not holds_newcomers(1, 0.0, 4, 64, 0.0)
