"""Rules: what an operation does to gradient liveness.

Following the idiom of JAX's own interpreters (``ad.primitive_jvps``,
``batching.primitive_batchers``), rules live in a table keyed by the
operation's name.  The engine only needs the *static* half of a rule:

* :meth:`Rule.transfer` -- given the liveness of the node's outputs, the
  liveness of each input use;
* :meth:`Rule.guards_input` -- whether a partly dead use of input ``i`` needs a
  gradient guard.  Only operations whose local derivative may be non-finite
  (or which multiply a cotangent by a 0/1 coefficient instead of selecting it)
  need one; linear structural operations pass an exact zero through on their
  own.

A front end's rules add a method that computes per-lane masks in its own array
operations; the engine reaches it through :class:`passes.masks.MaskResolver`.
An operation with no rule is treated as fully live and reported.

Optionally, for forward mode (:func:`passes.analysis.analyze_forward`), the
methods of :class:`ForwardRule`:

* ``forward(analysis, node, ins)`` -- tangent liveness of the outputs from that
  of the inputs (default when absent: fully live);
* ``guards_output(analysis, node, index)`` -- whether an output whose input
  tangents are partly structurally zero needs a guard (planned by
  :func:`passes.planning.plan_output_guards`).

The mask halves (:class:`MaskRule`, :class:`ForwardMaskRule`) are called by
the front ends only.  These optional methods are declared as protocols so that
the engine asks ``implements(rule, ForwardRule)`` (a memoised ``isinstance``)
instead of probing attribute
names: a misspelt method is then a type error, not a silently absent rule.

The rules both front ends share (:class:`Conservative`, :class:`ZeroDerivative`,
:class:`StructuralTransfer`) and the small helpers rules are written with
(:func:`joined`, :func:`dropping`) live here too; they read the graph only
through :class:`passes.graph.Graph`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import (
    Any,
    Protocol,
    TypeGuard,
    TypeVar,
    runtime_checkable,
)

from passes.lattice import LIVE, NO_DERIVATIVE, Liveness, dropped_by, join_all
from passes.masks import ALL, NONE


class Rule:
    """Base rule.  Subclasses override :meth:`transfer` and :meth:`guards_input`."""

    #: a short word used in reports ("elementwise", "selection", "structural", ...)
    kind: str = "generic"

    def transfer(self, ctx, node: int, outs: Sequence[Liveness]) -> list[Liveness]:
        raise NotImplementedError

    def guards_input(self, ctx, node: int, index: int) -> bool:
        return False

    def keeps_lanes_apart(self, ctx, node: int) -> bool:
        """True when no output lane's cotangent reaches an input lane other
        than "its own" (elementwise ops of one shape, reductions, layout ops):
        NaN formed in dead lanes behind such an op stays in dead lanes, so the
        op can sit *inside* a dead region without a guard on its output
        (:func:`passes.planning.plan_guards`).  False (lane-mixing) unless a
        rule proves otherwise: broadcasts, gathers, contractions, calls."""
        return False

    def mask_passes_through(self, ctx, node: int, index: int) -> bool:
        """True when the mask of input ``index`` *is* the mask of the op's
        single output (same-shape elementwise ops): the placement then knows
        two reads of a value dead in the same lanes without building masks."""
        return False

    def called_body(self, ctx, node: int):
        """The analysis of this node's body when it is a plain call, whose
        body's outputs go straight back to the caller: the boundary placement
        then places the body together with its caller and tells it what lies
        beyond its outputs, instead of assuming a hazard there.  None for
        everything else (control flow, whose carries feed back; custom
        derivatives)."""
        return None

    def transparent_body(self, ctx, node: int):
        """The analysis of this call's body when the boundary placement may
        see through the call as one lane-local operation (every op in the
        body keeps lanes apart), else None.  The body's inputs and outputs are
        then no boundaries of their own: the enclosing graph's placement
        decides them, and the body's guards sit only at its inner joins and
        lane-mixing ops.  ``jnp``'s one-op ``jit`` wrappers are the case that
        matters (docs/PLACEMENT.md)."""
        return None

    def broadcasts_operand(self, ctx, node: int, index: int) -> bool:
        """True when the op broadcasts input ``index`` implicitly to its
        output's shape and can guard it there (:class:`BroadcastOperandRule`):
        ``w1 * log(x)`` with ``w1`` of shape ``[1, D]``.  The op's own
        derivative then *sums* ``ct * log(x)`` over output lanes, dead ones
        included, into each lane of ``w1``: the mixing happens at this use,
        so when the op is a hazard for it the guard must sit here, at the
        output's shape -- not further up a lane-local chain (a
        ``broadcast_in_dim`` adding the size-1 axis, a weak-type
        ``convert_element_type``), where the operand's mask is the OR over the
        broadcast axes and the select selects nothing."""
        return False

    def forward_exit(self, ctx, node: int, index: int) -> bool:
        """True when the op's derivative *multiplies* input ``index``'s
        tangent by a 0/1 coefficient instead of selecting it (the JVPs of
        ``max``/``min`` and ``reduce_max``).  A non-finite tangent in a lane
        the op does not choose then turns into NaN in a live output lane: the
        use is where a forward-mode dead region exits, and it keeps a guard of
        its own whenever a tangent hazard lies upstream (docs/PLACEMENT.md).
        Such an op is not a *reverse* hazard: its transpose multiplies a
        finite cotangent by 0 or 1."""
        return False

    def body_guards_own_outputs(self, backward, forward, node: int) -> bool:
        """True when the op is a call whose body, rewritten on its own, already
        puts a forward-mode output guard on every operation that could turn
        this call's partly zero output tangents non-finite: the caller's own
        output guard on the call would repeat those selects (and their masks)
        one level up.  False (the caller guards) unless a call rule proves it."""
        return False

    def tangent_may_be_nonfinite(self, ctx, node: int) -> bool:
        """Whether the op's tangent may be non-finite when its input tangents
        are finite (its local derivative may be inf/NaN).  By default: where
        some input is a reverse hazard, or when the op is only known
        conservatively; calls answer from their bodies."""
        if self.kind == "conservative":
            return True
        return any(
            self.guards_input(ctx, node, i) and not self.forward_exit(ctx, node, i)
            for i in range(n_inputs(ctx.graph, node))
        )

    # the front end's view of one node (a jaxpr equation, a ``tf.Operation``),
    # for the shared rules' mask halves below
    def item_inputs(self, item) -> Sequence[Any]:
        raise NotImplementedError(type(self).__name__)

    def item_outputs(self, item) -> Sequence[Any]:
        raise NotImplementedError(type(self).__name__)


class RuleTable:
    """A mapping from operation name to :class:`Rule`, with aliasing helpers."""

    def __init__(self, name: str):
        self.name = name
        self._rules: dict[str, Rule] = {}

    def register(self, names: Iterable[str] | str, rule: Rule) -> Rule:
        if isinstance(names, str):
            names = [names]
        for n in names:
            self._rules[n] = rule
        return rule

    def get(self, name: str) -> Rule | None:
        return self._rules.get(name)

    def __contains__(self, name: str) -> bool:
        return name in self._rules

    def names(self) -> list[str]:
        return sorted(self._rules)


def all_inputs(n_inputs: int, liveness: Liveness) -> list[Liveness]:
    return [liveness] * n_inputs


def conservative_transfer(n_inputs: int, outs: Sequence[Liveness]) -> list[Liveness]:
    """Every input fully live as soon as any output carries a derivative."""
    joined = join_all(outs)
    return all_inputs(n_inputs, LIVE if joined.reaches_output else NO_DERIVATIVE)


# -- optional rule methods ----------------------------------------------------


@runtime_checkable
class ForwardRule(Protocol):
    """A rule that knows the forward (tangent) half: see the module docstring."""

    def forward(self, fa, node: int, ins: Sequence[Liveness]) -> list[Liveness]: ...

    def guards_output(self, analysis, node: int, index: int) -> bool: ...

    def body_guards_own_outputs(self, backward, forward, node: int) -> bool: ...


@runtime_checkable
class MaskRule(Protocol):
    """Per-lane masks of a node's inputs from those of its outputs, in the
    front end's own array operations (``item`` is the equation / ``tf.Operation``)."""

    def input_masks(self, mctx, node: int, item, out_masks: list[Any]) -> list[Any]: ...


