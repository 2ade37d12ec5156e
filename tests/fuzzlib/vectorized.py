"""The program under test: a tree evaluated with whole-vector ``jnp`` ops.

This is what a user writes -- ``jnp.where`` computes both branches in every
lane, ``jnp.maximum`` and ``jnp.clip`` differentiate both sides, indexing
drops lanes -- and what ``hlo_guard.guard`` must make safe.
"""

from __future__ import annotations

import jax.numpy as jnp

from fuzzlib.program import (
    BINARY,
    COMPARE,
    UNARY,
    Binary,
    Clip,
    Concat,
    Const,
    Gather,
    Leaf,
    Reduce,
    SetAt,
    Slice,
    Unary,
    Where,
)


def evaluate(node, env):
    """``env`` maps ``"x"``/``"y"`` to float vectors of length ``N``."""
    ev = lambda n: evaluate(n, env)  # noqa: E731
    if isinstance(node, Leaf):
        return env[node.name]
    if isinstance(node, Const):
        return jnp.full((node.n,), node.value, dtype=env["x"].dtype)
    if isinstance(node, Unary):
        return UNARY[node.op](ev(node.a))
    if isinstance(node, Binary):
        a, b = ev(node.a), ev(node.b)
        if node.op == "maximum":
            return jnp.maximum(a, b)
        if node.op == "minimum":
            return jnp.minimum(a, b)
        return BINARY[node.op](a, b)
    if isinstance(node, Where):
        pred = COMPARE[node.cmp](ev(node.left), ev(node.right))
        return jnp.where(pred, ev(node.then), ev(node.other))
    if isinstance(node, Clip):
        return jnp.clip(ev(node.a), ev(node.lo), ev(node.hi))
    if isinstance(node, Reduce):
        return getattr(jnp, node.op)(ev(node.a), keepdims=True)
    if isinstance(node, Slice):
        return ev(node.a)[node.start : node.stop : node.step]
    if isinstance(node, Gather):
        return ev(node.a)[jnp.array(node.idx)]
    if isinstance(node, Concat):
        return jnp.concatenate([ev(node.a), ev(node.b)])
    if isinstance(node, SetAt):
        return ev(node.a).at[jnp.array(node.idx)].set(ev(node.b))
    raise TypeError(type(node).__name__)


def as_function(root):
    """``f(x, y) -> vector``: the program as an ordinary JAX function."""

    def program(x, y):
        return evaluate(root, {"x": x, "y": y})

    return program
