"""Binding one equation with guards that must not touch its forward program.

* An operand an elementwise primitive broadcasts implicitly (a scalar divisor)
  is guarded at the *output's* shape, inside a ``custom_jvp`` whose primal is
  the bare operation (:func:`bind_with_broadcast_guards`).
* A contraction's operand rows that no live output lane reads are zeroed in
  the *other* operand's derivative term (:func:`bind_with_contraction_guards`).
* A contraction that was already computed on the side for a mask hands those
  values over as its primal (:func:`bind_sharing`, :mod:`shared_primal`).

Split out of the interpreter: these bind a single equation and know nothing of
scopes, plans or masks beyond the boolean arrays they are given.
"""

from __future__ import annotations

from functools import partial

import jax
import numpy as np
from jax import lax

from hlo_guard.jax_frontend.binding import bind_eqn, jvp_in, live_tangent_indices
from hlo_guard.jax_frontend.compat import primitive_jvp
from hlo_guard.jax_frontend.graph import is_inexact_aval
from hlo_guard.jax_frontend.mask_ops import to_guard_mask
from hlo_guard.jax_frontend.shared_primal import share_side_primal


def bind_sharing(eqn, invals, wide, side, contraction=None):
    """Bind ``eqn`` with ``side`` as its primal outputs (see
    :mod:`shared_primal`); its tangents come from the guarded binding."""
    if contraction:
        index = sorted(contraction)
        masks = [to_guard_mask(contraction[i], tuple(eqn.invars[i].aval.shape)) for i in index]
        return share_side_primal(side, partial(_bind_contraction, eqn, index), invals, masks)
    if not wide:
        return share_side_primal(side, partial(_bind_plain, eqn), invals)
    index = sorted(wide)
    shape = tuple(eqn.outvars[0].aval.shape)
    masks = [to_guard_mask(wide[i], shape) for i in index]
    return share_side_primal(side, partial(_bind_wide, eqn, index), invals, masks)


def call_with(fn, xs, masks):
    return list(fn(*xs, *masks))


def _bind_plain(eqn, xs, masks):
    return bind_eqn(eqn, xs)


def _bind_wide(eqn, index, xs, masks):
    return bind_with_broadcast_guards(eqn, xs, dict(zip(index, masks)))


def _bind_contraction(eqn, index, xs, masks):
    return bind_with_contraction_guards(eqn, xs, dict(zip(index, masks)))


def bind_with_contraction_guards(eqn, invals, masks):
    """Bind a contraction (``dot_general``) so that, in its derivative, each
    operand's term reads the *other* operand with its dead lanes zeroed.

    ``ct_W = h^T ct_z`` sums ``h[r] * ct_z[r]`` over every row ``r``; in a row
    no live output lane reads, ``ct_z[r]`` is an exact zero but ``h[r]`` may
    be inf (``h = 1 / d`` of a padded row), and ``0 * inf`` poisons every
    lane of ``W``'s cotangent.  A select on ``h``'s use cannot help: it
    changes ``h``'s cotangent, not the value the transpose multiplies by.  So
    the JVP is written out, ``dz = dot(dh, W_m) + dot(h_m, dW)`` with
    ``X_m = select(live lanes of X, X, 0)`` (``masks``: each operand's use
    mask, the lanes some live output reads), and the forward program is the
    bare operation.  Exact when an operand's row is dead for every output
    lane it feeds (padding, masked rows); a row live in some output lanes and
    dead in others keeps its value, as it must for the live ones."""
    index = sorted(masks)
    mask_args = [to_guard_mask(masks[i], tuple(eqn.invars[i].aval.shape)) for i in index]

    def jvp(apply, vals, tans, live_masks):
        out = apply(*vals)
        masked = list(vals)
        for i, m in live_masks.items():
            masked[i] = lax.select(m, vals[i], lax.full_like(vals[i], 0))
        t_out = None
        for i in live_tangent_indices(tans):
            args = list(masked)
            args[i] = tans[i]  # bilinear: the tangent term of operand i
            term = apply(*args)
            t_out = term if t_out is None else t_out + term
        return out, lax.full_like(out, 0) if t_out is None else t_out

    return _bind_with_jvp(eqn, invals, index, mask_args, jvp)


