"""The guard itself: ``select(mask, x, stop_gradient(x))`` and ``stop_gradient(x)``.

These two equations are most of what the rewrite adds to a program (one pair
per guarded use), so inside a jaxpr trace they are emitted as equations
directly (:func:`compat.emit`): their output type is their operand's, and
going through ``lax.select``/``lax.stop_gradient`` (pytree mapping, dtype
checks, weak-type promotion, the shape rule, ``bind``) per guard was about a
quarter of the rewrite's time on a guard-dense program.  Anywhere else (an
eager call, a JVP or batching trace, a mask known while tracing) they are
bound as usual, which is what the emitted equations are equal to.
"""

from __future__ import annotations

import numpy as np
from jax import lax

from hlo_guard.jax_frontend.compat import emit, stop_gradient_primitive
from hlo_guard.jax_frontend.mask_ops import to_guard_mask

_STOP_GRADIENT = stop_gradient_primitive()


def stopped(x):
    """``lax.stop_gradient(x)``."""
    aval = getattr(x, "aval", None)
    if _STOP_GRADIENT is not None and aval is not None:
        out = emit(_STOP_GRADIENT, {}, [x], [aval])
        if out is not None:
            return out[0]
    return lax.stop_gradient(x)


def guarded(mask, x):
    """``select(mask, x, stop_gradient(x))``: ``x`` in every lane; in any
    derivative, the lanes where ``mask`` is false contribute an exact zero.
    ``mask`` is a mask of :mod:`mask_ops` (not ALL/NONE: callers short-cut
    those) of ``x``'s shape or broadcastable to it."""
    m = to_guard_mask(mask, np.shape(x))
    aval = getattr(x, "aval", None)
    mask_aval = getattr(m, "aval", None)
    if (
        aval is not None
        and mask_aval is not None
        and mask_aval.dtype == np.bool_
        and mask_aval.shape == aval.shape
    ):
        stop = stopped(x)
        out = emit(lax.select_n_p, {}, [m, stop, x], [aval])
        if out is not None:
            return out[0]
        return lax.select_n(m, stop, x)
    return lax.select(m, x, lax.stop_gradient(x))
