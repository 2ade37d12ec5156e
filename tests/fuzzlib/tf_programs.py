"""The fuzz trees of :mod:`fuzzlib.program`, interpreted with TensorFlow.

Two interpreters, as on the JAX side, sharing nothing with hlo_guard:

* :func:`evaluate` -- the program under test, whole-vector TF ops
  (``tf.where``, ``tf.maximum``, ``tf.clip_by_value``, gathers, scatters);
* :func:`oracle_grads` -- lane by lane with Python ``if`` (a branch that is
  not taken is never computed), differentiated under XLA like the program.

Branch decisions come from the vectorised program's own values under XLA
(:func:`decisions_of`), so oracle and program can differ only in derivatives.
Ties follow TF's own gradient conventions, on a tie both sides being live:

* ``maximum(a, b)``: TF's gradient goes to ``a`` where ``a >= b`` (ties
  included), else to ``b`` (a NaN comparison is false: ``b``); ``minimum``
  likewise with ``<=``;
* ``tf.clip_by_value(a, lo, hi)`` is ``maximum(minimum(a, hi), lo)`` in TF's
  Python API, and is decided as that;
* ``max``/``min`` reductions share the derivative equally among the lanes
  equal to the result (TF's ``indicators / count``).  With a NaN among the
  lanes TF's own rule divides 0 by 0: such programs are not compared.
* a NaN reaching ``maximum``/``minimum``/clip: XLA's fast CPU min/max may
  keep or drop it, differently in two compilations; not compared either.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from fuzzlib.oracle import LaneEvaluator
from fuzzlib.program import (
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
    children,
)

#: the UNARY ops of fuzzlib.program that TF has (``cbrt`` has no TF op)
TF_UNARY = {
    "sqrt": tf.sqrt,
    "rsqrt": tf.math.rsqrt,
    "log": tf.math.log,
    "log1p": tf.math.log1p,
    "exp": tf.exp,
    "expm1": tf.math.expm1,
    "arccos": tf.acos,
    "arcsin": tf.asin,
    "arctanh": tf.atanh,
    "arccosh": tf.acosh,
    "arcsinh": tf.asinh,
    "arctan": tf.atan,
    "tanh": tf.tanh,
    "sin": tf.sin,
    "cos": tf.cos,
    "tan": tf.tan,
    "sinh": tf.sinh,
    "reciprocal": tf.math.reciprocal,
    "square": tf.square,
    "cube": lambda a: a**3,
    "inv_square": lambda a: a**-2,
    "abs": tf.abs,
    "neg": tf.negative,
    "sigmoid": lambda a: 1.0 / (1.0 + tf.exp(-a)),
    "logistic": tf.sigmoid,
    "erf": tf.math.erf,
    "lgamma": tf.math.lgamma,
}

TF_BINARY = {
    "add": tf.add,
    "sub": tf.subtract,
    "mul": tf.multiply,
    "div": tf.math.divide,
    "pow": tf.pow,
    "arctan2": tf.math.atan2,
}

TF_COMPARE = {
    "gt": tf.greater,
    "ge": tf.greater_equal,
    "lt": tf.less,
    "le": tf.less_equal,
    "eq": tf.equal,
    "ne": tf.not_equal,
}

_REDUCE = {
    "sum": tf.reduce_sum,
    "mean": tf.reduce_mean,
    "max": tf.reduce_max,
    "min": tf.reduce_min,
}


def evaluate(node, env, found=None):
    """The vectorised program; ``found`` (when given) collects what each
    selection compared, keyed by ``id(node)``."""
    ev = lambda n: evaluate(n, env, found)  # noqa: E731

    def note(n, *values):
        if found is not None:
            found[id(n)] = values

    if isinstance(node, Leaf):
        return env[node.name]
    if isinstance(node, Const):
        return tf.fill([node.n], tf.constant(node.value, env["x"].dtype))
    if isinstance(node, Unary):
        return TF_UNARY[node.op](ev(node.a))
    if isinstance(node, Binary):
        a, b = ev(node.a), ev(node.b)
        if node.op in ("maximum", "minimum"):
            note(node, a, b)
            return tf.maximum(a, b) if node.op == "maximum" else tf.minimum(a, b)
        return TF_BINARY[node.op](a, b)
    if isinstance(node, Where):
        pred = TF_COMPARE[node.cmp](ev(node.left), ev(node.right))
        then, other = ev(node.then), ev(node.other)
        n = node.length
        note(node, tf.broadcast_to(pred, [n]))
        return tf.where(pred, then, other)
    if isinstance(node, Clip):
        a, lo, hi = ev(node.a), ev(node.lo), ev(node.hi)
        note(node, a, hi, tf.minimum(a, hi), lo)
        return tf.clip_by_value(a, lo, hi)
    if isinstance(node, Reduce):
        a = ev(node.a)
        note(node, a)
        return _REDUCE[node.op](a, keepdims=True)
    if isinstance(node, Slice):
        return ev(node.a)[node.start : node.stop : node.step]
    if isinstance(node, Gather):
        return tf.gather(ev(node.a), list(node.idx))
    if isinstance(node, Concat):
        return tf.concat([ev(node.a), ev(node.b)], axis=0)
    if isinstance(node, SetAt):
        updates = tf.broadcast_to(ev(node.b), [len(node.idx)])
        return tf.tensor_scatter_nd_update(ev(node.a), [[i] for i in node.idx], updates)
    raise TypeError(type(node).__name__)


def as_function(root):
    return lambda x, y: evaluate(root, {"x": x, "y": y})


def decisions_of(root, x, y) -> dict:
    """What every selection compared, as the XLA-compiled program computes it."""
    keys: list = []

    def compared(xv, yv):
        found: dict = {}
        evaluate(root, {"x": xv, "y": yv}, found)
        keys[:] = list(found)
        return [list(found[k]) for k in keys]

    values = tf.function(compared, jit_compile=True)(tf.constant(x), tf.constant(y))
    return {k: tuple(np.asarray(v) for v in vs) for k, vs in zip(keys, values)}


def _lane_of(values, i):
    values = np.asarray(values).reshape(-1)
    return values[i if values.size > 1 else 0]


class NotComparable(Exception):
    """The program is outside what the oracle can speak for (TF's own rule
    is NaN by construction there)."""


class _Lanes(LaneEvaluator):
    """The JAX oracle's memoised lane-on-demand evaluation, with TF ops and
    TF's tie conventions in :meth:`_compute`."""

    def _choose(self, a, b, va, vb, greater):
        """TF's ``Maximum``/``Minimum`` gradient: to ``a`` where ``a >= b``
        (``<=``), else to ``b``."""
        return a if (va >= vb if greater else va <= vb) else b

    def _compute(self, node, i):
        lane = self.lane
        if isinstance(node, Leaf):
            return self.env[node.name][i]
        if isinstance(node, Const):
            return tf.constant(node.value, self.dtype)
        if isinstance(node, Unary):
            return TF_UNARY[node.op](lane(node.a, i))
        if isinstance(node, Binary):
            a, b = lane(node.a, i), lane(node.b, i)
            if node.op in ("maximum", "minimum"):
                va, vb = (_lane_of(v, i) for v in self.decisions[id(node)])
                return self._choose(a, b, va, vb, node.op == "maximum")
            return TF_BINARY[node.op](a, b)
        if isinstance(node, Where):
            (pred,) = self.decisions[id(node)]
            return lane(node.then, i) if _lane_of(pred, i) else lane(node.other, i)
        if isinstance(node, Clip):
            va, vhi, vmin, vlo = (_lane_of(v, i) for v in self.decisions[id(node)])
            low = self._choose(lane(node.a, i), lane(node.hi, i), va, vhi, greater=False)
            return self._choose(low, lane(node.lo, i), vmin, vlo, greater=True)
        if isinstance(node, Reduce):
            lanes = [lane(node.a, j) for j in range(node.a.length)]
            if node.op in ("max", "min"):
                values = np.asarray(self.decisions[id(node)][0]).reshape(-1)
                if np.isnan(values).any():
                    raise NotComparable("a NaN reaches a max/min reduction")
                best = values.max() if node.op == "max" else values.min()
                tied = [v for v, w in zip(lanes, values) if w == best]
                return _REDUCE[node.op](tf.stack(tied))
            return _REDUCE[node.op](tf.stack(lanes))
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


