"""A walk back through a program that carries facts gathered on the way
(what the ``where``s passed say about the lanes they take), for either front
end's reports (:mod:`hlo_guard.jax_frontend.rules.where_made_zeros`,
:mod:`hlo_guard.tf.where_made_zeros`).

Each selection passed adds facts, so the same value is reached along many
paths with different fact sets; walked path by path, a chain of 40 selects
did not finish.  A value walked with fewer facts settles it for any superset
(more facts can only excuse more), and values are taken fewest facts first,
so that a chain is walked once.  A limit keeps the walk bounded anyway.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Hashable, Iterable
from typing import Any

#: ``step(item, facts)``: the items to walk next, each with its facts, or
#: None to end the walk unexcused
Step = Callable[[Any, frozenset], "Iterable[tuple[Any, frozenset]] | None"]


def walk_with_facts(
    start, admit: Callable[[Any], bool], key: Callable[[Any], Hashable], step: Step, limit: int
) -> bool:
    """Walk from ``start`` (with no facts): True when the walk ends, False
    when ``step`` ends it or more than ``limit`` items were walked (too far
    to tell).  Items ``admit`` rejects are passed over; ``key`` names an
    item's value, for the facts it was walked with."""
    walked: dict[Hashable, list[frozenset]] = {}
    order = itertools.count()
    todo: list = [(0, next(order), start, frozenset())]
    visits = 0
    while todo:
        _, _, item, facts = heapq.heappop(todo)
        if not admit(item):
            continue
        before = walked.setdefault(key(item), [])
        if any(earlier <= facts for earlier in before):
            continue
        before.append(facts)
        visits += 1
        if visits > limit:
            return False
        found = step(item, facts)
        if found is None:
            return False
        for nxt, more in found:
            heapq.heappush(todo, (len(more), next(order), nxt, more))
    return True
