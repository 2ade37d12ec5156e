"""The JAX rule table against the primitives the installed JAX really has.

* every name the table (or the call machinery) keys on must be a primitive
  that exists: a renamed primitive (``pjit`` -> ``jit``) would otherwise leave
  its rule dead while the real primitive goes unruled;
* every primitive of the core lax/dispatch/sharding modules has a rule or is
  listed below as conservative *by decision*, with the reason: a new JAX
  primitive fails this test instead of silently being fully live;
* identity-like primitives (``device_put``, ``sharding_constraint``,
  ``optimization_barrier``, ``checkpoint_name`` ...) pass masks through: one of
  them between a ``sqrt`` and its ``where`` must not switch the guard off.
"""
import importlib
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.ad_checkpoint import checkpoint_name
from jax.extend.core import Primitive

from hlo_guard import explain, guard
from hlo_guard.jax_frontend.rules import RULES
from hlo_guard.jax_frontend.rules.calls import CALL_BODY_PARAM, REWRITTEN_CALLS

#: modules whose primitives every user program may contain
CORE_MODULES = [
    "jax._src.lax.lax", "jax._src.lax.slicing", "jax._src.lax.special",
    "jax._src.lax.windowed_reductions", "jax._src.lax.convolution", "jax._src.lax.fft",
    "jax._src.lax.control_flow.loops", "jax._src.lax.control_flow.conditionals",
    "jax._src.dispatch", "jax._src.pjit", "jax._src.ad_checkpoint", "jax._src.ad_util",
    "jax._src.custom_derivatives", "jax._src.random.prng", "jax._src.random.core",
    "jax._src.lax.control_flow.solves",
    "jax._src.lax.parallel", "jax._src.lax.linalg", "jax._src.core", "jax._src.shard_alike",
]

#: primitives deliberately left without a rule (fully live, reported as
#: "no rule"): their derivative mixes lanes in ways no mask rule here models.
CONSERVATIVE = {
    # linear algebra decompositions and solves: every output lane depends on
    # every input lane, and their derivatives are not 0/1 maps
    "cholesky", "cholesky_update", "eig", "eigh", "geqrf", "geqp3", "householder_product",
    "hessenberg", "lu", "ormqr", "qr", "schur", "svd", "symmetric_product",
    "triangular_solve", "tridiagonal", "tridiagonal_solve",
    # collectives (shard_map bodies): lanes move across devices
    "all_gather", "all_gather_invariant", "all_gather_reduced", "all_to_all", "axis_index",
    "pbroadcast", "pmax", "pmin", "ppermute", "psum", "psum_invariant", "ragged_all_to_all",
    "reduce_scatter", "unreduced_psum", "unreduced_reduce_scatter", "preduced", "precv",
    "psend", "reduced_vary_cast_p", "vary_unreduced_cast_p",
    # generic reductions / windows with a user computation
    "reduce", "reduce_window", "select_and_gather_add", "select_and_scatter",
    "select_and_scatter_add", "approx_top_k", "ragged_dot_general", "scaled_dot",
    "scatter-mul", "scatter-max", "scatter-min", "mulhi",
    # opaque or effectful: callbacks, foreign calls, tokens, refs, custom lowering
    "pure_callback", "io_callback", "debug_callback", "debug_print", "ffi_call",
    "custom_partitioning", "custom_linear_solve", "linear_call", "custom_vmap_call",
    "composite", "after_all", "create_token", "empty", "empty2", "dce_sink", "tie",
    "from_edtype", "to_edtype", "random_gamma", "random_clone", "iota_2x32_shape",
    "platform_index", "custom_jvp_call_jaxpr", "custom_lin", "remat_opt", "unreachable",
    "call", "stage", "accum_grad_in_ref", "empty_ref", "free_ref", "freeze", "new_ref",
    "inspect_sharding", "eval_jaxpr",
}


def installed_primitives():
    for name in CORE_MODULES:
        importlib.import_module(name)
    found = {}
    for mod in list(sys.modules.values()):
        if not getattr(mod, "__name__", "").startswith("jax"):
            continue
        for v in list(vars(mod).values()):
            if isinstance(v, Primitive):
                found.setdefault(v.name, mod.__name__)
    return found


