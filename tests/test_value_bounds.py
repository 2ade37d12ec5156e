"""Lower bounds of traced values (``jax_frontend.value_bounds``) and the one
decision they drive: a division by a value at least 1 needs no forward-mode
output guard.

The masked mean of every padded batch, ``sum(where(m, x, 0)) /
maximum(sum(m), 1)``, used to carry an output guard on the division (its
numerator's tangent is partly zero); ``d(n / d)`` is finite wherever ``n`` is
when ``d >= 1``, so the guard selected nothing.  Oracle: the hand double
where in forward, reverse and second-order modes.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from double_where import assert_like_double_where, modes

from hlo_guard import guard
from hlo_guard.inspect.explain import explain
from hlo_guard.jax_frontend.value_bounds import lower_bound

M = jnp.array([True, True, False, False, True])
X = jnp.array([1.0, 2.0, 0.0, -1.0, 0.25], jnp.float32)


def _top_graph(f, *args):
    program, _ = guard(f).traced(*args)
    return program.analysis.graph


def _bound_of_output(f, *args):
    graph = _top_graph(f, *args)
    return lower_bound(graph, graph.jaxpr.outvars[0])


@pytest.mark.parametrize(
    "f, expected",
    [
        (lambda s: jnp.maximum(jnp.sum(s), 1), 1.0),  # through jnp.maximum's wrapper
        (lambda s: jnp.maximum(s, 0.5), 0.5),
        (lambda s: jnp.maximum(3.0, jnp.maximum(s, 1.0)), 3.0),
        (lambda s: jnp.minimum(jnp.maximum(s, 1.0), 4.0), 1.0),
        (lambda s: jnp.broadcast_to(jnp.maximum(s, 2.0), (2, 5)), 2.0),
        (lambda s: jnp.maximum(s, 1.7).astype(jnp.int32), 1.0),  # truncation is monotonic
        (lambda s: jnp.maximum(s, 0.0) + 1e-5, 0.0 + np.float32(1e-5)),  # a sum of bounds
        (lambda s: jnp.sqrt(jnp.maximum(s, 4.0)), 2.0),
        (lambda s: jnp.maximum(s, 0.0) + s, None),  # a sum needs both bounds
        (lambda s: jnp.sqrt(jnp.maximum(s, -4.0)), None),
        (lambda s: jnp.minimum(s, 4.0), None),  # min needs both bounds
        (lambda s: jnp.sum(s), None),
        (lambda s: s * 2.0, None),
    ],
)
def test_lower_bound(f, expected):
    assert _bound_of_output(f, X) == expected


def test_bound_follows_an_argument_into_a_call_body():
    """Inside ``jnp.divide``'s wrapper the divisor is a body input; its bound
    is asked where the caller computes it."""

    def f(s):
        return s / jnp.maximum(jnp.sum(M), 1)

    top = _top_graph(f, X)
    (node,) = [n for n, e in enumerate(top.eqns) if e.params.get("name") == "true_divide"]
    body = top.call_body_graph(node)
    (div,) = [e for e in body.eqns if e.primitive.name == "div"]
    assert lower_bound(body, div.invars[1]) == 1.0
    assert lower_bound(body, div.invars[0]) is None


def masked_mean(floor):
    def f(x):
        return jnp.sum(jnp.where(M, jnp.sqrt(x), 0.0)) / jnp.maximum(jnp.sum(M), floor)

    return f


def masked_mean_oracle(floor):
    def f(x):
        safe = jnp.sqrt(jnp.where(M, x, 1.0))
        return jnp.sum(jnp.where(M, safe, 0.0)) / jnp.maximum(jnp.sum(M), floor)

    return f


def count_mean(x):
    return jnp.sum(jnp.where(M, jnp.sqrt(x), 0.0)) / jnp.sum(M)


def _forward_guards(f):
    return [s.op for s in explain(f, X).guards if s.mode == "forward"]


def test_division_by_a_count_of_at_least_one_has_no_output_guard():
    assert _forward_guards(masked_mean(1)) == []


@pytest.mark.parametrize("f", [masked_mean(0.5), count_mean], ids=["floor_0.5", "bare_count"])
def test_division_by_a_value_that_may_be_small_keeps_its_output_guard(f):
    assert _forward_guards(f) == ["true_divide"]


MODES = modes("jacfwd", "grad", "hessian", "jacfwd_jacfwd", "jacrev_grad")


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("floor", [1, 0.5])
def test_masked_mean_matches_the_double_where(mode, floor):
    d = MODES[mode]
    assert_like_double_where(d, masked_mean(floor), masked_mean_oracle(floor), X)
    if mode in ("grad", "hessian", "jacrev_grad"):  # reverse mode: the leak is real
        assert np.isnan(np.asarray(d(masked_mean(floor))(X))).any()


def test_literal_operands_are_bounded_too():
    """``jnp.unwrap``'s jaxpr feeds literals straight into ``max``/``div``
    (literals are not hashable: they must not reach the per-graph cache)."""
    from jax import lax

    def f(s):
        return lax.max(s, 1.5), lax.div(s, 4.0)

    graph = _top_graph(f, X)
    (mx,) = [e for e in graph.eqns if e.primitive.name == "max"]
    assert lower_bound(graph, mx.outvars[0]) == 1.5
    (dv,) = [e for e in graph.eqns if e.primitive.name == "div"]
    assert lower_bound(graph, dv.invars[1]) == 4.0
    np.testing.assert_array_equal(jnp.unwrap(X), guard(jnp.unwrap)(X))
    np.testing.assert_array_equal(
        jax.grad(lambda x: jnp.sum(jnp.unwrap(x)))(X),
        jax.grad(guard(lambda x: jnp.sum(jnp.unwrap(x))))(X),
    )


@pytest.mark.parametrize("mode", ["jacfwd", "grad"])
def test_a_taken_zero_under_the_masked_mean_stays_infinite(mode):
    """A lane the mask keeps, at ``x = 0``: ``sqrt'(0)`` is genuine and the
    division (now unguarded) passes it on, as in the hand double where."""
    x0 = X.at[0].set(0.0)
    got = np.asarray(MODES[mode](guard(masked_mean(1)))(x0))
    assert np.isinf(got[0])  # (jacfwd's other columns meet it as 0 * inf, as plain JAX's do)
    assert_like_double_where(MODES[mode], masked_mean(1), masked_mean_oracle(1), x0)


#: (f, its double where) of a layer norm's scale: the variance clamped at 0
#: by ``maximum`` (Flax's and Equinox's norms do this), its tangent then
#: structurally zero where the variance is negative
V = jnp.array([0.5, -0.25, 2.0, -1.0e-3, 0.75], jnp.float32)  # no tie at 0


def _scale_cases(eps):
    """(f, the hand double where): the clamped lanes get ``g(eps)`` as a
    constant, the others ``g`` of the variance made safe inside."""
    scales = {
        "rsqrt": jax.lax.rsqrt,
        "one_over_sqrt": lambda u: 1.0 / jnp.sqrt(u),
        "log": jnp.log,
    }

    def case(g):
        def f(v):
            return jnp.sum(g(jnp.maximum(0.0, v) + eps) * 3.0)

        def oracle(v):
            pos = v > 0.0
            clamped = g(jnp.full_like(v, eps))
            return jnp.sum(jnp.where(pos, g(jnp.where(pos, v, 1.0) + eps), clamped) * 3.0)

        return f, oracle

    return {name: case(g) for name, g in scales.items()}


@pytest.mark.parametrize("case", ["rsqrt", "one_over_sqrt", "log"])
def test_a_scale_bounded_away_from_zero_has_no_output_guard(case):
    """``rsqrt(maximum(0, var) + eps)``: the operand is at least ``eps``,
    where the derivative is finite, so a zero tangent stays zero through it
    (a cost survey found this guard in every Flax LayerNorm and BatchNorm)."""
    f, _ = _scale_cases(1e-5)[case]
    assert [s for s in explain(f, V).guards if s.mode == "forward"] == []


@pytest.mark.parametrize("eps", [0.0, 1e-45], ids=["no_eps", "eps_past_the_dtype"])
@pytest.mark.parametrize("case", ["rsqrt", "one_over_sqrt", "log"])
def test_a_scale_that_may_reach_zero_keeps_its_output_guard(case, eps):
    """Without ``eps`` the clamped lane is 0 and the derivative infinite; an
    ``eps`` whose derivative overflows float32 (``1e-45`` is a denormal) is
    no better."""
    f, oracle = _scale_cases(eps)[case]
    assert [s for s in explain(f, V).guards if s.mode == "forward"]
    assert np.isnan(np.asarray(jax.jacfwd(f)(V))).any()  # the leak is real
    assert_like_double_where(jax.jacfwd, f, oracle, V)


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("case", ["rsqrt", "one_over_sqrt", "log"])
def test_a_bounded_scale_matches_the_double_where(case, mode):
    f, oracle = _scale_cases(1e-5)[case]
    assert_like_double_where(MODES[mode], f, oracle, V, atol=1e-3)
