"""Import the traced graph into the guarded wrapper and insert the guards.

Inside the wrapper ``tf.function`` (never directly under a tape, never
directly inside a jit function -- the wrapper is the unit that gets
differentiated and compiled) the user's GraphDef is imported once with
``tf.graph_util.import_graph_def``: arguments through ``input_map``, captured
resource handles through ``tf.identity`` of the outer handle.  The imported
operations are the program that runs; nothing is executed twice.

Then, for every planned site, the consumer's input is rewired to

    x_g = SelectV2(mask, x, StopGradient(x))

with ``Operation._update_input``.  ``x_g`` equals ``x`` in every lane, so the
forward values are bitwise the original ones; in the derivative the dead
lanes' cotangent is *selected* to zero before ``0 * inf`` can leave them.

Masks are built from original values.  A mask may need a value downstream of
the very consumer it guards (``a = sqrt(x); where(a == max(a), ...)``):
reading the imported tensor there would make the graph cyclic, so values
downstream of any guarded consumer are recomputed on the side ("shadow"
copies of stateless ops from gradient-stopped inputs; XLA's CSE merges them
with the originals).  A mask that would need a stateful op twice (a random
draw, a variable update) is not built: that guard is skipped and reported.
"""

from __future__ import annotations

from collections.abc import Sequence
from collections.abc import Set as AbstractSet

import tensorflow as tf

from hlo_guard.tf import compat, local_constants, output_guards
from hlo_guard.tf.contractions import guarded_contractions, with_masked_gradient
from hlo_guard.tf.control import guard_bodies
from hlo_guard.tf.function_names import with_fresh_function_names
from hlo_guard.tf.graph import TFGraph, is_inexact
from hlo_guard.tf.loop_bodies import attach_shaped_bodies, copy_loop_handle_data
from hlo_guard.tf.mask_broadcasts import is_one_bit
from hlo_guard.tf.mask_ops import ALGEBRA, StaticShape
from hlo_guard.tf.opcopy import copy_op, is_stateful, move_consumers
from hlo_guard.tf.records import AppliedGuard, BuildRecord
from hlo_guard.tf.rules import RULES
from hlo_guard.tf.tracing import TracedFunction
from passes import tangent_gaps
from passes.analysis import Analysis, analyze
from passes.lattice import LIVE
from passes.masks import ALL, NONE, MaskResolver, ShadowUnavailable
from passes.planning import (
    GuardSite,
    contraction_covers_operand,
    guard_sharing_key,
    plan_boundary_guards,
)
from passes.rules import BroadcastOperandRule, MaskRule, implements
from passes.side_evaluation import evaluate_on_side


def import_traced(
    traced: TracedFunction, flat_args: Sequence[tf.Tensor], scope: str = "hlo_guard"
) -> tuple[list[tf.Operation], list[tf.Tensor], str]:
    """Import the traced GraphDef into the current graph; (ops, outputs, prefix)."""
    if len(flat_args) != len(traced.arg_names):
        raise ValueError(
            f"the traced function takes {len(traced.arg_names)} tensor "
            f"argument(s), got {len(flat_args)}"
        )
    input_map = dict(zip(traced.arg_names, flat_args))
    for external, internal in traced.captures:
        input_map[internal] = tf.identity(external)
    return _import(traced.graph_def, input_map, traced.output_names, scope)


