"""The JAX rule tables against the primitives of the installed JAX (every
table keyed by primitive name, and the documented conservative-on-purpose list).

* every name a table keys on exists (a renamed primitive -- ``pjit`` became
  ``jit``, ``scatter_add`` is ``scatter-add`` -- would otherwise silently never
  match, and the operation would fall back to "no rule");
* every user-facing primitive has a rule or is listed, with a reason, in
  :data:`CONSERVATIVE_ON_PURPOSE` -- unruled means fully live and reported;
* identity-like primitives (``device_put``, ``with_sharding_constraint``,
  ``checkpoint_name``, ``optimization_barrier``, ``copy``) pass liveness
  through: before they had a rule, a ``device_put`` between ``sqrt`` and the
  ``where`` left the ``sqrt`` unguarded.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys

import jax
import jax.ad_checkpoint
import jax.numpy as jnp
import numpy as np
import pytest

from hlo_guard import explain, guard
from hlo_guard.inspect import render
from hlo_guard.jax_frontend import interpreter
from hlo_guard.jax_frontend.rules import RULES, calls
from hlo_guard.jax_frontend.rules.coverage import (
    CONSERVATIVE_ON_PURPOSE,
    LIBRARY_PRIMITIVES,
    ONLY_IN_SOME_VERSIONS,
)

#: modules whose primitives users reach through jax.numpy / jax.lax / jax.*
USER_FACING = (
    "jax._src.lax",
    "jax._src.dispatch",
    "jax._src.pjit",
    "jax._src.ad_checkpoint",
    "jax._src.custom_derivatives",
    "jax._src.callback",
    "jax._src.debugging",
    "jax._src.random",
    "jax._src.shard_alike",
    "jax._src.ffi",
    "jax._src.checkify",
    "jax._src.custom_batching",
    "jax._src.custom_partitioning",
)


def _import_all_of_jax():
    import jax._src

    for info in pkgutil.walk_packages(jax._src.__path__, "jax._src."):
        try:
            importlib.import_module(info.name)
        except Exception:  # noqa: BLE001,S110 -- platform-specific modules (TPU, GPU) may not import here
            pass


def _primitives():
    """{name: set of modules that hold a Primitive of that name}."""
    from jax._src.core import Primitive

    _import_all_of_jax()
    found = {}
    for modname, mod in list(sys.modules.items()):
        if not isinstance(modname, str) or not modname.startswith("jax"):
            continue
        for value in list(vars(mod).values()):
            if isinstance(value, Primitive):
                found.setdefault(value.name, set()).add(modname)
    return found


@pytest.fixture(scope="module")
def primitives():
    found = _primitives()
    assert {"jit", "sqrt", "select_n", "scatter-add"} <= set(found)  # the probe itself works
    return found


def _user_facing(found):
    return {
        name
        for name, mods in found.items()
        if any(m == p or m.startswith(p + ".") for m in mods for p in USER_FACING)
    }


def test_rule_table_has_no_stale_names(primitives):
    known = set(primitives) | set(ONLY_IN_SOME_VERSIONS) | set(LIBRARY_PRIMITIVES)
    stale = sorted(set(RULES.names()) - known)
    assert not stale, f"rules for primitives this JAX does not have: {stale}"


@pytest.mark.parametrize(
    "table_name, names",
    [
        ("calls.CALL_BODY_PARAM", lambda: calls.CALL_BODY_PARAM),
        ("calls.REWRITTEN_CALLS", lambda: calls.REWRITTEN_CALLS),
        ("interpreter.BINDERS", lambda: interpreter.BINDERS),
        ("render.TRANSPARENT", lambda: render.TRANSPARENT),
        ("render.INFIX", lambda: render.INFIX),
        ("CONSERVATIVE_ON_PURPOSE", lambda: CONSERVATIVE_ON_PURPOSE),
    ],
)
def test_other_primitive_tables_have_no_stale_names(primitives, table_name, names):
    stale = sorted(set(names()) - set(primitives) - set(ONLY_IN_SOME_VERSIONS))
    assert not stale, f"{table_name} names primitives this JAX does not have: {stale}"


def test_every_user_facing_primitive_is_ruled_or_conservative_on_purpose(primitives):
    unlisted = sorted(_user_facing(primitives) - set(RULES.names()) - set(CONSERVATIVE_ON_PURPOSE))
    assert not unlisted, (
        "primitives with neither a rule nor a reason to be conservative "
        f"(add a rule, or list them in rules/coverage.py): {unlisted}"
    )


def test_version_specific_names_are_used_by_a_table():
    """Every name excused as version-specific is still keyed on somewhere
    (otherwise the excuse is stale itself)."""
    tables = (
        set(RULES.names())
        | set(CONSERVATIVE_ON_PURPOSE)
        | set(calls.CALL_BODY_PARAM)
        | set(calls.REWRITTEN_CALLS)
        | set(interpreter.BINDERS)
    )
    assert set(ONLY_IN_SOME_VERSIONS) <= tables, sorted(set(ONLY_IN_SOME_VERSIONS) - tables)


def test_conservative_on_purpose_is_not_also_ruled():
    both = sorted(set(CONSERVATIVE_ON_PURPOSE) & set(RULES.names()))
    assert not both
    assert all(reason.strip() for reason in CONSERVATIVE_ON_PURPOSE.values())


# -- conservative is reported, never silent ----------------------------------------------


def _tridiagonal_solve(x):
    ones = jnp.ones_like(x)
    return jax.lax.linalg.tridiagonal_solve(ones * 0.5, x + 4.0, ones * 0.5, x[:, None])[:, 0]


def _callback_sqrt(x):
    return jax.pure_callback(lambda v: np.sqrt(v), jax.ShapeDtypeStruct(x.shape, x.dtype), x)


@pytest.mark.parametrize(
    "inner, prim", [(_tridiagonal_solve, "tridiagonal_solve"), (_callback_sqrt, "pure_callback")]
)
def test_conservative_primitive_under_a_where_is_reported(inner, prim):
    assert prim in CONSERVATIVE_ON_PURPOSE

    def f(x):
        return jnp.sum(jnp.where(x > 1.0, inner(x), 0.0))

    report = explain(f, jnp.array([0.0, 2.0, 3.0]))
    assert any(s.op == prim and "no rule" in s.reason for s in report.unguarded), report


# -- identity-like primitives -------------------------------------------------------------

X = jnp.array([-1.0, 0.0, 1.0, 4.0])


def _oracle_grad(x):
    """Hand double-where: sqrt only ever sees the taken lanes."""
    return jax.grad(lambda v: jnp.sum(jnp.where(v > 0, jnp.sqrt(jnp.where(v > 0, v, 1.0)), 0.0)))(x)


def _replicated():
    return jax.sharding.SingleDeviceSharding(jax.devices()[0])


IDENTITIES = {
    "device_put": lambda y: jax.device_put(y),
    "device_put_sharding": lambda y: jax.device_put(y, _replicated()),
    "sharding_constraint": lambda y: jax.lax.with_sharding_constraint(y, _replicated()),
    "checkpoint_name": lambda y: jax.ad_checkpoint.checkpoint_name(y, "s"),
    "optimization_barrier": lambda y: jax.lax.optimization_barrier(y),
    "copy": lambda y: jnp.array(y, copy=True),
}


@pytest.mark.parametrize("name", sorted(IDENTITIES))
@pytest.mark.parametrize("where", ["after_sqrt", "before_sqrt"])
def test_identity_like_primitive_keeps_guards(name, where):
    ident = IDENTITIES[name]

    def f(x):
        if where == "after_sqrt":
            return jnp.sum(jnp.where(x > 0, ident(jnp.sqrt(x)), 0.0))
        return jnp.sum(jnp.where(x > 0, jnp.sqrt(ident(x)), 0.0))

    g = jax.grad(guard(f))(X)
    np.testing.assert_array_equal(g, _oracle_grad(X))
    np.testing.assert_array_equal(guard(f)(X), f(X))
    report = explain(f, X)
    assert not report.unguarded, report


def test_identity_like_primitive_in_forward_mode():
    def f(x):
        return jnp.where(x > 0, jax.device_put(jnp.sqrt(jax.device_put(x))), 0.0)

    def oracle(x):
        return jnp.where(x > 0, jnp.sqrt(jnp.where(x > 0, x, 1.0)), 0.0)

    np.testing.assert_array_equal(jax.jacfwd(guard(f))(X), jax.jacfwd(oracle)(X))


def test_optimization_barrier_with_operands_of_different_shapes():
    def f(x, s):
        y, t = jax.lax.optimization_barrier((jnp.sqrt(x), jnp.log(s)))
        return jnp.sum(jnp.where(x > 0, y, 0.0)) + t

    gx, gs = jax.grad(guard(f), argnums=(0, 1))(X, 2.0)
    np.testing.assert_array_equal(gx, _oracle_grad(X))
    assert gs == pytest.approx(0.5)
