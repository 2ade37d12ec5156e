"""Memory held by guarded functions (issue 9, item 4).

A trace of ``f`` holds ``f``'s jaxpr and, through it, every array ``f``
closes over.  Checked with weak references to those very arrays (the objects
the jaxprs hold), not with RSS, which the allocator does not give back:

* the per-signature trace cache keeps at most ``cache_size`` traces, least
  recently used dropped first;
* ``jax.clear_caches()`` empties it, as it empties JAX's own caches;
* no module-level cache keeps a jaxpr (and so its constants) alive after the
  guarded function dropped it.
"""

import gc
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hlo_guard
from hlo_guard.jax_frontend.trace_cache import DEFAULT_CACHE_SIZE

BIG = 200_000  # floats: 0.8 MB stands in for the 200 MB model constant


def big_arrays(closed, out):
    """The large arrays a closed jaxpr holds: its consts, literal values and
    those of every closed sub-jaxpr (nested jit bodies)."""
    for c in closed.consts:
        if np.size(c) >= BIG:
            out.append(c)
    for eqn in closed.jaxpr.eqns:
        for v in eqn.invars:
            if hasattr(v, "val") and np.size(v.val) >= BIG:
                out.append(v.val)
        for p in eqn.params.values():
            if hasattr(p, "consts") and hasattr(p, "jaxpr"):
                big_arrays(p, out)
    return out


def make_fn(base):
    """``where``-guarded sqrt whose constant sits in a jit nested in a jit, the
    shape of a model applied inside a jitted layer.  The constant is computed
    at trace time (a fresh array per trace, as ``params * scale`` in Python
    would be), so every trace owns its copy -- the case that adds up."""

    def f(x):
        const = base * np.float32(2.0)
        inner = jax.jit(lambda x: jnp.where(x.sum() > 0, jnp.sqrt(x.sum() * const), 0.0))
        outer = jax.jit(lambda x: jnp.where(x > 0, jnp.sqrt(inner(x).sum() * x), 0.0))
        return outer(x).sum() + jnp.where(x > 0, jnp.log(x), 0.0).sum() + (x.sum() * const).sum()

    return f


def make_custom_call_fn(base):
    """A norm with a custom derivative whose primal body holds a jit with a
    per-trace constant, used under ``where``: the call rule asks whether the
    body is selection-free, which used to memoise the answer in a module
    cache keyed by ``id(jaxpr)`` that held the jaxpr itself."""

    def f(x):
        const = base * np.float32(2.0)

        @jax.custom_jvp
        def norm(v):
            # `v.sum() * const` keeps the constant in the body's jaxpr (a traced use)
            return jax.jit(lambda v: jnp.sqrt(jnp.sum(v * v) + 0.0 * jnp.sum(v.sum() * const)))(v)

        @norm.defjvp
        def _norm_jvp(primals, tangents):
            (v,), (dv,) = primals, tangents
            n = norm(v)
            return n, jnp.sum(v * dv) / n

        n = norm(x)
        return jnp.where(n > 0, 1.0 / n, 0.0)

    return f


def alive(refs):
    """How many distinct constant arrays are still alive."""
    gc.collect()
    return len({id(r()) for r in refs if r() is not None})


def run_shapes(g, sizes, grad=False, call=True):
    """Call ``g`` at every size (or only trace it: ``call=False``, quicker, the
    same cache); weak references to the constants each trace holds."""
    refs = []
    for n in sizes:
        x = np.linspace(-1, 2, n).astype(np.float32)
        if call:
            out = jax.grad(lambda x: jnp.sum(g(x)))(x) if grad else g(x)
            assert np.isfinite(np.asarray(out)).all()
        program, _ = g.traced(x)
        held = list({id(a): a for a in big_arrays(program.closed_jaxpr, [])}.values())
        assert held, "the test must see the constants the trace holds"
        refs.extend(weakref.ref(c) for c in held)
        del program, held
    return refs


def test_trace_cache_is_a_bounded_lru():
    const = np.ones(BIG, np.float32)
    g = hlo_guard.guard(make_fn(const), cache_size=3)
    refs = run_shapes(g, range(2, 12))
    info = g._cache.cache_info()
    assert info.currsize == 3 and info.maxsize == 3
    assert len(refs) == 10  # one constant per trace
    assert alive(refs) == 3
    # least recently used goes first: touching size 9 keeps it across a new shape
    x9 = np.linspace(-1, 2, 9).astype(np.float32)
    g(x9)
    hits = g._cache.cache_info().hits
    g(np.ones(40, np.float32))
    g(x9)
    assert g._cache.cache_info().hits == hits + 1