def _import(graph_def, input_map, output_names, scope):
    """Import without the mapped placeholders: a dangling ``Placeholder`` in a
    function body would reach XLA when TF rewrites an ``If`` for its gradient."""
    mapped = {name.split(":")[0] for name in input_map}
    trimmed = type(graph_def)()
    trimmed.versions.CopyFrom(graph_def.versions)
    trimmed.library.CopyFrom(graph_def.library)
    removed = {n.name for n in graph_def.node if n.name in mapped and n.op == "Placeholder"}
    for n in graph_def.node:
        if n.name in removed:
            continue
        node = trimmed.node.add()
        node.CopyFrom(n)
        if "_class" in node.attr:  # colocation with a removed placeholder
            keep = [
                c
                for c in node.attr["_class"].list.s
                if c.decode(errors="replace")[len("loc:@") :] not in removed
            ]
            if keep:
                del node.attr["_class"].list.s[:]
                node.attr["_class"].list.s.extend(keep)
            else:
                del node.attr["_class"]
    # an argument the graph never reads (a loss ignoring ``y_true``, a loop
    # counter autograph folded away) has no consumer left once its placeholder
    # is removed, and ``import_graph_def`` rejects a mapping it cannot place
    read = _tensors_read(trimmed)
    used_map = {k: v for k, v in input_map.items() if _canonical(k) in read}
    node_names = [n.name for n in trimmed.node]
    ops = tf.graph_util.import_graph_def(
        trimmed, input_map=used_map, return_elements=node_names, name=scope
    )
    copy_loop_handle_data(ops)
    graph = tf.compat.v1.get_default_graph()
    prefix = (
        ops[0].name[: len(ops[0].name) - len(node_names[0])]
        if ops
        else graph.unique_name(scope, mark_as_used=False) + "/"
    )
    outputs = [
        input_map[n] if n in input_map else graph.get_tensor_by_name(prefix + n)
        for n in output_names
    ]
    return list(ops), outputs, prefix


def _canonical(tensor_name: str) -> str:
    """``"x"`` and ``"x:0"`` name the same tensor."""
    return tensor_name if ":" in tensor_name else tensor_name + ":0"


def _tensors_read(graph_def) -> set[str]:
    """Every tensor some node of ``graph_def`` (top level) reads as a data input."""
    return {_canonical(i) for n in graph_def.node for i in n.input if not i.startswith("^")}


