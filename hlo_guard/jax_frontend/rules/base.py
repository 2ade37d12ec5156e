"""Common shape of a JAX rule: static transfer plus a per-lane mask function.

``transfer`` and ``guards_input`` are what :mod:`passes` needs.  ``input_masks``
turns the masks of an equation's outputs into one mask per input; it reads the
values it needs (predicates, operands, indices) through ``mctx.value``, which
returns the value from the guarded evaluation when it already exists and
computes it (unguarded, gradient-stopped) otherwise.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hlo_guard.jax_frontend.graph import is_inexact_aval, is_literal
from hlo_guard.jax_frontend.mask_ops import stretched_axes
from passes import rules as passes_rules
from passes.lattice import LIVE, NO_DERIVATIVE, Level, Liveness, join_all, merge_origins
from passes.masks import ALL
from passes.masks import or_all as passes_or_all
from passes.rules import BroadcastOperandRule, Rule, dropping, implements, joined  # noqa: F401  (shared helpers, re-exported)


def _cotangent_stops_at(analysis, v) -> bool:
    """Whether a cotangent summed into ``v`` goes no further: ``v`` is a
    constant, or the result of an op with no derivative (``stop_gradient``:
    the max that ``softmax`` subtracts), seen through the ``jnp`` wrapper
    calls around it.  A broadcast of such an operand sums dead lanes'
    cotangents into lanes that are then dropped, so it mixes nothing that
    matters: ``exp(x - stop_gradient(m))`` needs no guard between the ``sub``
    and the ``exp``."""
    graph, atom = analysis.graph.value_source(v)
    if graph.is_constant(atom):
        return True
    found = graph.producer(atom)
    if found is None:
        return False
    rule = analysis.rules.get(graph.op_name(found[0]))
    return isinstance(rule, passes_rules.ZeroDerivative)


class JaxRule(Rule):
    #: True when a partly dead input needs ``select(mask, x, stop_gradient(x))``
    guards = False

    def guards_input(self, analysis, node, index) -> bool:
        if not self.guards:
            return False
        atom = analysis.graph.eqns[node].invars[index]
        return not is_literal(atom) and is_inexact_aval(atom.aval)

    def input_masks(self, mctx, node: int, eqn, out_masks: list[Any]) -> list[Any]:
        raise NotImplementedError(type(self).__name__)

    def keeps_lanes_apart(self, analysis, node) -> bool:
        """Lane-local when the rule class says so (``lane_local``) and, for
        ops that could broadcast an operand implicitly, every differentiable
        operand has the output's shape (a scalar ``w`` in ``w * x`` gathers
        every output lane's cotangent: that is lane mixing)."""
        if not self.lane_local:
            return False
        if self.lane_local != "same-shape":
            return True
        # asked of every node by each placement sweep: plain loops, no sets
        eqn = analysis.graph.eqns[node]
        outs = eqn.outvars
        if not outs:
            return False
        shape = aval_shape(outs[0])
        for v in outs[1:]:
            if aval_shape(v) != shape:
                return False
        for i, v in enumerate(eqn.invars):
            if is_literal(v) or not is_inexact_aval(v.aval):
                continue
            if aval_shape(v) != shape and analysis.use(node, i).reaches_output:
                if not _cotangent_stops_at(analysis, v):
                    return False  # (a constant operand mixes nothing)
        return True

    def broadcasts_operand(self, analysis, node, index) -> bool:
        """A differentiable operand of another shape than the output, of an
        op that guards such operands at the output's shape."""
        if not implements(self, BroadcastOperandRule):
            return False
        eqn = analysis.graph.eqns[node]
        v = eqn.invars[index]
        if is_literal(v) or not is_inexact_aval(v.aval) or len(eqn.outvars) != 1:
            return False
        return aval_shape(v) != aval_shape(eqn.outvars[0])

    def guards_in_forward_context(self, backward, forward, node) -> bool:
        """True for a call whose body is evaluated in its caller's forward
        context: the body's plan reads the caller's forward analysis of it,
        and the caller passes its operands' tangent masks in
        (:meth:`Call.guards_in_forward_context`).  No other op has a body."""
        return False

    def forward_unfollowed(self, backward, forward, node) -> tuple[str, Liveness, Any] | None:
        """``(why, the entering tangent's liveness, where its origins live)``
        when forward mode leaves op ``node`` unguarded, or None: an op with a
        body that a partly zero tangent enters but whose tangents the
        forward half does not follow lane by lane
        (:meth:`ControlFlow.forward_unfollowed`, :meth:`Call.forward_unfollowed`).
        Reported, never called clean.  The third part is None (origins in
        this graph's forward analysis) or ``(forward analyses, backward
        analysis)`` of the body whose analyses named them."""
        return None

    def mask_passes_through(self, analysis, node, index) -> bool:
        """Elementwise and pass-through rules hand an operand of the output's
        shape the output's own mask (``reduce_to_shape`` of one mask to its
        own shape is that mask)."""
        if self.kind not in ("elementwise", "pass-through"):
            return False
        eqn = analysis.graph.eqns[node]
        return len(eqn.outvars) == 1 and aval_shape(eqn.invars[index]) == aval_shape(eqn.outvars[0])

    def tangent_may_be_nonfinite(self, analysis, node) -> bool:
        """Besides the reverse hazards (the base answer): a call whose body
        holds a risky operation, and control flow and custom-derivative calls,
        whose bodies or rules are not followed here."""
        if self.kind in ("control-flow", "custom-call"):
            return True
        if super().tangent_may_be_nonfinite(analysis, node):
            return True
        n_out = len(analysis.graph.eqns[node].outvars)
        return any(self.guards_output(analysis, node, j) for j in range(n_out))

    #: False: lane-mixing (default); True: never mixes; "same-shape": lane-local
    #: when every differentiable operand has the output's shape
    lane_local: bool | str = False

    def item_inputs(self, eqn):
        return eqn.invars

    def item_outputs(self, eqn):
        return eqn.outvars

    # -- forward (tangent) half ---------------------------------------------------
    def guards_output(self, analysis, node, index) -> bool:
        """Guard this output when its input tangents are partly structurally
        zero: the same operations whose derivative may be non-finite."""
        return self.guards

    def forward(self, fa, node, ins: Sequence[Liveness]) -> list[Liveness]:
        """Tangent liveness of the outputs; by default fully live (conservative)."""
        eqn = fa.graph.eqns[node]
        return [LIVE] * len(eqn.outvars)

    def forward_masks(self, mctx, node: int, eqn, in_masks: list[Any]) -> list[Any]:
        return [ALL] * len(eqn.outvars)


