"""Hypothesis strategies: random program trees and adversarial inputs.

Inputs are drawn mostly from the values where derivatives break -- 0, -0,
+-1, +-inf, NaN, the largest and smallest floats, subnormals, exp's overflow
threshold -- and equal values are common, so predicates, ``maximum`` and
``clip`` hit ties and boundaries.  Trees mix elementwise ops (the singular ones
included) with every kind of selection and lane-dropping operation.
"""

from __future__ import annotations

import dataclasses
import math
import os

import numpy as np
from hypothesis import strategies as st

from fuzzlib.program import (
    BINARY,
    BODY_KINDS,
    COMPARE,
    IDENTITY,
    REDUCE,
    SCALAR_DTYPES,
    SCALAR_KINDS,
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
    Node,
    Reduce,
    Scalar,
    ScalarInput,
    SegmentMax,
    SetAt,
    Slice,
    Unary,
    Where,
    nodes_of,
)

F32_MAX = float(np.finfo(np.float32).max)
F32_TINY = float(np.finfo(np.float32).tiny)
F32_SUBNORMAL = float(np.nextafter(np.float32(0), np.float32(1)))

# Subnormals are left out on purpose: eager XLA kernels flush them to zero while
# inlined library jits (``jnp.mean``) may not, so the *unguarded* program is not
# even consistent with itself there (see test_fuzz_regressions).
SPECIAL_INPUTS = [
    0.0,
    -0.0,
    1.0,
    -1.0,
    math.inf,
    -math.inf,
    math.nan,
    F32_MAX,
    -F32_MAX,
    F32_TINY,
    -F32_TINY,
    0.5,
    -0.5,
    2.0,
    1e-7,
    88.8,
    -104.0,
    1e20,
]
CONSTANTS = [0.0, 1.0, -1.0, 0.5, 2.0, -2.0, 3.0, 1e-30, 1e30, math.inf, -math.inf]

MAX_LEN = 6

floats = st.one_of(
    st.sampled_from(SPECIAL_INPUTS),
    st.sampled_from(SPECIAL_INPUTS),
    # no subnormals here either (see SPECIAL_INPUTS; seen: 3.4e-43 drawn, the
    # eager max flushing it to 0 and tying with three zeros the oracle did not tie)
    st.floats(-4.0, 4.0, width=32, allow_subnormal=False),
)


@st.composite
def input_vectors(draw, dtype=np.float32):
    return np.array(draw(st.lists(floats, min_size=N, max_size=N)), dtype=dtype)


def _reciprocal_is_normal(v: float) -> bool:
    return not math.isfinite(v) or abs(v) < 2.0**126


@st.composite
def scalar_inputs(draw):
    """The scalar input ``s``: a kind (how it is passed) and a value drawn as
    the vectors' lanes are, rounded to the kind's dtype (so 1e20 is inf as a
    float16) -- but not a finite value whose reciprocal is subnormal
    (F32_MAX): XLA compiles ``a / s`` of a 0-d ``s`` as ``a * (1 / s)``, and
    ``1 / s`` flushed to 0 makes ``inf / F32_MAX`` NaN; not so in the
    compilation of its JVP, where it is inf.  The program differentiated would
    take other branches than the one whose values the oracle decides on (seen:
    ``sum(maximum(0, inv_square(full(5, 0.0)) / s))`` at ``s = F32_MAX``)."""
    kind = draw(st.sampled_from(SCALAR_KINDS))
    with np.errstate(over="ignore"):
        value = np.asarray(draw(floats.filter(_reciprocal_is_normal)), np.float32)
        value = value.astype(SCALAR_DTYPES[kind])
    return ScalarInput(kind, float(value))


#: ``HLO_GUARD_FUZZ_NO_BROADCAST=1`` stops drawing size-1 operands, to explore
#: past the known implicit-broadcast bug (tests/test_fuzz_regressions.py)
NO_BROADCAST = os.environ.get("HLO_GUARD_FUZZ_NO_BROADCAST", "") not in ("", "0")