class Builder:
    """Masks and guards for one imported graph (the ``mctx`` rules read)."""

    def __init__(
        self, graph: TFGraph, analysis: Analysis, rewired_outputs: AbstractSet[int] = frozenset()
    ):
        """``rewired_outputs``: nodes whose outputs output guards will move
        the consumers off (their descendants are recomputed for masks, too)."""
        self.graph = graph
        self.analysis = analysis
        sites, unguarded = plan_boundary_guards(analysis)
        self.sites: list[GuardSite] = sites
        self.record = BuildRecord(graph, analysis, unguarded=list(unguarded))
        self.original_inputs = [list(op.inputs) for op in graph.ops]
        #: bilinear nodes with a partly dead operand (:mod:`hlo_guard.tf.contractions`)
        self.contractions = guarded_contractions(graph, analysis)
        self.downstream = self._descendants(
            {s.node for s in sites if not s.statically_dead}
            | set(rewired_outputs)
            | set(self.contractions)
        )
        self._values: dict[str, tf.Tensor] = {}
        #: the StopGradient reads of imported tensors that masks are built from
        self.value_readers: set[str] = set()
        #: outputs of operations swapped for a guarded copy (old name -> new tensor)
        self.replaced: dict[str, tf.Tensor] = {}
        out_masks = [
            ALL if lv.reaches_output and not lv.is_dead else NONE for lv in analysis.out_liveness
        ]
        self.resolver = MaskResolver(analysis, ALGEBRA, out_masks, self._input_masks)

    # -- values --------------------------------------------------------------------
    def _descendants(self, roots: set[int]) -> set[int]:
        consumers: dict[str, list[int]] = {}
        for n, op in enumerate(self.graph.ops):
            for t in op.inputs:
                consumers.setdefault(t.op.name, []).append(n)
            for c in op.control_inputs:
                consumers.setdefault(c.name, []).append(n)
        seen = set(roots)
        stack = list(roots)
        while stack:
            n = stack.pop()
            for k in consumers.get(self.graph.ops[n].name, ()):
                if k not in seen:
                    seen.add(k)
                    stack.append(k)
        return seen

    def value(self, t) -> tf.Tensor:
        """The original value of tensor ``t`` (a tensor or its name), gradient-stopped.

        Operations downstream of a guard are copied on the side (the guarded
        graph's own outputs would close a cycle through the guard's mask);
        everything else is read as it is, behind a ``StopGradient``."""
        name = t if isinstance(t, str) else t.name
        hit = self._values.get(name)
        if hit is not None:
            return hit
        evaluate_on_side(
            name,
            available=lambda n: n in self._values,
            producer=self._side_producer,
            operands=lambda node: [x.name for x in self.original_inputs[node]],
            leaf=self._read_original,
            compute=self._copy_on_side,
        )
        return self._values[name]

    def shaped(self, t: tf.Tensor) -> tf.Tensor | StaticShape:
        """``t`` for a mask that needs only its shape (and dtype): a
        :class:`~hlo_guard.tf.mask_ops.StaticShape` when the shape is known at
        trace time -- no edge into the program, so nothing downstream of a
        guard is copied on the side for it -- else its value."""
        if t.shape.is_fully_defined():
            return StaticShape(t.shape, t.dtype)
        return self.value(t)

    def _side_producer(self, name: str) -> int | None:
        prod = self.graph.producer(name)
        if prod is None or prod[0] not in self.downstream:
            return None
        return prod[0]

    def _read_original(self, name: str) -> None:
        tensor = self.graph.tensors.get(name)
        if tensor is None:
            tensor = tf.compat.v1.get_default_graph().get_tensor_by_name(name)
        if is_inexact(tensor.dtype):
            read = tf.stop_gradient(tensor)
            self.value_readers.add(read.op.name)
        else:
            read = tensor
        self._values[name] = read

    def _copy_on_side(self, node: int) -> None:
        op = self.graph.op(node)
        if is_stateful(op):
            raise ShadowUnavailable(
                f"the mask needs the result of stateful '{op.type}' "
                f"('{self.graph.user_name(op.name)}'), which must run exactly once"
            )
        inputs = self.original_inputs[node]
        with tf.name_scope("hlo_guard_shadow"):
            copy = copy_op(op, [self._values[x.name] for x in inputs])
        for orig, new in zip(op.outputs, copy.outputs):
            self._values[orig.name] = new

    # -- masks -----------------------------------------------------------------------
    def _input_masks(self, node: int, out_masks):
        op = self.graph.op(node)
        rule = RULES.get(op.type)
        if not implements(rule, MaskRule):  # the analysis keeps such ops fully live
            raise RuntimeError(
                f"hlo_guard internal: masks asked of '{op.type}', which has no mask rule"
            )
        return rule.input_masks(self, node, op, out_masks)

    # -- guards ----------------------------------------------------------------------
    def apply(self) -> BuildRecord:
        """Create every guard, then rewire the consumers (masks first: no
        mask may see a half-rewired graph)."""
        pending = []
        #: (operand, mask key) -> its select: uses of one tensor whose masks
        #: the placement knows equal share one guard (``d * d``), as in JAX
        shared: dict[tuple[str, object], tf.Tensor] = {}
        contraction_masks = {node: self._contraction_masks(node) for node in self.contractions}
        for site in self.sites:
            x = self.original_inputs[site.node][site.index]
            if self._contraction_covers(site, contraction_masks):
                continue
            with tf.name_scope("hlo_guard_guard"):
                if site.statically_dead:
                    pending.append((site, tf.stop_gradient(x), "stop_gradient"))
                    continue
                try:
                    x, mask = self._guard_operand(site, x)
                except ShadowUnavailable as exc:
                    self.record.skipped.append((site, str(exc)))
                    continue
                if mask is ALL:
                    continue
                if mask is NONE:
                    pending.append((site, tf.stop_gradient(x), "stop_gradient"))
                    continue
                key = (x.name, guard_sharing_key(self.analysis, site.node, site.index))
                guarded = shared.get(key)
                if guarded is None:
                    guarded = tf.raw_ops.SelectV2(condition=mask, t=x, e=tf.stop_gradient(x))
                    shared[key] = guarded
                pending.append((site, guarded, "select"))
        by_node: dict[int, list] = {}
        for site, guarded, form in pending:
            by_node.setdefault(site.node, []).append((site.index, guarded))
            self.record.applied.append(AppliedGuard(site, form))
        for node, items in by_node.items():
            op = self.graph.op(node)
            if all(op.inputs[i].shape.is_compatible_with(g.shape) for i, g in items):
                for i, g in items:
                    compat.update_input(op, i, g)
            else:
                self._replace(op, dict(items))
        for node, masks in contraction_masks.items():
            if masks:
                self._guard_contraction(node, masks)
        return self.record

    def _contraction_masks(self, node: int) -> dict[int, tf.Tensor]:
        """Each partly dead operand's use mask at its own shape, also of an
        operand that carries no derivative (fully live operands are left out; a mask that needs a stateful value twice is
        skipped and reported, as a guard's would be)."""
        op = self.graph.op(node)
        found: dict[int, tf.Tensor] = {}
        for i, x in enumerate(self.original_inputs[node]):
            lv = self.analysis.use(node, i)
            if lv.is_live or not is_inexact(x.dtype):
                continue
            try:
                if lv.reaches_output:
                    mask = self.resolver.use_mask(node, i)
                else:  # carries no derivative (a Const): the lanes live outputs read
                    mask = self.resolver.node_input_masks(node)[i]
            except ShadowUnavailable as exc:
                self.record.skipped.append((GuardSite(node, i, lv), str(exc)))
                continue
            if mask is ALL or (op.type == "MatMul" and is_one_bit(mask)):
                # a MatMul operand whose lanes live or die together (the
                # weights under a row mask) needs no zeroing: while live it
                # is live in every lane, and when dead so is every output
                # lane and every lane of the partner (docs/PLACEMENT.md)
                continue
            with tf.name_scope("hlo_guard_guard"):
                if mask is NONE:
                    mask = tf.zeros_like(x, dtype=tf.bool)
                elif not _same_static_shape(mask, x):
                    mask = tf.broadcast_to(mask, tf.shape(x))
            found[i] = mask
        self.record.contractions.append((op.name, sorted(found)))
        return found

    def _contraction_covers(self, site: GuardSite, contraction_masks) -> bool:
        """Whether the guarded ``MatMul`` at the site makes its boundary guard
        redundant: an operand with a one-bit mask whose only hazard is the
        product's own (``Placement.own_hazard_only``) and whose partner the
        contraction zeroes in its dead lanes or is live in every lane -- the
        JAX front end's ``Scope._contraction_covers``, whose docstring and
        docs/PLACEMENT.md give the argument."""
        node = site.node
        if site.statically_dead or node not in contraction_masks:
            return False
        if self.graph.op(node).type != "MatMul" or site.index > 1:
            return False
        return contraction_covers_operand(
            self.analysis,
            self.resolver,
            node,
            site.index,
            is_one_bit,
            lambda partner: partner in contraction_masks[node],
        )

    def _guard_contraction(self, node: int, masks: dict[int, tf.Tensor]) -> None:
        """Swap the contraction at ``node`` (as guarded so far) for one whose
        gradient reads the masked operands (:mod:`hlo_guard.tf.contractions`)."""
        original = self.graph.op(node)
        current = self.replaced.get(original.outputs[0].name)
        op = original if current is None else current.op
        with tf.name_scope("hlo_guard_guarded"):
            outputs = with_masked_gradient(op, list(op.inputs), masks)
        self._move_consumers(op, outputs)
        compat.move_control_outputs(op, outputs[0].op)
        for old, new in zip(original.outputs, outputs):
            self.replaced[old.name] = new

    def _replace(self, op: tf.Operation, new_inputs: dict[int, tf.Tensor]) -> None:
        """Swap ``op`` for a copy reading ``new_inputs`` (an input edge cannot
        change rank in place), and move every consumer -- guards included --
        to the copy's outputs."""
        inputs = [new_inputs.get(i, t) for i, t in enumerate(op.inputs)]
        with tf.name_scope("hlo_guard_guarded"):
            new_op = copy_op(op, inputs, name=op.name.split("/")[-1])
        self._move_consumers(op, new_op.outputs)
        compat.move_control_outputs(op, new_op)

    def _move_consumers(self, op: tf.Operation, new_outputs: Sequence[tf.Tensor]) -> None:
        """Point every reader of ``op``'s outputs at ``new_outputs``."""
        move_consumers(op, new_outputs)
        for old, new in zip(op.outputs, new_outputs):
            self.replaced[old.name] = new

    def _guard_operand(self, site: GuardSite, x: tf.Tensor):
        """(operand to guard, its mask).

        An operand that the op broadcasts implicitly (``y`` of shape [3] in
        ``log(x) * y`` with x of shape [2, 3]) cannot be guarded at its own
        shape: one of its lanes feeds live and dead output lanes alike, and the
        dead ones' ``0 * -inf`` is summed into it.  Such an operand is
        broadcast to the output shape first and guarded there with the
        output-shaped mask; the value is unchanged and the op sees the same
        broadcast result.
        """
        op = self.graph.op(site.node)
        rule = RULES.get(op.type)
        out = op.outputs[0]
        if not implements(rule, BroadcastOperandRule) or _same_static_shape(x, out):
            return x, self.resolver.use_mask(site.node, site.index)
        out_masks = [self.resolver.value_mask(v) for v in self.graph.node_outputs(site.node)]
        mask = rule.broadcast_operand_mask(self, site.node, op, site.index, out_masks)
        if mask is ALL or mask is NONE:
            return x, mask
        return tf.broadcast_to(x, tf.shape(mask)), mask


