"""Per-lane masks, built on demand and memoised.

The static lattice says *whether* a use is partly dead; when a guard actually
needs to know *which* lanes, the resolver computes the mask of the value the
guarded node produces: the OR over that value's uses of each use's mask, where a
use's mask comes from the rule of the consuming node applied to the masks of
*its* outputs.  This walks towards the outputs, so it is done with an explicit
stack (a 100k-node chain must not hit Python's recursion limit), and it stops
at the first fully live use.

Masks are either the sentinels :data:`ALL` / :data:`NONE` or front-end arrays of
the value's exact shape; :class:`MaskAlgebra` is the little the engine needs to
combine them.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # passes.rules imports ALL/NONE from here; analysis imports rules
    from passes.analysis import Analysis
from passes.lattice import Level


class _Sentinel:
    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return self.name


ALL = _Sentinel("ALL")  # every lane live
NONE = _Sentinel("NONE")  # no lane live


class ShadowUnavailable(Exception):
    """A mask needs an original value that cannot be computed a second time
    (it sits downstream of a guard and comes from an effectful op or a
    structure the front end cannot re-run).  Both front ends raise it from
    their side recomputation ("shadow" values); the guard is then left out and
    the site reported, never guessed at."""


class MaskAlgebra:
    """Array operations on masks, implemented by each front end."""

    def or_(self, a: Any, b: Any) -> Any:
        raise NotImplementedError

    def normalize(self, mask: Any) -> Any:
        """Turn a statically all-true/all-false array into ALL/NONE."""
        return mask


def or_masks(algebra: MaskAlgebra, a: Any, b: Any) -> Any:
    if a is ALL or b is ALL:
        return ALL
    if a is b:  # ``x * x``: both uses give the same mask object; no op for it
        return a
    if a is NONE:
        return b
    if b is NONE:
        return a
    return algebra.normalize(algebra.or_(a, b))


def or_all(algebra: MaskAlgebra, masks) -> Any:
    """OR of any number of masks (NONE for none)."""
    result = NONE
    for m in masks:
        result = or_masks(algebra, result, m)
    return result


InputMasksFn = Callable[[int, list[Any]], list[Any]]


class MaskResolver:
    """Masks of one graph's values and uses, given its outputs' masks.

    ``input_masks(node, out_masks)`` is the front end's hook: it runs the node's
    rule to turn output masks into one mask per input.
    """

    def __init__(
        self,
        analysis: Analysis,
        algebra: MaskAlgebra,
        out_masks: Sequence[Any],
        input_masks: InputMasksFn,
    ):
        self.analysis = analysis
        self.graph = analysis.graph
        self.algebra = algebra
        self.input_masks_fn = input_masks
        self._value_masks: dict[Hashable, Any] = {}
        self._node_masks: dict[int, list[Any]] = {}
        self._output_seed: dict[Hashable, Any] = {}
        for v, m in zip(self.graph.graph_outputs(), out_masks):
            if v is None:
                continue
            prev = self._output_seed.get(v, NONE)
            self._output_seed[v] = or_masks(algebra, prev, m)

    # -- public --------------------------------------------------------------
    def use_mask(self, node: int, index: int) -> Any:
        lv = self.analysis.use(node, index)
        if lv.level is Level.LIVE:
            return ALL
        if lv.level is Level.DEAD:
            return NONE
        return self.node_input_masks(node)[index]

    def value_mask(self, value: Hashable) -> Any:
        if value is None:
            return NONE
        cached = self._value_masks.get(value)
        if cached is not None:
            return cached
        stack = [value]
        while stack:
            v = stack[-1]
            if v in self._value_masks:
                stack.pop()
                continue
            missing = self._missing_dependencies(v)
            if missing:
                stack.extend(missing)
                continue
            self._value_masks[v] = self._combine_uses(v)
            stack.pop()
        return self._value_masks[value]

    def node_input_masks(self, node: int) -> list[Any]:
        masks = self._node_masks.get(node)
        if masks is None:
            outs = [self.value_mask(v) for v in self.graph.node_outputs(node)]
            masks = self.input_masks_fn(node, outs)
            self._node_masks[node] = masks
        return masks

    # -- internals -----------------------------------------------------------
    def _partial_uses(self, value):
        for use in self.analysis.uses.get(value, ()):
            if self.analysis.use_liveness[use].level is Level.PARTIAL:
                yield use

    def _missing_dependencies(self, value) -> list[Hashable]:
        lv = self.analysis.value_liveness(value)
        if lv.level is not Level.PARTIAL:
            return []
        missing = []
        for node, _ in self._partial_uses(value):
            if node in self._node_masks:
                continue
            for out in self.graph.node_outputs(node):
                if out is not None and out not in self._value_masks:
                    missing.append(out)
        return missing

    def _combine_uses(self, value) -> Any:
        lv = self.analysis.value_liveness(value)
        if lv.level is Level.LIVE:
            return ALL
        mask = self._output_seed.get(value, NONE)
        if lv.level is Level.DEAD or mask is ALL:
            return mask
        for node, index in self._partial_uses(value):
            mask = or_masks(self.algebra, mask, self.node_input_masks(node)[index])
            if mask is ALL:
                break
        return mask


OutputMasksFn = Callable[[int, list[Any]], list[Any]]


class ForwardMaskResolver:
    """Tangent masks: lanes whose tangent may be non-zero.

    The mask of a value comes from its producer's rule applied to the masks of
    the producer's inputs, so it walks towards the inputs -- again with an
    explicit stack.  ``input_masks`` gives the masks of the graph's inputs.
    """

    def __init__(
        self,
        forward,
        algebra: MaskAlgebra,
        input_masks: dict[Hashable, Any],
        output_masks: OutputMasksFn,
        producer: Callable[[Hashable], Any],
    ):
        self.forward = forward
        self.graph = forward.graph
        self.algebra = algebra
        self.output_masks_fn = output_masks
        self.producer = producer
        self._masks: dict[Hashable, Any] = dict(input_masks)
        self._node_masks: dict[int, list[Any]] = {}

    def value_mask(self, value) -> Any:
        if value is None:
            return NONE
        if value in self._masks:
            return self._masks[value]
        stack = [value]
        while stack:
            v = stack[-1]
            if v in self._masks:
                stack.pop()
                continue
            lv = self.forward.value_liveness(v)
            if lv.level is Level.LIVE:
                self._masks[v] = ALL
                stack.pop()
                continue
            if lv.level is Level.DEAD:
                self._masks[v] = NONE
                stack.pop()
                continue
            prod = self.producer(v)
            if prod is None:  # a graph input with no given mask: conservative
                self._masks[v] = ALL
                stack.pop()
                continue
            node, j = prod
            missing = [
                u for u in self.graph.node_inputs(node) if u is not None and u not in self._masks
            ]
            if missing:
                stack.extend(missing)
                continue
            self._masks[v] = self.node_output_masks(node)[j]
            stack.pop()
        return self._masks[value]

    def node_output_masks(self, node: int) -> list[Any]:
        masks = self._node_masks.get(node)
        if masks is None:
            ins = [self.value_mask(u) for u in self.graph.node_inputs(node)]
            masks = self.output_masks_fn(node, ins)
            self._node_masks[node] = masks
        return masks
