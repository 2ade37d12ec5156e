"""Functional control flow (``If``/``Case``/``While``): tangents across the boundary.

Reverse mode keeps these boundaries fully live (:class:`structural.Conservative`,
reported when dead lanes arrive), but for an ``If``/``Case`` operand some branch
does not read: TF's gradient of the untaken branch gives it an instantiated
zero, so it is dead whenever such a branch is taken (mask: the predicate or
index, broadcast).  Forward mode needs more: a branch that
returns a constant (``tf.cond(p, lambda: x, lambda: 0.)``) makes the ``If``
output's tangent structurally zero whenever that branch is taken, and
``sqrt`` downstream turns the zero into NaN under XLA.  So the forward half
analyses each branch (or the loop body) with the tangent liveness of the
op's inputs:

- ``If``/``Case``: an output whose tangent is, in every branch, either fully
  live or structurally zero gets the mask "the taken branch is one of the
  live ones" -- a per-lane broadcast of the predicate (or branch index), so
  an output guard downstream selects the tangent exactly as the double where
  would.  A branch whose output is *partly* zero (its mask lives inside the
  branch) or unknown is taken as fully live and noted (reported where it
  reaches a singular op, :mod:`passes.tangent_gaps`).
- ``While``: the carried tangents' fixed point.  An output is fully live
  when its initial tangent and the body's output are both fully live; an
  accumulator that starts from a constant is live exactly when the loop ran
  (``while_v2``'s counter moved: the mask).  Otherwise (a lane zeroed by
  some iteration) it is taken as fully live and noted.
"""

from __future__ import annotations

from collections.abc import Hashable

import tensorflow as tf

from hlo_guard.tf import compat
from hlo_guard.tf.graph import TFGraph, carries_derivative
from hlo_guard.tf.mask_ops import normalize
from hlo_guard.tf.rules.structural import Conservative, _shape_of
from passes.analysis import analyze_forward
from passes.lattice import LIVE, NO_DERIVATIVE, Liveness, dead_by, partial_by
from passes.masks import ALL, NONE
from passes.tangent_gaps import body_seeds, note_unfollowed, tainted_values

IFS = ("If", "StatelessIf")
CASES = ("Case", "StatelessCase")
WHILES = ("While", "StatelessWhile")
#: ``ForwardAnalysis.notes`` keys
BRANCHES = "branches"  # {node: [tuple of live branch indices, or None (output LIVE)]}
CARRIED = "carried"  # {node: (tangent liveness of the body inputs, suspect flags)}
RAN = "ran"  # {node: outputs whose tangent is live iff the loop ran once}

#: rounds of the loop fixed point before giving up (the lattice is 3 levels high)
MAX_ROUNDS = 6


class BodyView(TFGraph):
    """A function body as the forward analysis reads it: its arguments are
    the graph inputs (their ``Placeholder`` ops are left out), in order."""

    def __init__(self, func_graph):
        args = {t.op.name for t in func_graph.inputs}
        ops = [op for op in func_graph.get_operations() if op.name not in args]
        super().__init__(ops, func_graph.outputs)
        self.func_graph = func_graph
        self._args = [t.name for t in func_graph.inputs]
        for t in func_graph.inputs:
            self.tensors.setdefault(t.name, t)
            self._inexact.setdefault(t.name, _carries(t.dtype))

    def graph_inputs(self) -> list[Hashable | None]:
        return list(self._args)

    @property
    def arg_names(self) -> list[str]:
        return self._args

    def carries_derivative(self, value) -> bool:
        return self._inexact.get(value, False)


def _carries(dtype) -> bool:
    """As :class:`hlo_guard.tf.output_guards.ForwardView`: a variable handle
    may be a primal of the accumulator."""
    return carries_derivative(dtype) or tf.as_dtype(dtype) == tf.resource


def function_body(op: tf.Operation, name: str, inputs) -> BodyView:
    """The body ``name`` called by ``op``, as a graph of its own."""
    fdef = compat.function_def(op.graph, name)
    shapes = [t.shape for t in inputs]
    return BodyView(compat.function_def_to_graph(fdef, input_shapes=shapes))


def analyse_body(fa, body: BodyView, tangents: list[Liveness], where: str):
    """(output tangent liveness, suspect flags) of one body for these input tangents."""
    sub = analyze_forward(body, fa.rules, tangents)
    seeds = body_seeds(body.arg_names, tangents, [False] * len(tangents), where)
    tainted, _ = tainted_values(body, sub, seeds)
    outs = [sub.value_liveness(v) for v in body.graph_outputs()]
    return outs, [v in tainted for v in body.graph_outputs()]


def _branch_reads(op) -> list[list[bool]]:
    """Per operand after the predicate or index, per branch: read or not."""
    per_branch = [_args_read(op, name) for name in _branch_names(op)]
    return [list(r) for r in zip(*per_branch)]


