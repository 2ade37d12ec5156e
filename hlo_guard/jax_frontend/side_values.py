"""The values a guarded evaluation reads: the guarded environment, and the
values computed *on the side* when a mask needs one that the evaluation has
not reached yet (a predicate downstream of the guarded operation).

Side values are computed once per scope, from gradient-stopped inputs, never
from an effectful equation (:class:`passes.masks.ShadowUnavailable` says
why, and the guard is skipped and reported).  During a gradient-mode
evaluation a contraction computed on the side hands its values to the
guarded evaluation as its primal (:mod:`hlo_guard.jax_frontend.shared_primal`)
rather than be computed twice; its tangents come from the guarded binding.

Split out of the interpreter's ``Scope``: this part only knows the jaxpr, not
rules, masks or guards.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from hlo_guard.jax_frontend.binding import bind_eqn, eqn_context, stop_if_inexact
from hlo_guard.jax_frontend.graph import DropVar, JaxprGraph, Literal
from passes.masks import ShadowUnavailable
from passes.side_evaluation import evaluate_on_side

MISSING = object()


class ScopeValues:
    """The values of one jaxpr's variables during its (guarded or mask-only)
    evaluation.  ``parent_value`` reads a variable of the enclosing scope;
    ``parent_inputs`` maps this body's inputs to the caller's atoms."""

    def __init__(
        self,
        graph: JaxprGraph,
        consts: Sequence[Any],
        args: Sequence[Any],
        parent_value: Callable[[Any], Any] | None = None,
        parent_inputs: dict[Any, Any] | None = None,
    ):
        self.graph = graph
        #: values of the guarded evaluation, in program order
        self.env: dict[Any, Any] = {}
        #: values computed on the side for masks
        self.shadow: dict[Any, Any] = {}
        self.parent_value = parent_value
        self.parent_inputs = parent_inputs or {}
        jaxpr = graph.jaxpr
        for v, c in zip(jaxpr.constvars, consts):
            self.env[v] = c
        for v, a in zip(jaxpr.invars, args):
            self.env[v] = a
        #: set while a gradient-mode evaluation runs: an equation whose
        #: outputs were computed on the side takes them as its primal
        #: (:mod:`shared_primal`); mask-only scopes never share
        self.sharing = False
        #: the scope is an inline call's body evaluated in place: side
        #: equations keep the call's location too (``eqn_context``)
        self.at_call_site = False

    def value(self, atom):
        """The value of ``atom``, computing it on the side if need be."""
        if isinstance(atom, Literal):
            return atom.val
        val = self.known(atom)
        if val is MISSING:
            self._compute_on_side(atom)
            val = self.known(atom)
        return val

    def known(self, var):
        """The value of ``var`` if it is already available, else ``MISSING``."""
        val = self.env.get(var, MISSING)
        if val is MISSING:
            val = self.shadow.get(var, MISSING)
        if val is MISSING and var in self.parent_inputs and self.parent_value is not None:
            val = self.parent_value(self.parent_inputs[var])
            self.shadow[var] = val
        return val

    def side(self, var):
        """The side value of ``var``, or ``MISSING``."""
        return self.shadow.get(var, MISSING)

    def _compute_on_side(self, target):
        evaluate_on_side(
            target,
            available=lambda v: self.known(v) is not MISSING,
            producer=self._producer,
            operands=lambda node: [
                v for v in self.graph.eqns[node].invars if not isinstance(v, Literal)
            ],
            leaf=self._no_value,
            compute=self._compute,
        )

    def _producer(self, var):
        prod = self.graph.producer(var)
        return None if prod is None else prod[0]

    @staticmethod
    def _no_value(var):
        raise ShadowUnavailable(f"no value for {var}")

    def _compute(self, node: int) -> None:
        eqn = self.graph.eqns[node]
        if eqn.effects:
            raise ShadowUnavailable(
                f"the mask needs the result of effectful '{eqn.primitive.name}', "
                "which must run exactly once"
            )
        invals = [self._side_input(v) for v in eqn.invars]
        with eqn_context(eqn, self.at_call_site):
            outs = bind_eqn(eqn, invals)
        for ov, o in zip(eqn.outvars, outs):
            if not isinstance(ov, DropVar):
                self.shadow[ov] = o

    def _side_input(self, atom):
        """Side values are computed from gradient-stopped inputs, shared ones
        too: a shared value is the primal of ``share_side_primal``'s
        ``custom_jvp``, whose rule takes the tangents from the guarded
        binding and never reads the side value's own; and under a JVP or
        linearize trace an input without a tangent makes the side evaluation
        bind on the parent trace, not be differentiated and then dropped
        (``jax.jit(jax.grad(guard(f)))`` of a 2-layer transformer: 176 -> 146 ms
        trace; 174 -> 151 equations in ``make_jaxpr`` of ``jax.jvp(guard(block))``)."""
        if isinstance(atom, Literal):
            return atom.val
        if atom in self.shadow:
            return self.shadow[atom]
        return stop_if_inexact(self.value(atom))
