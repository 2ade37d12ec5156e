"""Matrix decompositions and solves: lanes mix within a matrix, not across the batch.

``cholesky``, ``eigh``, ``svd``, ``qr``, ``lu`` and ``triangular_solve`` work
on the last two axes of their operands; every leading axis is a batch of
independent problems.  Their derivatives mix every lane of a matrix with every
other (``L^{-1} dA L^{-T}``, ``1 / (w_i - w_j)``), so no lane of a matrix is
structurally dead while one output lane of that matrix is live -- but a
matrix none of whose output lanes is live (a padded batch element, a masked
Gaussian-process dimension) is dead in every lane, and its NaN (the Cholesky
of a matrix that is not positive definite) is discarded where it meets live
computation, as for any other hazard.

So: an output mask reduced over its matrix axes, ORed over the outputs, and
spread over each operand's matrix axes.  Within a matrix nothing is followed --
some decompositions never read a triangle, a solve's columns are independent
-- so, as for an op without a rule, the site is reported whenever a
derivative flows through it (:meth:`MatrixMixing._report`).  Forward mode is not followed lane by
lane (a Cholesky factor's upper triangle has a zero tangent whatever comes
in): as for an op without a rule, the outputs' tangents are taken as live and
a partly zero tangent arriving is noted, so a singular op after it is
reported.
"""

from __future__ import annotations

from hlo_guard.jax_frontend.graph import is_inexact_aval, is_literal
from hlo_guard.jax_frontend.mask_ops import normalize, xp
from hlo_guard.jax_frontend.rules.base import aval_shape
from hlo_guard.jax_frontend.rules.structural import Conservative, _place
from passes.lattice import NO_DERIVATIVE, join_all, partial_by
from passes.masks import ALL, NONE

#: decompositions and solves over the last two axes, batched over the rest
MATRIX_OPS = ("cholesky", "eigh", "svd", "qr", "lu", "triangular_solve")


class MatrixMixing(Conservative):
    """A batch element is live in every lane iff one of its output lanes is."""

    kind = "structural"
    guards = True

    def __init__(self):
        super().__init__("linear algebra: forward tangents not followed lane by lane")

    @staticmethod
    def _batch_rank(eqn) -> int:
        return len(aval_shape(eqn.invars[0])) - 2

    def transfer(self, analysis, node, outs):
        eqn = analysis.graph.eqns[node]
        reached = [o for o in outs if o.reaches_output]
        out = join_all(reached).without_partition() if reached else None
        if out is not None:
            self._report(analysis, node, eqn, out)
        return [
            out
            if out is not None and not is_literal(v) and is_inexact_aval(v.aval)
            else NO_DERIVATIVE
            for v in eqn.invars
        ]

    @staticmethod
    def _report(analysis, node, eqn, out) -> None:
        """Within a matrix, lanes are not followed: a triangle the operation
        does not read (``triangular_solve``'s other half, a Cholesky without
        symmetrisation), a column of ``b`` no live output column reaches,
        an ``R`` entry a QR column cannot reach -- those are kept live, and
        a singular op behind them is unguarded.  So, as for an op without a
        rule, the site is reported whenever a derivative flows through it;
        the difference is that a wholly dead batch element is guarded."""
        name = eqn.primitive.name
        reason = (
            f"{name}: lanes within one matrix are not followed (a triangle or column it "
            "does not read is kept live); only a wholly dead batch element is guarded"
        )
        if out.is_live:
            out = partial_by(analysis.graph.origin(node))
        analysis.note_unreached(node, reason, out)

    def input_masks(self, mctx, node, eqn, out_masks):
        nb = self._batch_rank(eqn)
        batch = NONE
        for v, m in zip(eqn.outvars, out_masks):
            if m is NONE or not is_inexact_aval(v.aval):
                continue
            if m is ALL:
                batch = ALL
                break
            ops = xp(m)
            axes = tuple(range(nb, len(aval_shape(v))))
            reduced = ops.any(m, axis=axes) if axes else m
            batch = reduced if batch is NONE else xp(batch, reduced).logical_or(batch, reduced)
        masks = []
        for v in eqn.invars:
            if is_literal(v) or not is_inexact_aval(v.aval) or batch is NONE:
                masks.append(NONE)
            elif batch is ALL:
                masks.append(ALL)
            else:
                masks.append(normalize(_place(xp(batch), batch, aval_shape(v), range(nb))))
        return masks

    def guards_output(self, analysis, node, index) -> bool:
        return False  # forward mode: not followed (see the module)


def register(table):
    table.register(list(MATRIX_OPS), MatrixMixing())
