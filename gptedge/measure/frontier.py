"""The accuracy x speed frontier: which (KL, tok/s) points dominate which.

A point dominates another when it is at least as faithful (KL no higher) and at least as fast
(tok/s no lower), and strictly better on one of the two. The Pareto front is the points nothing
dominates. Pure functions over plain numbers: compare fills each row's `dominated_by` with them and
the chart draws the front with them.
"""

from __future__ import annotations

from collections.abc import Sequence

Point = tuple[float, float]  # (KL(ref || model), decode tok/s): lower KL and higher tok/s are better


def dominates(a: Point, b: Point) -> bool:
    """Whether a is at least as good as b on both axes and strictly better on one."""
    return a[0] <= b[0] and a[1] >= b[1] and (a[0] < b[0] or a[1] > b[1])


def dominators(points: Sequence[Point]) -> list[list[int]]:
    """For each point, the indices of the points that dominate it (empty: it is on the front)."""
    return [[j for j, q in enumerate(points) if j != i and dominates(q, p)] for i, p in enumerate(points)]


def pareto_front(points: Sequence[Point]) -> list[int]:
    """Indices of the non-dominated points, fastest first (so KL falls along the list as speed does)."""
    front = [i for i, by in enumerate(dominators(points)) if not by]
    return sorted(front, key=lambda i: (-points[i][1], points[i][0]))
