"""Structural primitives: lanes move, merge or are dropped.

For every operation here the derivative is a linear map whose coefficients are
0 or 1 (broadcast, reshape, slice, gather, pad, concatenate, scatter, sums,
cumulative sums, window sums) -- or becomes one when the other operand of a
bilinear operation (``dot_general``, convolution) is replaced by ones.  So one
generic rule serves them all: apply JAX's own VJP of the operation to the float
output mask; an input lane is live iff what comes back is non-zero.  Because
the coefficients are non-negative nothing cancels, and because it *is* JAX's
own VJP, the mask follows JAX's conventions (out-of-bounds modes, duplicate
scatter indices, window selection) without restating them.

When the output masks and the index operands are known at trace time the VJP
is evaluated eagerly (``jax.ensure_compile_time_eval``) and the mask stays a
numpy constant: slicing a literal never costs a traced op.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import jax
import numpy as np
from jax import lax

import passes.rules as passes_rules
from hlo_guard.jax_frontend.graph import Literal, is_inexact_aval, is_literal
from hlo_guard.jax_frontend.index_values import index_components, iota_axis
from hlo_guard.jax_frontend.mask_ops import (
    and_,
    broadcast_source,
    holds_result,
    is_static,
    lax_ops,
    materialize,
    normalize,
    record_within,
    xp,
)
from hlo_guard.jax_frontend.rules.base import (
    ForwardExitSelection,
    JaxRule,
    aval_shape,
    diff_indices,
    forward_join,
    forward_placed,
    joined,
    or_all,
)
from passes.lattice import LIVE, NO_DERIVATIVE, Level, Liveness
from passes.masks import ALL, NONE
from passes.tangent_gaps import is_partly_zero, note_unfollowed


def _never(eqn, i):
    return False


def _always(eqn, i):
    return True


class Structural(passes_rules.StructuralTransfer, JaxRule):
    """A lane of an input is live if any live output lane reads it.

    ``drops(eqn, i)`` says whether input ``i`` can have lanes no output reads
    (a slice, a gather, an overwritten region); only then does a fully live
    output make the input partly dead.
    """

    kind = "structural"

    def __init__(
        self,
        drops: Callable = _never,
        *,
        guards: bool = False,
        value_dependent: bool = False,
        bilinear: bool = False,
        seed: Callable | None = None,
    ):
        self.drops = drops
        self.guards = guards
        self.value_dependent = value_dependent
        self.bilinear = bilinear
        self.seed = seed  # optional: replace the primitive for mask purposes

    def node_item(self, analysis, node):
        return analysis.graph.eqns[node]

    def differentiable_input(self, analysis, node, index):
        v = analysis.graph.eqns[node].invars[index]
        return not is_literal(v) and is_inexact_aval(v.aval)

    def input_masks(self, mctx, node, eqn, out_masks):
        return transpose_masks(
            mctx,
            eqn,
            out_masks,
            value_dependent=self.value_dependent,
            bilinear=self.bilinear,
            seed=self.seed,
        )

    def forward(self, fa, node, ins):
        if self.bilinear:
            return forward_join(fa, node, ins)
        return forward_placed(fa, node, ins)

    def forward_masks(self, mctx, node, eqn, in_masks):
        return tangent_masks(
            mctx,
            eqn,
            in_masks,
            value_dependent=self.value_dependent,
            bilinear=self.bilinear,
            seed=self.seed,
        )


def _float_seed(mask, aval):
    shape = tuple(aval.shape)
    if not is_inexact_aval(aval):
        return np.zeros(shape, dtype=jax.dtypes.float0)
    m = materialize(mask, shape)
    if is_static(m):
        return np.asarray(m).astype(aval.dtype)
    return m.astype(aval.dtype)


class _LinearProbe:
    """The operation as a function of (a group of) its floating operands, ready
    for ``jax.vjp``/``jax.jvp`` on masks.

    Linear structural operations are probed at zero (their derivative does not
    depend on the point); value-dependent ones (max pooling) at their actual,
    gradient-stopped operands; for a bilinear operation the operands outside
    the group are replaced by ones.  When everything involved is known at trace
    time the probe runs eagerly and yields numpy masks.
    """

    def __init__(self, mctx, eqn, seeds, *, value_dependent, bilinear, seed, at=None):
        self.eqn = eqn
        self.diff = diff_indices(eqn)
        self.bilinear = bilinear
        self.value_dependent = value_dependent
        probed = set() if value_dependent else set(self.diff)
        known = {i: mctx.value(v) for i, v in enumerate(eqn.invars) if i not in probed}
        if at is not None:
            known = {i: at(eqn, i, x) for i, x in known.items()}
        self.static = all(is_static(x) for x in known.values()) and all(is_static(x) for x in seeds)
        self.vals = [known[i] if i in known else self._filled(i, 0) for i in range(len(eqn.invars))]
        self.prim, self.params = seed(eqn) if seed else (eqn.primitive, dict(eqn.params))

    def _filled(self, i, value):
        """A probe point of input ``i``'s shape.  Traced probes use ``lax.full``
        (one broadcast of a literal) rather than a numpy array: a numpy array
        of an activation's shape would be captured as a constant of the
        guarded jaxpr, and every such constant is lowered into the HLO and
        costs compile time even though XLA then removes it as dead."""
        v = self.eqn.invars[i]
        shape, dtype = aval_shape(v), v.aval.dtype
        if self.static:
            return np.full(shape, value, dtype=dtype)
        return jax.lax.full(shape, value, dtype)

    def groups(self):
        return [[i] for i in self.diff] if self.bilinear else [self.diff]

    def function(self, group):
        def f(*d):
            args = list(self.vals)
            for k, i in enumerate(group):
                args[i] = d[k]
            if self.bilinear:
                for j in self.diff:
                    if j not in group:
                        args[j] = self._filled(j, 1)
            out = self.prim.bind(*args, **self.params)
            return list(out) if self.prim.multiple_results else [out]

        return f

    def primals(self, group):
        ps = [self.vals[i] if self.value_dependent else self._filled(i, 0) for i in group]
        return ps if self.static else [jax.lax.stop_gradient(p) for p in ps]

    def run(self, compute):
        """``compute()`` eagerly when static (numpy masks out), else traced."""
        if not self.static:
            return compute(), False
        with jax.ensure_compile_time_eval():
            return compute(), True


def _finish(mask, static):
    if mask is None:
        return NONE
    if static and not isinstance(mask, jax.core.Tracer):
        return normalize(np.asarray(mask))
    # Inside a shard_map body even a compile-time evaluation comes back traced
    # (an invariant array): use it as it is, never pull it into numpy.
    return normalize(mask)


def transpose_masks(
    mctx, eqn, out_masks, *, value_dependent=False, bilinear=False, seed=None, at=None
) -> list:
    """Input masks: JAX's own VJP of the operation applied to the float output
    masks; an input lane is live iff what comes back is non-zero.  A
    value-dependent probe runs at the operands, or at ``at(eqn, index,
    value)`` of each when given."""
    n = len(eqn.invars)
    if not diff_indices(eqn) or all(m is NONE for m in out_masks):
        return [NONE] * n
    cts = [_float_seed(m, v.aval) for m, v in zip(out_masks, eqn.outvars)]
    probe = _LinearProbe(
        mctx, eqn, cts, value_dependent=value_dependent, bilinear=bilinear, seed=seed, at=at
    )

    def compute():
        found = {}
        for group in probe.groups():
            _, vjp = jax.vjp(probe.function(group), *probe.primals(group))
            for i, g in zip(group, vjp(cts)):
                found[i] = g != 0
        return found

    found, static = probe.run(compute)
    return [_finish(found.get(i), static) for i in range(n)]


def tangent_masks(
    mctx, eqn, in_masks, *, value_dependent=False, bilinear=False, seed=None, at=None
) -> list:
    """Forward counterpart of :func:`transpose_masks`: JAX's own JVP of the
    operation applied to the float input masks; non-zero = may be non-zero."""
    diff = diff_indices(eqn)
    n_out = len(eqn.outvars)
    if not diff or all(in_masks[i] is NONE for i in diff):
        return [NONE] * n_out
    tans = {i: _float_seed(in_masks[i], eqn.invars[i].aval) for i in diff}
    probe = _LinearProbe(
        mctx,
        eqn,
        list(tans.values()),
        value_dependent=value_dependent,
        bilinear=bilinear,
        seed=seed,
        at=at,
    )

    def compute():
        total = [None] * n_out
        for group in probe.groups():
            _, outs = jax.jvp(probe.function(group), probe.primals(group), [tans[i] for i in group])
            for j, o in enumerate(outs):
                if getattr(o, "dtype", None) is None or o.dtype == jax.dtypes.float0:
                    continue
                live = o != 0
                total[j] = live if total[j] is None else (total[j] | live)
        return total

    found, static = probe.run(compute)
    return [_finish(m, static) for m in found]


class DotGeneral(Structural):
    """``dot_general`` without contracting anything.

    With the other operand replaced by ones, ``out[b, i, j]`` reads
    ``lhs[b, i, k]`` for every ``k``: a lane of ``lhs`` is live iff any live
    output lane shares its batch and free indices.  That is a ``reduce_or`` of
    the output mask over the other operand's free dimensions and a broadcast
    over the contracting ones -- the same answer as JAX's VJP of the dot
    applied to the mask, without a matmul the size of the program's own.
    """

    def __init__(self):
        super().__init__(guards=True, bilinear=True)

    @staticmethod
    def _dims(eqn):
        (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
        lhs_rank = len(aval_shape(eqn.invars[0]))
        rhs_rank = len(aval_shape(eqn.invars[1]))
        lfree = [d for d in range(lhs_rank) if d not in lc and d not in lb]
        rfree = [d for d in range(rhs_rank) if d not in rc and d not in rb]
        return list(lc), list(rc), list(lb), list(rb), lfree, rfree

    def input_masks(self, mctx, node, eqn, out_masks):
        out = out_masks[0]
        if out is ALL or out is NONE:
            return [out, out]
        lc, rc, lb, rb, lfree, rfree = self._dims(eqn)
        nb = len(lb)
        lhs_axes = tuple(range(nb + len(lfree), nb + len(lfree) + len(rfree)))
        rhs_axes = tuple(range(nb, nb + len(lfree)))
        m = xp(out)
        lhs = _place(
            m, m.any(out, axis=lhs_axes) if lhs_axes else out, aval_shape(eqn.invars[0]), lb + lfree
        )
        rhs = _place(
            m, m.any(out, axis=rhs_axes) if rhs_axes else out, aval_shape(eqn.invars[1]), rb + rfree
        )
        return [normalize(lhs), normalize(rhs)]

    def forward_masks(self, mctx, node, eqn, in_masks):
        lc, rc, lb, rb, lfree, rfree = self._dims(eqn)
        out_shape = aval_shape(eqn.outvars[0])
        nb = len(lb)
        parts = []
        for mask, contract, batch, free, offset in (
            (in_masks[0], lc, lb, lfree, nb),
            (in_masks[1], rc, rb, rfree, nb + len(lfree)),
        ):
            if mask is NONE:
                continue
            if mask is ALL:
                return [ALL]
            m = xp(mask)
            reduced = m.any(mask, axis=tuple(contract)) if contract else mask
            kept = [d for d in range(len(np.shape(mask))) if d not in contract]
            # reduced's dims are the kept dims in order; they go to batch/free slots of out
            target = {d: k for k, d in enumerate(batch)}
            target.update({d: offset + k for k, d in enumerate(free)})
            parts.append(_place(m, reduced, out_shape, [target[d] for d in kept]))
        result = NONE
        for p in parts:
            result = (
                normalize(p) if result is NONE else normalize(xp(result, p).logical_or(result, p))
            )
        return [result]


def _place(m, mask, shape, dims):
    """Broadcast ``mask`` into ``shape``, its axis k landing on ``dims[k]``."""
    dims = list(dims)
    shape = tuple(shape)
    if m is not np:  # broadcast_in_dim orders the axes itself (and remembers the source)
        return lax_ops.broadcast_in_dim(mask, shape, tuple(dims))
    order = sorted(range(len(dims)), key=lambda k: dims[k])
    if order != list(range(len(dims))):
        mask = np.transpose(mask, order)
    dims = sorted(dims)
    expanded = np.reshape(mask, tuple(shape[d] if d in dims else 1 for d in range(len(shape))))
    return np.broadcast_to(expanded, shape)


class _Gather(Structural):
    """``gather``: the operand's mask is JAX's transpose (a scatter) of the
    output mask, as for any structural op.  Besides, where the output mask is
    a broadcast of a mask on the gather's *batching* dimensions (a per-row
    mask read by ``take_along_axis``), the operand mask is noted to lie within
    that mask broadcast over the operand (:func:`mask_ops.record_within`): an
    operand lane is read only by outputs of its own batch row.  A value read
    both by the gather and by a row-wise op of the same mask (the
    ``logsumexp`` of a cross-entropy) then has that mask, without the
    scatter."""

    def __init__(self):
        super().__init__(_always)

    def transfer(self, analysis, node, outs):
        """As any structural op; besides, when the output is fully live and
        the gather reads a lane of every line along its indexed axes
        (:func:`_lines_read`), the operand's liveness says so
        (``Liveness.covered``): a cross-entropy's ``logsumexp``, broadcast
        back over each row, is then fully live, and so is the network
        before it -- no guard where every guard would select nothing."""
        found = super().transfer(analysis, node, outs)
        lv = found[0]
        if not joined(outs).is_live or lv.level is not Level.PARTIAL:
            return found
        eqn = analysis.graph.eqns[node]
        axes = _lines_read(analysis.graph, eqn)
        if axes is None:
            return found
        if not axes:  # every lane is read by a live output
            return [LIVE, *found[1:]]
        covered = (axes, aval_shape(eqn.invars[0]))
        return [Liveness(lv.level, lv.origins, None, covered), *found[1:]]

    def forward(self, fa, node, ins):
        """As any structural op -- except that ``mode="fill"``
        (``jnp.take(..., mode="fill")``, ``.at[i].get(mode="fill")``) places
        its fill value where an index is out of bounds: a constant, whose
        tangent is structurally zero.  The output is then partly tangent-dead
        even when the operand is fully live, so a singular op after it gets
        its forward-mode output guard (``sqrt`` of the filled zeros:
        ``jacfwd`` was NaN with a clean report).  Which lanes are filled is
        known only from the indices' values; the tangent masks (JAX's JVP of
        the gather, which fills the tangent with zeros) find them."""
        found = super().forward(fa, node, ins)
        if not _fills(fa.graph.eqns[node]):
            return found
        lv = found[0]
        if lv.is_live:
            lv = Liveness(Level.PARTIAL).with_origin(fa.graph.origin(node))
        elif lv.level is Level.PARTIAL:
            lv = lv.with_origin(fa.graph.origin(node))
        return [lv] * len(found)

    def input_masks(self, mctx, node, eqn, out_masks):
        found = super().input_masks(mctx, node, eqn, out_masks)
        bound = _batch_row_bound(eqn, out_masks[0])
        if bound is not None and not is_static(found[0]) and found[0] is not NONE:
            record_within(found[0], *bound)
        return found


def _fills(eqn) -> bool:
    """Whether a gather may place its fill value (``mode="fill"``)."""
    from jax.lax import GatherScatterMode

    return eqn.params.get("mode") == GatherScatterMode.FILL_OR_DROP


def _lines_read(graph, eqn) -> frozenset | None:
    """The operand axes along which a gather reads at least one lane of every
    line, or None where that is not known while tracing.  An empty set: it
    reads every lane.

    Every operand axis must be a batching axis (each of its coordinates is
    some output's own: the indices' batching axis has the same size), an
    indexed axis (``start_index_map``: the lines are along these), or sliced
    whole; and each batch coordinate must get at least one index vector.
    An indexed axis whose index component is an ``arange`` over the whole
    axis (:func:`_counted_axes`: ``logp[jnp.arange(B), labels]``) visits
    every coordinate, as a batching axis does, so the lines run along the
    other indexed axes only.
    An index may still point outside the operand: ``clip`` and
    ``promise_in_bounds`` read a lane anyway; ``fill`` reads nothing there,
    so it qualifies only with a NaN fill value (the default for floats,
    ``take_along_axis``'s), where the row's forward value is NaN and the
    output, fully live, is NaN with it -- the gradient cannot be clean there
    whatever the guard does."""
    from jax.lax import GatherScatterMode

    dn = eqn.params["dimension_numbers"]
    mode = eqn.params.get("mode")
    if mode == GatherScatterMode.FILL_OR_DROP:
        fill = eqn.params.get("fill_value")
        if fill is not None and not (isinstance(fill, float) and math.isnan(fill)):
            return None
    elif mode not in (GatherScatterMode.CLIP, GatherScatterMode.PROMISE_IN_BOUNDS):
        return None
    operand, indices = eqn.invars[0], eqn.invars[1]
    shape = aval_shape(operand)
    sizes = eqn.params["slice_sizes"]
    batching = set(getattr(dn, "operand_batching_dims", ()))
    indexed = set(dn.start_index_map)
    for k, n in enumerate(shape):
        if k not in batching and k not in indexed and sizes[k] != n:
            return None
    index_batching = set(getattr(dn, "start_indices_batching_dims", ()))
    per_batch = [n for d, n in enumerate(aval_shape(indices)[:-1]) if d not in index_batching]
    if not indexed or math.prod(per_batch) < 1 or math.prod(shape) < 1:
        return None
    return frozenset(indexed - _counted_axes(graph, eqn))


def _counted_axes(graph, eqn) -> set:
    """Operand axes whose index component counts through the whole axis:
    an ``arange`` of the axis' size along an index dimension of its own
    (two components counting along the same index dimension walk a diagonal,
    so only the first is taken), with a slice of one lane there."""
    dn = eqn.params["dimension_numbers"]
    operand, indices = eqn.invars[0], eqn.invars[1]
    index_batching = set(getattr(dn, "start_indices_batching_dims", ()))
    last = len(indices.aval.shape) - 1
    counted, used = set(), set()
    for body, start, column in index_components(graph, indices):
        if column.aval.shape[last] != 1 or isinstance(column, Literal):
            continue
        index_dim = iota_axis(body, column)
        if index_dim is None or index_dim == last or index_dim in index_batching:
            continue
        axis = dn.start_index_map[start]
        size = column.aval.shape[index_dim]
        if size == operand.aval.shape[axis] and eqn.params["slice_sizes"][axis] == 1:
            if index_dim not in used:
                counted.add(axis)
                used.add(index_dim)
    return counted


def _batch_row_bound(eqn, out_mask):
    """``(source, operand dims)`` with the gather's operand mask within
    ``broadcast_in_dim(source, operand shape, operand dims)``, or None.

    The output's non-offset dimensions are the indices' batch dimensions in
    order (the index vector is the indices' last dimension); batching pair
    ``j`` ties indices dimension ``start_indices_batching_dims[j]`` to operand
    dimension ``operand_batching_dims[j]``, and an output lane reads operand
    lanes of the same coordinate there.  So when every axis of the output
    mask's broadcast source lies on such a dimension, an operand lane the
    transpose marks lies where the source (moved to the operand's dimensions)
    is true."""
    if out_mask is ALL or out_mask is NONE or is_static(out_mask):
        return None
    dn = eqn.params["dimension_numbers"]
    operand_batch = tuple(getattr(dn, "operand_batching_dims", ()) or ())
    indices_batch = tuple(getattr(dn, "start_indices_batching_dims", ()) or ())
    if not operand_batch or len(operand_batch) != len(indices_batch):
        return None
    out_rank = len(eqn.outvars[0].aval.shape)
    batch_out = [d for d in range(out_rank) if d not in tuple(dn.offset_dims)]
    to_operand = {
        batch_out[k]: o for k, o in zip(indices_batch, operand_batch) if k < len(batch_out)
    }
    source, dims = broadcast_source(out_mask)
    if any(d not in to_operand for d in dims):
        return None
    operand_dims = tuple(to_operand[d] for d in dims)
    if list(operand_dims) != sorted(operand_dims):
        return None
    return source, operand_dims


class _BoolLayout(Structural):
    """Shape-only primitives whose masks are computed on the bool masks
    directly: ``reshape``, ``squeeze``, ``transpose``, ``broadcast_in_dim``,
    ``reduce_sum``.

    The generic rule (JAX's VJP of the operation on the float mask) is right
    for these too, but costs a ``convert``, the float operation and a ``ne``
    per mask, and those extra float ops split XLA's fusions in the gradient.
    The answers are the same by construction: each method is the boolean
    counterpart of the operation's transpose (``reduce_or`` where the VJP
    sums).  Forms with dynamic-shape operands fall back to the generic rule.
    """

    def _direct(self, eqn) -> bool:
        return len(eqn.invars) == 1 and bool(diff_indices(eqn))

    def input_masks(self, mctx, node, eqn, out_masks):
        out = out_masks[0]
        if not self._direct(eqn) or out is NONE:
            return super().input_masks(mctx, node, eqn, out_masks)
        if out is ALL:  # a static all-true mask: numpy, no probe traced
            out = np.ones(aval_shape(eqn.outvars[0]), bool)
        return [normalize(self.pull(eqn, xp(out), out))]

    def forward_masks(self, mctx, node, eqn, in_masks):
        m = in_masks[0]
        if not self._direct(eqn) or m is NONE:
            return super().forward_masks(mctx, node, eqn, in_masks)
        if m is ALL:
            m = np.ones(aval_shape(eqn.invars[0]), bool)
        return [normalize(self.push(eqn, xp(m), m))]

    def pull(self, eqn, m, out):
        """Input mask from the output mask."""
        raise NotImplementedError

    def push(self, eqn, m, mask):
        """Output mask from the input mask."""
        raise NotImplementedError


class _Squeeze(_BoolLayout):
    lane_local = True
    """``squeeze`` (and ``reshape`` without a transposition) keep the lanes
    in row-major order: the mask is reshaped."""

    def pull(self, eqn, m, out):
        return m.reshape(out, aval_shape(eqn.invars[0]))

    def push(self, eqn, m, mask):
        return m.reshape(mask, aval_shape(eqn.outvars[0]))


class _Reshape(_Squeeze):
    def _direct(self, eqn):
        return super()._direct(eqn) and eqn.params.get("dimensions") is None


class _Transpose(_BoolLayout):
    lane_local = True

    def pull(self, eqn, m, out):
        return _transpose(m, out, tuple(int(k) for k in np.argsort(eqn.params["permutation"])))

    def push(self, eqn, m, mask):
        return _transpose(m, mask, tuple(eqn.params["permutation"]))


class _BroadcastInDim(_BoolLayout):
    def transfer(self, analysis, node, outs):
        """The operand is fully live when every line of output lanes one
        operand lane is copied to holds a live lane (the lines along the new
        and the stretched axes: :meth:`Liveness.covers_lines_along`) -- a
        per-row value broadcast back over rows that each have a live lane."""
        found = super().transfer(analysis, node, outs)
        eqn = analysis.graph.eqns[node]
        out = joined(outs)
        if out.covered is None or found[0] is NO_DERIVATIVE:
            return found
        dims = [int(d) for d in eqn.params["broadcast_dimensions"]]
        out_shape = aval_shape(eqn.outvars[0])
        copied = [d for d in range(len(out_shape)) if d not in dims]
        copied += [dims[k] for k in self._expanded(eqn)]
        if out.covers_lines_along(copied, out_shape):
            return [LIVE, *found[1:]]
        return found

    def keeps_lanes_apart(self, analysis, node) -> bool:
        """A broadcast that replicates nothing -- it only inserts size-1 axes,
        as ``jnp.sum(..., keepdims=True)`` does after its reduction -- is a
        reshape: each output lane reads exactly one input lane.  A broadcast
        that replicates sums every copy's cotangent into one lane: mixing."""
        eqn = analysis.graph.eqns[node]
        in_size = math.prod(aval_shape(eqn.invars[0]))
        return in_size > 0 and in_size == math.prod(aval_shape(eqn.outvars[0]))

    @staticmethod
    def _expanded(eqn):
        """Operand axes of size 1 that are stretched to a larger size."""
        in_shape, out_shape = aval_shape(eqn.invars[0]), aval_shape(eqn.outvars[0])
        dims = eqn.params["broadcast_dimensions"]
        return [k for k, d in enumerate(dims) if in_shape[k] == 1 and out_shape[d] != 1]

    def pull(self, eqn, m, out):
        dims = [int(d) for d in eqn.params["broadcast_dimensions"]]
        new_axes = tuple(d for d in range(len(np.shape(out))) if d not in dims)
        kept = m.any(out, axis=new_axes) if new_axes else out  # axes in operand order
        stretched = tuple(self._expanded(eqn))
        if stretched:
            kept = m.any(kept, axis=stretched, keepdims=True)
        return m.reshape(kept, aval_shape(eqn.invars[0]))

    def push(self, eqn, m, mask):
        dims = [int(d) for d in eqn.params["broadcast_dimensions"]]
        stretched = self._expanded(eqn)
        in_shape = aval_shape(eqn.invars[0])
        if stretched:  # drop the size-1 axes; the broadcast fills them
            mask = m.reshape(mask, tuple(n for k, n in enumerate(in_shape) if k not in stretched))
            dims = [d for k, d in enumerate(dims) if k not in stretched]
        return _place(m, mask, aval_shape(eqn.outvars[0]), dims)


class _ReduceSum(_BoolLayout):
    lane_local = True

    def pull(self, eqn, m, out):
        axes = set(eqn.params["axes"])
        in_shape = aval_shape(eqn.invars[0])
        return _place(m, out, in_shape, [d for d in range(len(in_shape)) if d not in axes])

    def push(self, eqn, m, mask):
        return m.any(mask, axis=tuple(eqn.params["axes"]))


class _Slice(_BoolLayout):
    """``slice``: an output lane reads one input lane; the others are dropped.
    Pulled back, the mask is padded with False (strides as interior
    padding); pushed forward, it is sliced."""

    @staticmethod
    def _spec(eqn):
        shape = aval_shape(eqn.invars[0])
        strides = eqn.params.get("strides") or (1,) * len(shape)
        return (
            shape,
            tuple(eqn.params["start_indices"]),
            tuple(eqn.params["limit_indices"]),
            strides,
        )

    def pull(self, eqn, m, out):
        shape, start, limit, strides = self._spec(eqn)
        if m is np:
            found = np.zeros(shape, bool)
            found[tuple(slice(a, b, c) for a, b, c in zip(start, limit, strides))] = out
            return found
        config = []
        for n, a, k, st in zip(shape, start, np.shape(out), strides):
            covered = (k - 1) * st + 1 if k else 0
            config.append((a if k else 0, n - a - covered if k else n, st - 1 if k else 0))
        return lax.pad(out, np.bool_(False), config)

    def push(self, eqn, m, mask):
        _, start, limit, strides = self._spec(eqn)
        if m is np:
            return mask[tuple(slice(a, b, c) for a, b, c in zip(start, limit, strides))]
        return lax.slice(mask, start, limit, strides)


class _Pad(Structural):
    """``pad`` with non-negative padding: an operand lane lands on one output
    lane, and the padding value fills the rest.  Pulled back, the operand's
    mask is a strided slice of the output's and the padding value's is "any
    padding lane live"; pushed forward, the masks are padded together.
    Negative padding (which crops) takes the generic rule."""

    @staticmethod
    def _direct(eqn) -> bool:
        config = eqn.params["padding_config"]
        return all(lo >= 0 and hi >= 0 for lo, hi, _ in config) and 0 in diff_indices(eqn)

    @staticmethod
    def _operand_slices(eqn):
        config = eqn.params["padding_config"]
        shape = aval_shape(eqn.invars[0])
        return [
            slice(lo, lo + (n - 1) * (inner + 1) + 1 if n else lo, inner + 1)
            for (lo, _, inner), n in zip(config, shape)
        ]

    def _padding_lanes(self, eqn) -> np.ndarray:
        lanes = np.ones(aval_shape(eqn.outvars[0]), bool)
        lanes[tuple(self._operand_slices(eqn))] = False
        return lanes

    def input_masks(self, mctx, node, eqn, out_masks):
        out = out_masks[0]
        if not self._direct(eqn) or out is ALL or out is NONE:
            return super().input_masks(mctx, node, eqn, out_masks)
        m = xp(out)
        if m is np:
            operand = np.asarray(out)[tuple(self._operand_slices(eqn))]
        else:
            sl = self._operand_slices(eqn)
            operand = lax.slice(
                out,
                tuple(s.start for s in sl),
                tuple(s.start if n == 0 else s.stop for s, n in zip(sl, aval_shape(eqn.invars[0]))),
                tuple(s.step for s in sl),
            )
        value = NONE
        if 1 in diff_indices(eqn):
            value = m.any(m.logical_and(out, self._padding_lanes(eqn)))
        return [normalize(operand), normalize(value) if value is not NONE else NONE]

    def forward_masks(self, mctx, node, eqn, in_masks):
        op_mask = in_masks[0]
        value = in_masks[1] if 1 in diff_indices(eqn) else NONE
        if not self._direct(eqn) or (op_mask is value and (value is ALL or value is NONE)):
            return super().forward_masks(mctx, node, eqn, in_masks)
        shape = aval_shape(eqn.invars[0])
        if op_mask is ALL or op_mask is NONE:
            op_mask = np.full(shape, op_mask is ALL)
        if value is ALL or value is NONE:
            value = np.bool_(value is ALL)
        if xp(op_mask, value) is np:
            out = np.full(aval_shape(eqn.outvars[0]), bool(value))
            out[tuple(self._operand_slices(eqn))] = op_mask
            return [normalize(out)]
        config = [(lo, hi, inner) for lo, hi, inner in eqn.params["padding_config"]]
        return [normalize(lax.pad(op_mask, value, config))]


class _Cumulative(_BoolLayout):
    """``cumsum`` (and, by the same lane structure, ``cumprod`` and
    ``cumlogsumexp``): output lane ``j`` reads the
    input lanes up to ``j`` (from ``j`` on when ``reverse``).  An input lane
    is live iff a later (earlier) output lane is: a cumulative OR in the
    other direction; forward, a cumulative OR in the same one."""

    @staticmethod
    def _cumulative_or(m, mask, axis: int, reverse: bool):
        if m is np:
            flip = (lambda a: np.flip(a, axis)) if reverse else (lambda a: a)
            return flip(np.logical_or.accumulate(flip(np.asarray(mask)), axis=axis))
        as_int = lax.convert_element_type(mask, np.int8)
        return lax.ne(lax.cummax(as_int, axis=axis, reverse=reverse), np.int8(0))

    def pull(self, eqn, m, out):
        p = eqn.params
        return self._cumulative_or(m, out, p["axis"], not p["reverse"])

    def push(self, eqn, m, mask):
        p = eqn.params
        return self._cumulative_or(m, mask, p["axis"], p["reverse"])


class _MultiplyingChooser(ForwardExitSelection, Structural):
    """A value-dependent selection whose JVP *multiplies* each tangent by a
    0 / 1 / 1-over-ties coefficient: ``cummax``/``cummin`` (a running
    maximum; JAX differentiates it as an associative scan of ``max``) and
    ``scatter-max``/``scatter-min`` (``jax.ops.segment_max``,
    ``x.at[i].max(u)``; JAX's JVP weighs the winners by their count).  An
    input lane no live output lane chooses has a structurally zero
    derivative, as the losing side of ``max``; the masks come from JAX's own
    VJP/JVP at the actual, gradient-stopped operands (non-negative
    coefficients: no cancellation).

    ``cummax`` was read with ``cumsum``'s lane structure, fully live behind
    any live output lane: a ``log(0) = -inf`` that never wins a kept prefix
    kept its ``0 * inf``, unguarded and unreported (found 2026-11-26,
    ``sum(cummax(log(x))[1:])``); ``scatter-max`` had no rule (reported).
    Like ``reduce_max`` these are forward-mode exits, not reverse hazards
    (:class:`ForwardExitSelection`).

    A NaN operand wins: XLA's ``max`` propagates it into every output lane
    that reads it, so its lane is a taken path (contract 3), while JAX's
    ``x == ans`` coefficients are 0 there (``cummax([1, nan, 4])`` gave the
    NaN lane a zero gradient under a NaN result).  So a NaN lane is live
    where an output lane it reaches is: for ``cummax`` every later one, the
    lanes ``cumsum`` reads (a cumulative OR: probing ``cummax`` again would
    double its associative scan in the compiled masks), for ``scatter-max``
    from a second probe with each NaN replaced by the value that wins as it
    does (``+inf`` for a maximum, ``-inf`` for a minimum: :meth:`_nan_wins`).
    Every other lane keeps the probe at the operands themselves (a finite
    lane beside a NaN result lost to it, even one equal to that infinity)."""

    kind = "selection"

    def __init__(self):
        super().__init__(_always, guards=True, value_dependent=True)

    @staticmethod
    def _nan_wins(eqn, index, value):
        if not is_inexact_aval(eqn.invars[index].aval):
            return value
        wins = np.inf if eqn.primitive.name.endswith("max") else -np.inf
        if is_static(value):
            value = np.asarray(value)
            return np.where(np.isnan(value), np.asarray(wins, value.dtype), value)
        return lax.select(lax.ne(value, value), lax.full_like(value, wins), value)

    @staticmethod
    def _nan_lanes(mctx, v):
        """Where operand ``v`` is NaN (NONE for a non-float or a NaN-free
        constant)."""
        if is_literal(v) or not is_inexact_aval(v.aval):
            return NONE
        x = mctx.value(v)
        return normalize(xp(x).not_equal(x, x))

    def _nan_reach(self, propagate, mctx, eqn, masks):
        """``propagate`` (:func:`transpose_masks` or :func:`tangent_masks`)
        of ``masks`` as a NaN wins: ``cumsum``'s lanes for a running
        maximum, else a probe with each NaN made the winning infinity."""
        if eqn.primitive.name in ("cummax", "cummin"):
            return propagate(mctx, eqn, masks, seed=_as_cumsum)
        return propagate(mctx, eqn, masks, value_dependent=True, at=self._nan_wins)

    def input_masks(self, mctx, node, eqn, out_masks):
        masks = super().input_masks(mctx, node, eqn, out_masks)
        nans = [self._nan_lanes(mctx, v) for v in eqn.invars]
        if all(n is NONE for n in nans):
            return masks
        won = self._nan_reach(transpose_masks, mctx, eqn, out_masks)
        return [
            or_all([m, and_(n, w, aval_shape(v))]) if n is not NONE else m
            for m, n, w, v in zip(masks, nans, won, eqn.invars)
        ]

    def forward_masks(self, mctx, node, eqn, in_masks):
        masks = super().forward_masks(mctx, node, eqn, in_masks)
        nans = [
            and_(n, m, aval_shape(v))
            for n, m, v in zip((self._nan_lanes(mctx, v) for v in eqn.invars), in_masks, eqn.invars)
        ]
        if all(n is NONE for n in nans):
            return masks
        won = self._nan_reach(tangent_masks, mctx, eqn, nans)
        return [or_all([m, w]) for m, w in zip(masks, won)]


class _ScatterChooser(_MultiplyingChooser):
    """``scatter-max``/``scatter-min``.  The updates' masks come from JAX's
    VJP (their coefficient is a select: exactly 0 for a loser), but the
    operand's coefficient is computed as ``1 + sum over its references of
    (-1 + normalizer) / references``, which float rounding leaves a few ulp
    off zero for a losing lane with many references (11 updates into one
    lane: ``-6e-8``, and plain JAX's own derivative there is ``-6e-8 *
    log'(0) = -inf``).  A losing operand lane is dead by the contract (the
    per-lane ``if`` never returns it), so its mask is decided by value:
    live iff it equals the result there (ties share) or is NaN
    (:func:`~hlo_guard.jax_frontend.mask_ops.holds_result`), and the output
    lane is live."""

    def input_masks(self, mctx, node, eqn, out_masks):
        masks = list(super().input_masks(mctx, node, eqn, out_masks))
        if masks[0] is NONE:
            return masks
        shape = aval_shape(eqn.outvars[0])
        operand = mctx.value(eqn.invars[0])
        out = mctx.value(eqn.outvars[0])
        m = xp(operand, out)
        masks[0] = and_(out_masks[0], normalize(holds_result(m, operand, out)), shape)
        return masks


def _transpose(m, mask, perm):
    if perm == tuple(range(len(perm))):
        return mask
    return np.transpose(mask, perm) if m is np else lax_ops.transpose(mask, perm)


class MixingLinear(JaxRule):
    """Linear maps with finite, mixed-sign coefficients (FFT): a zero cotangent
    stays zero, every input lane may be live.  No guard, no mask."""

    kind = "linear"

    def transfer(self, analysis, node, outs):
        out = joined(outs)
        eqn = analysis.graph.eqns[node]
        return [LIVE if out.reaches_output else NO_DERIVATIVE] * len(eqn.invars)

    def input_masks(self, mctx, node, eqn, out_masks):
        return [ALL] * len(eqn.invars)

    def forward(self, fa, node, ins):
        return forward_join(fa, node, ins)

    def forward_masks(self, mctx, node, eqn, in_masks):
        live = any(m is not NONE for m in in_masks)
        return [ALL if live else NONE] * len(eqn.outvars)


class Conservative(passes_rules.Conservative, JaxRule):
    """Known but not followed: inputs fully live, and the report says why.
    Forward mode takes the outputs' tangents as live; a partly zero input
    tangent is noted, so that a singular operation after it is reported."""

    def forward(self, fa, node, ins):
        eqn = fa.graph.eqns[node]
        if any(is_partly_zero(lv) for lv in ins):
            note_unfollowed(fa, node, f"`{eqn.primitive.name}` (its output tangents taken as live)")
        return [LIVE] * len(eqn.outvars)


# -- when does an operation drop lanes of an input? ---------------------------


def _slice_drops(eqn, i):
    shape = aval_shape(eqn.invars[0])
    start = eqn.params["start_indices"]
    limit = eqn.params["limit_indices"]
    strides = eqn.params.get("strides") or (1,) * len(shape)
    return any(
        s != 0 or l != d or (st != 1 and d > 1) for s, l, st, d in zip(start, limit, strides, shape)
    )


def _dynamic_slice_drops(eqn, i):
    return tuple(eqn.params["slice_sizes"]) != aval_shape(eqn.invars[0])


def _operand_only(eqn, i):
    return i == 0


def _pad_drops(eqn, i):
    if i == 1:
        return True  # the padding value reaches only the padding lanes
    return any(lo < 0 or hi < 0 for lo, hi, _ in eqn.params["padding_config"])


def _first_operand_drops(eqn, i):
    return i == 0


def _window_reads_all(size, out, window, stride, lo, base=1, dilation=1) -> tuple[bool, bool]:
    """Along one axis of a windowed op (a convolution, a window sum):
    whether every operand lane is read by some output's window, and whether
    every window tap reads some operand lane.  Output ``o``'s tap ``k`` sits
    at ``o * stride + k * dilation - lo`` in the operand's dilated axis,
    whose real lanes are the multiples of ``base``."""
    if out < 1 or size < 1 or window < 1:
        return False, False
    at = np.arange(out)[:, None] * stride + np.arange(window)[None, :] * dilation - lo
    real = (at >= 0) & (at % base == 0) & (at // base < size)
    lanes = np.zeros(size, bool)
    lanes[(at[real] // base).astype(int)] = True
    return bool(lanes.all()), bool(real.any(axis=0).all())


def _conv_drops(eqn, i):
    """A convolution drops lanes of its input only where some input position
    lies under no output's window (a stride past the kernel, VALID edges),
    and of its kernel only where a tap meets no input lane; a SAME-padded
    stride-1 convolution reads every lane of both.  ``lhs_spec`` etc. give
    each operand's spatial axes after its batch/feature axes."""
    p = eqn.params
    dn = p["dimension_numbers"]
    lhs, rhs = aval_shape(eqn.invars[0]), aval_shape(eqn.invars[1])
    out = aval_shape(eqn.outvars[0])
    for j, (lo, _) in enumerate(p["padding"]):
        reads_lanes, uses_taps = _window_reads_all(
            lhs[dn.lhs_spec[2 + j]],
            out[dn.out_spec[2 + j]],
            rhs[dn.rhs_spec[2 + j]],
            p["window_strides"][j],
            lo,
            p["lhs_dilation"][j],
            p["rhs_dilation"][j],
        )
        if not (reads_lanes if i == 0 else uses_taps):
            return True
    return False


def _window_sum_drops(eqn, i):
    """A window sum (average pooling) drops the operand lanes no window
    covers: a stride past the window, or VALID edges."""
    p = eqn.params
    shape, out = aval_shape(eqn.invars[0]), aval_shape(eqn.outvars[0])
    for j, (lo, _) in enumerate(p["padding"]):
        reads_lanes, _ = _window_reads_all(
            shape[j],
            out[j],
            p["window_dimensions"][j],
            p["window_strides"][j],
            lo,
            p["base_dilation"][j],
            p["window_dilation"][j],
        )
        if not reads_lanes:
            return True
    return False


def _as_reduce_sum(eqn):
    return jax.lax.reduce_sum_p, {"axes": tuple(eqn.params["axes"]), "out_sharding": None}


def _as_cumsum(eqn):
    return jax.lax.cumsum_p, {"axis": eqn.params["axis"], "reverse": eqn.params["reverse"]}


def register(table):
    same = Structural()
    table.register("reshape", _Reshape())
    table.register("squeeze", _Squeeze())
    table.register("transpose", _Transpose())
    table.register("broadcast_in_dim", _BroadcastInDim())
    table.register("reduce_sum", _ReduceSum())
    table.register(
        [
            "rev",
            "concatenate",
            "tile",
            "stack",
        ],
        same,
    )
    table.register("cumsum", _Cumulative())
    table.register("slice", _Slice(_slice_drops))
    table.register("dynamic_slice", Structural(_dynamic_slice_drops))
    table.register("dynamic_update_slice", Structural(_first_operand_drops))
    table.register("gather", _Gather())
    table.register(["scatter-add", "scatter-sub"], Structural(lambda eqn, i: i != 0))
    table.register("scatter", Structural(_always))
    table.register("pad", _Pad(_pad_drops))
    table.register(["split", "unstack"], Structural(_always))
    table.register("reduce_window_sum", Structural(_window_sum_drops))
    # value-dependent selections whose JAX derivative gathers/scatters (exact zeros)
    table.register(
        ["reduce_window_max", "reduce_window_min"], Structural(_always, value_dependent=True)
    )
    # max pooling's own derivative ops, met in a loss that differentiates a
    # pooling inside it (a gradient penalty, an inner jvp): the tangent at
    # each window's argmax gathered, or the cotangent scattered there -- a
    # selection by the operand's values whose JAX derivative is the other
    # of the two (exact zeros); the operand itself gets no derivative
    table.register(
        ["select_and_gather_add", "select_and_scatter_add"],
        Structural(_always, value_dependent=True),
    )
    table.register("top_k", Structural(_always, value_dependent=True))
    # lax.approx_max_k/approx_min_k: JAX differentiates it as top_k (a gather
    # of the chosen lanes); the probe runs the op itself, so its choice is the
    # forward's choice even where the search is approximate
    table.register("approx_top_k", Structural(_always, value_dependent=True))
    # nonlinear reductions: the structure of a sum, but the derivative multiplies
    table.register(["reduce_prod"], Structural(guards=True, seed=_as_reduce_sum))
    table.register(["cumprod", "cumlogsumexp"], _Cumulative(guards=True, seed=_as_cumsum))
    table.register(["cummax", "cummin"], _MultiplyingChooser())
    table.register(["scatter-max", "scatter-min"], _ScatterChooser())
    # bilinear: the other operand replaced by ones
    table.register("dot_general", DotGeneral())
    table.register("conv_general_dilated", Structural(_conv_drops, guards=True, bilinear=True))
    table.register("fft", MixingLinear())
    # a permutation by value, the same for every operand: its masks are the
    # operands' (or the outputs') permuted as its JVP (VJP) at the actual,
    # gradient-stopped operands permutes them, like top_k's; no lane dropped
    table.register("sort", Structural(value_dependent=True))