@runtime_checkable
class ForwardMaskRule(Protocol):
    """Per-lane tangent masks of a node's outputs from those of its inputs."""

    def forward_masks(self, mctx, node: int, item, in_masks: list[Any]) -> list[Any]: ...


@runtime_checkable
class BroadcastOperandRule(Protocol):
    """A rule whose operation broadcasts an operand implicitly (``w * x`` with
    a scalar ``w``): the operand's cotangent is a *sum* over output lanes, dead
    ones included, so the front end guards it at the output's shape with this
    output-shaped mask of input ``index``."""

    def broadcast_operand_mask(
        self, mctx, node: int, item, index: int, out_masks: list[Any]
    ) -> Any: ...


_IMPLEMENTS: dict[tuple[type, type], bool] = {}


_P = TypeVar("_P")


def implements(rule: object, protocol: type[_P]) -> TypeGuard[_P]:
    """``isinstance(rule, protocol)`` for the protocols above, memoised per
    rule class.  A runtime-checkable protocol check walks the protocol's
    attributes on every call (tens of microseconds); the engine asks it per
    node and per guard site, which on a 100k-equation program was a tenth of
    the rewrite time.  Rules implement these methods on their class, so the
    answer is a property of the class.  Typed as a ``TypeGuard`` so a type
    checker narrows ``rule`` the way it would after ``isinstance``."""
    key = (type(rule), protocol)
    found = _IMPLEMENTS.get(key)
    if found is None:
        found = _IMPLEMENTS[key] = isinstance(rule, protocol)
    return found


