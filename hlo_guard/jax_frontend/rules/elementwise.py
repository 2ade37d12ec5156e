"""Elementwise primitives: a lane of an input is live where the output is.

Binary lax operations broadcast rank-0 operands (and size-1 dimensions)
implicitly, so an operand's mask is the output mask OR-reduced over the
dimensions it was broadcast along.

Which elementwise operations need a guard?  Those whose local derivative can be
non-finite -- ``sqrt'(0)``, ``log'(0)``, ``d(1/x)``, ``arccos'(1)`` -- but also
``mul`` (its derivative is the *other* operand, which can be inf) and almost
everything else.  Only operations whose derivative is a finite constant (add,
sub, neg, conversions, real/imag/conj) pass an exact zero cotangent through
unchanged and need none; the mask still flows through them.
"""

from __future__ import annotations

import numpy as np

import passes.rules as passes_rules
from hlo_guard.jax_frontend.mask_ops import broadcast_to, reduce_to_shape
from hlo_guard.jax_frontend.rules.base import (
    JaxRule,
    LazyMasks,
    aval_shape,
    forward_join,
    or_all,
    same_as_output,
)
from hlo_guard.jax_frontend.value_bounds import lower_bound


class Elementwise(JaxRule):
    lane_local = "same-shape"
    kind = "elementwise"

    def __init__(self, guards: bool):
        self.guards = guards

    def transfer(self, analysis, node, outs):
        return same_as_output(analysis.graph.eqns[node], outs)

    def input_masks(self, mctx, node, eqn, out_masks):
        out = or_all(out_masks)
        out_shape = aval_shape(eqn.outvars[0])
        return LazyMasks(
            lambda i: reduce_to_shape(out, out_shape, aval_shape(eqn.invars[i])), len(eqn.invars)
        )

    def broadcast_operand_mask(self, mctx, node, eqn, index, out_masks):
        """The mask of input ``index`` at the *output's* shape, for an operand the
        op broadcasts implicitly (:class:`passes.rules.BroadcastOperandRule`)."""
        return or_all(out_masks)

    def forward(self, fa, node, ins):
        return forward_join(fa, node, ins)

    def guards_output(self, analysis, node, index):
        """Scaling by a finite constant known while tracing (``2 * x``,
        ``x / 4``, also through ``jnp``'s wrappers, which receive the scalar
        as an input: :meth:`JaxprGraph.known_constant`) cannot turn a zero
        tangent into NaN: no output guard there."""
        if not self.guards:
            return False
        graph = analysis.graph
        eqn = graph.eqns[node]
        name = eqn.primitive.name
        if name not in ("mul", "div"):
            return True
        known = {i: graph.known_constant(v) for i, v in enumerate(eqn.invars)}
        known = {i: val for i, val in known.items() if val is not None}
        if name == "mul" and known:
            return not all(np.all(np.isfinite(val)) for val in known.values())
        if name == "div" and list(known) == [1]:
            val = known[1]
            return not (np.all(np.isfinite(val)) and np.all(val != 0))
        if name == "div":
            # d(n / d) = dn / d - n dd / d**2: finite wherever n is when d >= 1
            # (the masked mean's ``maximum(count, 1)``)
            bound = lower_bound(graph, eqn.invars[1])
            return bound is None or bound < 1.0
        return True

    def forward_masks(self, mctx, node, eqn, in_masks):
        shape = aval_shape(eqn.outvars[0])
        m = or_all(broadcast_to(m, shape) for m in in_masks)
        return [m] * len(eqn.outvars)


class ZeroDerivative(passes_rules.ZeroDerivative, JaxRule):
    lane_local = True
    """Comparisons, rounding, sign, ``stop_gradient``, argmax ...: JAX gives
    these a zero (or no) derivative, so nothing flows back through them."""


# Derivative is a finite constant: a zero cotangent stays exactly zero.
LINEAR_ELEMENTWISE = [
    "add",
    "sub",
    "neg",
    "add_any",
    "convert_element_type",
    "reduce_precision",
    "real",
    "imag",
    "complex",
    "conj",
]

# Local derivative may be non-finite (or is another operand that may be).
NONLINEAR_ELEMENTWISE = [
    "mul",
    "div",
    "rem",
    "pow",
    "integer_pow",
    "square",
    "sqrt",
    "rsqrt",
    "cbrt",
    "exp",
    "exp2",
    "expm1",
    "log",
    "log1p",
    "log2",  # jax 0.11+
    "one_minus_square",  # jax 0.11+: 1 - x**2 with its own JVP -2x
    "polynomial",  # jax 0.12+: Horner's rule, coefficients broadcast like a binary op
    "logistic",
    "tanh",
    "tan",
    "sin",
    "cos",
    "sinh",
    "cosh",
    "asin",
    "acos",
    "atan",
    "asinh",
    "acosh",
    "atanh",
    "atan2",
    "abs",
    "erf",
    "erfc",
    "erf_inv",
    "lgamma",
    "digamma",
    "igamma",
    "igammac",
    "igamma_grad_a",
    "polygamma",
    "zeta",
    "bessel_i0e",
    "bessel_i1e",
    "regularized_incomplete_beta",
    "nextafter",
]

ZERO_DERIVATIVE = [
    "eq",
    "ne",
    "lt",
    "le",
    "gt",
    "ge",
    "eq_to",
    "lt_to",
    "le_to",
    "sign",
    "floor",
    "ceil",
    "round",
    "is_finite",
    "stop_gradient",
    "and",
    "or",
    "not",
    "xor",
    "shift_left",
    "shift_right_arithmetic",
    "shift_right_logical",
    "population_count",
    "clz",
    "argmax",
    "argmin",
    "iota",
    "reduce_and",
    "reduce_or",
    "reduce_xor",
    "random_bits",
    "random_seed",
    "random_wrap",
    "random_unwrap",
    "random_fold_in",
    "random_split",
    "threefry2x32",
    "rng_bit_generator",
    "rng_uniform",
    "bitcast_convert_type",
    "lu_pivots_to_permutation",
    "zeros_like",
]


def register(table):
    table.register(LINEAR_ELEMENTWISE, Elementwise(guards=False))
    table.register(NONLINEAR_ELEMENTWISE, Elementwise(guards=True))
    table.register(ZERO_DERIVATIVE, ZeroDerivative())
