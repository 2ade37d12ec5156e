"""Selecting primitives: where lanes die.

Each rule mirrors the convention of JAX's own derivative exactly, because a
lane JAX differentiates must never be marked dead:

* ``select_n(p, *cases)``: case k is live where ``p == k``.  Its JVP selects
  tangents and its transpose selects cotangents, so no guard is needed *at*
  the select; the guards go on the operations that computed the cases.
* ``max``/``min``: JAX multiplies the tangent by ``_balanced_eq`` (1, 1/2 on a
  tie, 0 for the loser), so an operand is live where it equals the result.  A
  multiply by 0 turns an inf/NaN tangent or cotangent into NaN, hence these
  operands *are* guarded.
* ``clamp(lo, x, hi)``: JAX selects: ``x`` where ``lo < x < hi`` (strict),
  ``lo`` where ``lo > x`` and ``lo < hi``, ``hi`` where ``hi < x``.
* ``reduce_max``/``reduce_min``: location indicators ``x == max`` (ties share),
  multiplied -- guarded.

A NaN is the exception to "the loser is dead".  XLA's ``max``, ``min`` and
``clamp`` propagate a NaN operand, so a NaN result lane *came from* that
operand: the path is taken, and contract 3 forbids hiding its NaN gradient.
JAX's own indicators (``x == ans``, strict bounds) are false for NaN on every
side, which read literally would make every operand of such a lane dead and
its guard would zero the gradient under a NaN loss (``arccos(clip(0 / 0))``;
``log(maximum(nan, eps))`` had grad 0 but jacfwd NaN).  So each mask also
holds where its own operand is NaN (:func:`holds_result`; for ``clamp``, a
NaN operand or bound, which ``clamp`` returns as well).  On every lane
without a NaN it is JAX's condition exactly; on a NaN lane the NaN operands
are live, with JAX's own coefficient (0: their infinite or NaN derivative
gives NaN, as in plain JAX), and a finite operand beside them lost to the
NaN and stays dead.
"""

from __future__ import annotations

import numpy as np

from hlo_guard.jax_frontend.graph import is_inexact_aval, is_literal
from hlo_guard.jax_frontend.mask_ops import (
    and_,
    broadcast_to,
    holds_result,
    is_static,
    lax_ops,
    normalize,
    reduce_to_shape,
    xp,
)
from hlo_guard.jax_frontend.rules.base import (
    ForwardExitSelection,
    JaxRule,
    LazyMasks,
    aval_shape,
    dropping,
    forward_placed,
    joined,
    or_all,
)
from passes.lattice import NO_DERIVATIVE, case_of, dead_by, partial_by
from passes.masks import ALL, NONE


def _chosen_forward(chosen_masks, in_masks, shape):
    """OR over operands of (operand chosen) AND (operand's tangent live)."""
    return or_all(
        and_(normalize(broadcast_to(c, shape)), broadcast_to(m, shape), shape)
        for c, m in zip(chosen_masks, in_masks)
    )


def forward_chosen(fa, node, ins):
    """``max``/``min``/``clamp``: the output is never statically fully live in
    forward mode; its mask (:func:`_chosen_forward`) says which lanes take a
    live tangent.  (Written when a NaN lane counted as taking no operand.
    Since NaN operands count as taken, ``max``/``min`` of two operands with
    fully live tangents is live in every lane, and its output guard selects
    nothing; a cheaper reading would skip it.  ``clamp`` with a constant
    bound still has lanes without a tangent.)"""
    eqn = fa.graph.eqns[node]
    floats = [lv for v, lv in zip(eqn.invars, ins) if is_inexact_aval(v.aval)]
    if not any(lv.reaches_output for lv in floats):
        return [NO_DERIVATIVE] * len(eqn.outvars)
    placed = forward_placed(fa, node, ins)[0]
    out = placed if not placed.is_live else partial_by(fa.graph.origin(node))
    return [out] * len(eqn.outvars)


def predicate_value(mctx, var):
    """The value of a select's predicate, as a remembered broadcast when the
    program made it with ``broadcast_in_dim`` (``jnp.where`` broadcasts its
    ``[B, T, 1]`` condition to the operands' shape): masks built from it then
    stay at the predicate's own shape until a guard needs the full one."""
    value = mctx.value(var)
    if is_literal(var) or is_static(value):
        return value
    producer = mctx.graph.producer(var)
    if producer is None:
        return value
    eqn = mctx.graph.eqns[producer[0]]
    if eqn.primitive.name != "broadcast_in_dim" or len(eqn.invars) != 1:
        return value
    source = eqn.invars[0]
    if is_literal(source) or np.dtype(source.aval.dtype) != np.dtype(var.aval.dtype):
        return value
    return lax_ops.broadcast_in_dim(
        predicate_value(mctx, source), aval_shape(var), eqn.params["broadcast_dimensions"]
    )


