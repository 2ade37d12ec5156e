"""The oracle: the same tree evaluated lane by lane with Python ``if``.

Every lane is a 0-d JAX value, so ``jax.grad`` of the oracle differentiates
exactly the computations that were *taken*: an unselected ``where`` branch is
never evaluated, the loser of ``maximum`` is compared but never returned, a
lane that indexing drops is never read.  This is the contract's definition of
the right derivative ("each select replaced by a per-lane ``if``"), written
without any code from hlo_guard.

Which branch a lane takes is decided on the values JAX itself computed for the
vectorised program (:func:`fuzzlib.vectorized.decisions_of`), never on the
oracle's own 0-d lanes: XLA's scalar and vector kernels, and its constant
folding under ``jit``, may round a value 1 ulp apart (``arctan(-1.0)``), and a
comparison of two such values must not send the oracle down another branch
than the program it checks.  Only derivatives can then differ.

Ties follow JAX's own derivative conventions, because on a tie both sides are
genuinely live:

* ``maximum``/``minimum``: ``a > b`` -> ``a``; ``b > a`` -> ``b``; ``a == b``
  -> ``jnp.maximum(a, b)`` on the two scalars (JAX's balanced rule: half the
  derivative to each); unordered (a NaN) -> the NaN side was taken (XLA
  propagates it), with JAX's own coefficient for it (0: its derivative times
  0, NaN when that is infinite), the finite side not at all.
* ``clip(x, lo, hi)`` is ``minimum(hi, maximum(lo, x))``, as ``jnp.clip`` is.
* ``max``/``min`` reductions: JAX's reduction over exactly the lanes equal to
  the result (each gets an equal share); with a NaN among the lanes, JAX's
  reduction over the NaN lanes (taken: the result is theirs; JAX gives them
  ``0 / 0``), the others not at all.
* ``segment_max``/``segment_min``: as the reductions, per segment, with the
  identity the segment starts from (-inf for max) counted as one more tied
  lane when the result equals it (JAX's ``scatter-max`` JVP).
* ``sum``/``mean`` read every lane; they are computed by JAX over the stacked
  lanes so the value is bit-for-bit the vectorised one (branch decisions
  downstream must see the same numbers).

An identity call (``x.real``, ``jnp.squeeze``, ...) is its operand's lane.

The scalar input ``s`` gets a separate float32 copy in every lane of every
:class:`Scalar` node that reads it (whatever dtype the program is passed: all
of them promote to float32 exactly, so the lanes compute the program's
values); ``d/ds`` is then the sum of the copies' derivatives, each the
derivative of a lane that was taken.  :func:`value_and_grad` returns the
copies' derivatives, grouped by node, and :func:`scalar_gradient` sums them.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from fuzzlib.program import (
    BINARY,
    UNARY,
    Binary,
    Body,
    Clip,
    Concat,
    Const,
    Gather,
    Identity,
    Leaf,
    N,
    Reduce,
    Scalar,
    SegmentMax,
    SetAt,
    Slice,
    Unary,
    Where,
    children,
)
from fuzzlib.vectorized import decisions_of


def _lane_of(values, i):
    """Lane ``i`` of a recorded vector (a length-1 vector broadcasts)."""
    values = np.asarray(values).reshape(-1)
    return values[i if values.size > 1 else 0]


def _choose(a, b, va, vb, greater):
    """``maximum`` (``greater``) or ``minimum`` of the traced lanes ``a``/``b``,
    decided on JAX's own values ``va``/``vb`` of them."""
    wins_a = va > vb if greater else va < vb
    wins_b = vb > va if greater else vb < va
    if wins_a:
        return a
    if wins_b:
        return b
    pick = jnp.maximum if greater else jnp.minimum
    if va == vb:
        return pick(a, b)
    # a NaN: taken, with JAX's coefficient for it; a finite side lost to it
    a_nan, b_nan = np.isnan(va), np.isnan(vb)
    return pick(a if a_nan else lax.stop_gradient(a), b if b_nan else lax.stop_gradient(b))


def _segment_choose(op, lanes, values, dtype):
    """One segment of ``jax.ops.segment_max``/``_min``, JAX's scatter JVP: a
    reduction (:func:`_reduce_choose`) over the segment's lanes and the
    identity the segment starts from (-inf for max), a constant.  So the
    lanes equal to the result share the derivative, the identity counting as
    one more of them when the result is the identity; with a NaN among the
    lanes only the NaN lanes are taken; an empty segment is the identity."""
    identity = -np.inf if op == "max" else np.inf
    start = jnp.asarray(identity, dtype)
    return _reduce_choose(op, [*lanes, start], [*values, identity])


