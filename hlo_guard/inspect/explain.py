"""``explain(fn, *args)``: what the guard pass does to ``fn`` at these arguments.

The report lists

* every **guard site** -- an input of an operation (``sqrt``, ``log``, ``max``
  ...) that gets ``select(mask, x, stop_gradient(x))`` because some of its lanes
  are dead -- with the selecting operations that made them dead (``where``,
  ``maximum``, ``clip``, slicing, ``max`` ...), both with file:line, and the
  dead lanes in words ("lanes where `x > 0.0` is false");
* every **unguarded site**: an operation that dead lanes reach but the pass does
  not see through (no rule for the primitive, a control-flow boundary, a rule
  that keeps inputs fully live) or a guard that was skipped because its mask
  needed the result of an effectful operation;
* counts, by kind and by nested scope (``jit(_where)``, ``cond[1]`` ...).

Guard sites are *planned* per (operation, input): a site whose mask turns out
to be all-true at trace time gets no ``select`` in the program.  Forward-mode
guards sit on an operation's *output* (``output`` is set instead of
``operand``): its input tangents are structurally zero in some lanes, which
its derivative could multiply by inf under ``jvp``/``jacfwd``.
"""

from __future__ import annotations

from typing import Any, cast

import jax

from hlo_guard.inspect.dumps import ProgramDumps
from hlo_guard.inspect.programs import Programs, function_name
from hlo_guard.inspect.render import Renderer, slice_text
from hlo_guard.inspect.report_model import ExplainReport, OriginInfo, SiteInfo
from hlo_guard.inspect.scopes import ScopeTree
from hlo_guard.jax_frontend.compat import jit_inlines
from hlo_guard.jax_frontend.graph import JaxprGraph, Literal, OriginToken, is_inexact_aval
from hlo_guard.jax_frontend.plan import plan_of
from hlo_guard.jax_frontend.rule_table import RULES
from hlo_guard.jax_frontend.rules.custom_rule_hazards import custom_rule_hazards
from hlo_guard.jax_frontend.rules.where_made_zeros import (
    where_made_zero_factors,
    where_made_zero_quotients,
)
from passes.analysis import analyze
from passes.lattice import LIVE, NO_DERIVATIVE, Level
from passes.planning import plan_guards, protected_hazards


def explain(fn, *args, **kwargs) -> ExplainReport:
    """Explain the guards ``guard(fn)`` inserts for these arguments.

    ``fn`` may be a plain function, ``guard(f)`` or ``guarded_jit(f)``, or a
    function from ``hlo_guard.tf.guard``/``guarded_function`` (pass a
    guarded function to declare static arguments: ``explain(guard(f,
    static_argnums=1), x, 3)``).  The report prints as text (``str(report)``)
    and serialises with ``report.to_json()``; ``report.dumps(level, program)``
    shows the program itself.
    """
    from hlo_guard.inspect.explain_tf import explain_tf, is_tf_guarded, refuse_plain_tf

    if is_tf_guarded(fn):  # one report model for both front ends
        return explain_tf(fn, *args, **kwargs)
    with refuse_plain_tf(fn, args, kwargs):
        progs = Programs.build(fn, args, kwargs)
        return build_report(progs)


def build_report(progs: Programs) -> ExplainReport:
    analysis = progs.program.analysis
    # Guards skipped because their mask would have needed an effectful value
    # are found by evaluating the guarded program; its records (one per scope)
    # are complete once one evaluation in the guard's mode has finished --
    # the user's own call of the guarded function, or this trace.
    if progs.guarded.mode not in plan_of(analysis).record.finished:
        jax.make_jaxpr(progs.flat("guarded"))(*progs.leaves)
    tree = ScopeTree(analysis)
    input_names = dict(zip(progs.program.closed_jaxpr.jaxpr.invars, progs.leaf_names()))
    explainer = _Explainer(tree, Renderer(tree, input_names), progs.guarded.mode)
    sites: list[SiteInfo] = []
    covered = 0
    for a in tree.analyses():
        if not plan_of(a).mask_only:  # a custom call's body: masks only, never guarded
            sites.extend(explainer.scope_sites(a))
            covered += len(plan_of(a).record.covered)
    dumps = ProgramDumps(progs)
    notes = [hint] if (hint := _aux_hint(progs)) else []
    if covered:
        notes.append(
            f"{covered} planned guard(s) left out: operands of a contraction whose lanes live "
            "or die together (when they are dead, so is everything the contraction reads; "
            "docs/PLACEMENT.md)"
        )
    report = ExplainReport(
        framework="jax",
        function=function_name(progs.guarded.fn),
        sites=sites,
        signature=progs.signature(),
        notes=notes,
        _dumps=dumps.show,
    )
    return report