def _same_static_shape(a: tf.Tensor, b: tf.Tensor) -> bool:
    return a.shape.is_fully_defined() and b.shape.is_fully_defined() and a.shape == b.shape


def _guard_graph(
    ops,
    outputs,
    library,
    locations,
    body_locations,
    prefix,
    depth,
    out_liveness=None,
    in_tangents=None,
    tangent_seeds=None,
):
    """``in_tangents``/``tangent_seeds``: a body's argument tangents and the
    arguments whose lanes are not known inside (:mod:`passes.tangent_gaps`)."""
    graph = TFGraph(ops, outputs, locations, strip_prefix=prefix)
    analysis = analyze(graph, RULES, out_liveness)
    forward, out_sites = output_guards.plan(graph, analysis, in_tangents)
    builder = Builder(graph, analysis, output_guards.output_nodes(out_sites))
    record = builder.apply()
    outputs = [builder.replaced.get(t.name, t) for t in outputs]
    outputs = output_guards.apply(builder, forward, out_sites, outputs)
    suspect, gaps = tangent_gaps.unguarded_sites(
        forward.graph, forward, analysis, tangent_seeds or {}
    )
    record.unguarded.extend(gaps)
    record.nested = guard_bodies(
        graph, library, build_body, body_locations, depth, analysis, forward, suspect
    )
    return outputs, record


