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
(docs/PLACEMENT.md, "Forward-mode output guards carry nothing in reverse").
So the tangent mask here is a primitive of its own, :data:`tangent_mask_p`,
whose transpose is the identity: a JVP (``jvp``, ``jacfwd``, ``linearize``)
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


def _guard_jvp(primals, tangents, zero_type):
    mask, y = primals
    t = tangents[1]
    out = tangent_guard_p.bind(mask, y)
    return out, t if type(t) is zero_type else tangent_mask_p.bind(mask, t)


def _mask_jvp(primals, tangents, zero_type):
    mask, t = primals
    dt = tangents[1]
    out = tangent_mask_p.bind(mask, t)
    return out, dt if type(dt) is zero_type else tangent_mask_p.bind(mask, dt)


def _cotangent_jvp(primals, tangents, zero_type):
    """A derivative of a gradient program differentiates its cotangents: there
    the guard is the select it stands for, ``select(mask, dct, 0)``."""
    mask, ct = primals
    dct = tangents[1]
    out = cotangent_guard_p.bind(mask, ct)
    return out, dct if type(dct) is zero_type else _masked(mask, dct)


def _to_cotangent_guard(ct, mask, t):
    return [None, ct if _is_zero(ct) else cotangent_guard_p.bind(mask, ct)]


def _to_tangent_mask(ct, mask, x):
    return [None, ct if _is_zero(ct) else tangent_mask_p.bind(mask, ct)]


def _pass_cotangent(ct, mask, x):
    return [None, ct]


def _is_zero(ct) -> bool:
    return type(ct).__name__ == "Zero"


#: ``tangent_guard(mask, y) = y``; in a JVP, the tangent is ``tangent_mask``'d
tangent_guard_p = define_masking_primitive("tangent_guard", _identity, _guard_jvp, _pass_cotangent)
#: ``tangent_mask(mask, t) = select(mask, t, 0)``, transposed to ``cotangent_guard``
tangent_mask_p = define_masking_primitive("tangent_mask", _masked, _mask_jvp, _to_cotangent_guard)
#: ``cotangent_guard(mask, ct) = ct``; differentiated, ``select(mask, dct, 0)``
cotangent_guard_p = define_masking_primitive(
    "cotangent_guard", _identity, _cotangent_jvp, _to_tangent_mask
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
