"""Shared printing for the examples: plain vs guarded gradients, one row per lane.

Every example prints, for each case, a table

    x | plain jax.grad | double-where oracle | hlo_guard

whose last column is the gradient of the ``@guarded_jit`` function, and checks it
against the hand-written double-where oracle (exit status 1 on a mismatch), so an
example that runs is also an example that is right.
"""

from __future__ import annotations

import sys

import jax
import jax.numpy as jnp
import numpy as np

from hlo_guard import guarded_jit

_failures = []


def _fmt(v) -> str:
    return np.array2string(np.asarray(v), precision=6, floatmode="maxprec", separator=", ")


def side_by_side(title, f, oracle, *args, argnums=0, labels=None, names=None):
    """Print the per-lane gradients of ``sum(f(*args))`` with respect to
    ``args[argnums]`` (an int, or a tuple for one table per argument): plain JAX,
    the double-where oracle, and hlo_guard."""
    single = isinstance(argnums, int)
    nums = (argnums,) if single else tuple(argnums)
    loss = lambda g: lambda *a: jnp.sum(g(*a))
    plain = jax.jit(jax.grad(loss(f), argnums=nums))(*args)
    want = jax.jit(jax.grad(loss(oracle), argnums=nums))(*args)
    got = jax.grad(loss(guarded_jit(f)), argnums=nums)(*args)
    for k, i in enumerate(nums):
        suffix = "" if single else f"  (d / d {names[k] if names else f'arg {i}'})"
        _table(title + suffix, np.asarray(args[i]).reshape(-1), plain[k], want[k], got[k], labels)
    forward_plain = np.asarray(jax.jit(f)(*args))
    forward_guarded = np.asarray(guarded_jit(f)(*args))
    if forward_plain.tobytes() != forward_guarded.tobytes():
        _failures.append(title + " (forward)")
        print("  MISMATCH: forward values changed")


def _table(title, x, plain, want, got, labels):
    plain, want, got = (np.asarray(a).reshape(-1) for a in (plain, want, got))
    labels = labels or [_fmt(v) for v in x]
    width = max(len(s) for s in labels + ["x"])
    print(f"\n{title}")
    print(f"  {'x':>{width}} | {'plain jax.grad':>14} | {'double-where':>12} | hlo_guard")
    for lab, p, w, g in zip(labels, plain, want, got):
        print(f"  {lab:>{width}} | {_fmt(p):>14} | {_fmt(w):>12} | {_fmt(g)}")
    if not np.allclose(got, want, rtol=1e-5, atol=1e-6, equal_nan=False):
        _failures.append(title)
        print("  MISMATCH: hlo_guard differs from the double-where oracle")


def finish():
    """Exit non-zero if any table disagreed with its oracle."""
    if _failures:
        print(f"\n{len(_failures)} mismatch(es): {_failures}")
        sys.exit(1)
