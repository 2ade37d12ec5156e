"""Computing a value *on the side*: the one algorithm both front ends use when
a mask needs a value their guarded evaluation has not produced yet (a
predicate downstream of the operation being guarded).

The walk is depth-first over producers with an explicit stack (programs have
100k-operation chains; recursion would overflow), computes each producing
operation once, and leaves everything framework-specific to callbacks: what is
already available, where a value comes from, how an operation is computed on
the side and what it must refuse (an effectful or stateful operation must run
exactly once: the callback raises :class:`passes.masks.ShadowUnavailable`,
and the front end skips that guard and reports it).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from typing import TypeVar

#: a value's key in the front end's graph (a jaxpr Var, a TF tensor name)
V = TypeVar("V", bound=Hashable)


def evaluate_on_side(
    target: V,
    *,
    available: Callable[[V], bool],
    producer: Callable[[V], int | None],
    operands: Callable[[int], Iterable[V]],
    leaf: Callable[[V], None],
    compute: Callable[[int], None],
) -> None:
    """Make ``target`` available.

    ``available(v)``: ``v`` has a value (guarded, side or read from outside);
    ``producer(v)``: the node to compute ``v`` with, or None when ``v`` is not
    to be computed here; ``leaf(v)`` then makes it available or raises;
    ``operands(node)``: the values ``node`` reads (constants left out);
    ``compute(node)``: computes ``node`` from its available operands and
    stores its outputs, or raises ``ShadowUnavailable``.
    """
    stack = [target]
    while stack:
        value = stack[-1]
        if available(value):
            stack.pop()
            continue
        node = producer(value)
        if node is None:
            leaf(value)
            stack.pop()
            continue
        missing = [v for v in operands(node) if not available(v)]
        if missing:
            stack.extend(missing)
            continue
        compute(node)
        stack.pop()