class SelectN(JaxRule):
    lane_local = "same-shape"
    kind = "selection"

    def transfer(self, analysis, node, outs):
        eqn = analysis.graph.eqns[node]
        out = joined(outs)
        n_cases = len(eqn.invars) - 1
        if not out.reaches_output:
            return [NO_DERIVATIVE] * (n_cases + 1)
        origin = analysis.graph.origin(node)
        pred = eqn.invars[0]
        if is_literal(pred) and np.ndim(pred.val) == 0:
            chosen = int(pred.val)
            cases = [out if k == chosen else dead_by(origin) for k in range(n_cases)]
        elif out.is_dead:
            cases = [out.with_origin(origin)] * n_cases
        else:
            cases = [case_of(origin, k, n_cases, out) for k in range(n_cases)]
        return [NO_DERIVATIVE] + cases

    def input_masks(self, mctx, node, eqn, out_masks):
        out = out_masks[0]
        shape = aval_shape(eqn.outvars[0])

        def case_mask(i):
            if i == 0:
                return NONE
            chosen = self._case_chosen(mctx, eqn, i - 1)
            return and_(out, normalize(broadcast_to(chosen, shape)), shape)

        return LazyMasks(case_mask, len(eqn.invars))

    @staticmethod
    def _case_chosen(mctx, eqn, k):
        """Lanes where the select takes case ``k`` (a bool predicate: 0 = False)."""
        p = predicate_value(mctx, eqn.invars[0])
        m = xp(p)
        if np.dtype(eqn.invars[0].aval.dtype) == np.bool_:
            return p if k == 1 else m.logical_not(p)
        return m.equal(p, k)

    def _chosen(self, mctx, eqn):
        chosen = [self._case_chosen(mctx, eqn, k) for k in range(len(eqn.invars) - 1)]
        return chosen, aval_shape(eqn.outvars[0])

    def forward(self, fa, node, ins):
        eqn = fa.graph.eqns[node]
        pred = eqn.invars[0]
        if is_literal(pred) and np.ndim(pred.val) == 0:
            return [ins[1 + int(pred.val)]]
        return forward_placed(fa, node, [NO_DERIVATIVE] + list(ins[1:]))

    def forward_masks(self, mctx, node, eqn, in_masks):
        chosen, shape = self._chosen(mctx, eqn)
        return [_chosen_forward(chosen, in_masks[1:], shape)]


class MaxMin(ForwardExitSelection):
    """``max``/``min``: live where the operand equals the result (ties: both;
    JAX's JVP multiplies each operand's tangent by a 0/0.5/1 indicator), and
    on a NaN lane (module docstring)."""

    lane_local = "same-shape"
    kind = "selection"

    def transfer(self, analysis, node, outs):
        eqn = analysis.graph.eqns[node]
        lv = dropping(analysis, node, joined(outs))
        return [lv] * len(eqn.invars)

    def input_masks(self, mctx, node, eqn, out_masks):
        out = out_masks[0]
        shape = aval_shape(eqn.outvars[0])
        ans = mctx.value(eqn.outvars[0])

        def operand_mask(i):
            v = eqn.invars[i]
            x = mctx.value(v)
            chosen = normalize(broadcast_to(holds_result(xp(x, ans), x, ans), shape))
            return reduce_to_shape(and_(out, chosen, shape), shape, aval_shape(v))

        # lazily: ``minimum(x, 1.0)``'s literal needs no mask, and an unused
        # mask would be a traced comparison and reduction in the program
        return LazyMasks(operand_mask, len(eqn.invars))

    def broadcast_operand_mask(self, mctx, node, eqn, index, out_masks):
        shape = aval_shape(eqn.outvars[0])
        ans = mctx.value(eqn.outvars[0])
        x = mctx.value(eqn.invars[index])
        chosen = normalize(broadcast_to(holds_result(xp(x, ans), x, ans), shape))
        return and_(out_masks[0], chosen, shape)

    def forward(self, fa, node, ins):
        return forward_chosen(fa, node, ins)

    def forward_masks(self, mctx, node, eqn, in_masks):
        shape = aval_shape(eqn.outvars[0])
        ans = mctx.value(eqn.outvars[0])
        chosen, tangents = [], []
        for v, m in zip(eqn.invars, in_masks):
            if m is NONE:  # no tangent (a literal bound): its choice adds nothing
                continue
            x = mctx.value(v)
            chosen.append(holds_result(xp(x, ans), x, ans))
            tangents.append(m)
        return [_chosen_forward(chosen, tangents, shape)]


