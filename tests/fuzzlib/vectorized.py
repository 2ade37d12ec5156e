"""The program under test: a tree evaluated with whole-vector ``jnp`` ops.

This is what a user writes -- ``jnp.where`` computes both branches in every
lane, ``jnp.maximum`` and ``jnp.clip`` differentiate both sides, indexing
drops lanes -- and what ``hlo_guard.guard`` must make safe.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from fuzzlib.program import (
    BINARY,
    COMPARE,
    IDENTITY,
    UNARY,
    Binary,
    Body,
    Clip,
    Concat,
    Const,
    Gather,
    Identity,
    Leaf,
    Reduce,
    Scalar,
    SegmentMax,
    SetAt,
    Slice,
    Unary,
    Where,
    uses_scalar,
)


def evaluate(node, env, decisions=None):
    """``env`` maps ``"x"``/``"y"`` to float vectors of length ``N`` (and
    ``"s"`` to the scalar input, as passed, when the program reads it).

    ``decisions``, when given, is filled with the values every selection of the
    program compared, as JAX computed them (``id(node) -> tuple of arrays``): the oracle takes its branch decisions from these, so that a
    comparison XLA rounds one way (a constant subtree folded at compile time, a
    scalar kernel against a vector one) cannot send the oracle down another
    branch than the program it checks."""
    ev = lambda n: evaluate(n, env, decisions)  # noqa: E731

    def note(n, *values):
        if decisions is not None:
            decisions[id(n)] = values

    if isinstance(node, Leaf):
        return env[node.name]
    if isinstance(node, Const):
        return jnp.full((node.n,), node.value, dtype=env["x"].dtype)
    if isinstance(node, Scalar):
        return env["s"]
    if isinstance(node, Unary):
        return UNARY[node.op](ev(node.a))
    if isinstance(node, Identity):
        return IDENTITY[node.op](ev(node.a))
    if isinstance(node, Body):
        if decisions is not None:
            # what the selections compare, as plain eager values (a value
            # traced in a body cannot leave it)
            return ev(node.a)
        return in_body(node.kind, lambda e: evaluate(node.a, e), env, node.length)
    if isinstance(node, Binary):
        a, b = ev(node.a), ev(node.b)
        if node.op == "maximum":
            note(node, a, b)
            return jnp.maximum(a, b)
        if node.op == "minimum":
            note(node, a, b)
            return jnp.minimum(a, b)
        return BINARY[node.op](a, b)
    if isinstance(node, Where):
        pred = COMPARE[node.cmp](ev(node.left), ev(node.right))
        note(node, pred)
        return jnp.where(pred, ev(node.then), ev(node.other))
    if isinstance(node, Clip):
        a, lo, hi = ev(node.a), ev(node.lo), ev(node.hi)
        note(node, a, lo, hi, jnp.maximum(lo, a))  # jnp.clip is minimum(hi, maximum(lo, a))
        return jnp.clip(a, lo, hi)
    if isinstance(node, Reduce):
        a = ev(node.a)
        note(node, a)
        return getattr(jnp, node.op)(a, keepdims=True)
    if isinstance(node, Slice):
        return ev(node.a)[node.start : node.stop : node.step]
    if isinstance(node, Gather):
        return ev(node.a)[jnp.array(node.idx)]
    if isinstance(node, Concat):
        return jnp.concatenate([ev(node.a), ev(node.b)])
    if isinstance(node, SetAt):
        return ev(node.a).at[jnp.array(node.idx)].set(ev(node.b))
    if isinstance(node, SegmentMax):
        a = ev(node.a)
        note(node, a)
        segment = getattr(jax.ops, f"segment_{node.op}")
        return segment(a, jnp.array(node.ids), num_segments=node.n_segments)
    raise TypeError(type(node).__name__)


def in_body(kind: str, f, env: dict, n: int):
    """``f(env)`` computed inside a body of kind ``kind``
    (:data:`fuzzlib.program.BODY_KINDS`): the same values, in a ``cond``,
    a loop, a ``jit`` or a ``checkpoint``."""
    zeros = jnp.zeros((n,), env["x"].dtype)
    if kind == "cond":
        return lax.cond(env["x"][0] == env["x"][0], f, f, env)
    if kind == "scan ys":
        return lax.scan(lambda c, _: (c, f(c)), env, None, length=1)[1][0]
    if kind == "scan carry":
        return lax.scan(lambda c, _: ((c[0], f(c[0])), None), (env, zeros), None, length=1)[0][1]
    if kind == "fori":
        return lax.fori_loop(0, 1, lambda i, acc: f(env), zeros)
    if kind == "while":
        return lax.while_loop(lambda c: c[0] < 1, lambda c: (c[0] + 1, f(env)), (0, zeros))[1]
    if kind == "jit":
        return jax.jit(f)(env)
    if kind == "checkpoint":
        return jax.checkpoint(f)(env)
    raise ValueError(kind)


def arguments(root, x, y, s=None) -> tuple:
    """The program's arguments: ``(x, y)``, and ``s`` (a
    :class:`fuzzlib.program.ScalarInput`, passed as its kind says) when the
    program reads it."""
    args = (jnp.asarray(x), jnp.asarray(y))
    if uses_scalar(root):
        assert s is not None, "the program reads the scalar input s"
        args += (s.arg(),)
    return args


def decisions_of(root, x, y, s=None, *, jit: bool = False) -> dict:
    """What every selection of ``root`` compared, as JAX computes it: eagerly,
    or (``jit``) in one compiled program, where XLA may fold constant subtrees
    and round them differently from the eager kernels."""
    args = arguments(root, x, y, s)
    if not jit:
        decisions: dict = {}
        evaluate(root, _env(*args), decisions)
        return {k: tuple(np.asarray(v) for v in vs) for k, vs in decisions.items()}
    keys: list = []

    def compared(*args):
        found: dict = {}
        evaluate(root, _env(*args), found)
        keys[:] = list(found)
        return [found[k] for k in keys]

    values = jax.jit(compared)(*args)
    return {k: tuple(np.asarray(v) for v in vs) for k, vs in zip(keys, values)}


def _env(x, y, *s):
    return {"x": x, "y": y, **({"s": s[0]} if s else {})}


def as_function(root):
    """``f(x, y) -> vector`` (``f(x, y, s)`` when the program reads the scalar
    input): the program as an ordinary JAX function."""
    if uses_scalar(root):

        def program_s(x, y, s):
            return evaluate(root, {"x": x, "y": y, "s": s})

        return program_s

    def program(x, y):
        return evaluate(root, {"x": x, "y": y})

    return program