def _branch_names(op) -> list[str]:
    if op.type in IFS:
        return [op.get_attr("then_branch").name, op.get_attr("else_branch").name]
    return [f.name for f in op.get_attr("branches")]


def _args_read(op, name: str) -> list[bool]:
    """Per argument of the function ``name`` (a branch of ``op``): whether
    the branch reads it at all -- a node's data input or a returned value
    names it.  Read off the ``FunctionDef`` itself, no graph built."""
    fdef = compat.function_def(op.graph, name)
    used = {i.split(":")[0] for node in fdef.node_def for i in node.input if not i.startswith("^")}
    used.update(r.split(":")[0] for r in fdef.ret.values())
    return [arg.name in used for arg in fdef.signature.input_arg]


class ControlFlow(Conservative):
    """Reverse half as :class:`Conservative`, but for ``If``/``Case``
    operands some branch does not read; forward half through the bodies."""

    def transfer(self, analysis, node, outs):
        result = super().transfer(analysis, node, outs)
        op = analysis.graph.op(node)
        if op.type in WHILES or not any(lv.reaches_output for lv in outs):
            return result
        try:
            reads = _branch_reads(op)
        except Exception:  # pylint: disable=broad-except  # a body not read back: live
            return result
        origin = analysis.graph.origin(node)
        for k, per_branch in enumerate(reads, start=1):
            if not result[k].reaches_output or all(per_branch):
                continue
            if not carries_derivative(op.inputs[k].dtype):
                continue
            # dead whenever the index picks a branch that does not read it:
            # that branch's gradient is an instantiated zero, which a hazard
            # before the op turns into NaN (``tf.cond(n <= 1, lambda: x,
            # lambda: x / n)`` with ``n = norm(x)`` at 0)
            result[k] = partial_by(origin) if any(per_branch) else dead_by(origin)
        return result

    def input_masks(self, mctx, node, op, out_masks):
        """An ``If``/``Case`` operand's mask is "the taken branch reads it"
        (:meth:`transfer`), the predicate or index broadcast over its lanes."""
        masks = [ALL] * len(op.inputs)
        if op.type in WHILES:
            return masks
        for k, per_branch in enumerate(_branch_reads(op), start=1):
            if all(per_branch) or not carries_derivative(op.inputs[k].dtype):
                continue
            if not any(per_branch):
                masks[k] = NONE
                continue
            live = tuple(b for b, r in enumerate(per_branch) if r)
            taken = self._taken_in(mctx, op, live)
            masks[k] = normalize(tf.broadcast_to(taken, _shape_of(mctx, op.inputs[k])))
        return masks

    def forward(self, fa, node, ins):
        graph = fa.graph
        op = graph.op(node)
        n_out = len(graph.node_outputs(node))
        where = f"'{op.type}' '{graph.user_name(op.name)}'"
        try:
            if op.type in WHILES:
                return self._loop(fa, node, op, ins, where)
            return self._branches(fa, node, op, ins, where)
        except Exception as exc:  # pylint: disable=broad-except
            # a body that cannot be read back is not guessed at
            note_unfollowed(fa, node, f"{where} (its bodies could not be analysed: {exc})")
            return [LIVE] * n_out

    # -- If / Case -------------------------------------------------------------
    def _branches(self, fa, node, op, ins, where):
        graph = fa.graph
        tangents = ins[1:]
        per_branch = []
        for name in _branch_names(op):
            body = function_body(op, name, op.inputs[1:])
            per_branch.append(analyse_body(fa, body, tangents, where))
        pred = op.inputs[0]
        selectable = pred.shape.rank == 0 and (op.type in CASES or pred.dtype == tf.bool)
        outs: list[Liveness] = []
        live_sets: list[tuple | None] = []
        unfollowed = []
        for k, _v in enumerate(graph.node_outputs(node)):
            status = []  # per branch: True (live), False (zero), None (partly / unknown)
            for out_lvs, suspect in per_branch:
                lv = out_lvs[k]
                if suspect[k]:
                    status.append(None)
                elif lv.is_live:
                    status.append(True)
                elif not lv.reaches_output or lv.is_dead:
                    status.append(False)
                else:
                    status.append(None)
            live_sets.append(None)
            if all(s is True for s in status):
                outs.append(LIVE)
            elif all(s is False for s in status):
                outs.append(
                    dead_by(op.name) if any(t.reaches_output for t in tangents) else NO_DERIVATIVE
                )
            elif None in status or not selectable:
                unfollowed.append(k)
                outs.append(LIVE)
            else:
                live_sets[k] = tuple(i for i, s in enumerate(status) if s)
                outs.append(partial_by(op.name))
        fa.notes.setdefault(BRANCHES, {})[node] = live_sets
        if unfollowed:
            note_unfollowed(
                fa,
                node,
                f"{where} (a branch's output tangent is partly "
                "structurally zero, with lanes known only inside the branch)",
                unfollowed,
            )
        return outs

    # -- While -----------------------------------------------------------------
    def _loop(self, fa, node, op, ins, where):
        body = function_body(op, op.get_attr("body").name, op.inputs)
        carried = list(ins)
        for _ in range(MAX_ROUNDS):
            outs, suspect = analyse_body(fa, body, carried, where)
            joined = [c.join(o) for c, o in zip(carried, outs)]
            if joined == carried:
                break
            carried = joined
        else:
            note_unfollowed(fa, node, f"{where} (its carried tangents did not settle)")
            fa.notes.setdefault(CARRIED, {})[node] = (carried, [True] * len(carried))
            return [LIVE] * len(carried)
        counted = _has_loop_counter(body)
        result, unfollowed, bad, after_first = [], [], [], []
        for k, (init, out, c) in enumerate(zip(ins, outs, carried)):
            variant = op.inputs[k].dtype == tf.variant
            if not c.reaches_output:
                result.append(NO_DERIVATIVE)
                bad.append(False)
            elif out.is_live and not suspect[k] and (init.is_live or variant):
                # a TensorList accumulator starts without a tangent but every
                # element the loop writes has one
                result.append(LIVE)
                bad.append(False)
            elif out.is_live and not suspect[k] and not init.reaches_output and counted:
                # an accumulator starting from a constant (``s = 0; s += f(x)``):
                # live once the loop has run, zero if it ran zero times -- the
                # loop counter tells which.  Inside the body its first
                # iteration still reads the constant: suspect there.
                result.append(partial_by(op.name))
                after_first.append(k)
                bad.append(True)
            else:
                result.append(LIVE)
                unfollowed.append(k)
                bad.append(True)
        fa.notes.setdefault(CARRIED, {})[node] = (carried, bad)
        fa.notes.setdefault(RAN, {})[node] = after_first
        if unfollowed:
            note_unfollowed(
                fa,
                node,
                f"{where} (a loop-carried tangent is structurally zero "
                "in some lanes after some iteration, or before the first)",
                unfollowed,
            )
        return result

    def forward_masks(self, mctx, node, op, in_masks):
        fa = getattr(mctx, "forward", None)
        notes = fa.notes if fa is not None else {}
        live_sets = notes.get(BRANCHES, {}).get(node)
        after_first = notes.get(RAN, {}).get(node) or ()
        masks = []
        for k, out in enumerate(op.outputs):
            live = live_sets[k] if live_sets else None
            if k in after_first:
                # the counter (an int, no tangent) moved: the loop ran
                taken = tf.not_equal(op.outputs[0], op.inputs[0])
            elif live is None:
                masks.append(ALL)
                continue
            else:
                taken = self._taken_in(mctx, op, live)
            shape = out.shape.as_list() if out.shape.is_fully_defined() else tf.shape(out)
            masks.append(normalize(tf.broadcast_to(taken, shape)))
        return masks

    @staticmethod
    def _taken_in(mctx, op, live: tuple) -> tf.Tensor:
        """Scalar: the branch that runs is one of ``live``."""
        selector = mctx.value(op.inputs[0])
        if op.type in IFS:
            return selector if live == (0,) else tf.logical_not(selector)
        n = len(op.get_attr("branches"))
        # Case runs the last branch for an out-of-range index
        index = tf.where((selector >= 0) & (selector < n), selector, n - 1)
        return tf.reduce_any(tf.equal(index, tf.constant(live, dtype=index.dtype)))


