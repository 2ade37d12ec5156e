"""Output guards for forward mode (``tf.autodiff.ForwardAccumulator``).

Reverse mode leaks where a singular operation sits *upstream* of a selection;
forward mode leaks where it sits *downstream*: in ``sqrt(maximum(x, 0))`` at
``x = -1`` the tangent of the ``maximum`` is structurally zero (the constant
won), and ``sqrt'(0) = inf`` times that zero is NaN although the per-lane
program has no derivative there at all.  Input guards cannot help (a selected
zero tangent is still multiplied by inf), so the *output* of the singular
operation is guarded with the mask of lanes whose tangent may be non-zero:

    y_g = SelectV2(tangent_mask, y, StopGradient(y))

Its JVP selects the tangent, so the ``0 * inf`` never leaves the dead lane; its
value is ``y`` in every lane.  Which outputs, and their masks, come from the
engine's forward analysis (:func:`passes.analysis.analyze_forward`,
:func:`passes.planning.plan_output_guards`) with the TF rules' forward halves,
exactly as the JAX front end does.
"""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf

from hlo_guard.tf import compat
from hlo_guard.tf.graph import TFGraph
from hlo_guard.tf.mask_ops import ALGEBRA
from hlo_guard.tf.records import AppliedGuard
from hlo_guard.tf.rules import RULES
from passes.analysis import Analysis, ForwardAnalysis, analyze_forward
from passes.lattice import LIVE, Liveness
from passes.masks import ALL, NONE, ForwardMaskResolver, ShadowUnavailable
from passes.planning import OutputGuardSite, plan_output_guards
from passes.rules import ForwardMaskRule, implements


class ForwardView:
    """The TFGraph as the forward analysis reads it: its inputs are the tensors
    it reads from outside (arguments, captured handles), and a ``resource``
    handle counts as carrying a derivative -- a variable may be a primal of
    the accumulator, so what is read from it has a live tangent."""

    def __init__(self, graph: TFGraph):
        self._graph = graph

    def carries_derivative(self, value) -> bool:
        if self._graph.has_float_dtype(value):
            return True
        t = self._graph.tensors.get(value)
        return t is not None and t.dtype == tf.resource

    def __getattr__(self, name):
        return getattr(self._graph, name)


def plan(graph: TFGraph, analysis: Analysis, in_tangents: dict[str, Liveness] | None = None):
    """(forward analysis, output guard sites) of one imported graph.

    ``in_tangents``: tangent liveness of some inputs by tensor name (a
    control-flow body's arguments, from the caller's analysis); other inputs
    are fully live."""
    view = ForwardView(graph)
    given = in_tangents or {}
    fa = analyze_forward(view, RULES, [given.get(v, LIVE) for v in view.graph_inputs()])
    return fa, plan_output_guards(analysis, fa)


def apply(
    builder, fa: ForwardAnalysis, sites: Sequence[OutputGuardSite], outputs: list[tf.Tensor]
) -> list[tf.Tensor]:
    """Insert the output guards; returns the graph outputs, rewired.

    Every consumer of a guarded output moves to the guard, except the
    gradient-stopped reads that masks were built from (``builder.value``),
    which must keep reading the original tensor or the graph would close a
    cycle through the guard's own mask.
    """
    graph = builder.graph
    builder.forward = fa  # rules whose masks need the analysis' notes (control flow)
    resolver = ForwardMaskResolver(
        fa, ALGEBRA, {}, lambda node, ins: _output_masks(builder, node, ins), graph.producer
    )
    planned = []
    for site in sites:
        op = graph.op(site.node)
        name = op.outputs[site.index].name
        y = builder.replaced.get(name, op.outputs[site.index])
        if site.statically_dead:
            planned.append((site, y, NONE))
            continue
        try:
            mask = resolver.value_mask(name)
        except ShadowUnavailable as exc:
            builder.record.skipped.append((site, str(exc)))
            continue
        if mask is not ALL:
            planned.append((site, y, mask))
    keep: set[str] = set(builder.value_readers)
    for site, y, mask in planned:
        with tf.name_scope("hlo_guard_output_guard"):
            stopped = tf.stop_gradient(y)
            if mask is NONE:
                guarded, form = stopped, "stop_gradient"
            else:
                guarded, form = tf.raw_ops.SelectV2(condition=mask, t=y, e=stopped), "select"
        mine = {stopped.op.name, guarded.op.name}
        for consumer in list(y.consumers()):
            if consumer.name in mine or consumer.name in keep:
                continue
            for k, t in enumerate(consumer.inputs):
                if t.name == y.name:
                    compat.update_input(consumer, k, guarded)
        outputs = [guarded if t.name == y.name else t for t in outputs]
        builder.record.output_guards.append(AppliedGuard(site, form))
    return outputs


def _output_masks(builder, node: int, in_masks):
    op = builder.graph.op(node)
    rule = RULES.get(op.type)
    if rule is None:
        return [ALL] * len(op.outputs)
    if not implements(rule, ForwardMaskRule):  # its outputs are fully live forward
        raise RuntimeError(
            f"hlo_guard internal: tangent masks asked of '{op.type}', which has no forward mask rule"
        )
    return rule.forward_masks(builder, node, op, in_masks)


def output_nodes(sites: Sequence[OutputGuardSite]) -> set[int]:
    """Nodes whose outputs will be rewired: values downstream of them must be
    recomputed on the side when a mask needs them (see ``Builder.value``)."""
    return {s.node for s in sites if not s.statically_dead}