def _reduce_choose(op, lanes, values):
    # the lanes that tie with the result, decided on JAX's own vector
    values = np.asarray(values).reshape(-1)
    if np.isnan(values).any():
        nan_lanes = [v for v, w in zip(lanes, values) if np.isnan(w)]
        return getattr(jnp, op)(jnp.stack(nan_lanes))
    best = values.max() if op == "max" else values.min()
    tied = [v for v, w in zip(lanes, values) if w == best]
    return getattr(jnp, op)(jnp.stack(tied))


class LaneEvaluator:
    """Evaluates lanes on demand (memoised), so only taken branches run."""

    def __init__(self, env: dict, dtype, decisions: dict):
        #: ``"x"``/``"y"``: the lanes of the inputs; ``"s"``: the copy of the
        #: scalar input for each ``(id(Scalar node), lane)``
        self.env = env
        self.dtype = dtype
        #: what each selection compared, from the vectorised program's values
        self.decisions = decisions
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
        if isinstance(node, Scalar):
            return self.env["s"][(id(node), i)]
        if isinstance(node, Unary):
            return UNARY[node.op](lane(node.a, i))
        if isinstance(node, (Identity, Body)):
            return lane(node.a, i)
        if isinstance(node, Binary):
            a, b = lane(node.a, i), lane(node.b, i)
            if node.op in ("maximum", "minimum"):
                va, vb = (_lane_of(v, i) for v in self.decisions[id(node)])
                return _choose(a, b, va, vb, greater=node.op == "maximum")
            return BINARY[node.op](a, b)
        if isinstance(node, Where):
            (pred,) = self.decisions[id(node)]
            if _lane_of(pred, i):
                return lane(node.then, i)
            return lane(node.other, i)
        if isinstance(node, Clip):
            va, vlo, vhi, vmax = (_lane_of(v, i) for v in self.decisions[id(node)])
            low = _choose(lane(node.lo, i), lane(node.a, i), vlo, va, greater=True)
            return _choose(lane(node.hi, i), low, vhi, vmax, greater=False)
        if isinstance(node, Reduce):
            lanes = [lane(node.a, j) for j in range(node.a.length)]
            if node.op in ("max", "min"):
                return _reduce_choose(node.op, lanes, self.decisions[id(node)][0])
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
        if isinstance(node, SegmentMax):
            members = [j for j, k in enumerate(node.ids) if k == i]
            (values,) = self.decisions[id(node)]
            vals = [_lane_of(values, j) for j in members]
            return _segment_choose(node.op, [lane(node.a, j) for j in members], vals, self.dtype)
        raise TypeError(type(node).__name__)


def scalar_nodes(root) -> list:
    """The :class:`Scalar` nodes of the tree, each once, in a fixed order."""
    found: dict = {}
    stack = [root]
    while stack:
        node = stack.pop()
        stack.extend(children(node))
        if isinstance(node, Scalar):
            found[id(node)] = node
    return list(found.values())


def _scalar_keys(root) -> list:
    """One key per copy of the scalar input: ``(id(Scalar node), lane)``."""
    return [(id(node), i) for node in scalar_nodes(root) for i in range(node.length)]


def _lanes(root, scalars, decisions, dtype, keys) -> list:
    """The oracle's output lanes from one 0-d value per input lane: ``x``'s
    ``N``, ``y``'s ``N``, then the scalar input's copies (``keys``)."""
    copies = dict(zip(keys, scalars[2 * N :]))
    return evaluate(root, scalars[:N], scalars[N : 2 * N], decisions, dtype, copies)


def _summed(outs):
    total = outs[0]
    for o in outs[1:]:
        total = total + o
    return total


def evaluate(root, xs, ys, decisions: dict, dtype=jnp.float32, s_copies=None) -> list:
    env = {"x": list(xs), "y": list(ys), "s": s_copies or {}}
    ev = LaneEvaluator(env, dtype, decisions)
    return [ev.lane(root, i) for i in range(root.length)]


