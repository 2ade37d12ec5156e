"""Re-evaluate a jaxpr with gradient guards (the custom-interpreter pattern).

Each equation is re-evaluated as ``core.eval_jaxpr`` does, inside its own
source context so that guards and re-evaluated operations keep the user's
file:line in jaxprs and HLO metadata.  Inside a jaxpr trace (``jit``,
``make_jaxpr``) an equation whose operands keep their types is *copied* into
the new jaxpr rather than bound again (:func:`compat.restage`, what JAX's own
``inline_jaxpr_into_trace`` does); guards, masks and rewritten call bodies
are bound.  Before an equation runs, every planned use gets

    x_g = select(mask, x, stop_gradient(x))

which is ``x`` in every lane (the forward program is unchanged, and XLA folds
it away), while in any derivative the dead lanes' contribution is selected to
an exact zero before ``0 * inf`` can leave them.

Masks are built on demand (:class:`passes.masks.MaskResolver`).  They read
values from the guarded environment, which holds the same values as the
original program; a value not computed yet (a predicate downstream of the
guarded operation) is computed once on the side, unguarded and
gradient-stopped.  Effectful equations are never computed on the side: a
guard whose mask would need one is skipped (conservative) and reported.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, cast

import jax
import numpy as np
from jax import lax
from jax.core import eval_jaxpr

from hlo_guard.jax_frontend import staged_bodies
from hlo_guard.jax_frontend.binding import bind_eqn, call_site_source, copy_unchanged, eqn_context
from hlo_guard.jax_frontend.bodies import body_of, open_jaxpr
from hlo_guard.jax_frontend.compat import (
    inline_jits_inline_here,
    jit_inlined_while_tracing,
    no_mesh_in_context,
    scan_layout,
)
from hlo_guard.jax_frontend.graph import DropVar, JaxprGraph, Literal, is_inexact_aval
from hlo_guard.jax_frontend.guard_ops import guarded, stopped
from hlo_guard.jax_frontend.guarded_binding import (
    bind_custom_call_with_broadcast_guards,
    bind_sharing,
    bind_with_broadcast_guards,
    bind_with_contraction_guards,
    call_with,
)
from hlo_guard.jax_frontend.mask_ops import (
    ALGEBRA,
    broadcast_source,
    is_one_bit,
    lax_broadcast_in_dim,
    materialize,
    normalize,
    to_guard_mask,
    xp,
)
from hlo_guard.jax_frontend.plan import plan_of
from hlo_guard.jax_frontend.rules import RULES
from hlo_guard.jax_frontend.shared_primal import can_share, share_side_primal
from hlo_guard.jax_frontend.side_values import MISSING, ScopeValues
from hlo_guard.jax_frontend.staged_bodies import (
    STAGED_BODIES,
    fingerprint,
    finish_like_a_run,
    skipped_nothing,
)
from hlo_guard.jax_frontend.tangent_guard import tangent_guarded
from hlo_guard.jax_frontend.value_mode import (
    custom_call_safe_point,
    safe_point,
    value_substitutable,
)
from passes.analysis import Analysis
from passes.lattice import LIVE
from passes.masks import (
    ALL,
    NONE,
    ForwardMaskResolver,
    MaskResolver,
    ShadowUnavailable,
    or_masks,
)
from passes.planning import (
    GuardSite,
    OutputGuardSite,
    contraction_covers_operand,
    guard_sharing_key,
)
from passes.rules import BroadcastOperandRule, implements

# -- evaluation ----------------------------------------------------------------


class Scope:
    """The guarded (or mask-only) evaluation of one jaxpr."""

    def __init__(
        self,
        analysis: Analysis,
        consts: Sequence[Any],
        args: Sequence[Any],
        out_masks: Sequence[Any],
        parent: Scope | None = None,
        parent_inputs: dict[Any, Any] | None = None,
        forward=None,
        in_tmasks: Sequence[Any] | None = None,
        mode: str = "gradient",
        nested: bool = False,
        at_call_site: bool = False,
    ):
        self.analysis = analysis
        self.mode = mode
        self.nested = nested
        #: the body of an inline call evaluated in place (see ``eqn_context``)
        self.at_call_site = at_call_site
        # the JAX front end analyses jaxpr graphs only
        self.graph: JaxprGraph = cast(JaxprGraph, analysis.graph)
        self.jaxpr = self.graph.jaxpr
        self.forward = forward
        self._in_tmasks = in_tmasks
        self._fresolver: ForwardMaskResolver | None = None
        self.parent = parent
        self.values = ScopeValues(
            self.graph,
            consts,
            args,
            parent.value if parent is not None else None,
            parent_inputs,
        )
        self.values.at_call_site = at_call_site
        self.resolver = MaskResolver(analysis, ALGEBRA, out_masks, self._input_masks)
        self.children: dict[Any, Scope] = {}
        #: (variable, mask key) -> its guarded value (:meth:`shared_guard`)
        self._shared_guards: dict[Any, Any] = {}
        #: node -> :meth:`contraction_masks` (asked by the guards of the
        #: contraction's operands and again when it is bound)
        self._contraction_masks: dict[int, dict[int, Any]] = {}
        self.plan = plan_of(analysis)
        self.record = self.plan.record

    # -- values ------------------------------------------------------------------
    def value(self, atom):
        """The value of ``atom`` (what rules read to build masks)."""
        return self.values.value(atom)

    def shared_side(self, eqn):
        """Side values of ``eqn``'s outputs that the guarded evaluation can
        take as its own primal values, or None."""
        name = eqn.primitive.name
        if not self.values.sharing or (name in BINDERS and name not in _SHARED_CALLS):
            return None
        side = []
        for ov in eqn.outvars:
            val = MISSING if isinstance(ov, DropVar) else self.values.side(ov)
            if val is MISSING:
                return None
            side.append(val)
        return side if can_share(eqn, side) else None

    # -- masks -------------------------------------------------------------------
    def _input_masks(self, node, out_masks):
        eqn = self.graph.eqns[node]
        rule = self.analysis.rules.get(eqn.primitive.name)  # RULES, or a variant of it
        return rule.input_masks(self, node, eqn, out_masks)

    def tangent_mask(self, var):
        if isinstance(var, Literal):
            return NONE
        if self._fresolver is None:
            fa = self.forward if self.forward is not None else self.plan.forward
            inputs = list(self.jaxpr.invars) + list(self.jaxpr.constvars)
            # only masks passed in are given: an input without one reads its
            # liveness -- live ones all lanes, a closed-over constant none
            # (``where(x > 1, x, K)`` takes K's lanes with a zero tangent)
            given = list(self._in_tmasks) if self._in_tmasks is not None else []
            self._fresolver = ForwardMaskResolver(
                fa, ALGEBRA, dict(zip(inputs, given)), self._output_tmasks, self.graph.producer
            )
        return self._fresolver.value_mask(var)

    def _output_tmasks(self, node, in_masks):
        eqn = self.graph.eqns[node]
        rule = RULES.get(eqn.primitive.name)
        if rule is None:
            return [ALL] * len(eqn.outvars)
        return rule.forward_masks(self, node, eqn, in_masks)

    def child_forward(self, node: int, k: int, in_masks) -> Scope:
        """A mask-only scope over call ``node``'s body (a ``cond``'s branch
        ``k``) for tangent masks."""
        key = ("fwd", node, k, tuple(id(m) for m in in_masks))
        child = self.children.get(key)
        if child is None:
            eqn = self.graph.eqns[node]
            if eqn.primitive.name == "cond":
                body, consts = open_jaxpr(eqn.params["branches"][k])
                operands = eqn.invars[1:]
            else:
                body, consts = body_of(eqn)
                operands = eqn.invars
            fa = self.forward if self.forward is not None else self.plan.forward
            sub_fa = fa.subs[(node, k)]
            sub = self.analysis.subs.get((node, k))
            if sub is None:
                from passes.analysis import analyze

                sub = analyze(sub_fa.graph, RULES, [LIVE] * len(body.outvars))
            child = Scope(
                sub,
                consts,
                [],
                [ALL] * len(body.outvars),
                parent=self,
                parent_inputs=dict(zip(body.invars, operands)),
                forward=sub_fa,
                in_tmasks=list(in_masks),
            )
            self.children[key] = child
        return child

    def guard_output(self, node: int, site: OutputGuardSite, y):
        if site.statically_dead:
            return stopped(y)
        try:
            mask = self.tangent_mask(self.graph.eqns[node].outvars[site.index])
        except ShadowUnavailable as exc:
            self.record.skip(node, ("output", site.index), str(exc))
            return y
        if mask is ALL:
            return y
        if mask is NONE:
            return stopped(y)
        return tangent_guarded(mask, y)

    def child_masks(self, node: int, k: int, out_masks, analysis: Analysis | None = None) -> Scope:
        """A mask-only scope over the body of call ``node``, reading its inputs
        from this scope's values (used to push masks through a call).  The
        body's analysis is the one the pass made of it, unless the rule brings
        its own (a custom call's structure-only analysis)."""
        key = (node, k, id(analysis), tuple(id(m) for m in out_masks))
        child = self.children.get(key)
        if child is None:
            eqn = self.graph.eqns[node]
            body, consts = body_of(eqn)
            sub = analysis if analysis is not None else self.analysis.subs[(node, k)]
            child = Scope(
                sub,
                consts,
                [],
                out_masks,
                parent=self,
                parent_inputs=dict(zip(body.invars, eqn.invars)),
            )
            self.children[key] = child
        return child

    # -- guarded evaluation --------------------------------------------------------
    def guard(self, node: int, site: GuardSite, x):
        safe = self._safe_point(node, site) if self.mode == "value" else None
        if safe is not None:
            return self._substitute(node, site, x, safe)
        if site.statically_dead:
            return stopped(x)
        try:
            mask = self.resolver.use_mask(node, site.index)
        except ShadowUnavailable as exc:
            self.record.skip(node, site.index, str(exc))
            return x
        if mask is ALL:
            return x
        if mask is NONE:
            return stopped(x)
        return guarded(mask, x)

    def shared_guard(self, node: int, site: GuardSite, x):
        """:meth:`guard`, once per (value, mask): the uses of one value whose
        masks are known equal (``d * d``, ``s * s - s``) share one select, as
        a hand-written double where does.  Gradient mode only: value mode's
        safe point depends on the guarded primitive."""
        atom = self.graph.eqns[node].invars[site.index]
        if self.mode == "value" or isinstance(atom, Literal):
            return self.guard(node, site, x)
        if self._contraction_covers(node, site):
            self.record.covered.add((node, site.index))
            return x
        key = (atom, guard_sharing_key(self.analysis, node, site.index))
        found = self._shared_guards.get(key)
        if found is None:
            found = self._shared_guards[key] = self.guard(node, site, x)
        return found

    def _contraction_covers(self, node: int, site: GuardSite) -> bool:
        """Whether the guarded contraction ``node`` makes this use's boundary
        guard redundant: a ``dot_general`` operand whose lanes live or die
        together (a one-bit mask: the weights under a row mask), whose only
        hazard is the contraction's own rule (no unguarded hazard beyond its
        output: ``Placement.own_hazard_only``), and whose partner operand the
        contraction zeroes in its dead lanes (or which is live in every lane).

        While the bit is true the guard is the identity.  When it is false,
        every output lane is dead and so is every lane of the partner.
        Reverse mode: this operand's cotangent is ``partner_m^T . ct``, with
        the partner zeroed and the output's dead cotangents exact zeros: 0.
        Forward mode: its tangent term ``partner_m . dx`` is 0 unless ``dx``
        is non-finite, and then only in output lanes that are all dead --
        the selections that make them dead discard it, and a forward exit on
        the way (``max``/``min``) is guarded because a ``dot_general``'s own
        tangent already counts as possibly non-finite.  Higher orders
        differentiate these selects into selects."""
        if self.mode != "gradient" or site.statically_dead:
            return False
        eqn = self.graph.eqns[node]
        if eqn.primitive.name != "dot_general" or node not in self.plan.guarded_contractions:
            return False
        return contraction_covers_operand(
            self.analysis,
            self.resolver,
            node,
            site.index,
            is_one_bit,
            lambda partner: partner in self.contraction_masks(node, eqn),
        )

    def _safe_point(self, node: int, site: GuardSite):
        """Value mode: the safe point for this site, or None if its dead lanes
        are not all value-dead (see :mod:`value_mode`)."""
        eqn = self.graph.eqns[node]
        safe = safe_point(eqn.primitive.name)
        if safe is None:
            safe = custom_call_safe_point(eqn)
        if safe is None or not value_substitutable(self.analysis, node, self.nested):
            return None
        return safe

    def body_nested(self, node: int) -> bool:
        """Whether the body of call/cond ``node`` must treat its outputs as
        opaque in value mode: yes unless the call's outputs are themselves
        value-transparent here.  (``scan``/``while`` bodies always are: their
        carries feed back.)"""
        return self.mode != "value" or not value_substitutable(self.analysis, node, self.nested)

    def _substitute(self, node: int, site: GuardSite, x, safe):
        """``select(mask, x, safe)``: dead lanes hold a point where the primitive
        and its derivatives are finite; their derivative is zero."""
        if site.statically_dead:
            return lax.full_like(x, safe)
        try:
            mask = self.resolver.use_mask(node, site.index)
        except ShadowUnavailable as exc:
            self.record.skip(node, site.index, str(exc))
            return x
        if mask is ALL:
            return x
        if mask is NONE:
            return lax.full_like(x, safe)
        return lax.select(to_guard_mask(mask, np.shape(x)), x, lax.full_like(x, safe))

    @staticmethod
    def _implicitly_broadcast(eqn, x) -> bool:
        if len(eqn.outvars) != 1:
            return False
        rule = RULES.get(eqn.primitive.name)
        return implements(rule, BroadcastOperandRule) and tuple(np.shape(x)) != tuple(
            eqn.outvars[0].aval.shape
        )

    def broadcast_masks(self, node, eqn, sites, invals):
        """Full-shape masks of the operands the op broadcasts implicitly.

        ``w * x`` with a scalar ``w``: the mask of ``w`` is OR-reduced and so
        usually all-true, yet its cotangent is a *sum* over the output lanes,
        dead ones included, and a dead lane's ``0 * inf`` is summed in.  Such
        operands are guarded at the output's shape inside the op's derivative
        (:func:`bind_with_broadcast_guards`)."""
        if len(eqn.outvars) != 1 or not sites:
            return {}
        found = {}
        for site in sites:
            if site.statically_dead or not self._implicitly_broadcast(eqn, invals[site.index]):
                continue
            try:
                outs = [
                    self.resolver.value_mask(None if isinstance(v, DropVar) else v)
                    for v in eqn.outvars
                ]
                mask = RULES.get(eqn.primitive.name).broadcast_operand_mask(
                    self, node, eqn, site.index, outs
                )
            except ShadowUnavailable as exc:
                self.record.skip(node, site.index, str(exc))
                continue
            if mask is not ALL:
                found[site.index] = mask
        return found

    def contraction_masks(self, node: int, eqn) -> dict[int, Any]:
        """The use masks of a partly dead contraction's operands (operands
        fully live are left out; a site whose mask needs an effectful value
        is skipped and reported), for :func:`bind_with_contraction_guards`.

        A ``dot_general`` operand whose lanes are all live or all dead
        together (its mask one bit broadcast: the weights under a row mask)
        is left out too.  Zeroing an operand's dead lanes protects the
        *other* operand's live lanes from their values; every output lane
        reads some lanes of each operand, so when this operand is dead in
        every lane, so is every output lane and every lane of the other
        operand -- there is nothing live to protect.  (Not so for a
        convolution: with padding, an output lane may read none of the
        input.)"""
        if node not in self.plan.guarded_contractions:
            return {}
        found = self._contraction_masks.get(node)
        if found is None:
            found = self._contraction_masks[node] = self._contraction_operand_masks(node, eqn)
        return found

    def _contraction_operand_masks(self, node: int, eqn) -> dict[int, Any]:
        one_bit_free = eqn.primitive.name == "dot_general"
        found: dict[int, Any] = {}
        for i, v in enumerate(eqn.invars):
            if isinstance(v, Literal) or not is_inexact_aval(v.aval):
                continue
            lv = self.analysis.use(node, i)
            if lv.is_live:
                continue
            try:
                if lv.reaches_output:
                    mask = self.resolver.use_mask(node, i)
                else:  # carries no derivative (a constant): the lanes live outputs read
                    mask = self.resolver.node_input_masks(node)[i]
            except ShadowUnavailable as exc:
                self.record.skip(node, i, str(exc))
                continue
            if one_bit_free and is_one_bit(mask):
                self.record.covered.add((node, ("contraction", i)))
                continue
            if mask is NONE:
                mask = np.zeros(tuple(v.aval.shape), bool)
            if mask is not ALL:
                found[i] = mask
        return found

    def run(self) -> list[Any]:
        sites = self.plan.sites_for(self.mode)
        out_sites = self.plan.output_sites_by_node
        env = self.values.env
        # gradient mode: the guarded evaluation takes side values as primals
        # (:mod:`shared_primal`); mask-only scopes never run() and never share
        self.values.sharing = self.mode == "gradient"
        rewritten = self.plan.rewritten_bodies(self.mode)
        contractions = self.plan.guarded_contractions
        # an inline body evaluated in place keeps its call's location
        call_site = call_site_source() if self.at_call_site else None
        for node, eqn in enumerate(self.graph.eqns):
            invals = [v.val if isinstance(v, Literal) else env[v] for v in eqn.invars]
            if (
                node not in sites
                and node not in out_sites
                and node not in contractions
                and node not in rewritten
                and self.shared_side(eqn) is None
            ):
                outs = copy_unchanged(eqn, invals, call_site)
                if outs is not None:
                    for ov, o in zip(eqn.outvars, outs):
                        if not isinstance(ov, DropVar):
                            env[ov] = o
                    continue
            with eqn_context(eqn, self.at_call_site):
                wide = self.guard_operands(node, eqn, sites.get(node, ()), invals)
                outs = self.bind_node(node, eqn, invals, wide, self.shared_side(eqn))
                for ov, o in zip(eqn.outvars, outs):
                    if not isinstance(ov, DropVar):
                        env[ov] = o
                for site in out_sites.get(node, ()):
                    ov = eqn.outvars[site.index]
                    env[ov] = self.guard_output(node, site, env[ov])
        self.record.finished.add(self.mode)
        return [v.val if isinstance(v, Literal) else env[v] for v in self.jaxpr.outvars]

    def guard_operands(self, node: int, eqn, node_sites, invals: list) -> dict[int, Any]:
        """Guard ``node``'s planned uses in ``invals`` (in place), each value
        once per mask (:meth:`shared_guard`), except an operand the op
        broadcasts implicitly: its full-shape mask is returned (``wide``), to
        guard it inside the op's derivative (:meth:`bind_guarded`)."""
        wide = self.broadcast_masks(node, eqn, node_sites, invals)
        for site in node_sites:
            if site.index not in wide:
                invals[site.index] = self.shared_guard(node, site, invals[site.index])
        return wide

    def bind_node(self, node: int, eqn, invals, wide: dict[int, Any], side=None):
        """Bind ``node`` reading its (guarded) operands: with ``side`` (the
        outputs a mask computed on the side, :meth:`shared_side`) as its
        primal outputs, else as :meth:`bind_guarded` does."""
        if side is None:
            return self.bind_guarded(node, eqn, invals, wide)
        if eqn.primitive.name in _SHARED_CALLS and node in self.plan.rewritten_bodies(self.mode):
            fn, passed = _guarded_call(self, node, eqn, len(invals))
            return share_side_primal(side, partial(call_with, fn), invals, passed)
        contraction = self.contraction_masks(node, eqn)
        return bind_sharing(eqn, invals, wide, side, contraction)

    def bind_guarded(self, node: int, eqn, invals, wide: dict[int, Any]):
        """Bind ``node`` reading its guarded operands: a guarded contraction
        with each operand's dead lanes zeroed in the other's derivative, an
        implicitly broadcast operand guarded at the output's shape (``wide``),
        a call or control-flow node with its guarded body, else as it is."""
        contraction = self.contraction_masks(node, eqn)
        if contraction:
            return bind_with_contraction_guards(eqn, invals, contraction)
        if wide and eqn.primitive.name == "custom_jvp_call":
            return bind_custom_call_with_broadcast_guards(eqn, invals, wide)
        if wide:
            return bind_with_broadcast_guards(eqn, invals, wide)
        return self._bind(node, eqn, invals)

    def output_masks_for(self, node: int, sub: Analysis, compact: bool = False):
        """Masks of call ``node``'s outputs to pass into its guarded body:
        ``(passed, fixed, layouts)``.  ``compact``: a mask known to be a
        broadcast is passed as its source, ``layouts`` holding its ``(shape,
        dims)`` (None for a mask passed whole), so that the body rebuilds it
        as a known broadcast -- an argument of a traced body is a fresh
        tracer, and rules inside would otherwise reduce the full-size mask
        again (``any`` over a row mask's broadcast axes for a ``dot_general``
        operand inside ``jnp.matmul``'s body)."""
        eqn = self.graph.eqns[node]
        passed: list[Any] = []
        fixed: list[Any] = []
        layouts: list[Any] = []
        n_carry = scan_layout(eqn.params, len(eqn.invars))[1] if eqn.primitive.name == "scan" else 0
        carried = None
        if any(lv.is_partial for lv in sub.out_liveness[:n_carry]):
            carried = self._scan_carry_mask(node, eqn, n_carry)
        for j, lv in enumerate(sub.out_liveness):
            if lv.is_partial and j < n_carry:
                fixed.append(carried)  # every iteration's, closed over
            elif lv.is_partial:
                ov = eqn.outvars[j]
                try:
                    m = self.resolver.value_mask(None if isinstance(ov, DropVar) else ov)
                except ShadowUnavailable as exc:
                    self.record.skip(node, None, str(exc))
                    m = ALL
                _pass_mask(m, tuple(ov.aval.shape), compact, passed, layouts)
                fixed.append(None)
            else:
                fixed.append(ALL if lv.is_live else NONE)
        return passed, fixed, layouts

    def _scan_carry_mask(self, node: int, eqn, n_carry: int):
        """The one mask a scan's followed carries get in every iteration
        (``rules.calls.scan_carry_liveness``): the OR of the final carries'
        masks and of each stacked output's mask ORed over its iterations,
        all of the carries' one shape."""
        outs = eqn.outvars
        shape = next(tuple(v.aval.shape) for v in outs[:n_carry] if is_inexact_aval(v.aval))
        found: Any = NONE
        try:
            for j, ov in enumerate(outs):
                if isinstance(ov, DropVar) or not is_inexact_aval(ov.aval):
                    continue
                m = self.resolver.value_mask(ov)
                if m is ALL:
                    return ALL
                if m is NONE:
                    continue
                if j >= n_carry:  # [iterations, *shape]: a lane live in any of them
                    full = materialize(m, tuple(ov.aval.shape))
                    m = normalize(xp(full).any(full, axis=0))
                    if m is ALL:
                        return ALL
                    if m is NONE:
                        continue
                found = or_masks(ALGEBRA, found, materialize(m, shape))
        except ShadowUnavailable as exc:
            self.record.skip(node, None, str(exc))
            return ALL
        return found

    def tangent_masks_for(
        self,
        node: int,
        operands: Sequence[Any] | None = None,
        compact: bool = True,
        first: int = 0,
    ):
        """Tangent masks of call ``node``'s operands to pass into a body
        evaluated in this forward context (:attr:`GuardPlan.forward_context`):
        ``(passed, fixed, layouts)`` as for :meth:`output_masks_for`, ``fixed``
        None for a call guarded in its own context.  ``operands``: those the
        body receives (a ``cond``'s, after its index), by default all; the
        first is the body's input ``first``."""
        if node not in self.plan.forward_context_calls:
            return [], None, []
        eqn = self.graph.eqns[node]
        passed: list[Any] = []
        fixed: list[Any] = []
        layouts: list[Any] = []
        for i, v in enumerate(eqn.invars if operands is None else operands, start=first):
            m = self.operand_tangent_mask(node, v, i)
            if m is ALL or m is NONE:
                fixed.append(m)
            else:
                _pass_mask(m, tuple(v.aval.shape), compact, passed, layouts)
                fixed.append(None)
        return passed, fixed, layouts

    def operand_tangent_mask(self, node: int, v, index: int):
        """The tangent mask of ``v``, call ``node``'s operand that is its
        body's input ``index``.  A mask that needs an effectful value is ALL
        (the tangent taken as live, so the body guards nothing for it) and
        reported as a skipped guard."""
        try:
            return self.tangent_mask(v)
        except ShadowUnavailable as exc:
            self.record.skip(node, ("tangent", index), str(exc))
            return ALL

    def _bind(self, node, eqn, invals):
        binder = BINDERS.get(eqn.primitive.name)
        if binder is not None and node in self.plan.rewritten_bodies(self.mode):
            return binder(self, node, eqn, invals)
        return bind_eqn(eqn, invals)


def _pass_mask(mask, shape, compact: bool, passed: list, layouts: list) -> None:
    """Append ``mask``, as passed into a traced body, to ``passed``: its
    broadcast source when ``compact`` and it is a known broadcast (its
    ``(shape, dims)`` in ``layouts``), else the full mask (layout None)."""
    full = to_guard_mask(mask, shape)
    source, dims = broadcast_source(full)
    if compact and source is not full:
        passed.append(source)
        layouts.append((shape, tuple(dims)))
    else:
        passed.append(full)
        layouts.append(None)


def run_guarded(
    analysis: Analysis,
    consts,
    args,
    out_masks=None,
    mode: str = "gradient",
    nested: bool = False,
    at_call_site: bool = False,
    in_tmasks=None,
):
    """Evaluate ``analysis``'s jaxpr with guards.  ``mode="value"`` substitutes
    safe points in value-dead lanes where it can (:mod:`value_mode`);
    ``nested``: a call or control-flow body, whose outputs feed a caller;
    ``at_call_site``: an inline call's body evaluated in place;
    ``in_tmasks``: its inputs' tangent masks, for a body evaluated in its
    caller's forward context."""
    if out_masks is None:
        out_masks = [ALL] * len(cast(JaxprGraph, analysis.graph).jaxpr.outvars)
    scope = Scope(
        analysis,
        consts,
        args,
        out_masks,
        mode=mode,
        nested=nested,
        at_call_site=at_call_site,
        in_tmasks=in_tmasks,
    )
    return scope.run()


# -- re-binding calls and control flow with guarded bodies ------------------------


def _guarded_body(
    sub: Analysis,
    consts,
    n_args: int,
    fixed,
    mode: str = "gradient",
    nested: bool = True,
    at_call_site: bool = False,
    layouts: Sequence[Any] = (),
    tfixed: Sequence[Any] | None = None,
):
    """A function (*args, *passed_masks) -> outputs evaluating ``sub`` guarded;
    a passed mask with a layout (see :meth:`Scope.output_masks_for`) is the
    source of a broadcast, rebuilt here.  The passed masks are the outputs'
    (``fixed``) and then, for a body evaluated in its caller's forward
    context, the inputs' tangent masks (``tfixed``)."""

    def body(*args_and_masks):
        args = args_and_masks[:n_args]
        given = list(args_and_masks[n_args:])
        for k, layout in enumerate(layouts):
            if layout is not None:
                given[k] = lax_broadcast_in_dim(given[k], *layout)
        passed = iter(given)
        out_masks = [next(passed) if f is None else f for f in fixed]
        in_tmasks = None if tfixed is None else [next(passed) if f is None else f for f in tfixed]
        return run_guarded(
            sub,
            consts,
            args,
            out_masks,
            mode=mode,
            nested=nested,
            at_call_site=at_call_site,
            in_tmasks=in_tmasks,
        )

    return body


def _bind_call(scope: Scope, node, eqn, invals):
    context = _call_context(scope, node, eqn)
    shared = _shared_body_key(scope, node, eqn, context)
    args = [*invals, *context.passed]
    if shared is not None:
        body, consts, key = shared
        outs = STAGED_BODIES.get(body, consts, key, args)
        if outs is not None:
            finish_like_a_run(context.sub, scope.mode)
            return outs
    fn = _guarded_callable(scope, node, eqn, len(invals), context)
    outs = list(fn(*args))
    if shared is not None and skipped_nothing(context.sub):
        STAGED_BODIES.put(body, consts, key, args, outs)
    return outs


def _shared_body_key(scope: Scope, node, eqn, context):
    """``(body, consts, key)`` under which the guarded body of ``jit`` call
    ``node`` is shared across call sites and traces (:mod:`staged_bodies`),
    or None: not a ``jit`` bound as a call, effects, value mode, or a
    context the fingerprint cannot name."""
    if (
        not staged_bodies.enabled
        or scope.mode != "gradient"
        or eqn.primitive.name != "jit"
        or context.inline_here
        or eqn.effects
        or not no_mesh_in_context()
    ):
        return None
    found = fingerprint(context.sub, scope.mode)
    if found is None:
        return None
    body, consts = body_of(eqn)
    key = (
        found,
        _mask_pattern(context.fixed),
        _mask_pattern(context.tfixed),
        tuple(context.layouts),
        context.nested,
        str(eqn.params.get("name")),
        str(eqn.params.get("inline")),
    )
    return body, consts, key


def _mask_pattern(fixed) -> tuple | None:
    """Which masks are passed and which fixed ALL/NONE, as a cache key."""
    if fixed is None:
        return None
    return tuple("passed" if f is None else "all" if f is ALL else "none" for f in fixed)


@dataclass(frozen=True)
class _CallContext:
    """How call ``node``'s guarded body is made here: its analysis, the
    masks passed in (the outputs' masks, then the operands' tangent masks
    for a body evaluated in the caller's forward context), which of each are
    fixed ALL/NONE (``fixed``, ``tfixed``; ``tfixed`` None when no tangent
    masks are passed), the layouts of the passed ones, value-mode nesting,
    and whether it is evaluated in place."""

    sub: Analysis
    passed: list
    fixed: list
    layouts: list
    nested: bool
    inline_here: bool
    tfixed: list | None = None


def _call_context(scope: Scope, node, eqn) -> _CallContext:
    sub = scope.analysis.subs[(node, 0)]
    passed, fixed, layouts = scope.output_masks_for(node, sub, compact=True)
    tpassed, tfixed, tlayouts = scope.tangent_masks_for(node)
    passed, layouts = passed + tpassed, layouts + tlayouts
    # a jit that binding here would inline: call its guarded body directly
    # instead of tracing it to a jaxpr JAX then copies in
    inline_here = (
        eqn.primitive.name == "jit"
        and jit_inlined_while_tracing(eqn.params)
        and inline_jits_inline_here()
    )
    return _CallContext(sub, passed, fixed, layouts, scope.body_nested(node), inline_here, tfixed)


def _guarded_call(scope: Scope, node, eqn, n_invals):
    """The guarded body of call ``node`` as a function of (inputs, passed
    output masks), and the masks to pass."""
    context = _call_context(scope, node, eqn)
    return _guarded_callable(scope, node, eqn, n_invals, context), context.passed


def _guarded_callable(scope: Scope, node, eqn, n_invals, context: _CallContext):
    sub, fixed, layouts = context.sub, context.fixed, context.layouts
    nested, inline_here = context.nested, context.inline_here
    name = eqn.primitive.name
    tfixed = context.tfixed
    key = (
        node,
        _mask_pattern(fixed),
        _mask_pattern(tfixed),
        tuple(layouts),
        scope.mode,
        nested,
        inline_here,
    )
    fn = scope.plan.callables.get(key)
    if fn is None:
        body, consts = body_of(eqn)
        inner = _guarded_body(
            sub, consts, n_invals, fixed, scope.mode, nested, inline_here, layouts, tfixed
        )
        if inline_here:
            fn = inner
        elif name == "remat2":
            fn = jax.checkpoint(
                inner,
                prevent_cse=eqn.params.get("prevent_cse", True),
                policy=eqn.params.get("policy"),
            )
        else:
            inner.__name__ = inner.__qualname__ = str(eqn.params.get("name", "guarded_call"))
            if name == "jit":
                fn = jax.jit(inner, inline=eqn.params.get("inline", False))
            else:
                fn = inner
        scope.plan.callables[key] = fn
    return fn


def _run_body(sub, consts):
    def fn(*args):
        return run_guarded(sub, consts, args)

    return fn


def _bind_cond(scope: Scope, node, eqn, invals):
    branches = eqn.params["branches"]
    index, *ops = invals
    passed, fixed, layouts = scope.output_masks_for(
        node, scope.analysis.subs[(node, 0)], compact=True
    )
    # branches evaluated in this forward context get the operands' tangent masks
    tpassed, tfixed, tlayouts = scope.tangent_masks_for(node, eqn.invars[1:])
    fns = []
    for k, br in enumerate(branches):
        body, consts = open_jaxpr(br)
        fns.append(
            _guarded_body(
                scope.analysis.subs[(node, k)],
                consts,
                len(ops),
                fixed,
                scope.mode,
                scope.body_nested(node),
                layouts=layouts + tlayouts,
                tfixed=tfixed,
            )
        )
    return list(lax.switch(index, fns, *ops, *passed, *tpassed))


def _bind_while(scope: Scope, node, eqn, invals):
    p = eqn.params
    cond_jaxpr, cond_consts_closed = open_jaxpr(p["cond_jaxpr"])
    body_jaxpr, body_consts_closed = open_jaxpr(p["body_jaxpr"])
    nc, nb = p["cond_nconsts"], p["body_nconsts"]
    cconsts, bconsts, init = invals[:nc], invals[nc : nc + nb], invals[nc + nb :]
    sub = scope.analysis.subs[(node, 0)]

    def cond_fun(carry):
        return eval_jaxpr(cond_jaxpr, cond_consts_closed, *cconsts, *carry)[0]

    loop = partial(_while_loop, tuple(cond_jaxpr.outvars[0].aval.shape))
    if node in scope.plan.forward_context_calls:
        # the body in this forward context: its carries' tangent masks ride
        # along as extra carries, which the cond function ignores
        masks = _CarriedTangentMasks(scope, node, body_jaxpr, eqn.invars[nc:], nb, len(init))
        out_masks = [ALL] * len(body_jaxpr.outvars)

        def body_with_masks(carry_and_masks):
            carry, carry_masks = carry_and_masks
            return masks.run(sub, body_consts_closed, [*bconsts, *carry], out_masks, carry_masks)

        carry, _ = loop(lambda c: cond_fun(c[0]), body_with_masks, (list(init), masks.init))
        return list(carry)

    def body_fun(carry):
        return run_guarded(
            sub, body_consts_closed, [*bconsts, *carry], mode=scope.mode, nested=True
        )

    return list(loop(cond_fun, body_fun, list(init)))


def _while_loop(pred_shape, cond_fun, body_fun, init):
    """``lax.while_loop``, also for the equation a ``vmap`` of a loop with a
    per-example predicate leaves (its cond returns ``bool[batch]``, which
    the primitive accepts and ``lax.while_loop`` does not): loop while any
    example's predicate holds, each example keeping its carry once its own
    is false -- what JAX's batching rule does."""
    if pred_shape == ():
        return lax.while_loop(cond_fun, body_fun, init)

    def step(carry):
        pred = cond_fun(carry)
        new = body_fun(carry)
        return jax.tree_util.tree_map(
            lambda n, o: lax.select(_pred_for(pred, jax.numpy.shape(n)), n, o), new, carry
        )

    return lax.while_loop(lambda c: jax.numpy.any(cond_fun(c)), step, init)


def _pred_for(pred, shape):
    """A per-example predicate broadcast over a carry whose leading axes are
    the examples'."""
    if tuple(shape[: pred.ndim]) != tuple(pred.shape):
        raise NotImplementedError(
            f"a while loop with a per-example predicate of shape {pred.shape} and a carry "
            f"of shape {tuple(shape)} not batched along its leading axes"
        )
    return lax.broadcast_in_dim(pred, tuple(shape), tuple(range(pred.ndim)))


def _bind_scan(scope: Scope, node, eqn, invals):
    p = eqn.params
    body_jaxpr, body_consts = open_jaxpr(p["jaxpr"])
    nconsts, ncarry = scan_layout(p, len(eqn.invars))
    consts, init, xs = (
        invals[:nconsts],
        invals[nconsts : nconsts + ncarry],
        invals[nconsts + ncarry :],
    )
    sub = scope.analysis.subs[(node, 0)]
    # masks of the stacked ys, whole: scan slices them along the leading axis
    passed, fixed, _ = scope.output_masks_for(node, sub)
    if node in scope.plan.forward_context_calls:
        return _bind_scan_in_forward_context(scope, node, eqn, invals, passed, fixed)

    def body(carry, x_and_masks):
        x, masks = x_and_masks
        masks = iter(masks)
        out_masks = [next(masks) if f is None else f for f in fixed]
        outs = run_guarded(
            sub, body_consts, [*consts, *carry, *x], out_masks, mode=scope.mode, nested=True
        )
        return outs[:ncarry], outs[ncarry:]

    carry, ys = lax.scan(
        body,
        list(init),
        (list(xs), list(passed)),
        length=p["length"],
        reverse=p["reverse"],
        unroll=p["unroll"],
    )
    return list(carry) + list(ys)


class _CarriedTangentMasks:
    """The tangent masks a loop body evaluated in its caller's forward
    context (``ControlFlow.guards_in_forward_context``) gets: its consts'
    (closed over) and its carries', carried along as extra carries -- each
    iteration computes the next one's from its own, so a lane one iteration
    zeroes is guarded in the next.  Only carries whose tangent is partly
    zero somewhere in the loop (the forward analysis's fixed point) carry a
    mask; the others are taken as live."""

    def __init__(self, scope: Scope, node, body_jaxpr, operands, n_consts: int, n_carry: int):
        self.scope, self.node, self.body_jaxpr = scope, node, body_jaxpr
        self.n_consts, self.n_carry = n_consts, n_carry
        context = scope.plan.forward.subs[(node, 0)]
        self.const_masks = [
            scope.operand_tangent_mask(node, v, i) for i, v in enumerate(operands[:n_consts])
        ]
        carry_vars = body_jaxpr.invars[n_consts : n_consts + n_carry]
        self.carried = [
            j for j, v in enumerate(carry_vars) if not context.value_liveness(v).is_live
        ]
        self.shapes = {j: tuple(carry_vars[j].aval.shape) for j in self.carried}
        self.init = [
            to_guard_mask(
                scope.operand_tangent_mask(node, operands[n_consts + j], n_consts + j),
                self.shapes[j],
            )
            for j in self.carried
        ]

    def run(self, sub, consts, args, out_masks, carry_masks, x_masks=()):
        """(outputs, the next iteration's carry masks) of one guarded iteration."""
        by_carry = dict(zip(self.carried, carry_masks))
        in_tmasks = [
            *self.const_masks,
            *(by_carry.get(j, ALL) for j in range(self.n_carry)),
            *x_masks,
        ]
        inner = Scope(
            sub,
            consts,
            args,
            out_masks,
            mode=self.scope.mode,
            nested=True,
            in_tmasks=in_tmasks,
        )
        outs = inner.run()
        next_masks = []
        for j in self.carried:
            try:
                m = inner.tangent_mask(self.body_jaxpr.outvars[j])
            except ShadowUnavailable as exc:
                self.scope.record.skip(self.node, ("tangent", self.n_consts + j), str(exc))
                m = ALL
            next_masks.append(to_guard_mask(m, self.shapes[j]))
        return outs, next_masks


def _bind_scan_in_forward_context(scope: Scope, node, eqn, invals, passed, fixed):
    """A ``scan`` whose body is evaluated in this forward context: besides
    the ys masks, the consts' and carries' tangent masks
    (:class:`_CarriedTangentMasks`) and each iteration's slice of the xs'
    (extra xs)."""
    p = eqn.params
    body_jaxpr, body_consts = open_jaxpr(p["jaxpr"])
    nconsts, ncarry = scan_layout(p, len(eqn.invars))
    sub = scope.analysis.subs[(node, 0)]
    consts, init, xs = (
        invals[:nconsts],
        invals[nconsts : nconsts + ncarry],
        invals[nconsts + ncarry :],
    )
    masks = _CarriedTangentMasks(scope, node, body_jaxpr, eqn.invars, nconsts, ncarry)
    # the xs' masks whole (scan slices them), as extra xs
    xs_passed, xs_fixed, _ = scope.tangent_masks_for(
        node, eqn.invars[nconsts + ncarry :], compact=False, first=nconsts + ncarry
    )

    def body(carry_and_masks, x_and_masks):
        carry, carry_masks = carry_and_masks
        x, ys_masks, x_tmasks = x_and_masks
        ys_given = iter(ys_masks)
        out_masks = [next(ys_given) if f is None else f for f in fixed]
        x_given = iter(x_tmasks)
        x_masks = [next(x_given) if f is None else f for f in xs_fixed]
        outs, next_masks = masks.run(
            sub, body_consts, [*consts, *carry, *x], out_masks, carry_masks, x_masks
        )
        return (outs[:ncarry], next_masks), outs[ncarry:]

    (carry, _), ys = lax.scan(
        body,
        (list(init), masks.init),
        (list(xs), list(passed), xs_passed),
        length=p["length"],
        reverse=p["reverse"],
        unroll=p["unroll"],
    )
    return list(carry) + list(ys)


def _bind_shard_map(scope: Scope, node, eqn, invals):
    p = eqn.params
    body, consts = open_jaxpr(p["jaxpr"])
    sub = scope.analysis.subs[(node, 0)]

    def fn(*args):
        return tuple(run_guarded(sub, consts, args, mode=scope.mode, nested=True))

    manual = set(p.get("newly_manual_axes", ()))
    mapped = jax.shard_map(
        fn,
        mesh=p["mesh"],
        in_specs=tuple(p["in_specs"]),
        out_specs=tuple(p["out_specs"]),
        check_vma=p.get("check_vma", True),
        **({"axis_names": manual} if manual else {}),  # empty: every mesh axis, JAX's default
    )
    return list(mapped(*invals))


#: calls whose guarded re-binding may take side values as its primal outputs
#: (``remat2`` is left out: its point is to recompute, not to share)
_SHARED_CALLS = {"jit", "closed_call", "eval_jaxpr"}

BINDERS = {
    "jit": _bind_call,
    "closed_call": _bind_call,
    "eval_jaxpr": _bind_call,  # jax 0.11+: closed_call under its new name
    "remat2": _bind_call,
    "cond": _bind_cond,
    "while": _bind_while,
    "scan": _bind_scan,
    "shard_map": _bind_shard_map,
}
