"""Elementwise operations: an input lane is live where the output lane is.

Binary TF ops broadcast implicitly (NumPy rules), so an operand's mask is the
output mask OR-reduced over the dimensions it was broadcast along.

Which ones need a guard mirrors the JAX table: operations whose local
derivative is a finite constant (``AddV2``, ``Sub``, ``Neg``, ``Identity``,
``Cast`` ...) pass an exact zero cotangent through and need none; everything
else (``Mul``: its derivative is the other operand, which can be inf; ``Sqrt``,
``Log``, ``RealDiv``, ``Pow``, ``Acos``, ``Atan2``, ``Exp`` ...) gets one.

Zero-derivative operations are those whose registered TF gradient is ``None``
or ``zeros_like`` (``Floor``, ``Sign``, ``StopGradient``, ``ZerosLike`` ...,
checked against ``math_grad.py``/``array_grad.py`` of TF 2.21); comparisons
and ``IsFinite`` produce booleans and never carry a derivative anyway.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

import passes.rules as passes_rules
from hlo_guard.tf.mask_ops import and_, broadcast_like, normalize, reduce_to
from hlo_guard.tf.rules.base import TFRule, dropping, forward_join, joined, n_inputs, or_all
from passes.lattice import LIVE, NO_DERIVATIVE, partial_by
from passes.masks import ALL


class Elementwise(TFRule):
    kind = "elementwise"
    lane_local = "same-shape"

    def __init__(self, guards: bool):
        self.guards = guards

    def transfer(self, analysis, node, outs):
        return [joined(outs)] * n_inputs(analysis, node)

    def input_masks(self, mctx, node, op, out_masks):
        out = or_all(out_masks)
        out_shape = mctx.shaped(op.outputs[0])
        return [reduce_to(out, out_shape, mctx.shaped(t)) for t in op.inputs]

    def broadcast_operand_mask(self, mctx, node, op, index, out_masks):
        """The mask at the *output* shape, for guarding a broadcast operand."""
        return or_all(out_masks)

    def forward(self, fa, node, ins):
        return forward_join(fa, node, ins)

    def forward_masks(self, mctx, node, op, in_masks):
        out = mctx.shaped(op.outputs[0])
        return [or_all([broadcast_like(m, out) for m in in_masks])] * len(op.outputs)

    def guards_output(self, analysis, node, index):
        """Scaling by a finite constant (``2 * x``, ``x / 4``) cannot turn a
        zero tangent into NaN: no output guard there."""
        if not self.guards:
            return False
        op = analysis.graph.op(node)
        consts = [i for i, t in enumerate(op.inputs) if t.op.type == "Const"]
        if op.type in ("Mul", "MulNoNan") and any(_bool_cast(t) for t in op.inputs):
            # a 0/1 mask (Keras's ``loss * cast(mask)``): finite, no tangent of its own
            return False
        if op.type in ("Mul", "MulNoNan") and consts:
            return not all(np.isfinite(_const(op.inputs[i])).all() for i in consts)
        if op.type in ("RealDiv", "Div") and consts == [1]:
            v = _const(op.inputs[1])
            return not (np.isfinite(v).all() and (v != 0).all())
        return True


def _const(t):
    return np.asarray(tf.get_static_value(t))


#: copies a 0/1 mask stays one through
_MASK_COPIES = frozenset({"Identity", "BroadcastTo", "Reshape", "ExpandDims", "Squeeze", "Tile"})


def _bool_cast(t, depth: int = 8) -> bool:
    """Whether ``t`` is a boolean cast to a number (every lane 0 or 1, no
    tangent), seen through copies."""
    for _ in range(depth):
        op = t.op
        if op.type == "Cast":
            return op.inputs[0].dtype == tf.bool
        if op.type not in _MASK_COPIES:
            return False
        t = op.inputs[0]
    return False


class ZeroWhereOperandIsZero(Elementwise):
    """``DivNoNan(x, y)`` and ``MulNoNan(x, y)`` are 0 where ``y == 0``,
    ``Xdivy(x, y)``, ``Xlogy(x, y)`` and ``Xlog1py(x, y)`` where ``x == 0``:
    a ``where`` that picks the constant 0 there.  TF's gradients agree: in
    those lanes they multiply the cotangent by an exact 0 (``div_no_nan(ct,
    y)``, ``xdivy(0, y)``, ``xlogy(0, y)``) -- except ``MulNoNan``'s ``y``,
    whose gradient is ``x * ct`` (TF differentiates that lane, so it stays
    live).  So the operands listed in ``dead`` are dead where the key operand
    is zero, and a singular op *upstream* of them (``div_no_nan(t,
    sqrt(p))`` at ``p = 0``) leaks ``0 * inf`` unless guarded, as behind any
    ``where``.  Still a hazard itself (``x / y**2`` may overflow)."""

    kind = "selection"

    def __init__(self, key: int, dead: tuple[int, ...]):
        super().__init__(guards=True)
        self.key = key
        self.dead = dead

    def transfer(self, analysis, node, outs):
        out = joined(outs)
        lv = dropping(analysis, node, out)
        return [lv if i in self.dead else out for i in range(n_inputs(analysis, node))]

    def _nonzero(self, mctx, op):
        out = mctx.shaped(op.outputs[0])
        k = mctx.value(op.inputs[self.key])
        return out, broadcast_like(normalize(tf.not_equal(k, tf.zeros([], k.dtype))), out)

    def input_masks(self, mctx, node, op, out_masks):
        out, nonzero = self._nonzero(mctx, op)
        full = or_all(out_masks)
        return [
            reduce_to(and_(full, nonzero) if i in self.dead else full, out, mctx.shaped(t))
            for i, t in enumerate(op.inputs)
        ]

    def broadcast_operand_mask(self, mctx, node, op, index, out_masks):
        full = or_all(out_masks)
        if index not in self.dead:
            return full
        return and_(full, self._nonzero(mctx, op)[1])

    def forward(self, fa, node, ins):
        joined_in = joined(ins)
        if not joined_in.reaches_output:
            return [NO_DERIVATIVE]
        return [partial_by(fa.graph.origin(node), joined_in)]

    def forward_masks(self, mctx, node, op, in_masks):
        out, nonzero = self._nonzero(mctx, op)
        return [
            or_all(
                [
                    and_(broadcast_like(m, out), nonzero)
                    if i in self.dead
                    else broadcast_like(m, out)
                    for i, m in enumerate(in_masks)
                ]
            )
        ]


class IdentityN(TFRule):
    """``IdentityN``: output i is input i.

    ``tf.custom_gradient`` is an ``IdentityN`` whose gradient is overridden
    (attribute ``_gradient_op_type``): what the user's rule sends where is
    unknown, so its inputs are kept fully live and the site is reported.
    """

    kind = "elementwise"

    def keeps_lanes_apart(self, analysis, node) -> bool:
        return not _has_custom_gradient(analysis.graph.op(node))

    def mask_passes_through(self, analysis, node, index) -> bool:
        return False  # output ``index`` is input ``index``: several outputs

    def transfer(self, analysis, node, outs):
        op = analysis.graph.op(node)
        if _has_custom_gradient(op):
            out = joined(outs)
            if out.reaches_output and not out.is_live:
                analysis.note_unreached(
                    node,
                    "tf.custom_gradient: the user's gradient is opaque; inputs kept fully live",
                    out,
                )
            return [LIVE if out.reaches_output else NO_DERIVATIVE] * len(op.inputs)
        return list(outs)

    def input_masks(self, mctx, node, op, out_masks):
        if _has_custom_gradient(op):
            return [ALL] * len(op.inputs)
        return list(out_masks)

    def forward(self, fa, node, ins):
        if _has_custom_gradient(fa.graph.op(node)):
            return [LIVE] * len(ins)
        return [lv.without_partition() for lv in ins]

    def forward_masks(self, mctx, node, op, in_masks):
        if _has_custom_gradient(op):
            return [ALL] * len(op.outputs)
        return list(in_masks)


def _has_custom_gradient(op) -> bool:
    try:
        op.get_attr("_gradient_op_type")
        return True
    except ValueError:
        return False


class ZeroDerivative(passes_rules.ZeroDerivative, TFRule):
    """TF registers no (or a zero) gradient: nothing flows back."""


class Source(ZeroDerivative):
    """``ReadVariableOp`` and other sources: nothing flows back to a handle,
    but a variable may be a primal of a ``ForwardAccumulator``: its value's
    tangent is live."""

    def forward(self, fa, node, ins):
        return [LIVE] * len(fa.graph.node_outputs(node))

    def forward_masks(self, mctx, node, op, in_masks):
        return [ALL] * len(op.outputs)


# Derivative is a finite constant: a zero cotangent stays exactly zero.
LINEAR = [
    "Add",
    "AddV2",
    "Sub",
    "Neg",
    "Identity",
    "Snapshot",
    "Cast",
    "Real",
    "Imag",
    "Conj",
    "Complex",
    "AddN",
    "EnsureShape",
    "CheckNumerics",
    "CheckNumericsV2",
    "PlaceholderWithDefault",
    "PreventGradient",
]

# Local derivative may be non-finite (or is another operand that may be).
NONLINEAR = [
    "Mul",
    "RealDiv",
    "Div",
    "FloorMod",
    "Mod",
    "TruncateMod",
    "Pow",
    "Square",
    "SquaredDifference",
    "Sqrt",
    "Rsqrt",
    "Reciprocal",
    "Inv",
    "Exp",
    "Expm1",
    "Log",
    "Log1p",
    "Sigmoid",
    "Tanh",
    "Sin",
    "Cos",
    "Tan",
    "Asin",
    "Acos",
    "Atan",
    "Atan2",
    "Asinh",
    "Acosh",
    "Atanh",
    "Sinh",
    "Cosh",
    "Abs",
    "ComplexAbs",
    "Erf",
    "Erfc",
    "Erfinv",
    "Ndtri",
    "Lgamma",
    "Digamma",
    "Igamma",
    "Igammac",
    "Polygamma",
    "Zeta",
    "Betainc",
    "Softplus",
    "Softsign",
    "Elu",
    "Selu",
    "LeakyRelu",
    "BesselI0e",
    "BesselI1e",
    "Angle",
]

# Registered gradient is None or zeros_like (TF 2.21 math_grad/array_grad).
ZERO_DERIVATIVE = [
    "Floor",
    "Ceil",
    "Round",
    "Rint",
    "Sign",
    "StopGradient",
    "ZerosLike",
    "OnesLike",
    "FloorDiv",
    "TruncateDiv",
    "Equal",
    "NotEqual",
    "Less",
    "LessEqual",
    "Greater",
    "GreaterEqual",
    "ApproximateEqual",
    "IsFinite",
    "IsNan",
    "IsInf",
    "LogicalAnd",
    "LogicalOr",
    "LogicalNot",
    "ArgMax",
    "ArgMin",
    "Shape",
    "ShapeN",
    "Size",
    "Rank",
    "OneHot",
    "RandomUniform",
    "RandomStandardNormal",
    "TruncatedNormal",
    "StatelessRandomUniform",
    "StatelessRandomNormal",
    "StatelessRandomUniformV2",
    "StatelessRandomNormalV2",
    "StatelessTruncatedNormal",
    "StatelessTruncatedNormalV2",
    "Range",
    "LinSpace",
]

# No differentiable input: nothing to analyse, nothing to report.
SOURCES = ["Const", "Placeholder", "VarHandleOp", "ReadVariableOp", "NoOp"]


def register(table):
    table.register(LINEAR, Elementwise(guards=False))
    table.register(NONLINEAR, Elementwise(guards=True))
    table.register("DivNoNan", ZeroWhereOperandIsZero(key=1, dead=(0, 1)))
    table.register("MulNoNan", ZeroWhereOperandIsZero(key=1, dead=(0,)))
    table.register(["Xdivy", "Xlogy", "Xlog1py"], ZeroWhereOperandIsZero(key=0, dead=(0, 1)))
    table.register(ZERO_DERIVATIVE, ZeroDerivative())
    table.register(SOURCES, Source())
    table.register("IdentityN", IdentityN())
