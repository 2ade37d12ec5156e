"""Guarded ``jit`` bodies shared across call sites and traces
(``hlo_guard.jax_frontend.staged_bodies``).

The oracle is the rewrite without sharing: every program traced with a shared
body must be, character for character, the program a fresh evaluation of the
body gives (``staged_bodies.enabled = False``), and its gradient the double
where's.  Contexts are varied so that a fingerprint missing a dependency
would hand one context's guarded body to another."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hlo_guard
from hlo_guard.jax_frontend import interpreter, staged_bodies
from hlo_guard.jax_frontend.plan import plan_of
from hlo_guard.jax_frontend.staged_bodies import STAGED_BODIES, fingerprint

# Each body mixes lanes (a mean, a sum), so that its caller cannot see
# through it as one lane-wise operation: it is re-bound with a guarded body
# of its own, which is what is shared.  The bodies are small, which a guard's
# staged trace would inline (tests/test_small_calls_inlined.py): here they are
# kept as calls, as larger ones are.
pytestmark = pytest.mark.usefixtures("small_calls_kept")


@jax.jit
def log_or_zero(x):
    y = jnp.where(x > 0, jnp.log(x), 0.0)
    return y - jnp.mean(y)


@jax.jit
def scaled(x, s):
    """``x / s`` where ``x > 0``: ``s`` known while tracing (a literal) or not."""
    y = jnp.where(x > 0, x / s, 0.0)
    return y + 0.5 * jnp.sum(y)


@jax.jit
def sqrt_plus(x):
    return jnp.sqrt(x) + jnp.sum(x)


@jax.jit
def outer_calls_inner(x):
    return log_or_zero(x) * 2.0 + sqrt_plus(jnp.abs(x))


X = jnp.array([-1.0, 0.0, 0.5, 2.0], jnp.float32)


def _program(fn, *args) -> str:
    return str(jax.make_jaxpr(hlo_guard.guard(fn))(*args))


def _fresh(fn, *args) -> str:
    staged_bodies.enabled = False
    try:
        return _program(fn, *args)
    finally:
        staged_bodies.enabled = True


@pytest.fixture(autouse=True)
def _empty_cache():
    STAGED_BODIES.cache_clear()
    yield
    STAGED_BODIES.cache_clear()


#: one library body in many contexts: each must get its own guarded body
CONTEXTS = {
    "live output": (lambda x: log_or_zero(x).sum(), (X,)),
    "masked output": (lambda x: jnp.where(x < 1.5, log_or_zero(x), 0.0).sum(), (X,)),
    "row-masked output": (
        lambda x: jnp.where(jnp.arange(4) < 2, log_or_zero(x), 0.0).sum(),
        (X,),
    ),
    "clipped input": (lambda x: log_or_zero(jnp.clip(x, 0.0, 1.0)).sum(), (X,)),
    # the same body jaxpr (a float32 scale) as the traced scale's
    "known scale": (lambda x: scaled(x, np.float32(2.0)).sum(), (X,)),
    "weak known scale": (lambda x: scaled(x, 2.0).sum(), (X,)),
    "traced scale": (lambda x, s: scaled(x, s).sum(), (X, jnp.float32(0.0))),
    "masked sqrt": (lambda x: jnp.where(x > 0, sqrt_plus(x), 0.0).sum(), (X,)),
    "nested": (lambda x: outer_calls_inner(x).sum(), (X,)),
    "nested, masked": (lambda x: jnp.where(x > 1, outer_calls_inner(x), 0.0).sum(), (X,)),
    # bodies evaluated in their caller's forward context (tangent masks passed in)
    "zero tangent into sqrt": (lambda x: sqrt_plus(jnp.where(x > 0, x, 0.0)).sum(), (X,)),
    "zero tangent, other lanes": (lambda x: sqrt_plus(jnp.where(x < 1, x, 0.0)).sum(), (X,)),
    "constant row of zero tangent": (
        lambda x: sqrt_plus(jnp.where(jnp.arange(4) < 2, x, 0.0)).sum(),
        (X,),
    ),
    "nested, zero tangent": (
        lambda x: outer_calls_inner(jnp.where(x > 0, x, 0.0)).sum(),
        (X,),
    ),
    "live and zero tangent": (
        lambda x: sqrt_plus(x * x).sum() + sqrt_plus(jnp.where(x > 0, x, 0.0)).sum(),
        (X,),
    ),
    "twice in one program": (
        lambda x: log_or_zero(x).sum() + jnp.where(x < 1, log_or_zero(x + 1), 0.0).sum(),
        (X,),
    ),
}


def test_every_context_gets_the_program_a_fresh_evaluation_gives():
    # each context twice, in two orders, so that every later trace may hit an
    # entry another context made
    names = list(CONTEXTS) + list(reversed(CONTEXTS))
    for name in names:
        fn, args = CONTEXTS[name]
        assert _program(lambda *a: fn(*a), *args) == _fresh(lambda *a: fn(*a), *args), name
    assert STAGED_BODIES.hits > 0


def test_a_known_scale_and_a_traced_one_are_different_contexts():
    """``x / 2.0`` has a finite derivative wherever ``x`` is dead; ``x / s``
    at ``s = 0`` does not: its body is guarded, the other's is not.  Sharing
    one for the other would leave a NaN in the dead lanes (or guard for
    nothing)."""
    a = _program(lambda x: scaled(x, np.float32(2.0)).sum(), X)
    b = _program(lambda x, s: scaled(x, s).sum(), X, jnp.float32(0.0))
    assert a != b
    assert b == _fresh(lambda x, s: scaled(x, s).sum(), X, jnp.float32(0.0))
    # the traced scale after the known one: dead lanes exactly 0, live ones inf
    g = jax.grad(hlo_guard.guard(lambda x, s: scaled(x, s).sum()))(X, jnp.float32(0.0))

    def double_where(x):
        y = jnp.where(x > 0, jnp.where(x > 0, x, 1.0) / 0.0, 0.0)
        return (y + 0.5 * jnp.sum(y)).sum()

    dw = jax.grad(double_where)(X)
    np.testing.assert_array_equal(np.asarray(g), np.asarray(dw))
    assert np.asarray(g)[0] == 0.0 and np.isinf(np.asarray(g)[3])


def test_a_body_guarded_again_in_a_new_trace_is_not_evaluated_again(monkeypatch):
    """The second trace of the same context stages the guarded body the first
    made, without evaluating it (or tracing it through ``jax.jit``) again."""
    evaluated = []
    real = interpreter.run_guarded

    def spy(analysis, *args, **kwargs):
        if analysis.graph.scope.endswith("log_or_zero)"):
            evaluated.append(1)
        return real(analysis, *args, **kwargs)

    monkeypatch.setattr(interpreter, "run_guarded", spy)
    fn = CONTEXTS["masked output"][0]
    first = _program(lambda x: fn(x), X)
    assert len(evaluated) == 1
    second = _program(lambda x: fn(x), X)
    assert len(evaluated) == 1 and second == first
    g = jax.grad(hlo_guard.guarded_jit(lambda x: fn(x)))(X)

    def double_where(x):
        y = jnp.where(x > 0, jnp.log(jnp.where(x > 0, x, 1.0)), 0.0)
        return jnp.where(x < 1.5, y - jnp.mean(y), 0.0).sum()

    dw = jax.grad(double_where)(X)
    np.testing.assert_allclose(np.asarray(g), np.asarray(dw), rtol=1e-6)


def test_value_mode_and_effects_are_not_shared():
    def effectful(x):
        jax.debug.print("x={}", x)
        return jnp.where(x > 0, jnp.log(x), 0.0)

    calls = jax.jit(effectful)
    before = STAGED_BODIES.hits + STAGED_BODIES.misses
    for _ in range(2):
        jax.make_jaxpr(hlo_guard.guard(lambda x: calls(x).sum()))(X)
        jax.make_jaxpr(hlo_guard.guard(lambda x: log_or_zero(x).sum(), mode="value"))(X)
    assert STAGED_BODIES.hits + STAGED_BODIES.misses == before


def test_a_fingerprint_names_the_context_not_the_trace():
    """Two traces of one function give equal fingerprints (origins and mask
    keys are renamed by first mention); another context gives another."""

    def subs_of(fn, *args):
        program, _ = hlo_guard.guard(fn).traced(*args)
        return [
            sub
            for (node, _), sub in program.analysis.subs.items()
            if program.analysis.graph.eqns[node].params.get("name") == "log_or_zero"
        ]

    fn = CONTEXTS["masked output"][0]
    (a,) = subs_of(lambda x: fn(x), X)
    (b,) = subs_of(lambda x: fn(x), X)
    (c,) = subs_of(lambda x: CONTEXTS["clipped input"][0](x), X)
    assert fingerprint(a, "gradient") is not None
    assert fingerprint(a, "gradient") == fingerprint(b, "gradient")
    assert fingerprint(a, "gradient") != fingerprint(c, "gradient")


def test_a_body_in_its_callers_forward_context_is_named_with_that_context():
    """A body evaluated in its caller's forward context (tangent masks passed
    in) reads the caller's forward analysis: its fingerprint names that
    analysis the same way in every trace -- so a later trace shares it --
    and differs from the same body entered by a live tangent."""

    def subs_of(fn):
        program, _ = hlo_guard.guard(fn).traced(X)
        return [
            sub
            for (node, _), sub in program.analysis.subs.items()
            if program.analysis.graph.eqns[node].params.get("name") == "sqrt_plus"
        ]

    zero = CONTEXTS["zero tangent into sqrt"][0]
    (a,) = subs_of(lambda x: zero(x))
    (b,) = subs_of(lambda x: zero(x))
    (c,) = subs_of(lambda x: sqrt_plus(x * x).sum())
    assert plan_of(a).forward_context is not None and plan_of(c).forward_context is None
    assert fingerprint(a, "gradient") is not None
    assert fingerprint(a, "gradient") == fingerprint(b, "gradient")
    assert fingerprint(a, "gradient") != fingerprint(c, "gradient")
    before = STAGED_BODIES.hits
    assert _program(lambda x: zero(x), X) == _program(lambda x: zero(x), X)
    assert STAGED_BODIES.hits > before


@pytest.mark.parametrize(
    "case",
    [
        "numpyro StickBreakingTransform log-det-J",
        "optax clip_by_global_norm+adam update",
        "optax softmax_xent+huber+safe_norm",
        "equinox MLP log_softmax",
    ],
)
def test_library_functions_traced_again_get_the_fresh_program(case):
    """The functions ``benchmarks/trace_cost_libraries.py`` times, traced
    twice (the second trace shares what the first staged) and compared with
    a fresh evaluation."""
    from benchmarks.trace_cost_libraries import CASES

    try:
        make, args = CASES[case]()
    except ImportError as exc:
        pytest.skip(str(exc))
    first = _program(make(), *args)
    hits = STAGED_BODIES.hits
    second = _program(make(), *args)
    assert STAGED_BODIES.hits > hits or "numpyro" not in case
    assert first == second == _fresh(make(), *args)
