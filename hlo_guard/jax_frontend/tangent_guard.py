"""The forward-mode output guard: the value unchanged, its *tangent* zeroed
where the mask is false -- and nothing at all in a reverse pass.

A forward-mode output guard sits after an operation whose tangent rule may
turn a structurally zero tangent lane into NaN (``sqrt`` of a ``maximum``
that took its constant: ``0 * sqrt'(0)``).  Written as the boundary guards
are, ``select(mask, y, stop_gradient(y))``, it also zeroes the *cotangent*
of ``y``'s masked lanes in every reverse pass, because ``grad`` transposes
the JVP: a select per output guard in every gradient program, with the mask
arithmetic it reads (on the attention workload about 120 of the gradient's
875 optimized HLO instructions).

A reverse pass does not need it.  A lane the forward analysis finds
tangent-dead depends on no differentiated input; its cotangent flows back
only into the lanes it was computed from, which are tangent-dead too, and
where a selection made them so, the reverse boundary guards discard it
(docs/PLACEMENT.md, "What a reverse pass sees of an output guard").
So the tangent mask here is a primitive of its own, :data:`tangent_mask_p`,
whose transpose is the identity (:data:`cotangent_guard_p`): a JVP (``jvp``, ``jacfwd``, ``linearize``)
masks the tangent with a select; a VJP of that JVP (``grad``, ``vjp``,
``jacrev``, and every reverse pass of a higher derivative) passes the
cotangent through untouched, and XLA never sees the select or its mask.

:data:`tangent_guard_p` marks the primal: its value is its operand's, and its
JVP is itself on the primal (so a derivative of the derivative still meets
the guard, as the boundary guards' ``custom_jvp`` primals do) and
:data:`tangent_mask_p` on the tangent.
"""

from __future__ import annotations

import numpy as np
from jax import lax

from hlo_guard.jax_frontend.compat import define_masking_primitive, emit
from hlo_guard.jax_frontend.mask_ops import to_guard_mask


def _identity(mask, x):
    return x


def _masked(mask, t):
    return lax.select(mask, t, lax.full_like(t, 0))


def _jvp_with(on_tangent):
    """The JVP rule of a primitive ``p(mask, x)``: ``p`` itself on the
    primal (so a derivative of the derivative still meets it), and
    ``on_tangent(mask, t)`` on a tangent that is not a symbolic zero."""

    def rule(prim, primals, tangents, zero_type):
        mask, x = primals
        t = tangents[1]
        return prim.bind(mask, x), t if type(t) is zero_type else on_tangent(mask, t)

    return rule


def _transpose_with(on_cotangent):
    """The transpose rule sending a cotangent that is not a symbolic zero to
    ``on_cotangent(mask, ct)`` (None: the identity) and none to the mask."""

    def rule(ct, mask, x, zero_type):
        if on_cotangent is None or type(ct) is zero_type:
            return [None, ct]
        return [None, on_cotangent(mask, ct)]

    return rule


def _mask_tangent(mask, t):
    return tangent_mask_p.bind(mask, t)


def _guard_cotangent(mask, ct):
    return cotangent_guard_p.bind(mask, ct)


#: ``tangent_guard(mask, y) = y``; in a JVP, the tangent is ``tangent_mask``'d;
#: never transposed by AD (it sits on primals), the identity for ``linear_transpose``
tangent_guard_p = define_masking_primitive(
    "tangent_guard", _identity, _jvp_with(_mask_tangent), _transpose_with(None)
)
#: ``tangent_mask(mask, t) = select(mask, t, 0)``, transposed to ``cotangent_guard``
tangent_mask_p = define_masking_primitive(
    "tangent_mask", _masked, _jvp_with(_mask_tangent), _transpose_with(_guard_cotangent)
)
#: ``cotangent_guard(mask, ct) = ct``; differentiated, ``select(mask, dct, 0)``: a
#: derivative of a gradient program differentiates its cotangents, and there the
#: guard is the select it stands for
cotangent_guard_p = define_masking_primitive(
    "cotangent_guard", _identity, _jvp_with(_masked), _transpose_with(_mask_tangent)
)


def tangent_guarded(mask, y):
    """``y``, with its tangent zeroed where ``mask`` is false in any forward
    pass (see the module docstring).  ``mask``: a :mod:`mask_ops` mask (not
    ALL/NONE: callers short-cut those) of ``y``'s shape or broadcastable."""
    m = to_guard_mask(mask, np.shape(y))
    aval = getattr(y, "aval", None)
    if aval is not None and getattr(m, "aval", None) is not None:
        out = emit(tangent_guard_p, {}, [m, y], [aval])
        if out is not None:
            return out[0]
    return tangent_guard_p.bind(m, y)