def forward_comparable(root, x, y) -> bool:
    """Whether the guarded and plain forward values must agree bitwise: not
    when a NaN meets a max/min/clip, which XLA's fast CPU min/max resolves
    differently in two compilations even for programs that differ only in
    ``select``s whose values equal their inputs (checked: with
    ``--xla_cpu_enable_fast_min_max=false`` both give NaN)."""
    return not _nan_meets_min_max(root, decisions_of(root, x, y))


def _nan_meets_min_max(root, decisions) -> bool:
    """A NaN among the operands of a ``maximum``/``minimum``/clip.  XLA's CPU
    min/max (``xla_cpu_enable_fast_min_max``, on in TF) may return the NaN or
    the other operand, and not the same way in two compilations: the plain
    and the guarded program may then route the gradient differently, and no
    per-lane answer speaks for both."""
    stack = [root]
    while stack:
        node = stack.pop()
        stack.extend(children(node))
        is_choice = isinstance(node, Clip) or (
            isinstance(node, Binary) and node.op in ("maximum", "minimum")
        )
        if is_choice and any(np.isnan(np.asarray(v)).any() for v in decisions[id(node)]):
            return True
    return False


def oracle_grads(root, x: np.ndarray, y: np.ndarray):
    """d(sum of lanes)/d(x, y), each lane differentiated only through what its
    per-lane ``if`` evaluation computed.  The oracle runs under XLA as the
    program does: eager TF kernels answer ``0 * NaN`` differently (``SqrtGrad``
    gives 0 where XLA gives NaN), and a genuine singularity must read the same
    in both."""
    decisions = decisions_of(root, x, y)
    if _nan_meets_min_max(root, decisions):
        raise NotComparable("a NaN meets maximum/minimum under XLA (fast min/max)")

    @tf.function(jit_compile=True)
    def run(xv, yv):
        with tf.GradientTape() as tape:
            tape.watch([xv, yv])
            lanes = _Lanes({"x": tf.unstack(xv), "y": tf.unstack(yv)}, x.dtype, decisions)
            outs = [lanes.lane(root, i) for i in range(root.length)]
            total = tf.add_n(outs) if len(outs) > 1 else outs[0]
        grads = tape.gradient(
            total, [xv, yv], unconnected_gradients=tf.UnconnectedGradients.ZERO
        )  # an input no taken lane reads: zero
        return [tf.convert_to_tensor(g) for g in grads]

    gx, gy = run(tf.constant(x), tf.constant(y))
    return np.asarray(gx), np.asarray(gy)