class ForwardExitSelection(JaxRule):
    """A selection whose JVP *multiplies* each operand's tangent by its
    indicator (0/1, or shared among ties) instead of selecting it: ``max``/
    ``min``, ``reduce_max``/``reduce_min``, ``cummax``, ``scatter-max``.  A
    non-finite tangent in a lane it does not choose then turns NaN in a live
    output lane, so its partly dead inputs are guarded as forward-mode exits
    (:meth:`passes.rules.Rule.forward_exit`), not as reverse hazards (its
    transpose multiplies a finite cotangent by 0 or 1); its outputs need no
    guard of their own -- the tangent it multiplies is already 0 there."""

    guards = True

    def guards_output(self, analysis, node, index):
        return False

    def forward_exit(self, analysis, node, index):
        return self.guards_input(analysis, node, index)


def same_as_output(eqn, outs) -> list[Liveness]:
    """Each operand lane of an elementwise op is as live as the output lanes
    it feeds.  An operand broadcast implicitly (a size-1 axis stretched, a
    scalar) feeds a whole line of output lanes per lane: fully live when
    every such line holds a live lane (:meth:`Liveness.covers_lines_along`),
    else as live as the output, without the covered lines (its lanes do not
    line up with them)."""
    lv = joined(outs)
    if lv.covered is None:
        return [lv] * len(eqn.invars)
    out_shape = aval_shape(eqn.outvars[0])
    return [_operand_liveness(lv, aval_shape(v), out_shape) for v in eqn.invars]


def _operand_liveness(lv: Liveness, shape: tuple, out_shape: tuple) -> Liveness:
    if shape == out_shape:
        return lv
    if shape and len(shape) != len(out_shape):
        return lv.without_cover()
    if lv.covers_lines_along(stretched_axes(shape, out_shape), out_shape):
        return LIVE
    return lv.without_cover()


def aval_shape(atom):
    return tuple(getattr(atom.aval, "shape", ()))


def diff_indices(eqn) -> list[int]:
    return [i for i, v in enumerate(eqn.invars) if not is_literal(v) and is_inexact_aval(v.aval)]


def or_all(masks):
    """:func:`passes.masks.or_all` in JAX's mask algebra."""
    from hlo_guard.jax_frontend.mask_ops import ALGEBRA

    return passes_or_all(ALGEBRA, masks)


def forward_join(fa, node, ins) -> list[Liveness]:
    """OR over inputs: a lane's tangent may be non-zero if any input's may."""
    eqn = fa.graph.eqns[node]
    return [join_all(ins)] * len(eqn.outvars)


def forward_placed(fa, node, ins) -> list[Liveness]:
    """Inputs placed side by side (concatenate, pad, select): the output is
    fully live only if every floating input (literals included) is.  The
    origins are those of the inputs' dead lanes; this node is named too when
    it places a constant (a literal or a value with no tangent at all)."""
    eqn = fa.graph.eqns[node]
    floats = [lv for v, lv in zip(eqn.invars, ins) if is_inexact_aval(v.aval)]
    if floats and all(lv.is_live for lv in floats):
        out = LIVE
    elif not any(lv.reaches_output for lv in floats):
        out = NO_DERIVATIVE
    else:
        origins = Liveness(Level.PARTIAL)
        for lv in floats:
            if not lv.is_live:
                origins = Liveness(Level.PARTIAL, merge_origins(origins.origins, lv.origins))
        if any(not lv.reaches_output for lv in floats) or not origins.origins:
            origins = origins.with_origin(fa.graph.origin(node))
        out = origins
    return [out] * len(eqn.outvars)


class LazyMasks:
    """Masks of a node's inputs (or outputs), each computed only when a guard
    asks for it: ``jnp.where`` and friends pass literals and constant branches
    nobody needs a mask for, and every unused mask would be a traced op."""

    def __init__(self, compute, n):
        self._compute = compute
        self._n = n
        self._done = {}

    def __len__(self):
        return self._n

    def __getitem__(self, i):
        if i not in self._done:
            self._done[i] = self._compute(i)
        return self._done[i]

    def __iter__(self):
        return (self[i] for i in range(self._n))
