"""``@guard`` on methods, and error texts in the user's terms (issue 9, item 5).

Decision (documented in docs/API.md): as with ``jax.jit``, ``self`` is an
ordinary argument.  A pytree-registered class has its arrays traced and
differentiated; any other ``self`` is refused with a message naming the method
and ``self`` and saying what to do (register the class, or
``static_argnums=0``).  ``staticmethod``/``classmethod`` work in either
decorator order; a ``classmethod``'s ``cls`` is bound as a constant.
Oracle for gradients: the hand-written double-where of ``where(x > 0,
sqrt(s * x), 0)``.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hlo_guard
from hlo_guard import guard

X = jnp.array([-1.0, 0.0, 1.0, 4.0])


def oracle(s):
    def f(x):
        safe = jnp.where(x > 0, x, 1.0)
        return jnp.where(x > 0, jnp.sqrt(s * safe), 0.0)

    return f


def grad_sum(fn):
    return jax.grad(lambda x: jnp.sum(fn(x)))(X)


class Plain:
    scale = 2.0

    def __init__(self):
        self.s = 2.0

    @guard
    def energy(self, x):
        return jnp.where(x > 0, jnp.sqrt(self.s * x), 0.0)

    @guard
    @staticmethod
    def static_inner(x):
        return jnp.where(x > 0, jnp.sqrt(2.0 * x), 0.0)

    @staticmethod
    @guard
    def static_outer(x):
        return jnp.where(x > 0, jnp.sqrt(2.0 * x), 0.0)

    @guard
    @classmethod
    def class_inner(cls, x):
        return jnp.where(x > 0, jnp.sqrt(cls.scale * x), 0.0)

    @classmethod
    @guard
    def class_outer(cls, x):
        return jnp.where(x > 0, jnp.sqrt(cls.scale * x), 0.0)


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Model:
    s: jax.Array

    @guard
    def energy(self, x):
        return jnp.where(x > 0, jnp.sqrt(self.s * x), 0.0)


def test_non_pytree_self_is_a_clear_error():
    with pytest.raises(hlo_guard.GuardUsageError) as err:
        Plain().energy(X)
    msg = str(err.value)
    assert "argument 'self' of Plain.energy is a Plain" in msg
    assert "register" in msg and "static_argnums" in msg


def test_pytree_self_is_traced_and_differentiated():
    m = Model(jnp.float32(2.0))
    want = grad_sum(oracle(2.0))
    np.testing.assert_array_equal(grad_sum(m.energy), want)
    gs = jax.grad(lambda m: jnp.sum(m.energy(X)))(m).s
    want_s = jax.grad(lambda s: jnp.sum(oracle(s)(X)))(jnp.float32(2.0))
    np.testing.assert_allclose(gs, want_s, rtol=1e-6)


@pytest.mark.parametrize("name", ["static_inner", "static_outer", "class_inner", "class_outer"])
@pytest.mark.parametrize("via", ["class", "instance"])
def test_staticmethod_and_classmethod_in_either_order(name, via):
    owner = Plain if via == "class" else Plain()
    fn = getattr(owner, name)
    np.testing.assert_array_equal(fn(X), oracle(2.0)(X))
    np.testing.assert_array_equal(grad_sum(fn), grad_sum(oracle(2.0)))


def test_classmethod_keeps_one_trace_cache_per_class():
    a = Plain.class_inner
    b = Plain().class_inner
    assert a is b
    a(X)
    b(X)
    assert a._cache.cache_info().hits >= 1


def test_tracing_errors_name_the_users_function_and_argument():
    """A Python ``if`` on a traced value: JAX's message must name ``branchy``
    and its argument ``x``, not the internal flat wrapper and ``leaves[0]``."""

    @guard
    def branchy(params, x):
        if x.sum() > 0:
            return x
        return params["w"] * x

    with pytest.raises(jax.errors.TracerBoolConversionError) as err:
        branchy({"w": 1.0}, X)
    msg = str(err.value)
    assert "branchy" in msg and "argument x" in msg
    assert "flat_fn" not in msg and "leaves[" not in msg


def test_tracing_errors_name_pytree_paths_and_skip_static_arguments():
    @guard(static_argnums=0)
    def branchy(mode, params):
        if params["b"].sum() > 0:
            return params["a"]
        return params["b"]

    with pytest.raises(jax.errors.TracerBoolConversionError) as err:
        branchy("m", {"a": X, "b": X})
    msg = str(err.value)
    assert "branchy" in msg and "params['b']" in msg and "leaves[" not in msg


def test_bad_argument_errors_use_parameter_names():
    def f(x, opts):
        return x

    class Opts:
        def __init__(self):
            self.fast = True

    with pytest.raises(hlo_guard.GuardUsageError, match=r"argument 'opts' of .*f is a Opts"):
        guard(f)(X, Opts())
    with pytest.raises(
        hlo_guard.GuardUsageError, match=r"argument 'opts' of .*f at \['k'\] is a Opts"
    ):
        guard(f)(X, {"k": Opts()})
    with pytest.raises(hlo_guard.GuardUsageError, match=r"keyword argument 'opts' of .*f"):
        guard(f)(X, opts=Opts())
