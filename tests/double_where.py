"""Derivative compositions, and the comparison the placement tests hold a
guarded function to: its hand-written double where, mode by mode.

Shared by the tests of guard placement (boundary placement, call output
guards, value bounds), which each pick the modes that exercise what they test.
"""

import jax
import numpy as np

from hlo_guard import guard

DERIVATIVES = {
    "grad": jax.grad,
    "hessian": jax.hessian,
    "jacfwd": jax.jacfwd,
    "jacfwd_jacfwd": lambda f: jax.jacfwd(jax.jacfwd(f)),
    "jacfwd_grad": lambda f: jax.jacfwd(jax.grad(f)),
    "jacrev_grad": lambda f: jax.jacrev(jax.grad(f)),
}


def modes(*names: str) -> dict:
    """The named compositions of :data:`DERIVATIVES`, in the order given."""
    return {name: DERIVATIVES[name] for name in names}


def assert_like_double_where(d, f, oracle, *args, atol: float = 1e-7) -> None:
    """``d(guard(f))`` is NaN exactly where ``d(oracle)`` is and equal to it
    elsewhere (relative tolerance 1e-6, absolute ``atol``) -- evaluated by
    the interpreter (``guard`` under the derivative's own trace) and, under
    ``jax.jit``, as the one call surgery builds where it applies."""
    want = np.asarray(d(oracle)(*args))
    for guarded in (guard(f), jax.jit(guard(f))):
        got = np.asarray(d(guarded)(*args))
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=atol)