def _clamp_chosen(mctx, eqn):
    """Which operand of ``clamp(lo, x, hi)`` JAX's JVP selects in each lane
    (strict inequalities, as in ``lax._clamp_jvp``), or is NaN there: XLA's
    ``clamp`` returns a NaN operand or bound (module docstring)."""
    lo, x, hi = (mctx.value(v) for v in eqn.invars)
    m = xp(lo, x, hi)

    def or_nan(chosen, v):
        return m.logical_or(chosen, m.not_equal(v, v))

    return [
        lambda: or_nan(m.logical_and(m.greater(lo, x), m.less(lo, hi)), lo),
        lambda: or_nan(m.logical_and(m.greater(x, lo), m.less(x, hi)), x),
        lambda: or_nan(m.less(hi, x), hi),
    ]


class Clamp(JaxRule):
    lane_local = "same-shape"
    kind = "selection"

    def transfer(self, analysis, node, outs):
        lv = dropping(analysis, node, joined(outs))
        return [lv, lv, lv]

    def input_masks(self, mctx, node, eqn, out_masks):
        out = out_masks[0]
        shape = aval_shape(eqn.outvars[0])
        chosen = _clamp_chosen(mctx, eqn)
        return LazyMasks(
            lambda i: reduce_to_shape(
                and_(out, normalize(broadcast_to(chosen[i](), shape)), shape),
                shape,
                aval_shape(eqn.invars[i]),
            ),
            3,
        )

    def broadcast_operand_mask(self, mctx, node, eqn, index, out_masks):
        shape = aval_shape(eqn.outvars[0])
        chosen = _clamp_chosen(mctx, eqn)[index]()
        return and_(out_masks[0], normalize(broadcast_to(chosen, shape)), shape)

    def forward(self, fa, node, ins):
        return forward_chosen(fa, node, ins)

    def forward_masks(self, mctx, node, eqn, in_masks):
        shape = aval_shape(eqn.outvars[0])
        chosen = [c() for c in _clamp_chosen(mctx, eqn)]
        return [_chosen_forward(chosen, in_masks, shape)]


class ReduceChooser(ForwardExitSelection):
    """``reduce_max``/``reduce_min``: live where the element equals the result
    (JAX's JVP sums tangent * location-indicator / count), and where the
    element is NaN (module docstring)."""

    kind = "selection"

    def transfer(self, analysis, node, outs):
        return [dropping(analysis, node, joined(outs))]

    def input_masks(self, mctx, node, eqn, out_masks):
        axes = tuple(eqn.params["axes"])
        in_shape = aval_shape(eqn.invars[0])
        keep = tuple(1 if d in axes else s for d, s in enumerate(in_shape))
        x = mctx.value(eqn.invars[0])
        ans = mctx.value(eqn.outvars[0])
        m = xp(x, ans)
        chosen = normalize(holds_result(m, x, m.reshape(ans, keep)))
        out = out_masks[0]
        if out is not ALL and out is not NONE:
            out = normalize(xp(out).broadcast_to(xp(out).reshape(out, keep), in_shape))
        return [and_(out, chosen, in_shape)]

    def forward(self, fa, node, ins):
        return [
            ins[0]
            if ins[0].is_live or not ins[0].reaches_output
            else partial_by(fa.graph.origin(node), ins[0])
        ]

    def forward_masks(self, mctx, node, eqn, in_masks):
        tin = in_masks[0]
        if tin is ALL or tin is NONE:
            return [tin]
        axes = tuple(eqn.params["axes"])
        in_shape = aval_shape(eqn.invars[0])
        keep = tuple(1 if d in axes else s for d, s in enumerate(in_shape))
        x = mctx.value(eqn.invars[0])
        ans = mctx.value(eqn.outvars[0])
        m = xp(x, ans, tin)
        chosen_live = m.logical_and(holds_result(m, x, m.reshape(ans, keep)), tin)
        return [normalize(m.any(chosen_live, axis=axes))]


def register(table):
    table.register("select_n", SelectN())
    table.register(["max", "min"], MaxMin())
    table.register("clamp", Clamp())
    table.register(["reduce_max", "reduce_min"], ReduceChooser())