def value_and_grad(root, x: np.ndarray, y: np.ndarray, s=None, *, jit: bool = False):
    """Oracle forward lanes and d(sum of lanes)/d(x, y), each lane differentiated
    only through what the per-lane ``if`` evaluation actually computed.  Branch
    decisions come from the vectorised program's own values (eager, or compiled
    with ``jit``): oracle and program can then differ only in derivatives.

    The fourth result is None when the program does not read the scalar input
    ``s`` (a :class:`fuzzlib.program.ScalarInput`), else the derivative of each
    copy of it, one array per :class:`Scalar` node (:func:`scalar_nodes`) with
    one entry per lane: the lanes' contributions to d/ds, which
    :func:`scalar_gradient` sums."""
    dtype = x.dtype
    decisions = decisions_of(root, x, y, s, jit=jit)
    keys = _scalar_keys(root)

    def loss(*scalars):
        outs = _lanes(root, scalars, decisions, dtype, keys)
        return _summed(outs), jnp.stack(outs)

    scalars = [jnp.asarray(v, dtype) for v in list(x) + list(y)]
    # float32 copies of the value every kind of ``s`` promotes to (exactly)
    scalars += [jnp.asarray(s.value, dtype) for _ in keys]
    grads, values = jax.grad(loss, argnums=tuple(range(len(scalars))), has_aux=True)(*scalars)
    grads = np.array([np.asarray(g) for g in grads], dtype=dtype)
    gs = None
    if keys:
        offsets = np.cumsum([0] + [node.length for node in scalar_nodes(root)])
        lanes = grads[2 * N :]
        gs = [lanes[a:b] for a, b in zip(offsets[:-1], offsets[1:])]
    return np.asarray(values), grads[:N], grads[N : 2 * N], gs


def scalar_gradient(contributions, dtype) -> tuple[list[np.ndarray], float]:
    """d/ds from the lanes' contributions (one array per :class:`Scalar` node),
    in ``dtype``, the dtype of the program's derivative: the candidates, and
    the sum of the contributions' magnitudes (the scale of the rounding a
    float32 sum in another order makes; the comparison's tolerance is relative
    to it).  Each node's lanes are summed in float32 by the program, but a
    bfloat16/float16 ``s`` has its cotangent rounded to its dtype at each
    node's ``convert_element_type`` before the nodes' are added -- eagerly;
    under ``jit`` XLA may keep the excess precision.  So two candidates: the
    whole sum rounded once, and the sum of the nodes' rounded sums (they
    differ when a node's sum overflows a float16)."""
    groups = [np.asarray(c, np.float64) for c in contributions]
    with np.errstate(invalid="ignore", over="ignore"):
        once = np.asarray(sum(g.sum() for g in groups)).astype(dtype)
        rounded = [np.asarray(g.sum()).astype(dtype).astype(np.float64) for g in groups]
        per_node = np.asarray(sum(rounded)).astype(dtype)
        scale = float(sum(np.abs(g).sum() for g in groups))
    return [once, per_node], scale


def hessian(root, x: np.ndarray, y: np.ndarray, s=None, *, with_s: bool = False):
    """The oracle's second derivative of the sum of the lanes, over the flat
    inputs ``[x, y]`` (and ``s`` last, when ``with_s``): a square float64
    matrix.  Each lane is differentiated twice through only what its
    per-lane ``if`` evaluation computed, so a branch that is not taken adds
    nothing to any order.  ``s`` has one copy per lane of every
    :class:`Scalar` node (as in :func:`value_and_grad`); its row and column
    are the sums of the copies' (the chain rule for ``s`` feeding every
    copy).  Branch decisions are the eager vectorised program's."""
    dtype = x.dtype
    decisions = decisions_of(root, x, y, s)
    keys = _scalar_keys(root)

    def loss(*scalars):
        return _summed(_lanes(root, scalars, decisions, dtype, keys))

    values = [jnp.asarray(v, dtype) for v in list(x) + list(y)]
    values += [jnp.asarray(s.value, dtype) for _ in keys]
    # one scalar per input lane, so the per-lane evaluation indexes scalars
    flat_hessian = jax.hessian(loss, argnums=tuple(range(len(values))))
    rows = flat_hessian(*values)
    full = np.array([[np.asarray(h) for h in row] for row in rows], dtype=np.float64)
    if not with_s:
        return full[: 2 * N, : 2 * N]
    # fold the copies of s into one row and column: d/ds = sum of d/dcopy
    fold = np.zeros((len(values), 2 * N + 1))
    fold[np.arange(2 * N), np.arange(2 * N)] = 1.0
    fold[2 * N :, 2 * N] = 1.0
    with np.errstate(invalid="ignore", over="ignore"):
        return _fold_product(fold, full)


def _fold_product(fold: np.ndarray, full: np.ndarray) -> np.ndarray:
    """``fold.T @ full @ fold`` in which a zero weight never multiplies an
    infinite entry: ``0 * inf`` of a copy the fold leaves out must not turn
    a taken-path infinity (or a structural zero) into NaN."""
    n = fold.shape[1]
    out = np.zeros((n, n))
    for i in range(n):
        for j in range(n):
            rows = np.flatnonzero(fold[:, i])
            cols = np.flatnonzero(fold[:, j])
            out[i, j] = full[np.ix_(rows, cols)].sum()
    return out