def _aux_hint(progs: Programs) -> str:
    """A note when ``fn`` returns a pair whose second part keeps lanes live
    that the first masks: guarded as it is, every output counts as
    differentiated; if the second part is an aux that never is
    (``jax.grad(..., has_aux=True)``), ``guard(f, has_aux=True)`` places the
    guards this count says are missing."""
    if getattr(progs.guarded, "has_aux", False):
        return ""
    out_tree = progs.program.out_tree
    children = out_tree.children()
    shape = jax.tree_util.tree_unflatten(out_tree, [0] * out_tree.num_leaves)
    if not isinstance(shape, tuple) or len(children) != 2 or children[1].num_leaves == 0:
        return ""
    analysis = progs.program.analysis
    n_out, n_aux = children[0].num_leaves, children[1].num_leaves
    as_aux = analyze(analysis.graph, RULES, [LIVE] * n_out + [NO_DERIVATIVE] * n_aux)
    missing = _guard_count(as_aux) - _guard_count(analysis)
    if missing <= 0:
        return ""
    return (
        f"note: {function_name(progs.guarded.fn)} returns a pair, and both parts count as "
        f"differentiated; its second part keeps lanes the first masks live. If it is an aux "
        f"output (jax.grad(..., has_aux=True)), guard(f, has_aux=True) places {missing} more "
        f"guard site(s)"
    )


def _guard_count(analysis) -> int:
    """Guard sites of a graph and the bodies analysed under it (gradient mode)."""
    plan = plan_of(analysis)
    own = 0 if plan.mask_only else sum(len(s) for s in plan.sites_for("gradient").values())
    return own + sum(_guard_count(sub) for sub in analysis.subs.values())


def _op_name(eqn) -> str:
    """``sqrt``; calls by their name: ``jit(norm)``, ``custom_jvp_call(relu)``."""
    name = eqn.params.get("name") if hasattr(eqn, "params") else None
    prim = eqn.primitive.name
    if prim in ("jit", "pjit") and jit_inlines(eqn.params) and isinstance(name, str) and name:
        return name.lstrip("_") or prim  # jnp's inline wrapper: the user's jnp.maximum
    return f"{prim}({name})" if isinstance(name, str) and name else prim


def _is_inline_call(eqn) -> bool:
    return eqn.primitive.name in ("jit", "pjit") and jit_inlines(eqn.params)


def _level_name(level: Level) -> str:
    return {Level.DEAD: "dead", Level.PARTIAL: "partial", Level.LIVE: "live"}[level]


