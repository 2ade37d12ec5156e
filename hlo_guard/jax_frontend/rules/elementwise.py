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
from hlo_guard.jax_frontend.graph import is_bool
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

    def guards_input(self, analysis, node, index):
        """A zero cotangent scaled by a finite constant known while tracing
        stays an exact zero: the operand ``x`` of ``2 * x`` or ``x * (1 /
        jnp.sqrt(d))`` is no hazard, whatever ``x`` holds.  A *division* by
        a known constant (``x / keep_prob``, ``jnp.mean``'s count) would be
        the same, but is still read as a hazard: without the guard on
        ``jnp.mean``'s operand in a layer norm, the 2-layer transformer's
        remaining guards took their masks from values computed on the side
        (``make bench``, 2026-11-27: 3627 -> 4657 gradient instructions).
        The guarded jaxpr is smaller without it; XLA recomputes the side
        mask (``var > 0``) inside every fusion that reads it (RESULTS.md,
        nineteenth session), so the instruction count of item 2 grows."""
        if not super().guards_input(analysis, node, index):
            return False
        eqn = analysis.graph.eqns[node]
        if eqn.primitive.name == "mul" and len(eqn.invars) == 2:
            other = eqn.invars[1 - index]
            return not (_finite_constant(analysis.graph, other) or _mask(analysis.graph, other))
        return True

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
        if name in _BOUNDED_BELOW_DERIVATIVE:
            return not _finite_derivative_above(graph, eqn.invars[0], name)
        if name not in ("mul", "div"):
            return True
        if name == "mul" and any(_mask(graph, v) for v in eqn.invars):
            return False  # a 0/1 factor without a tangent: a finite scale
        known = {i: graph.known_constant(v) for i, v in enumerate(eqn.invars)}
        known = {i: val for i, val in known.items() if val is not None}
        if name == "mul" and known:
            return not all(np.all(np.isfinite(val)) for val in known.values())
        if name == "div" and list(known) == [1]:
            return not _finite_constant(graph, eqn.invars[1], nonzero=True)
        if name == "div" and list(known) == [0] and _finite_constant(graph, eqn.invars[0]):
            # ``1 / sqrt(var + eps)``: d(n / d) = -n dd / d**2, bounded when d is
            numerator = float(np.max(np.abs(np.asarray(graph.known_constant(eqn.invars[0])))))
            return not _finite_derivative_above(graph, eqn.invars[1], "reciprocal", numerator)
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


#: the magnitude of the derivative at ``x``, decreasing for ``x > 0``: a
#: lower bound ``b > 0`` of the operand bounds it by its value at ``b``
_BOUNDED_BELOW_DERIVATIVE = {
    "sqrt": lambda b: 0.5 / np.sqrt(b),
    "rsqrt": lambda b: 0.5 * b**-1.5,
    "log": lambda b: 1.0 / b,
    # of a known finite numerator over d, per unit of the numerator
    "reciprocal": lambda b: 1.0 / (b * b),
}


def _finite_derivative_above(graph, atom, name: str, scale: float = 1.0) -> bool:
    """Whether the operand is bounded below by some ``b > 0`` at which the
    derivative is still finite in the operand's dtype: then a structurally
    zero tangent stays zero through the op (``rsqrt(var + eps)`` in every
    layer norm, the variance clamped at 0 by ``maximum``).  The bound holds
    for every element that is not NaN (:mod:`value_bounds`): a NaN operand
    is NaN in the forward value as well, a genuine singularity that no
    guard should hide."""
    bound = lower_bound(graph, atom)
    if bound is None or not bound > 0:
        return False
    dtype = np.dtype(atom.aval.dtype)
    if not np.issubdtype(dtype, np.floating):
        return False
    with np.errstate(all="ignore"):
        # the bound as the dtype holds it, a step down for the rounding
        b = float(np.nextafter(np.asarray(bound, dtype), np.asarray(0, dtype)))
        if not b > 0:
            return False
        slope = scale * _BOUNDED_BELOW_DERIVATIVE[name](b)
        return bool(slope <= float(np.finfo(dtype).max))


#: copies a 0/1 mask stays one through (for :func:`_mask`)
_MASK_COPIES = frozenset({"broadcast_in_dim", "reshape", "squeeze", "expand_dims"})


def _mask(graph, atom) -> bool:
    """Whether ``atom`` is a boolean converted to a number (``m.astype(f32)``:
    every lane 0 or 1, no derivative of its own), seen through copies and
    calls.  A factor like that scales a cotangent or tangent finitely."""
    found = graph.beneath(atom, _MASK_COPIES)
    if found is None:
        return False
    eqn = found[1]
    return eqn.primitive.name == "convert_element_type" and is_bool(eqn.invars[0])


def _finite_constant(graph, atom, nonzero: bool = False) -> bool:
    """Whether ``atom`` is known while tracing, finite in every lane (and
    non-zero, if asked)."""
    val = graph.known_constant(atom)
    if val is None:
        return False
    with np.errstate(all="ignore"):
        arr = np.asarray(val)
        if not np.issubdtype(arr.dtype, np.number) or arr.size == 0:
            return False
        return bool(np.all(np.isfinite(arr)) and (not nonzero or np.all(arr != 0)))


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
    # ``random_gamma(key, a)``: lane ``i`` of the sample is drawn with ``a[i]``
    # (the key is split per lane inside), and its derivative is
    # ``random_gamma_grad(a, sample) * t``, NaN for ``a <= 0``
    "random_gamma",
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