def _has_loop_counter(body: BodyView) -> bool:
    """Whether loop variable 0 is ``while_v2``'s counter: an int32 the body
    returns as ``counter + 1`` (through identities)."""
    func = body.func_graph
    if not func.inputs or not func.outputs or func.inputs[0].dtype != tf.int32:
        return False
    t = func.outputs[0]
    while t.op.type == "Identity":
        t = t.op.inputs[0]
    if t.op.type not in ("AddV2", "Add"):
        return False
    a, b = t.op.inputs
    one = tf.get_static_value(b)
    return a.name == func.inputs[0].name and one is not None and int(one) == 1


def body_tangents(fa, node, op):
    """(tangent liveness of a body's inputs, suspect flags) for guarding a
    body of ``op``: the op's inputs for branches, the carried fixed point
    for a loop (unknown: all live and suspect)."""
    if op.type in WHILES:
        carried = fa.notes.get(CARRIED, {}).get(node)
        if carried is not None:
            return carried
        ins = fa.input_liveness(node)
        return ins, [True] * len(ins)
    ins = fa.input_liveness(node)[1:]
    return ins, [False] * len(ins)


def register(table):
    boundary = (
        "control flow '{}': its bodies are guarded inside, but dead lanes "
        "are not followed across the boundary; its inputs are kept fully live"
    )
    for name in IFS + CASES + WHILES:
        table.register(name, ControlFlow(boundary.format(name)))