def core_primitives(found):
    """Async collective halves (``psum_start``/``psum_done`` ...) share their
    collective's decision (conservative), so they are left out here."""
    return {n for n, m in found.items() if m in CORE_MODULES
            and not (m == "jax._src.lax.parallel" and n.endswith(("_start", "_done")))}


def test_enumeration_finds_the_primitives_we_know():
    found = installed_primitives()
    assert {"jit", "sqrt", "select_n", "device_put", "sharding_constraint", "pvary",
            "custom_jvp_call", "scan"} <= set(found)


def test_every_ruled_name_is_an_installed_primitive():
    found = installed_primitives()
    keyed = set(RULES.names()) | set(CALL_BODY_PARAM) | set(REWRITTEN_CALLS)
    stale = sorted(keyed - set(found))
    assert not stale, f"rules for primitives JAX no longer has: {stale}"


def test_every_core_primitive_is_ruled_or_conservative_by_decision():
    found = installed_primitives()
    unruled = sorted(core_primitives(found) - set(RULES.names()) - CONSERVATIVE)
    assert not unruled, f"core primitives with no rule and no decision: {unruled}"
    both = sorted(CONSERVATIVE & set(RULES.names()))
    assert not both, f"listed conservative but ruled: {both}"


def _double_where(x):
    safe = jnp.where(x > 0, x, 1.0)
    return jnp.sum(jnp.where(x > 0, jnp.sqrt(safe), 0.0))


_SINGLE = jax.sharding.SingleDeviceSharding(jax.devices()[0])

IDENTITIES = {
    "device_put": lambda v: jax.device_put(v),
    "device_put_to_device": lambda v: jax.device_put(v, jax.devices()[0]),
    "sharding_constraint": lambda v: jax.lax.with_sharding_constraint(v, _SINGLE),
    "optimization_barrier": lambda v: jax.lax.optimization_barrier(v),
    "checkpoint_name": lambda v: checkpoint_name(v, "s"),
    "copy": lambda v: jax.lax.copy_p.bind(v),
}


@pytest.mark.parametrize("ident", sorted(IDENTITIES))
def test_identity_between_sqrt_and_where_keeps_the_guard(ident):
    wrap = IDENTITIES[ident]

    def f(x):
        s = wrap(jnp.sqrt(x))
        return jnp.sum(jnp.where(x > 0, s, 0.0))

    x = jnp.array([-1.0, 0.0, 4.0, 2.25])
    np.testing.assert_array_equal(guard(f)(x), f(x))
    np.testing.assert_array_equal(jax.grad(guard(f))(x), jax.grad(_double_where)(x))
    np.testing.assert_array_equal(jax.jit(jax.grad(guard(f)))(x), jax.grad(_double_where)(x))
    assert not explain(f, x).unguarded


def test_optimization_barrier_of_several_values_maps_each_to_its_own():
    def f(x, y):
        a, b = jax.lax.optimization_barrier((jnp.sqrt(x), jnp.log(y)))
        return jnp.sum(jnp.where(x > 0, a, 0.0)) + jnp.sum(jnp.where(y > 0, b, 0.0)[:2])

    def oracle(x, y):
        sx = jnp.where(x > 0, x, 1.0)
        sy = jnp.where(y > 0, y, 1.0)
        return (jnp.sum(jnp.where(x > 0, jnp.sqrt(sx), 0.0))
                + jnp.sum(jnp.where(y > 0, jnp.log(sy), 0.0)[:2]))

    x = jnp.array([0.0, 4.0, -1.0])
    y = jnp.array([0.0, 2.0])
    for got, want in zip(jax.grad(guard(f), (0, 1))(x, y), jax.grad(oracle, (0, 1))(x, y)):
        np.testing.assert_array_equal(got, want)


def test_forward_mode_through_device_put_and_maximum():
    def f(x):
        return jnp.sqrt(jax.device_put(jnp.maximum(x, 0.0)))

    def oracle(x):
        return jnp.where(x > 0, jnp.sqrt(jnp.where(x > 0, x, 1.0)), 0.0)

    x = jnp.array([-1.0, 0.5, 4.0])
    np.testing.assert_array_equal(jax.jacfwd(guard(f))(x), jax.jacfwd(oracle)(x))