def _operand_length(draw, n):
    """Operands of elementwise ops are either the same length or broadcast (1)."""
    if n > 1 and not NO_BROADCAST and draw(st.integers(0, 5)) == 0:
        return 1
    return n


def _leafish(draw, n):
    """A depth-0 node of length ``n``: an input (sliced or gathered) or a constant."""
    choice = draw(st.integers(0, 9))
    if choice <= 1:
        return Const(draw(st.sampled_from(CONSTANTS)), n)
    leaf = Leaf(draw(st.sampled_from(["x", "y"])))
    if n == N and choice <= 7:
        return leaf
    if n < N and choice <= 5:
        start = draw(st.integers(0, N - n))
        return Slice(leaf, start, start + n, 1)
    idx = tuple(draw(st.lists(st.integers(0, N - 1), min_size=n, max_size=n)))
    return Gather(leaf, idx)


#: the chance (1 in this) that a node of a program with identity calls is
#: wrapped in one (densely: a dead region must run through one to matter); and
#: that a node of a program reading ``s`` is wrapped in a binary op with ``s``.
#: Wrappers leave the shape of the tree they wrap as :func:`nodes` draws it
#: without them; they are drawn as ``== last`` so that hypothesis shrinks them
#: away (towards 0).
IDENTITY_ODDS = 3
SCALAR_ODDS = 5
#: the ops a scalar wrapper draws from: a weight or a scale (``s * f(x)``,
#: ``f(x) / s``) twice as often as the others (``add``/``sub`` have the
#: derivative 1 wrt ``s``: never a hazard for it)
SCALAR_OPS = ["mul", "div", *sorted(BINARY), "maximum", "minimum"]


@st.composite
def nodes(draw, n, depth, unary=None, identity=False, scalar=False, segments=False):
    """``unary``: the elementwise ops to draw from (default: all of UNARY; a
    front end without some op passes its own list).  ``identity``: sometimes
    wrap a node in an identity call (``x.real``, ...); ``scalar``: sometimes
    wrap a node in a binary op (or ``maximum``/``minimum``) with the 0-d input
    ``s``; ``segments``: draw ``jax.ops.segment_max``/``segment_min`` nodes
    too (all three JAX-only)."""
    node = _node(draw, n, depth, unary, identity, scalar, segments)
    if identity and draw(st.integers(0, IDENTITY_ODDS - 1)) == IDENTITY_ODDS - 1:
        ops = sorted(IDENTITY) if n > 1 else sorted(set(IDENTITY) - {"squeeze"})
        node = Identity(draw(st.sampled_from(ops)), node)
    if scalar and draw(st.integers(0, SCALAR_ODDS - 1)) == SCALAR_ODDS - 1:
        op = draw(st.sampled_from(SCALAR_OPS))
        s = Scalar(n)
        node = Binary(op, node, s) if draw(st.booleans()) else Binary(op, s, node)
    return node