def test_hundred_shapes_keep_only_the_default_number_of_traces():
    """The issue's scenario scaled down: 100 shapes with a closed-over constant
    keep at most DEFAULT_CACHE_SIZE traces (and their constants) alive."""
    const = np.ones(BIG, np.float32)
    g = hlo_guard.guard(make_fn(const))
    refs = run_shapes(g, range(1, 101), call=False)
    assert len(refs) == 100
    assert len(g._cache) == DEFAULT_CACHE_SIZE
    assert alive(refs) == DEFAULT_CACHE_SIZE


@pytest.mark.parametrize("grad", [False, True])
def test_jax_clear_caches_empties_the_trace_cache(grad):
    const = np.ones(BIG, np.float32)
    g = hlo_guard.guard(make_fn(const))
    refs = run_shapes(g, range(2, 6), grad=grad)
    assert g._cache.clears_with_jax  # the hook is active on the installed JAX
    assert alive(refs) == len(refs)
    jax.clear_caches()
    assert len(g._cache) == 0
    assert alive(refs) == 0
    # still usable afterwards
    x = np.array([-1.0, 0.0, 4.0], np.float32)
    np.testing.assert_array_equal(g(x), make_fn(const)(x))
    assert len(g._cache) == 1


@pytest.mark.parametrize("make", [make_fn, make_custom_call_fn], ids=["jit", "custom_call"])
@pytest.mark.parametrize("grad", [False, True])
def test_no_module_cache_keeps_dropped_traces_alive(grad, make):
    """Module-level caches keyed by jaxpr used to keep every analysed body (and
    the constants of the jits nested in it) alive forever -- the custom-call
    case (its body checked for selections) until the fourth session."""
    const = np.ones(BIG, np.float32)
    g = hlo_guard.guard(make(const))
    refs = run_shapes(g, range(2, 6), grad=grad)
    g._cache.cache_clear()
    jax.clear_caches()
    assert alive(refs) == 0


def test_dropping_the_guarded_function_frees_its_traces():
    const = np.ones(BIG, np.float32)
    g = hlo_guard.guard(make_fn(const))
    refs = run_shapes(g, range(2, 5))
    del g
    jax.clear_caches()
    assert alive(refs) == 0


def test_cache_size_zero_and_bad_values():
    count = []

    def f(x):
        count.append(1)
        return jnp.where(x > 0, jnp.sqrt(x), 0.0)

    g = hlo_guard.guard(f, cache_size=0)
    g(np.ones(3, np.float32))
    g(np.ones(3, np.float32))
    assert len(count) == 2 and len(g._cache) == 0
    for bad in (-1, 1.5, "8", True):
        with pytest.raises(TypeError, match="cache_size"):
            hlo_guard.guard(f, cache_size=bad)


def test_byte_budget_bounds_per_trace_constants():
    """The issue's scenario (100 shapes, a constant computed per trace) with the
    sizes scaled down 250x: 200 MB -> 0.8 MB per trace, the 512 MB default budget
    -> 2 MB.  At most 2 traces' constants stay alive, not 100 (or 16)."""
    const = np.ones(BIG, np.float32)
    g = hlo_guard.guard(make_fn(const), cache_bytes=2 * 2**20)
    refs = run_shapes(g, range(1, 101), call=False)
    assert len(refs) == 100
    assert alive(refs) == 2 and len(g._cache) == 2
    assert g._cache.nbytes() <= 2 * 2**20


def test_a_constant_shared_by_all_traces_counts_once():
    """A closed-over array used as it is (no per-trace copy; JAX reuses one
    view of it) is weighed once, so the byte budget does not evict traces that
    cost nothing extra."""
    base = np.ones(BIG, np.float32)

    def f(x):
        return jnp.where(x > 0, jnp.sqrt(x), 0.0).sum() + (x.sum() * base).sum()

    g = hlo_guard.guard(f, cache_bytes=BIG * 4 + 1024)
    for n in range(1, 11):
        g.traced(np.ones(n, np.float32))
    assert len(g._cache) == 10
    assert g._cache.nbytes() == BIG * 4


def test_cache_bytes_bad_values():
    for bad in (-1, 1.5, "8", True):
        with pytest.raises(TypeError, match="cache_bytes"):
            hlo_guard.guard(lambda x: x, cache_bytes=bad)