class _Explainer:
    def __init__(self, tree: ScopeTree, renderer: Renderer, mode: str = "gradient"):
        self.tree = tree
        self.render = renderer
        self.mode = mode  # value mode guards every hazard; gradient mode the boundaries

    def scope_sites(self, analysis) -> list[SiteInfo]:
        graph = analysis.graph
        plan = plan_of(analysis)
        guards = sorted(
            (site for sites in plan.sites_for(self.mode).values() for site in sites),
            key=lambda site: (site.node, site.index),
        )
        # (a where-made zero factor or numerator, and a custom rule's own dead
        # branch, are asked here, not while tracing)
        unguarded = (
            plan_guards(analysis)[1]
            + where_made_zero_factors(analysis)
            + where_made_zero_quotients(analysis)
            + custom_rule_hazards(analysis)
        )
        out: list[SiteInfo] = []
        skipped = sorted(
            plan_of(analysis).record.skipped,
            key=lambda t: (t[0], "" if t[1] is None else repr(t[1])),
        )
        covered = plan_of(analysis).record.covered
        skipped_uses = {(n, i) for n, i, _ in skipped}
        passed_skip = self.passed_masks_skipped(analysis)
        for site in guards:
            eqn = graph.eqns[site.node]
            loc, _ = self.tree.location(graph, site.node)
            origins = [
                self.origin(graph, site.node, site.index, tok) for tok in site.liveness.origins
            ]
            if passed_skip is not None and not any(
                self.within(cast(OriginToken, tok).graph, graph) for tok in site.liveness.origins
            ):
                # its mask was to come from the caller, which could not build it
                out.append(
                    SiteInfo(
                        kind="unguarded",
                        op=_op_name(eqn),
                        location=loc,
                        scope=graph.scope,
                        operand=site.index,
                        origins=origins,
                        primitive=eqn.primitive.name,
                        category="skipped",
                        node=site.node,
                        level=_level_name(site.liveness.level),
                        reason=f"guard on input {site.index} skipped: {passed_skip}",
                        mask=_mask_text(origins, False),
                    )
                )
                continue
            record = SiteInfo(
                kind="guard",
                op=_op_name(eqn),
                location=loc,
                scope=graph.scope,
                operand=site.index,
                statically_dead=site.statically_dead,
                origins=origins,
                primitive=eqn.primitive.name,
                operand_expr=self.render.atom(graph, eqn.invars[site.index]),
                level=_level_name(site.liveness.level),
                node=site.node,
                mask=_mask_text(origins, site.statically_dead),
                protects=self.protects(analysis, site) if self.mode != "value" else [],
            )
            if (site.node, site.index) in skipped_uses:
                continue  # reported below as skipped, not as a guard
            if (site.node, site.index) in covered:
                continue  # left out by the rewrite: counted in a note
            out.append(record)
        out.extend(self.output_sites(analysis, skipped_uses))
        out.extend(self.contraction_sites(analysis, skipped_uses))
        for node, index, reason in skipped:
            if isinstance(index, tuple) and index[0] == "output":  # a skipped forward guard
                out.append(self.skipped_output(analysis, node, index[1], reason))
                continue
            if isinstance(index, tuple):  # ("tangent", i): a mask passed into a call body
                out.append(self.skipped_tangent_mask(analysis, node, index[1], reason))
                continue
            eqn = graph.eqns[node]
            if (
                index is None
                and _is_inline_call(eqn)
                and (node, 0) in analysis.subs
                and plan_of(analysis.subs[(node, 0)]).sites_for(self.mode)
            ):
                continue  # reported on the guard sites inside (jnp.sqrt's sqrt)
            loc, _ = self.tree.location(graph, node)
            lv = analysis.use(node, index) if index is not None else None
            origins = [
                self.origin(graph, node, index, tok)
                for tok in (lv.origins if lv is not None else ())
            ]
            what = (
                f"input {index}"
                if index is not None
                else "the dead lanes of its outputs (passed into its body)"
            )
            out.append(
                SiteInfo(
                    kind="unguarded",
                    op=_op_name(eqn),
                    location=loc,
                    scope=graph.scope,
                    operand=index,
                    origins=origins,
                    primitive=eqn.primitive.name,
                    category="skipped",
                    node=node,
                    level=_level_name(lv.level) if lv is not None else "",
                    reason=f"guard on {what} skipped: {reason}",
                    mask=_mask_text(origins, False),
                )
            )
        forward_gaps = plan.forward_unfollowed
        for u in unguarded + forward_gaps:
            eqn = graph.eqns[u.node]
            loc, _ = self.tree.location(graph, u.node)
            if u in forward_gaps:  # a tangent's origins: in the forward analysis's graphs
                self.tree.add_forward(plan.forward, analysis)
                context = plan.forward_gap_contexts.get(u.node)
                if context is not None:  # a body analysed in that context: its bodies' graphs
                    analyses, sub = context
                    for fa in analyses:
                        for key, fsub in fa.subs.items():
                            self.tree.add_forward(fsub, sub.subs.get(key))
                origins = [self.forward_origin(tok) for tok in u.liveness.origins]
            else:
                origins = [self.origin(graph, u.node, None, tok) for tok in u.liveness.origins]
            out.append(
                SiteInfo(
                    kind="unguarded",
                    op=_op_name(eqn),
                    location=loc,
                    scope=graph.scope,
                    origins=origins,
                    primitive=eqn.primitive.name,
                    reason=u.reason,
                    category=self.category(analysis, u.node),
                    node=u.node,
                    level=_level_name(u.liveness.level),
                    mask=_mask_text(origins, False),
                )
            )
        return out

    def protects(self, analysis, site) -> list[str]:
        """The singular operations of the chain this boundary guard protects,
        ``sqrt at f.py:3``, in program order (docs/PLACEMENT.md)."""
        found = []
        for a, node in protected_hazards(analysis, site.node, site.index):
            graph = cast(JaxprGraph, a.graph)
            eqn = graph.eqns[node]
            loc, _ = self.tree.location(graph, node)
            found.append((loc, f"{eqn.primitive.name} at {loc or '?'}"))
        return list(dict.fromkeys(text for _, text in sorted(found)))

    def passed_masks_skipped(self, analysis):
        """The reason, if the caller of this body could not build the masks of
        the call's outputs (they needed an effectful value); else None."""
        p = self.tree.parent(analysis.graph)
        if p is None:
            return None
        for node, index, reason in plan_of(p.analysis).record.skipped:
            if node == p.node and index is None:
                return reason
        return None

    def within(self, graph, scope_graph) -> bool:
        """Whether ``graph`` is ``scope_graph`` or nested inside it."""
        graph = self.tree.canonical(graph)
        while graph is not None:
            if graph is scope_graph:
                return True
            p = self.tree.parent(graph)
            graph = p.analysis.graph if p is not None else None
        return False

    def output_sites(self, analysis, skipped_uses) -> list[SiteInfo]:
        """Forward-mode guards on operations' outputs, planned as the interpreter does."""
        graph = analysis.graph
        forward = plan_of(analysis).forward
        self.tree.add_forward(forward, analysis)
        out: list[SiteInfo] = []
        for node, sites in sorted(plan_of(analysis).output_sites_by_node.items()):
            for site in sites:
                if (node, ("output", site.index)) in skipped_uses:
                    continue
                eqn = graph.eqns[node]
                loc, _ = self.tree.location(graph, node)
                origins = [self.forward_origin(tok) for tok in site.liveness.origins]
                out.append(
                    SiteInfo(
                        kind="guard",
                        op=_op_name(eqn),
                        location=loc,
                        scope=graph.scope,
                        statically_dead=site.statically_dead,
                        origins=origins,
                        primitive=eqn.primitive.name,
                        output=site.index,
                        mode="forward",
                        operand_expr=self.render.equation(graph, node, out_index=site.index),
                        level=_level_name(site.liveness.level),
                        node=node,
                        mask=_mask_text(origins, site.statically_dead),
                    )
                )
        return out

    def contraction_sites(self, analysis, skipped_uses) -> list[SiteInfo]:
        """Contractions whose derivative reads an operand with its dead lanes
        zeroed (``Scope.contraction_masks``): one entry per operand zeroed.
        An operand that carries no derivative takes its dead lanes from the
        contraction's output."""
        graph = analysis.graph
        covered = plan_of(analysis).record.covered
        out: list[SiteInfo] = []
        for node in sorted(plan_of(analysis).guarded_contractions):
            eqn = graph.eqns[node]
            loc, _ = self.tree.location(graph, node)
            for i, v in enumerate(eqn.invars):
                if isinstance(v, Literal) or not is_inexact_aval(v.aval):
                    continue
                if (node, i) in skipped_uses or (node, ("contraction", i)) in covered:
                    continue
                lv = analysis.use(node, i)
                if lv.is_live:
                    continue
                if not lv.reaches_output:
                    lv = analysis.value_liveness(eqn.outvars[0])
                origins = [self.origin(graph, node, i, tok) for tok in lv.origins]
                out.append(
                    SiteInfo(
                        kind="guard",
                        op=_op_name(eqn),
                        location=loc,
                        scope=graph.scope,
                        operand=i,
                        origins=origins,
                        primitive=eqn.primitive.name,
                        operand_expr=self.render.atom(graph, v),
                        level=_level_name(lv.level),
                        node=node,
                        mode="contraction",
                        mask=_mask_text(origins, False),
                    )
                )
        return out

    def skipped_output(self, analysis, node, index, reason) -> SiteInfo:
        return self._skipped_forward(
            analysis, node, f"forward-mode guard on output {index} skipped: {reason}", output=index
        )

    def skipped_tangent_mask(self, analysis, node, index, reason) -> SiteInfo:
        """A body evaluated in its caller's forward context whose input
        ``index``'s tangent mask could not be built: the body took that
        tangent as live and guards nothing for it."""
        return self._skipped_forward(
            analysis,
            node,
            f"forward-mode tangent mask of input {index} (passed into its body) skipped: {reason}",
            operand=index,
        )

    def _skipped_forward(self, analysis, node, reason, **which) -> SiteInfo:
        graph = analysis.graph
        eqn = graph.eqns[node]
        loc, _ = self.tree.location(graph, node)
        return SiteInfo(
            kind="unguarded",
            op=_op_name(eqn),
            location=loc,
            scope=graph.scope,
            primitive=eqn.primitive.name,
            mode="forward",
            category="skipped",
            node=node,
            reason=reason,
            **which,
        )

    def forward_origin(self, token) -> OriginInfo:
        """An upstream selection that makes tangent lanes structurally zero."""
        graph = self.tree.canonical(token.graph)
        node = token.node
        eqn = graph.eqns[node]
        prim = eqn.primitive.name
        loc, inherited = self.tree.location(graph, node)
        op = prim
        if inherited:
            op = self.tree.wrapper_name(graph).lstrip("_") or prim
        fa = self.tree.forward_of_graph(token.graph)
        meaning = f"lanes whose tangent `{prim}` makes structurally zero"
        if prim == "select_n" and fa is not None:
            live = [
                k
                for k, v in enumerate(eqn.invars[1:])
                if not isinstance(v, Literal)
                and fa.value_liveness(v).reaches_output
                and not fa.value_liveness(v).is_dead
            ]
            pred = self.render.atom(graph, eqn.invars[0])
            if len(eqn.invars) == 3 and len(live) == 1:
                pred, negated = positive(pred)
                word = "false" if (live == [1]) != negated else "true"
                meaning = f"lanes where `{pred}` is {word} (the select takes a constant there)"
            else:
                meaning = f"lanes where the select on `{pred}` takes a constant"
        return OriginInfo(
            op=op,
            location=loc,
            meaning=meaning,
            primitive=prim,
            scope=graph.scope,
            inherited_location=inherited,
        )

    @staticmethod
    def category(analysis, node: int) -> str:
        rule = analysis.rules.get(analysis.graph.op_name(node))
        if rule is None:
            return "no-rule"
        kind = getattr(rule, "kind", "")
        if kind in ("control-flow", "conservative"):
            return kind
        return "other"

    # -- origins ------------------------------------------------------------------------
    def origin(self, graph, node: int, index, token) -> OriginInfo:
        ograph, onode = token.graph, token.node
        eqn = ograph.eqns[onode]
        prim = eqn.primitive.name
        loc, inherited = self.tree.location(ograph, onode)
        op = prim
        if inherited:
            wrapper = self.tree.wrapper_name(ograph).lstrip("_")
            if wrapper:
                op = wrapper
        if ograph is graph and onode == node and index is not None:
            operands = {index}
        else:
            operands = self.tree.operands_reached(graph, node, ograph, onode)
        if prim == "select_n" and len(operands) > 1:
            operands.discard(0)  # the predicate carries no derivative
        operand = min(operands) if len(operands) == 1 else None
        return OriginInfo(
            op=op,
            location=loc,
            meaning=self.meaning(ograph, onode, operand),
            primitive=prim,
            scope=ograph.scope,
            operand=operand,
            inherited_location=inherited,
        )

    def meaning(self, graph, node: int, operand) -> str:
        """The lanes this selecting equation kills for input ``operand``, in words."""
        eqn = graph.eqns[node]
        prim = eqn.primitive.name
        r = self.render
        args = eqn.invars
        if prim == "select_n":
            _, resolved = r.resolve(graph, args[0])
            pred = r.atom(graph, args[0])
            if isinstance(resolved, Literal):
                return f"every lane the constant predicate `{pred}` does not select"
            is_bool = str(getattr(args[0].aval, "dtype", "")) == "bool"
            if operand is None or operand == 0:
                return f"lanes the select on `{pred}` does not take"
            case = operand - 1
            if is_bool and len(args) == 3:
                pred, negated = positive(pred)
                return f"lanes where `{pred}` is {'false' if (case == 1) != negated else 'true'}"
            return f"lanes where `{pred}` != {case}"
        if prim in ("max", "min") and len(args) == 2:
            if operand is None:
                return f"lanes of the operand that does not win `{prim}`"
            this = r.atom(graph, args[operand])
            other = r.atom(graph, args[1 - operand])
            cmp = "<" if prim == "max" else ">"
            return (
                f"lanes where `{this} {cmp} {other}` "
                f"({prim} takes the other operand; ties share the derivative)"
            )
        if prim == "clamp":
            lo, x, hi = (r.atom(graph, a) for a in args)
            if operand == 1:
                return f"lanes where `{x}` is not strictly between `{lo}` and `{hi}`"
            if operand == 0:
                return f"lanes where the lower bound `{lo}` is not the result"
            if operand == 2:
                return f"lanes where the upper bound `{hi}` is not the result"
            return "lanes the clamp does not take from this operand"
        if prim in ("reduce_max", "reduce_min"):
            x = r.atom(graph, args[0])
            word = "maximum" if prim == "reduce_max" else "minimum"
            return (
                f"elements of `{x}` that are not the {word} over axes "
                f"{tuple(eqn.params.get('axes', ()))} (ties share the derivative)"
            )
        if prim == "slice":
            return f"lanes outside the slice `{slice_text(eqn)}` of `{r.atom(graph, args[0])}`"
        if prim in ("gather", "dynamic_slice"):
            return f"lanes of `{r.atom(graph, args[0])}` that the {prim} does not read"
        if prim in ("dynamic_update_slice", "scatter"):
            if operand == 0:
                return f"lanes of `{r.atom(graph, args[0])}` that the {prim} overwrites"
            return f"lanes the {prim} does not write"
        if prim == "pad":
            return "lanes the pad drops" if operand != 1 else "lanes holding the padding value"
        if prim == "cond":
            return self._cond_meaning(graph, eqn, operand)
        return f"lanes `{prim}` drops"

    def _cond_meaning(self, graph, eqn, operand) -> str:
        """A ``cond`` operand dies with the index: every lane, whenever the
        index picks a branch that does not read it (rules.calls'
        ``_cond_operand_liveness``)."""
        index = self.render.atom(graph, eqn.invars[0])
        branches = eqn.params.get("branches", ())
        if operand is None or operand < 1 or not branches:
            return f"every lane, when the index `{index}` picks a branch that does not read it"
        unread = [b for b, branch in enumerate(branches) if not _reads(branch.jaxpr, operand - 1)]
        if len(branches) == 2 and len(unread) == 1 and _from_predicate(graph, eqn.invars[0]):
            # ``lax.cond(p, true_fun, false_fun)``: branch 1 is the true one
            return f"every lane, when `{index}` is {'true' if unread[0] == 1 else 'false'}"
        which = ", ".join(str(b) for b in unread) or "none"
        verb = "do" if len(unread) > 1 else "does"
        return (
            f"every lane, when the index `{index}` picks branch"
            f"{'es' if len(unread) > 1 else ''} {which} (which {verb} not read it)"
        )