def _node(draw, n, depth, unary, identity, scalar, segments=False):
    if depth <= 0 or draw(st.integers(0, 7)) == 0:
        return _leafish(draw, n)
    sub = lambda m: draw(nodes(m, depth - 1, unary, identity, scalar, segments))  # noqa: E731
    kinds = (
        ["unary"] * 4
        + ["binary"] * 3
        + ["maxmin"] * 3
        + ["where"] * 4
        + ["clip"] * 2
        + ["slice", "gather", "setat"]
        + (["concat"] if n >= 2 else [])
        + (["reduce"] * 3 if n == 1 else [])
        + (["segment"] * 2 if segments else [])
    )
    kind = draw(st.sampled_from(kinds))
    if kind == "unary":
        return Unary(draw(st.sampled_from(sorted(unary or UNARY))), sub(n))
    if kind == "binary":
        a, b = sub(_operand_length(draw, n)), sub(_operand_length(draw, n))
        if a.length != n and b.length != n:  # two broadcast operands would make length 1
            a = sub(n)
        return Binary(draw(st.sampled_from(sorted(BINARY))), a, b)
    if kind == "maxmin":
        a, b = sub(_operand_length(draw, n)), sub(_operand_length(draw, n))
        if a.length != n and b.length != n:
            a = sub(n)
        return Binary(draw(st.sampled_from(["maximum", "minimum"])), a, b)
    if kind == "where":
        parts = [sub(_operand_length(draw, n)) for _ in range(4)]
        if all(p.length != n for p in parts):
            parts[2] = sub(n)
        return Where(draw(st.sampled_from(sorted(COMPARE))), *parts)
    if kind == "clip":
        a = sub(n)
        return Clip(a, sub(_operand_length(draw, n)), sub(_operand_length(draw, n)))
    if kind == "reduce":
        return Reduce(draw(st.sampled_from(REDUCE)), sub(draw(st.integers(1, MAX_LEN))))
    if kind == "slice":
        step = draw(st.integers(1, 2)) if 2 * n - 1 <= 2 * MAX_LEN else 1
        span = (n - 1) * step + 1
        m = draw(st.integers(span, max(span, min(span + 3, 2 * MAX_LEN))))
        start = draw(st.integers(0, m - span))
        return Slice(sub(m), start, start + span, step)
    if kind == "gather":
        m = draw(st.integers(1, MAX_LEN))
        idx = tuple(draw(st.lists(st.integers(0, m - 1), min_size=n, max_size=n)))
        return Gather(sub(m), idx)
    if kind == "concat":
        k = draw(st.integers(1, n - 1))
        return Concat(sub(k), sub(n - k))
    if kind == "segment":
        m = draw(st.integers(1, MAX_LEN))
        ids = tuple(draw(st.lists(st.integers(0, n - 1), min_size=m, max_size=m)))
        return SegmentMax(draw(st.sampled_from(["max", "min"])), sub(m), ids, n)
    if kind == "setat":
        idx = tuple(draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=n, unique=True)))
        blen = len(idx) if draw(st.booleans()) else 1
        return SetAt(sub(n), idx, sub(blen))
    raise AssertionError(kind)


@st.composite
def programs_in_bodies(draw, max_depth=3):
    """A program (:func:`programs`, with extras) with one to two of its
    nodes computed inside a control-flow or call body
    (:class:`fuzzlib.program.Body`): the subtree a body holds, and the rest
    of the program around it, meet the body's boundary -- where forward
    mode's tangent masks and reverse mode's dead lanes cross it."""
    root = draw(programs(max_depth=max_depth, extras=True))
    for _ in range(draw(st.integers(1, 2))):
        root = _wrap_one(draw, root, draw(st.sampled_from(BODY_KINDS)))
    return root


def _wrap_one(draw, root, kind):
    """``root`` with one of its nodes (drawn uniformly) wrapped in a body."""
    targets = [n for n in nodes_of(root) if not isinstance(n, (Leaf, Const, Scalar))] or [root]
    target = draw(st.sampled_from(range(len(targets))))
    return _replace(root, targets[target], Body(kind, targets[target]))


def _replace(node, old, new):
    if node is old:
        return new
    changes = {
        k: _replace(v, old, new) for k, v in vars(node).items() if isinstance(v, Node.__args__)
    }
    return dataclasses.replace(node, **changes) if changes else node


@st.composite
def programs(draw, max_depth=4, unary=None, extras=False):
    """``extras`` (the JAX fuzzer): in about a third of the programs identity
    calls, and in about half binary ops that read the scalar input ``s``
    (see :data:`IDENTITY_ODDS`); segment maxima and minima throughout."""
    n = draw(st.sampled_from([N, N, N, 1, 2, 3, 5]))
    identity = extras and draw(st.integers(0, 2)) == 2
    scalar = extras and draw(st.integers(0, 1)) == 1
    return draw(nodes(n, draw(st.integers(1, max_depth)), unary, identity, scalar, extras))