def _bind_with_jvp(eqn, invals, index, mask_args, jvp, apply=None):
    """``eqn``'s bare primitive as a ``custom_jvp`` whose JVP is
    ``jvp(apply, values, tangents, {operand index: mask})``.  The masks travel
    as arguments, never through a closure: under ``jax.jit`` the JVP runs
    when the jit is differentiated, after the tracers of this trace are gone."""
    prim, params = eqn.primitive, eqn.params
    n = len(invals)

    if apply is None:

        def apply(*args):
            return prim.bind(*args, **params)

    @jax.custom_jvp
    def op(*args):
        return apply(*args[:n])

    def op_jvp(primals, tangents):
        _, t_out = jvp(apply, list(primals[:n]), list(tangents[:n]), dict(zip(index, primals[n:])))
        # the primal through ``op`` itself, not the bare operation the JVP
        # evaluated: a derivative of this derivative (reverse over reverse,
        # ``jacrev(grad)``, a gradient penalty) differentiates the primal
        # again and must meet the guard again
        return op(*primals), t_out

    op.defjvp(op_jvp, symbolic_zeros=True)
    return [op(*invals, *mask_args)]


#: primitives whose JVP gives the same bits with a rank-0 operand broadcast
#: explicitly (lane by lane the same IEEE operation)
_SAME_BITS_BROADCAST = frozenset(
    {"mul", "add", "sub", "max", "min", "select_n", "neg", "add_any", "nextafter"}
)


def bind_with_broadcast_guards(eqn, invals, masks):
    """Bind ``eqn`` so that its *derivative* sees the implicitly broadcast
    operands in ``masks`` explicitly broadcast and guarded at the output's
    shape, while its forward program is the bare operation.

    A select on the broadcast operand itself would be folded away by XLA, but
    not before it changed the order of XLA's algebraic rewrites (a 1-ulp
    different forward in ``jnp.corrcoef``).  Inside a ``custom_jvp`` the guard
    exists only in the JVP (and so in its transpose): the forward HLO is
    untouched, and in reverse mode the dead lanes' contributions are selected
    to zero *before* the broadcast's transpose sums them."""
    prim = eqn.primitive
    params = eqn.params  # elementwise/selection primitives: no sub-jaxprs to convert
    out_shape = tuple(eqn.outvars[0].aval.shape)
    index = sorted(masks)
    mask_args = [to_guard_mask(masks[i], out_shape) for i in index]

    def jvp(apply, primals, tans, masks):
        # the broadcast operand as the tangent terms read it: broadcast and
        # guarded, so that a derivative of this derivative in that operand
        # (reverse over reverse: the other operand's term ``w * dx``,
        # differentiated in ``w``) sums live lanes only
        vals = list(primals)
        for i in index:
            wide_val = lax_broadcast(vals[i], out_shape)
            vals[i] = lax.select(masks[i], wide_val, lax.stop_gradient(wide_val))
        live = live_tangent_indices(tans)
        if not live:
            out = apply(*vals)
            return out, lax.full_like(out, 0)
        live_tans = {}
        for i in live:
            t = tans[i]
            if i in masks:
                t = lax_broadcast(t, out_shape)
                t = lax.select(masks[i], t, lax.full_like(t, 0))
            live_tans[i] = t
        # a division's terms read the broadcast operands broadcast and
        # guarded too (the divisor's own ``-dw * x / w**2`` at a dead ``x =
        # log(0)``; with a broadcast numerator ``s / d``, ``-dd * s / d**2``
        # at a padded ``d = 0``), but the numerator's term ``dx / w`` with a
        # broadcast divisor is written as XLA computes it
        if prim.name == "div" and 1 in masks and 0 in live:
            return _division_jvp(prim, params, apply, primals, vals, live, live_tans, masks[1])
        if prim.name in _SAME_BITS_BROADCAST or prim.name == "div":
            return _terms_jvp(prim, params, apply, [(vals, live)], live_tans)
        # other ops outside the same-bits list: the broadcast operands' own
        # terms read them broadcast and guarded, the other terms unbroadcast
        own = [i for i in live if i in masks]
        others = [i for i in live if i not in masks]
        groups = [(list(primals), others), (vals, own)]
        return _terms_jvp(prim, params, apply, [g for g in groups if g[1]], live_tans)

    return _bind_with_jvp(eqn, invals, index, mask_args, jvp)