def _reads(jaxpr, k: int) -> bool:
    """Whether ``jaxpr`` reads its ``k``-th input at all (an equation's
    operand, or an output)."""
    var = jaxpr.invars[k]
    return any(var is v for e in jaxpr.eqns for v in e.invars) or any(
        var is v for v in jaxpr.outvars
    )


def _from_predicate(graph, index) -> bool:
    """Whether a ``cond`` index is a boolean predicate converted to an
    integer (``lax.cond(pred, ...)``)."""
    prod = graph.producer(index) if not isinstance(index, Literal) else None
    if prod is None:
        return False
    eqn = graph.eqns[prod[0]]
    return (
        eqn.primitive.name == "convert_element_type"
        and str(getattr(eqn.invars[0].aval, "dtype", "")) == "bool"
    )


def positive(pred: str):
    """(``p``, True) for a rendered ``~p`` / ``~(p)``: "lanes where `x > 0` is
    false" reads better than "lanes where `~(x > 0)` is true"."""
    negated = False
    while pred.startswith("~"):
        inner = pred[1:]
        if inner.startswith("(") and inner.endswith(")") and _balanced(inner[1:-1]):
            inner = inner[1:-1]
        elif not inner or any(c in inner for c in " ()"):
            break
        pred, negated = inner, not negated
    return pred, negated


def _balanced(text: str) -> bool:
    depth = 0
    for c in text:
        depth += {"(": 1, ")": -1}.get(c, 0)
        if depth < 0:
            return False
    return depth == 0


def _mask_text(origins: list[OriginInfo], statically_dead: bool) -> str:
    if statically_dead:
        return "every lane"
    meanings = []
    for o in origins:
        if o.meaning and o.meaning not in meanings:
            meanings.append(o.meaning)
    return "; ".join(meanings)


def explain_dict(fn, *args, **kwargs) -> dict[str, Any]:
    """``explain(...).to_dict()``, for callers that only want data."""
    return explain(fn, *args, **kwargs).to_dict()
