"""The guard pauses Python's cyclic garbage collector while it traces and
rewrites (:mod:`hlo_guard.collection`) and always hands it back as it was.

Why it matters: a full collection walks every tracked object, and a guarded
trace allocates many long-lived ones, so collections were about half the
guarded trace time of a 1k-equation chain.  What must never happen: the
collector left off after the guard returns (or raises), or switched on when
the user had switched it off.
"""

from __future__ import annotations

import gc

import jax
import jax.numpy as jnp
import pytest

import hlo_guard
from hlo_guard import collection


def _fn_recording(seen):
    def fn(x):
        seen.append(gc.isenabled())
        return jnp.where(x > 0, jnp.sqrt(x), 0.0)

    return fn


def test_tracing_runs_with_the_collector_paused_and_restores_it():
    seen: list[bool] = []
    g = hlo_guard.guard(_fn_recording(seen))
    assert gc.isenabled()
    jax.make_jaxpr(g)(jnp.ones(3))
    assert seen == [False]
    assert gc.isenabled()


def test_the_collector_comes_back_when_tracing_raises():
    def broken(x):
        raise ValueError("user error while tracing")

    with pytest.raises(ValueError, match="user error"):
        jax.jit(hlo_guard.guard(broken))(jnp.ones(3))
    assert gc.isenabled()


def test_a_collector_the_user_switched_off_stays_off():
    seen: list[bool] = []
    gc.disable()
    try:
        jax.make_jaxpr(hlo_guard.guard(_fn_recording(seen)))(jnp.ones(3))
        assert not gc.isenabled()
    finally:
        gc.enable()
    assert seen == [False]


def test_eager_evaluation_is_not_paused(monkeypatch):
    g = hlo_guard.guard(lambda x: jnp.where(x > 0, jnp.sqrt(x), 0.0))
    g(jnp.ones(3))  # traced once: the next call only evaluates
    assert not collection.building_a_program()
    pauses = []
    real = gc.disable
    monkeypatch.setattr(gc, "disable", lambda: (pauses.append(1), real())[1])
    g(jnp.ones(3))
    assert pauses == [1]  # the cached-trace lookup only, not the eager run
    assert gc.isenabled()


def test_staged_evaluation_counts_as_building_a_program():
    found = []

    def f(x):
        found.append(collection.building_a_program())
        return x

    jax.make_jaxpr(f)(1.0)
    jax.jit(jax.grad(f))(1.0)
    assert found == [True, True]