def bind_custom_call_with_broadcast_guards(eqn, invals, masks):
    """Bind a lane-wise ``custom_jvp`` call so that an operand it broadcasts
    inside its body (``xlogy(a, x)`` with a scalar shape parameter ``a``) has
    its dead lanes' contributions zeroed before they are summed.

    The broadcast happens inside the call, so neither a select on ``a`` nor
    an explicitly broadcast ``a`` can reach it (the rule was traced for a
    scalar).  The call being lane-wise, output lane ``i`` depends on ``a``
    alone among the broadcast operand's values, with slope ``s_i``: the
    rule's own tangent for a unit tangent of ``a``.  So the JVP is written
    as ``s_m * broadcast(da)`` with ``s_m = select(live lanes, s, 0)``, plus
    the rule's tangent in the operands of the output's shape: in reverse mode
    ``da``'s cotangent is ``sum(s_m * ct)``, and a dead lane's
    ``s_i = log(0)`` never meets its zero cotangent.  The forward program is
    the bare call.  Found by a user-style hunt (2026-11-27): a gamma shape
    fitted to zero-padded data was NaN with a clean report."""
    out_shape = tuple(eqn.outvars[0].aval.shape)
    index = sorted(masks)
    mask_args = [to_guard_mask(masks[i], out_shape) for i in index]

    def apply(*args):
        return bind_eqn(eqn, list(args))[0]

    def jvp(apply, primals, tans, live_masks):
        out = apply(*primals)
        live = live_tangent_indices(tans)
        whole = [i for i in live if i not in live_masks]
        # the tangent terms read the broadcast operand ``a`` rank-0, and a
        # second derivative in ``a`` sums their derivative over the lanes:
        # in a dead lane that is ``0 * inf`` (the rule's ``dx * a / x`` at a
        # padded ``x = 0``, with ``dx`` an exact zero).  So they are taken at
        # operands whose dead lanes hold a live lane's values: the live
        # lanes' terms are unchanged, and a dead lane computes what a live
        # lane computes, finite unless that live lane is singular itself
        at = _dead_lanes_as_a_live_one(primals, _all_live(live_masks), out_shape)
        t_out = None
        if whole:
            t_out = jvp_in(apply, at, whole, [tans[i] for i in whole])[1]
        for i in live:
            if i not in live_masks:
                continue
            slope = jvp_in(apply, at, [i], [lax.full_like(primals[i], 1)])[1]
            slope = lax.select(live_masks[i], slope, lax.full_like(slope, 0))
            term = slope * lax_broadcast(tans[i], out_shape)
            t_out = term if t_out is None else t_out + term
        return out, lax.full_like(out, 0) if t_out is None else t_out

    return _bind_with_jvp(eqn, invals, index, mask_args, jvp, apply)


def _all_live(masks):
    """The lanes every mask of ``{operand: mask}`` keeps."""
    found = None
    for m in masks.values():
        found = m if found is None else lax.bitwise_and(found, m)
    return found


