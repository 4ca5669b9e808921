"""The Pareto front of throughput per chip against per-user token rate, confirmed lazily.

``pareto(points)``: the points no other point beats on both axes (at least as high on both,
higher on one). Equal points are one point on the front: the first in enumeration order
stands for the others.

``confirmed_front(candidates, confirm)``: the front of the candidates that pass a per-point
check which is expensive (the serving replay), computed without checking every candidate.
Repeat: take the front of the candidates not yet refuted; check the members not yet checked
(one batch, so the checks can run in parallel); drop those that fail. It ends when every
member of the front has passed. The result is the front of ``{c : passes(c)}`` exactly,
whatever the order of checks, so it depends only on the candidates (and is deterministic),
and a smaller candidate set can never give a front that beats it: every point of the
smaller front is a passing candidate of the larger set, hence on or below the larger front.
A budget of checks bounds the work; when it runs out the result says the front is
incomplete and claims only the members that passed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

X, Y = "tokens_per_s_per_chip", "tokens_per_s_per_user"


def dominates(a: dict, b: dict) -> bool:
    """``a`` is at least as good as ``b`` on both axes and better on one."""
    return a[X] >= b[X] and a[Y] >= b[Y] and (a[X] > b[X] or a[Y] > b[Y])


def pareto(points: Sequence[dict], order: str = "index") -> list[dict]:
    """The non-dominated points (ties: the lowest ``order`` key), by falling throughput per chip."""
    best_y = float("-inf")
    out = []
    for p in sorted(points, key=lambda p: (-p[X], -p[Y], p[order])):
        if p[Y] > best_y:
            out.append(p)
            best_y = p[Y]
    return out


@dataclass
class Confirmed:
    front: list[dict]  # members that passed, by falling throughput per chip
    checked: dict[int, dict] = field(default_factory=dict)  # index -> the check's row
    rounds: int = 0
    complete: bool = True


def confirmed_front(candidates: Sequence[dict], confirm: Callable[[list[dict]], list[dict]], budget: int,
                    passed: Callable[[dict], bool]) -> Confirmed:
    """The front of the candidates whose check passes (module docstring). ``confirm`` checks a
    batch of candidates and returns one row each; ``passed(row)`` reads a row's verdict."""
    result = Confirmed([])
    refuted: set[int] = set()
    while True:
        front = pareto([c for c in candidates if c["index"] not in refuted])
        todo = [c for c in front if c["index"] not in result.checked]
        if not todo:
            result.front = front
            return result
        left = budget - len(result.checked)
        if left <= 0:
            result.complete = False
            result.front = [c for c in front if c["index"] in result.checked]
            return result
        todo = todo[:left]
        result.rounds += 1
        for c, row in zip(todo, confirm(todo), strict=True):
            result.checked[c["index"]] = row
            if not passed(row):
                refuted.add(c["index"])


def chosen(front: Sequence[dict]) -> dict | None:
    """The deployment to pick: the most throughput per chip on the front (then per-user rate)."""
    return max(front, key=lambda p: (p[X], p[Y], -p["index"]), default=None)


__all__ = ["X", "Y", "Confirmed", "chosen", "confirmed_front", "dominates", "pareto"]
