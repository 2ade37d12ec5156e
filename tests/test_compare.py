"""compare(): plain vs guarded, compiled side by side, per output and derivative.

Oracles: the plain side is checked against JAX run directly by the test; the
guarded side against the hand-written double-where program (the per-lane
``if``), differentiated by JAX; the statistics against numpy on hand-made arrays.
"""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hlo_guard
from hlo_guard.errors import GuardUsageError
from hlo_guard.inspect.compare import compare, compare_arrays

X = jnp.array([-1.0, 0.0, 1.0, 4.0])


def f(x):
    return jnp.where(x > 0, jnp.sqrt(x), 0.0)


def f_double_where(x):  # the per-lane `if`: the dead branch never sees x <= 0
    safe = jnp.where(x > 0, x, 1.0)
    return jnp.where(x > 0, jnp.sqrt(safe), 0.0)


def g(x):
    return jnp.maximum(jnp.log(x), -5.0) * 2.0


def g_oracle(x):
    safe = jnp.where(jnp.log(x) > -5.0, x, 1.0)
    return jnp.where(jnp.log(x) > -5.0, jnp.log(safe), -5.0) * 2.0


def test_grad_counts_changed_lanes_and_values():
    c = compare(f, X, transform="grad")
    (v,) = c.values
    assert v.bitwise_equal and v.n_changed == 0
    (d,) = c.derivatives
    plain = np.asarray(jax.grad(lambda x: f(x).sum())(X))
    oracle = np.asarray(jax.grad(lambda x: f_double_where(x).sum())(X))
    assert d.plain.nan == int(np.isnan(plain).sum()) == 2
    assert d.guarded.nan == 0 and d.guarded.inf == 0
    assert d.changed == [(0,), (1,)] and d.n_changed == 2
    assert d.fixed == 2 and d.introduced == 0 and d.drifted == 0
    assert d.max_abs_diff == 0.0
    np.testing.assert_array_equal(np.asarray(d.guarded_values, dtype=float), oracle)
    assert c.ok() and c.guarded_nonfinite() == 0
    assert c.verdict().startswith("OK")


@pytest.mark.parametrize("transform", ["vjp", "jvp", "jacfwd", "jacrev", "hessian"])
def test_every_transform_matches_the_double_where_oracle(transform):
    c = compare(g, X, transform=transform)
    assert c.values_identical()
    oracle = {
        "vjp": lambda: [jax.vjp(g_oracle, X)[1](jnp.ones(4))[0]],
        "jvp": lambda: [jax.jvp(g_oracle, (X,), (jnp.ones(4),))[1]],
        "jacfwd": lambda: [jax.jacfwd(g_oracle)(X)],
        "jacrev": lambda: [jax.jacrev(g_oracle)(X)],
        "hessian": lambda: [jax.hessian(lambda x: g_oracle(x).sum())(X)],
    }[transform]()
    assert len(c.derivatives) == len(oracle)
    for e, want in zip(c.derivatives, oracle):
        want = np.asarray(want)
        assert e.shape == want.shape
        # the guarded side is stored for small arrays; recompute for large ones
        got = np.asarray(e.guarded_values, dtype=float) if e.guarded_values is not None else None
        if got is not None:
            np.testing.assert_allclose(got, want, rtol=1e-6)
        assert e.guarded.nonfinite == int((~np.isfinite(want)).sum())


def test_hessian_of_where_sqrt_has_no_nan_and_plain_does():
    c = compare(f, X, transform="hessian")
    (h,) = c.derivatives
    plain = np.asarray(jax.hessian(lambda x: f(x).sum())(X))
    assert h.plain.nan == int(np.isnan(plain).sum()) > 0
    assert h.guarded.nonfinite == 0 and c.ok()


def test_genuine_singularity_stays_visible():
    c = compare(lambda x: jnp.where(x >= 0, jnp.sqrt(x), 0.0), jnp.array([0.0, 1.0]))
    (d,) = c.derivatives
    assert d.plain.inf == d.guarded.inf == 1  # sqrt'(0) on the taken branch
    assert c.ok() and c.guarded_nonfinite() == 1
    assert "still NaN/inf" in c.verdict()


def test_several_arguments_outputs_and_integer_leaves():
    def h(x, n, scale):
        return {"a": jnp.where(x > 0, jnp.log(x), 0.0) * scale, "b": x[n]}

    c = compare(hlo_guard.guard(h), X, 1, jnp.float32(3.0), transform="vjp")
    names = [e.name for e in c.derivatives]
    assert names == [
        "vjp[out['a']] wrt x",
        "vjp[out['a']] wrt scale",
        "vjp[out['b']] wrt x",
        "vjp[out['b']] wrt scale",
    ]
    assert [e.name for e in c.values] == ["out['a']", "out['b']"]
    dx = c.derivatives[0]
    plain = jax.grad(lambda x: h(x, 1, jnp.float32(3.0))["a"].sum())(X)
    assert dx.plain.nonfinite == int((~np.isfinite(np.asarray(plain))).sum()) == 1
    assert dx.guarded.nonfinite == 0 and dx.changed == [(1,)]  # -0.0 == 0.0: not a change
    assert not dx.bitwise_equal  # ... but lane 0 is -0.0 plain, 0.0 guarded
    assert "n: i32[]" in c.signature


def test_json_is_strict_json():
    c = compare(f, X, transform="grad")
    text = c.to_json()

    def reject(name):
        raise ValueError(f"non-standard JSON constant {name}")

    d = json.loads(text, parse_constant=reject)
    assert d["ok"] is True and d["fixed"] == 2 and d["transform"] == "grad"
    der = d["entries"][1]
    assert der["kind"] == "derivative" and der["changed"] == [[0], [1]]
    assert der["plain_values"][:2] == ["nan", "nan"]


def test_text_report():
    text = compare(f, X).to_text()
    assert text.startswith("hlo_guard compare: f(x: f32[4]), transform=grad")
    assert "2 lane(s) changed: [0], [1]" in text and "identical (bitwise)" in text


def test_compare_arrays_statistics():
    a = np.array([1.0, np.nan, 2.0, np.inf, 5.0, np.nan], np.float32)
    b = np.array([1.0, 0.0, 2.5, np.nan, 5.0, np.nan], np.float32)
    e = compare_arrays("derivative", "t", a, b)
    assert (e.plain.nan, e.plain.inf, e.guarded.nan, e.guarded.inf) == (2, 1, 2, 0)
    assert e.changed == [(1,), (2,), (3,)]  # NaN vs NaN is not a change
    assert e.max_abs_diff == 0.5  # lanes 0, 2, 4 are finite in both
    assert e.fixed == 1 and e.introduced == 0 and e.drifted == 1
    assert not e.bitwise_equal
    worse = compare_arrays("derivative", "t", b, a)
    assert worse.introduced == 1


def test_usage_errors():
    with pytest.raises(GuardUsageError, match="transform must be one of"):
        compare(f, X, transform="jacobian")
    with pytest.raises(GuardUsageError, match="no floating-point input"):
        compare(lambda n: jnp.sqrt(n * 1.0), jnp.arange(3), transform="grad")
    assert compare(lambda n: n * 2, jnp.arange(3), transform="none").ok()
