"""The oracle: the same tree evaluated lane by lane with Python ``if``.

Every lane is a 0-d JAX value, so ``jax.grad`` of the oracle differentiates
exactly the computations that were *taken*: an unselected ``where`` branch is
never evaluated, the loser of ``maximum`` is compared but never returned, a
lane that indexing drops is never read.  This is the contract's definition of
the right derivative ("each select replaced by a per-lane ``if``"), written
without any code from hlo_guard.

Ties follow JAX's own derivative conventions, because on a tie both sides are
genuinely live:

* ``maximum``/``minimum``: ``a > b`` -> ``a``; ``b > a`` -> ``b``; ``a == b``
  -> ``jnp.maximum(a, b)`` on the two scalars (JAX's balanced rule: half the
  derivative to each); unordered (a NaN) -> the value with *no* derivative
  (JAX's rule multiplies both sides by 0 there: neither equals the result).
* ``clip(x, lo, hi)`` is ``minimum(hi, maximum(lo, x))``, as ``jnp.clip`` is.
* ``max``/``min`` reductions: JAX's reduction over exactly the lanes equal to
  the result (each gets an equal share); with a NaN among the lanes no lane
  equals the result and none gets a derivative.
* ``sum``/``mean`` read every lane; they are computed by JAX over the stacked
  lanes so the value is bit-for-bit the vectorised one (branch decisions
  downstream must see the same numbers).
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

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
    N,
    Reduce,
    SetAt,
    Slice,
    Unary,
    Where,
)


def _maximum(a, b):
    if a > b:
        return a
    if b > a:
        return b
    if a == b:
        return jnp.maximum(a, b)
    return lax.stop_gradient(jnp.maximum(a, b))


def _minimum(a, b):
    if a < b:
        return a
    if b < a:
        return b
    if a == b:
        return jnp.minimum(a, b)
    return lax.stop_gradient(jnp.minimum(a, b))


def _reduce_choose(op, lanes):
    # Only comparisons (``bool`` of a traced 0-d value) are concrete under
    # ``jax.grad``; ``float()`` of a lane is not.
    full = jnp.stack(lanes)
    if any(bool(v != v) for v in lanes):
        return lax.stop_gradient(getattr(jnp, op)(full))
    best = lanes[0]
    for v in lanes[1:]:
        if (v > best) if op == "max" else (v < best):
            best = v
    tied = [v for v in lanes if bool(v == best)]
    return getattr(jnp, op)(jnp.stack(tied))


class LaneEvaluator:
    """Evaluates lanes on demand (memoised), so only taken branches run."""

    def __init__(self, env: dict[str, Sequence], dtype):
        self.env = env
        self.dtype = dtype
        self.memo = {}
        self.keep = []  # nodes keyed by id must stay alive

    def lane(self, node, i):
        if node.length == 1:
            i = 0
        key = (id(node), i)
        if key not in self.memo:
            self.keep.append(node)
            self.memo[key] = self._compute(node, i)
        return self.memo[key]

    def _compute(self, node, i):
        lane = self.lane
        if isinstance(node, Leaf):
            return self.env[node.name][i]
        if isinstance(node, Const):
            return jnp.asarray(node.value, self.dtype)
        if isinstance(node, Unary):
            return UNARY[node.op](lane(node.a, i))
        if isinstance(node, Binary):
            a, b = lane(node.a, i), lane(node.b, i)
            if node.op == "maximum":
                return _maximum(a, b)
            if node.op == "minimum":
                return _minimum(a, b)
            return BINARY[node.op](a, b)
        if isinstance(node, Where):
            if COMPARE[node.cmp](lane(node.left, i), lane(node.right, i)):
                return lane(node.then, i)
            return lane(node.other, i)
        if isinstance(node, Clip):
            return _minimum(lane(node.hi, i), _maximum(lane(node.lo, i), lane(node.a, i)))
        if isinstance(node, Reduce):
            lanes = [lane(node.a, j) for j in range(node.a.length)]
            if node.op in ("max", "min"):
                return _reduce_choose(node.op, lanes)
            return getattr(jnp, node.op)(jnp.stack(lanes))
        if isinstance(node, Slice):
            return lane(node.a, node.start + i * node.step)
        if isinstance(node, Gather):
            return lane(node.a, node.idx[i])
        if isinstance(node, Concat):
            n = node.a.length
            return lane(node.a, i) if i < n else lane(node.b, i - n)
        if isinstance(node, SetAt):
            if i in node.idx:
                return lane(node.b, node.idx.index(i))
            return lane(node.a, i)
        raise TypeError(type(node).__name__)


def evaluate(root, xs, ys, dtype=jnp.float32) -> list:
    ev = LaneEvaluator({"x": list(xs), "y": list(ys)}, dtype)
    return [ev.lane(root, i) for i in range(root.length)]


def value_and_grad(root, x: np.ndarray, y: np.ndarray):
    """Oracle forward lanes and d(sum of lanes)/d(x, y), each lane differentiated
    only through what the per-lane ``if`` evaluation actually computed."""
    dtype = x.dtype

    def loss(*scalars):
        outs = evaluate(root, scalars[:N], scalars[N:], dtype)
        total = outs[0]
        for o in outs[1:]:
            total = total + o
        return total, jnp.stack(outs)

    scalars = [jnp.asarray(v, dtype) for v in list(x) + list(y)]
    grads, values = jax.grad(loss, argnums=tuple(range(2 * N)), has_aux=True)(*scalars)
    grads = np.array([np.asarray(g) for g in grads], dtype=dtype)
    return np.asarray(values), grads[:N], grads[N:]