def build_guarded(
    traced: TracedFunction, flat_args: Sequence[tf.Tensor], localize_constants: bool = False
):
    """Import, analyse, guard.  Returns (flat outputs, BuildRecord).
    ``localize_constants``: give the ops whose gradient reads an integer
    constant a gradient that builds it itself (:mod:`hlo_guard.tf.local_constants`)."""
    # each build imports its own copy of the library (see the module)
    traced = with_fresh_function_names(traced)
    ops, outputs, prefix = import_traced(traced, flat_args)
    outputs, record = _guard_graph(
        ops, outputs, traced.graph_def.library, traced.locations, traced.body_locations, prefix, 0
    )
    record.notes.extend(traced.notes)
    attach_shaped_bodies(ops, traced.shaped_functions)
    if localize_constants:
        replaced = local_constants.localize(ops)
        outputs = [replaced.get(t.name, t) if isinstance(t, tf.Tensor) else t for t in outputs]
    return outputs, record


def build_body(
    graph_def,
    in_names,
    out_names,
    args,
    library,
    body_locations,
    name,
    depth,
    out_liveness=None,
    tangents=None,
):
    """The same for a control-flow body (its outputs fully live unless
    ``out_liveness`` says which are unused; ``tangents``: (liveness, suspect
    flags, description of the op) of its arguments' tangents, for forward mode)."""
    ops, outputs, prefix = _import(
        graph_def, dict(zip(in_names, args)), out_names, "hlo_guard_body"
    )
    in_tangents = seeds = None
    if tangents is not None:
        lvs, suspect, where = tangents
        names = [a.name for a in args]
        # a variable handle's reads have a live tangent whatever the caller's
        # analysis says about the handle (it may be an accumulator primal)
        in_tangents = {
            n: LIVE if a.dtype == tf.resource else lv for n, a, lv in zip(names, args, lvs)
        }
        seeds = tangent_gaps.body_seeds(names, list(lvs), list(suspect), where)
    return _guard_graph(
        ops,
        outputs,
        library,
        body_locations.get(name, {}),
        body_locations,
        prefix,
        depth,
        out_liveness,
        in_tangents,
        seeds,
    )