def _dead_lanes_as_a_live_one(values, keep, shape):
    """``values`` with each operand of the output's ``shape`` holding, in
    the lanes ``keep`` drops, the value of the first lane it keeps.  When it
    keeps none there is no such value; the broadcast operands are then read
    through ``select(False, a, stop_gradient(a))``, which discards whatever
    the dead lanes send them."""
    flat = lax.reshape(keep, (int(np.prod(shape)),))
    first = lax.argmax(flat.astype(np.int32), 0, np.int32)
    any_live = lax.reduce_or(flat, (0,))
    found = []
    for v in values:
        if not is_inexact_aval(v):
            found.append(v)
            continue
        if tuple(np.shape(v)) != tuple(shape):
            some = lax.broadcast(any_live, tuple(np.shape(v)))
            found.append(lax.select(some, v, lax.stop_gradient(v)))
            continue
        lane = lax.dynamic_index_in_dim(lax.reshape(v, flat.shape), first, keepdims=False)
        found.append(lax.select(keep, v, lax.broadcast(lane, tuple(shape))))
    return found


def _division_jvp(prim, params, apply, primals, vals, live, live_tans, divisor_mask):
    """``x / w`` with ``w`` broadcast by the division: the numerator's term
    is ``dx * r`` with ``r = 1 / w`` computed rank-0 and then broadcast and
    guarded -- the reciprocal XLA itself rewrites a division by a broadcast
    scalar into, so the first derivative keeps plain JAX's bits, while a
    second derivative in ``w`` (reverse over a staged reverse pass, where a
    dead lane's seed may be NaN: ``0 * inf`` of ``(x - loc)**2`` at a padded
    ``x = inf``) meets the guard's select before the lanes are summed.  The
    divisor's own term reads it broadcast and guarded."""
    w = primals[1]
    recip = lax.div(lax.full_like(w, 1), w)
    out_shape = tuple(np.shape(live_tans[0]))
    wide = lax_broadcast(recip, out_shape)
    guarded = lax.select(divisor_mask, wide, lax.stop_gradient(wide))
    t_out = live_tans[0] * guarded
    if 1 in live:
        t_out = t_out + _terms_jvp(prim, params, apply, [(vals, [1])], live_tans)[1]
    return apply(*primals), t_out


def _terms_jvp(prim, params, apply, groups, live_tans):
    """The JVP as a sum of tangent terms, each group ``(values, operands)``
    the terms of ``operands`` evaluated at ``values`` (the op's JVP is linear
    in the tangents, and JAX's own rule adds its terms the same way).  The
    primal comes from the first group."""
    out = t_out = None
    for values, live in groups:
        tangents = [live_tans[i] for i in live]
        found = _exact_jvp(prim, values, live, tangents, params)
        if found is None:
            found = jvp_in(apply, values, live, tangents)
        if out is None:
            out = found[0]
        t_out = found[1] if t_out is None else t_out + found[1]
    return out, t_out


def _exact_jvp(prim, primals, live, live_tans, params):
    """The op's own JVP rule at ``primals``, the guarded tangents broadcast:
    the kernels plain JAX runs, lane by lane on the same values.  None if the
    rule is unavailable or refuses the broadcast tangent."""
    found = primitive_jvp(prim)
    if found is None:
        return None
    rule, zero, zero_type = found
    tangents = [zero(p) for p in primals]
    for i, t in zip(live, live_tans):
        tangents[i] = t
    try:
        out, t_out = rule(list(primals), tangents, **params)
    except (TypeError, ValueError):
        return None
    if type(t_out) is zero_type:
        t_out = lax.full_like(out, 0)
    if tuple(np.shape(t_out)) != tuple(np.shape(out)):
        return None
    return out, t_out


def lax_broadcast(x, shape):
    """``x`` (rank 0, or with size-1 dimensions) broadcast to ``shape``."""
    sx = tuple(np.shape(x))
    if sx == tuple(shape):
        return x
    if len(sx) == 0:
        return lax.broadcast_in_dim(x, shape, ())
    keep = [d for d, n in enumerate(sx) if n == shape[d]]
    squeezed = lax.reshape(x, tuple(sx[d] for d in keep))
    return lax.broadcast_in_dim(squeezed, shape, tuple(keep))