# -- helpers rules are written with ------------------------------------------


def joined(outs: Sequence[Liveness]) -> Liveness:
    """The liveness of a node's outputs taken together (a lane is live if any is)."""
    return join_all(outs)


def dropping(analysis, node: int, out: Liveness) -> Liveness:
    """The liveness of an input some of whose lanes ``node`` drops."""
    return dropped_by(analysis.graph.origin(node), out)


def n_inputs(graph, node: int) -> int:
    return len(graph.node_inputs(node))


def n_outputs(graph, node: int) -> int:
    return len(graph.node_outputs(node))


# -- rules both front ends share -----------------------------------------------


class ZeroDerivative(Rule):
    """The framework gives the operation a zero (or no) derivative --
    comparisons, rounding, ``stop_gradient``, argmax ...: nothing flows back
    through it, and no tangent flows forward."""

    kind = "zero-derivative"

    def transfer(self, analysis, node, outs):
        return [NO_DERIVATIVE] * n_inputs(analysis.graph, node)

    def input_masks(self, mctx, node, item, out_masks):
        return [NONE] * len(self.item_inputs(item))

    def guards_output(self, analysis, node, index) -> bool:
        return False

    def forward(self, fa, node, ins):
        return [NO_DERIVATIVE] * n_outputs(fa.graph, node)

    def forward_masks(self, mctx, node, item, in_masks):
        return [NONE] * len(self.item_outputs(item))


class Conservative(Rule):
    """Known but not followed: inputs fully live, and the report says why.

    :meth:`drops_through_unused_output` lets a front end also report lanes
    that die through an output nobody uses (see the TF rule)."""

    kind = "conservative"

    def __init__(self, reason: str):
        self.reason = reason

    def drops_through_unused_output(self, analysis, node: int, outs) -> None:
        """Called when the outputs taken together are fully live: report
        (``analysis.note_unreached``) lanes that die through an unused output,
        if the front end can tell.  By default nothing is reported."""

    def transfer(self, analysis, node, outs):
        out = joined(outs)
        if out.reaches_output and not out.is_live:
            analysis.note_unreached(node, self.reason, out)
        elif out.reaches_output:
            self.drops_through_unused_output(analysis, node, outs)
        return [LIVE if out.reaches_output else NO_DERIVATIVE] * n_inputs(analysis.graph, node)

    def input_masks(self, mctx, node, item, out_masks):
        return [ALL] * len(self.item_inputs(item))


class StructuralTransfer:
    """The static half of a structural rule (lanes move, merge or are dropped).

    A lane of an input is live if any live output lane reads it.  ``drops(item,
    i)`` says whether input ``i`` can have lanes no output reads (a slice, a
    gather, an overwritten region); only then does a fully live output make the
    input partly dead.  The select *partition* of the output never survives:
    lanes move, so they no longer line up with the select's predicate (see
    :class:`passes.lattice.Liveness`) -- keeping it would let two uses of a
    value, one per case of a select but through differently permuted paths,
    join to "fully live" when lanes are dead in both.

    A front end mixes it into its rule class and provides
    ``differentiable_input(analysis, node, i)`` and ``node_item(analysis, node)``.
    """

    drops: Callable

    def differentiable_input(self, analysis, node: int, index: int) -> bool:
        raise NotImplementedError

    def node_item(self, analysis, node: int):
        raise NotImplementedError

    def transfer(self, analysis, node, outs):
        item = self.node_item(analysis, node)
        out = joined(outs)
        any_unused = any(not o.reaches_output for o in outs)
        result = []
        for i in range(n_inputs(analysis.graph, node)):
            if not out.reaches_output or not self.differentiable_input(analysis, node, i):
                result.append(NO_DERIVATIVE)
            elif self.drops(item, i) or any_unused or out.is_dead:
                result.append(dropping(analysis, node, out))
            else:
                result.append(out.without_partition())
        return result
