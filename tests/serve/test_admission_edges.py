"""The admission plan's edges (runtime/serving/admission.py): the budget exactly met and one position past it,
the last free row, reuse that leaves one position, and plans as values the engine may share."""

from __future__ import annotations

import dataclasses

import pytest

from gptedge.runtime.serving.admission import NEXT_CHUNK, NOTHING, PrefillPlan, plan_prefill


@pytest.mark.parametrize("waiting, running, max_batch, budget, plan", [
    ([4, 4, 4, 4], 0, 8, 16, PrefillPlan(4)),  # 4 x 4 == 16: all four
    ([4, 4, 4, 5], 0, 8, 16, PrefillPlan(3)),  # the fourth pads the group to 4 x 5 = 20 > 16
    ([4, 4, 4, 4], 0, 8, 15, PrefillPlan(3)),  # one position less: 3 x 4 = 12
    ([17], 0, 8, 16, PrefillPlan(1, chunked=True)),  # one past the budget alone: chunked
    ([16], 0, 8, 16, PrefillPlan(1)),  # exactly the budget: one run
    ([1, 1], 7, 8, 16, PrefillPlan(1)),  # the last free row
    ([1, 1], 7, 8, None, PrefillPlan(1)),
    ([(17, 16)], 0, 8, 16, PrefillPlan(1, reused=(16,))),  # 1 position runs
    ([(33, 16)], 0, 8, 16, PrefillPlan(1, chunked=True, reused=(16,))),  # 17 positions run: chunked
    ([(10, 0), (20, 12)], 0, 8, 16, PrefillPlan(1)),  # 10 and 8 positions, padded to 10: 2 x 10 > 16
    ([(10, 2), (20, 12)], 0, 8, 16, PrefillPlan(2, reused=(2, 12))),  # 8 and 8: 2 x 8 == 16
])
def test_the_plan_at_each_edge(waiting, running, max_batch, budget, plan):
    assert plan_prefill(False, waiting, running, max_batch, budget) == plan


def test_the_empty_plans_and_their_fields():
    assert (NOTHING.admit, NOTHING.chunked, NOTHING.reused) == (0, False, ())
    assert (NEXT_CHUNK.admit, NEXT_CHUNK.chunked, NEXT_CHUNK.reused) == (0, True, ())
    assert PrefillPlan() == NOTHING and PrefillPlan().admit == 0
    assert plan_prefill(False, [], 0, 8, 16) is NOTHING and plan_prefill(True, [], 0, 8, 16) is NEXT_CHUNK


def test_plans_are_immutable_values():
    """NOTHING and NEXT_CHUNK are shared by every turn: a plan the engine could edit would change the next one."""
    with pytest.raises(dataclasses.FrozenInstanceError):
        NOTHING.admit = 1  # type: ignore[misc]
    assert hash(PrefillPlan(2, reused=(3, 0))) == hash(PrefillPlan(2, reused=(3, 0)))
