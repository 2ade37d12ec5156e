"""The boundary placement through the JAX front end, against the hand-written
double where (DESIGN.md step 3's hand-checked cases), in every AD mode.

The front end plans with :func:`passes.planning.plan_boundary_guards`; these
tests check that placement end to end on the cases it was argued on.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from double_where import assert_like_double_where, modes

from hlo_guard import guard
from hlo_guard.jax_frontend.surgery import spliced_program
from passes.planning import plan_boundary_guards

X = jnp.array([-1.0, 0.0, 0.5, 2.0])


def chain(x):
    return jnp.where(x > 0, jnp.log(jnp.sqrt(x)) * x**1.5 + 1 / x, 0.0)


def chain_oracle(x):
    m = x > 0
    s = jnp.where(m, x, 1.0)
    return jnp.where(m, jnp.log(jnp.sqrt(s)) * s**1.5 + 1 / s, 0.0)


def join(x):
    return jnp.sum(x**2) + jnp.sum(jnp.where(x > 0, jnp.sqrt(x), 0.0))


def join_oracle(x):
    return jnp.sum(x**2) + jnp.sum(jnp.where(x > 0, jnp.sqrt(jnp.where(x > 0, x, 1.0)), 0.0))


def dot_sqrt(x):
    a = jnp.outer(x, x) @ jnp.ones(4) - 1.0
    return jnp.sum(jnp.where(a > 0, jnp.sqrt(a), 0.0))


def dot_sqrt_oracle(x):
    a = jnp.outer(x, x) @ jnp.ones(4) - 1.0
    return jnp.sum(jnp.where(a > 0, jnp.sqrt(jnp.where(a > 0, a, 1.0)), 0.0))


def broadcast_scalar(x):
    w = jnp.sum(x)
    return jnp.sum(jnp.where(x > 0, jnp.log(w * x), 0.0))


def broadcast_scalar_oracle(x):
    w = jnp.sum(x)
    m = x > 0
    return jnp.sum(jnp.where(m, jnp.log(jnp.where(m, w * x, 1.0)), 0.0))


def taken_sqrt(x):
    # sqrt'(0) on a taken lane is a genuine singularity: stays inf
    return jnp.sum(jnp.where(x >= 0, jnp.sqrt(x), 0.0))


def taken_sqrt_oracle(x):
    return jnp.sum(jnp.where(x >= 0, jnp.sqrt(jnp.where(x >= 0, x, 1.0)), 0.0))


def nested(x):
    return jnp.sum(jax.jit(chain)(x))


def nested_oracle(x):
    return jnp.sum(chain_oracle(x))


CASES = [
    (lambda x: jnp.sum(chain(x)), lambda x: jnp.sum(chain_oracle(x))),
    (join, join_oracle),
    (dot_sqrt, dot_sqrt_oracle),
    (broadcast_scalar, broadcast_scalar_oracle),
    (taken_sqrt, taken_sqrt_oracle),
    (nested, nested_oracle),
]

MODES = modes("grad", "hessian", "jacfwd_grad", "jacrev_grad")


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("case", range(len(CASES)))
def test_boundary_guards_match_the_double_where(case, mode):
    f, oracle = CASES[case]
    assert_like_double_where(MODES[mode], f, oracle, X, atol=0)


def test_forward_value_is_unchanged_and_taken_sqrt_stays_inf():
    np.testing.assert_array_equal(guard(chain)(X), chain(X))
    g = jax.grad(guard(taken_sqrt))(X)
    assert np.isinf(g[1])


def test_chain_guards_only_where_x_enters():
    """The chain's input guards sit on ``x``'s three uses (sqrt, pow, div),
    none inside the chain (the hazard placement guards sqrt, log, pow, div)."""
    from hlo_guard.jax_frontend.graph import JaxprGraph
    from hlo_guard.jax_frontend.rules import RULES
    from passes import analyze

    jaxpr = jax.make_jaxpr(chain)(X).jaxpr
    an = analyze(JaxprGraph(jaxpr), RULES)
    sites = plan_boundary_guards(an)[0]
    assert {jaxpr.eqns[s.node].invars[s.index] for s in sites} == {jaxpr.invars[0]}
    assert {jaxpr.eqns[s.node].primitive.name for s in sites} == {"sqrt", "pow", "div"}


# -- what the front end applies: jnp wrappers seen through, one select per mask --------


def _bodies(params):
    """The jaxprs among an equation's parameters (open or closed, or in a
    tuple such as ``cond``'s branches)."""
    for value in params.values():
        for item in value if isinstance(value, (tuple, list)) else (value,):
            if hasattr(item, "eqns"):
                yield item
            elif hasattr(getattr(item, "jaxpr", None), "eqns"):
                yield item.jaxpr


def _guard_selects(f, *args) -> int:
    """Guards in the guarded program, at every nesting level: ``select_n``
    equations one of whose cases is a ``stop_gradient``, and the
    ``custom_jvp`` wrappers that guard an implicitly broadcast operand inside
    an op's derivative (the functions here have no custom_jvp of their own)."""
    closed = spliced_program(jax.make_jaxpr(guard(f))(*args))
    count = 0

    def walk(jaxpr):
        nonlocal count
        stopped = {e.outvars[0] for e in jaxpr.eqns if e.primitive.name == "stop_gradient"}
        for e in jaxpr.eqns:
            if e.primitive.name == "select_n" and any(v in stopped for v in e.invars[1:]):
                count += 1
            elif e.primitive.name == "custom_jvp_call":
                count += 1
                continue
            for sub in _bodies(e.params):
                walk(sub)

    walk(closed.jaxpr)
    return count


def lj_like(x):
    """``s * s - s`` behind a sqrt: every read of ``s`` is dead in the same
    lanes, so the chain is one region with one entry."""
    r = jnp.sqrt(x * x)
    s = (1.0 / r) ** 6
    return jnp.sum(jnp.where(x != 0, s * s - s, 0.0))


def lj_like_oracle(x):
    m = x != 0
    xs = jnp.where(m, x, 1.0)
    r = jnp.sqrt(xs * xs)
    s = (1.0 / r) ** 6
    return jnp.sum(jnp.where(m, s * s - s, 0.0))


def test_a_chain_of_jnp_calls_gets_one_guard_per_entry():
    """Every ``jnp`` ufunc is its own inline ``jit``; the placement sees
    through them, so ``log(sqrt(x)) * x**1.5 + 1/x`` is guarded where ``x``
    enters (three reads of ``x`` with one mask: one select), not at each op."""
    assert _guard_selects(chain, X) == 1
    np.testing.assert_array_equal(
        jax.grad(lambda x: guard(chain)(x).sum())(X), jax.grad(lambda x: chain_oracle(x).sum())(X)
    )


def test_which_bodies_are_rewritten_does_not_depend_on_what_was_asked_first():
    """A ``jnp.sqrt`` wrapper the placement sees through gets no guard of its
    own: its operand is guarded where the call reads it.  Asking which bodies
    need a rewrite before asking for the guard sites placed the body on its
    own (a guard inside as well, the call re-bound for nothing)."""
    from hlo_guard.jax_frontend.plan import plan_of

    def f(x):
        return jnp.where(x > 0, jnp.sqrt(x), 0.0).sum()

    answers = []
    for bodies_first in (True, False):
        # eager: the jnp wrappers stay calls in the traced program
        program, _ = guard(f).traced_for(False, (X,), {})
        plan = plan_of(program.analysis)
        if bodies_first:
            rewritten, sites = plan.rewritten_bodies("gradient"), plan.sites_for("gradient")
        else:
            sites, rewritten = plan.sites_for("gradient"), plan.rewritten_bodies("gradient")
        answers.append((rewritten, sorted(sites)))
    assert answers[0] == answers[1]
    assert answers[0][0] == frozenset() and answers[0][1]


@pytest.mark.parametrize("mode", sorted(MODES))
def test_reads_with_one_mask_are_no_join(mode):
    """``x * x`` and ``s * s - s`` read a value twice with the same dead
    lanes: no guard inside the chain, one select where ``x`` enters it, and
    the double where's derivatives in every mode."""
    assert _guard_selects(lj_like, X) == 1
    d = MODES[mode]
    np.testing.assert_array_equal(d(guard(lj_like))(X), d(lj_like_oracle)(X))


def test_a_value_that_is_also_an_output_is_a_join():
    """``y`` is returned *and* feeds a masked sqrt: the caller's cotangent of
    ``y`` is live in every lane, so the sqrt's dead lanes must be cleaned
    before the two are summed."""

    def f(x):
        y = x * x
        return y, jnp.where(x > 0, jnp.sqrt(y - 0.25), 0.0)

    def oracle(x):
        y = x * x
        safe = jnp.where(x > 0, y - 0.25, 1.0)
        return y, jnp.where(x > 0, jnp.sqrt(safe), 0.0)

    x = jnp.array([-0.5, 1.0, 2.0])  # y - 0.25 = 0 in the dead lane
    total = lambda g: lambda x: sum(jnp.sum(o) for o in g(x))  # noqa: E731
    want = jax.grad(total(oracle))(x)
    assert np.all(np.isfinite(want))
    np.testing.assert_array_equal(jax.grad(total(guard(f)))(x), want)


def test_broadcasting_jnp_op_is_placed_with_its_caller():
    """``pos[:, None] - pos[None, :]`` is a ``jit(subtract)`` that broadcasts
    (lane-mixing, so not seen through); its body used to assume a hazard
    beyond its output and guard its own inputs.  Placed with its caller, the
    pairwise chain has one guard, on the difference where it enters."""

    def pair(pos):
        d = pos[:, None, :] - pos[None, :, :]
        r = jnp.sqrt(jnp.sum(d * d, axis=-1))
        return jnp.sum(jnp.where(~jnp.eye(pos.shape[0], dtype=bool), 1.0 / r, 0.0))

    def pair_oracle(pos):
        d = pos[:, None, :] - pos[None, :, :]
        off = ~jnp.eye(pos.shape[0], dtype=bool)
        r2 = jnp.where(off, jnp.sum(d * d, axis=-1), 1.0)
        return jnp.sum(jnp.where(off, 1.0 / jnp.sqrt(r2), 0.0))

    pos = jnp.array([[0.0, 0.0], [1.0, 0.5], [2.0, -1.0]])
    assert _guard_selects(pair, pos) == 1
    np.testing.assert_allclose(jax.grad(guard(pair))(pos), jax.grad(pair_oracle)(pos), rtol=1e-6)


def dist_angle(p, q):
    d = q - p
    r = jnp.sqrt(jnp.sum(d * d, axis=-1))
    c = jnp.where(r > 0, d[:, 0] / r, 1.0)
    return jnp.where(r > 0, r + jnp.arccos(jnp.clip(c, -1.0, 1.0)), 0.0)


def dist_angle_oracle(p, q):
    d = q - p
    r2 = jnp.sum(d * d, axis=-1)
    pos = r2 > 0
    r = jnp.sqrt(jnp.where(pos, r2, 1.0))
    c = jnp.where(pos, d[:, 0] / r, 1.0)
    return jnp.where(pos, r + jnp.arccos(jnp.clip(c, -1.0, 1.0)), 0.0)


def test_distance_and_angle_lists_a_handful_of_guards_each_with_its_chain():
    """Issue 17 item 4: the hazard placement listed 18 guard sites for this
    kind of four-line function; the boundary placement lists a handful, each
    reverse-mode guard naming the singular ops of the chain it protects."""
    from hlo_guard import explain

    p = jnp.array([[0.0, 0.0, 0.0], [1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])
    q = jnp.array([[0.0, 0.0, 0.0], [2.0, 2.0, 1.0], [1.0, -1.0, 0.5]])
    loss = lambda f: lambda p, q: jnp.sum(f(p, q))  # noqa: E731
    for argnums in (0, 1):
        got = jax.grad(loss(guard(dist_angle)), argnums)(p, q)
        want = jax.grad(loss(dist_angle_oracle), argnums)(p, q)
        np.testing.assert_allclose(got, want, rtol=1e-6)
        assert np.isfinite(np.asarray(got)).all()
    sites = explain(dist_angle, p, q).guards
    assert len(sites) <= 8
    reverse = [s for s in sites if s.mode == "reverse"]
    assert reverse and all(s.protects for s in reverse)
    protected = {p.split()[0] for s in reverse for p in s.protects}
    assert {"sqrt", "div", "acos"} <= protected


# -- contractions: a dead row's value, not its cotangent, is the hazard --------------

D = jnp.array([0.0, 1.0, 2.0])
W = jnp.arange(6.0).reshape(3, 2) / 4.0


def padded_rows(w, d):
    """``1 / d`` is inf in the padded row; ``ct_w = h^T ct_z`` multiplies it by
    the row's exact-zero cotangent unless the contraction is guarded."""
    h = (1.0 / d)[:, None] * jnp.ones((1, 3))
    return jnp.sum(jnp.where((d > 0)[:, None], h @ w, 0.0) ** 2)


def padded_rows_oracle(w, d):
    h = (1.0 / jnp.where(d > 0, d, 1.0))[:, None] * jnp.ones((1, 3))
    return jnp.sum(jnp.where((d > 0)[:, None], h @ w, 0.0) ** 2)


def dead_columns(x, w):
    """The mirror case: an inf in a column of ``w`` no live output reads
    reaches ``ct_x = ct_z w^T``."""
    w = w.at[:, 1].set(jnp.log(w[:, 1] * 0.0))  # -inf column
    return jnp.sum(jnp.where(jnp.array([True, False]), jnp.tanh(x @ w), 0.0))


def dead_columns_oracle(x, w):
    w = w.at[:, 1].set(jnp.log(w[:, 1] * 0.0))
    w = jnp.where(jnp.array([True, False]), w, 0.0)
    return jnp.sum(jnp.where(jnp.array([True, False]), jnp.tanh(x @ w), 0.0))


@pytest.mark.parametrize("wrap", ["plain", "jit"])
def test_a_dead_rows_inf_value_does_not_poison_the_other_operands_gradient(wrap):
    """Found 2026-11-25: every guard was in place and the report clean, yet
    ``d/dw`` was NaN in every lane -- a silent miss.  A select on ``h``'s use
    changes ``h``'s cotangent, not the value ``w``'s cotangent multiplies by."""
    f = jax.jit(padded_rows) if wrap == "jit" else padded_rows
    assert np.isnan(np.asarray(jax.grad(f)(W, D))).all()
    g = guard(f)
    np.testing.assert_array_equal(g(W, D), f(W, D))
    for transform in (jax.grad, jax.jacfwd, jax.hessian):
        got = transform(g)(W, D)
        want = transform(padded_rows_oracle)(W, D)
        np.testing.assert_allclose(got, want, rtol=1e-6)
        assert np.isfinite(np.asarray(got)).all()


def test_a_dead_columns_inf_value_does_not_poison_the_other_operands_gradient():
    x = jnp.array([[1.0, 2.0, 3.0], [0.5, -1.0, 2.0]])
    assert np.isnan(np.asarray(jax.grad(dead_columns)(x, W))).all()
    for transform in (jax.grad, jax.jacfwd):
        got = transform(guard(dead_columns))(x, W)
        np.testing.assert_allclose(got, transform(dead_columns_oracle)(x, W), rtol=1e-6)


KERNEL = jnp.linspace(0.5, 1.5, 8).reshape(2, 1, 2, 2)  # OIHW


def padded_batch_conv(k, d):
    """A convolution's kernel gradient sums input * output cotangent over the
    batch: a padded item's inf input meets its exact-zero cotangent."""
    x = (1.0 / d)[:, None, None, None] * jnp.ones((1, 1, 4, 4))
    y = jax.lax.conv(x, k, (1, 1), "VALID")
    return jnp.sum(jnp.where((d > 0)[:, None, None, None], y, 0.0) ** 2)


def padded_batch_conv_oracle(k, d):
    x = (1.0 / jnp.where(d > 0, d, 1.0))[:, None, None, None] * jnp.ones((1, 1, 4, 4))
    y = jax.lax.conv(x, k, (1, 1), "VALID")
    return jnp.sum(jnp.where((d > 0)[:, None, None, None], y, 0.0) ** 2)


def test_a_padded_batch_items_inf_does_not_poison_a_convolutions_kernel_gradient():
    """The contraction guard covers ``conv_general_dilated`` (a silent miss
    before 2026-11-25's third session: NaN kernel gradient, clean report)."""
    assert np.isnan(np.asarray(jax.grad(padded_batch_conv)(KERNEL, D))).all()
    g = guard(padded_batch_conv)
    np.testing.assert_array_equal(g(KERNEL, D), padded_batch_conv(KERNEL, D))
    for transform in (jax.grad, jax.jacfwd, jax.hessian):
        got = transform(g)(KERNEL, D)
        want = transform(padded_batch_conv_oracle)(KERNEL, D)
        np.testing.assert_allclose(got, want, rtol=1e-5)
        assert np.isfinite(np.asarray(got)).all()


def test_a_closed_over_operand_with_an_inf_in_a_dead_row_is_zeroed_too():
    """The operand to zero may carry no derivative: an array the function
    closes over (data normalised to ``1 / 0`` in a padded row), computed
    eagerly while tracing, meets the row's zero cotangent in ``d/dw``."""
    with np.errstate(divide="ignore"):
        h = (1.0 / np.asarray(D))[:, None] * np.ones((1, 3), np.float32)
    h_safe = (1.0 / np.where(np.asarray(D) > 0, np.asarray(D), 1.0))[:, None] * np.ones((1, 3))
    rows = np.asarray(D) > 0

    def f(w):
        return jnp.sum(jnp.where(rows[:, None], jnp.asarray(h) @ w, 0.0) ** 2)

    def oracle(w):
        return jnp.sum(jnp.where(rows[:, None], jnp.asarray(h_safe, jnp.float32) @ w, 0.0) ** 2)

    assert np.isnan(np.asarray(jax.grad(f)(W))).all()
    for transform in (jax.grad, jax.jacfwd, jax.hessian):
        got = transform(guard(f))(W)
        np.testing.assert_allclose(got, transform(oracle)(W), rtol=1e-6)
        assert np.isfinite(np.asarray(got)).all()


def test_a_live_row_with_an_inf_stays_a_genuine_singularity():
    """Zeroing reaches only rows no live output reads: an inf in a live row
    is the program's own and stays non-finite."""
    d = jnp.array([0.0, 1.0, 2.0])

    def f(w, d):
        h = (1.0 / d)[:, None] * jnp.ones((1, 3))
        return jnp.sum(jnp.where((d >= 0)[:, None], h @ w, 0.0))

    assert not np.isfinite(np.asarray(jax.grad(guard(f))(W, d))).all()


def _contraction_mask_args(fn, *args):
    """Per guarded contraction in ``guard(fn)``'s jaxpr: how many masks it
    carries (its custom_jvp call's operands beyond the contraction's two)."""
    jaxpr = spliced_program(jax.make_jaxpr(guard(fn))(*args)).jaxpr
    return [
        len(e.invars) - 2
        for e in jaxpr.eqns
        if e.primitive.name == "custom_jvp_call"
        and any(q.primitive.name == "dot_general" for q in e.params["call_jaxpr"].jaxpr.eqns)
    ]


def test_weights_whose_lanes_live_or_die_together_are_not_zeroed():
    """Under a row mask every lane of ``w`` is live as soon as one row is
    (its mask is one bit): zeroing ``w``'s dead lanes protects nothing, since
    when ``w`` is dead so is every output lane and every row of ``h``.  Only
    ``h`` carries a mask into the contraction; the gradients still equal the
    hand double where's, with a padded row's inf in ``h``."""
    assert _contraction_mask_args(padded_rows, W, D) == [1]
    for transform in (jax.grad, jax.jacfwd, jax.hessian):
        got = transform(guard(padded_rows))(W, D)
        np.testing.assert_allclose(got, transform(padded_rows_oracle)(W, D), rtol=1e-6)


@pytest.mark.parametrize("w_inf", [False, True])
def test_every_row_dead_gives_exact_zero_gradients(w_inf):
    """The one-bit case at its edge: no row is live, ``h`` is inf in every
    row, and (second case) ``w`` holds an inf too.  Every derivative is a
    structural zero (the per-lane ``if`` never evaluates a row)."""
    d = jnp.zeros(3)
    w = W.at[0, 1].set(jnp.inf) if w_inf else W
    for argnums in (0, 1):
        got = jax.grad(guard(padded_rows), argnums=argnums)(w, d)
        np.testing.assert_array_equal(got, np.zeros_like(got))
    np.testing.assert_array_equal(jax.jacfwd(guard(padded_rows))(w, d), np.zeros(w.shape))


def _guards_on_first_argument(fn, *args):
    """How many guard selects ``guard(fn)`` puts on its first argument (each
    reads ``stop_gradient`` of it)."""
    jaxpr = spliced_program(jax.make_jaxpr(guard(fn))(*args)).jaxpr
    first = jaxpr.invars[0]
    return sum(
        1 for e in jaxpr.eqns if e.primitive.name == "stop_gradient" and e.invars[0] is first
    )


def test_a_one_bit_weight_needs_no_boundary_guard_when_its_partner_is_zeroed():
    """``w``'s lanes live or die together (every row reads all of it): while
    one row is live its guard is the identity, and when none is, ``h`` is
    zeroed in every row by the contraction and ``w``'s cotangent is
    ``0^T . 0``.  So ``w`` gets no select at all; the gradients stay the
    double where's, and exact zeros when every row is dead -- with infs in
    ``h`` and in ``w``, and an inf tangent for ``w`` in forward mode."""
    assert _guards_on_first_argument(padded_rows, W, D) == 0
    for transform in (jax.grad, jax.jacfwd, jax.hessian):
        got = transform(guard(padded_rows))(W, D)
        np.testing.assert_allclose(got, transform(padded_rows_oracle)(W, D), rtol=1e-6)
    dead = jnp.zeros(3)
    w_inf = W.at[0, 1].set(jnp.inf)
    np.testing.assert_array_equal(
        jax.hessian(guard(padded_rows))(w_inf, dead), np.zeros((3, 2, 3, 2))
    )
    _, t = jax.jvp(lambda w: guard(padded_rows)(w, dead), (W,), (jnp.full(W.shape, jnp.inf),))
    assert t == 0.0


def test_two_one_bit_operands_keep_their_guards():
    """Under a scalar predicate both operands of the contraction are one bit:
    neither is zeroed, so neither guard is redundant -- with the flag false
    and infs in both, every derivative is still an exact zero."""

    def f(w, d, flag):
        h = (1.0 / d)[:, None] * jnp.ones((1, 3))
        return jnp.sum(jnp.where(flag, h @ w, 0.0))

    w_inf = W.at[1, 0].set(jnp.inf)
    off = jnp.array(False)
    assert _guards_on_first_argument(f, W, D, off) == 1
    for argnums in (0, 1):
        got = jax.grad(guard(f), argnums=argnums)(w_inf, D, off)
        np.testing.assert_array_equal(got, np.zeros_like(got))
    got = jax.jacfwd(guard(f))(w_inf, D, off)
    np.testing.assert_array_equal(got, np.zeros_like(got))


def l2_normalize(x):
    """QK-norm as written in the wild: ``jnp.sum(..., keepdims=True)`` is a
    ``reduce_sum`` followed by a ``broadcast_in_dim`` that only inserts a
    size-1 axis, which replicates nothing and so keeps lanes apart."""
    n2 = jnp.sum(x * x, axis=-1, keepdims=True)
    return jnp.where(n2 > 0, x * jax.lax.rsqrt(n2), 0.0)


def l2_normalize_oracle(x):
    n2 = jnp.sum(x * x, axis=-1, keepdims=True)
    pos = n2 > 0
    return jnp.where(pos, x * jax.lax.rsqrt(jnp.where(pos, n2, 1.0)), 0.0)


ROWS = jnp.array([[0.0, 0.0, 0.0], [1.0, -2.0, 0.5], [0.0, 3.0, 0.0]])


def test_a_keepdims_reduction_is_inside_its_region():
    """``rsqrt(n2)`` is not a boundary: its operand is a keepdims sum, whose
    dead rows receive only dead rows' cotangents.  The guards sit where
    ``x`` enters (read by ``x * x`` and by ``x * rsqrt``: a join) and on the
    row norm that ``x * rsqrt(n2)`` broadcasts (lane-mixing as far as the
    placement can tell), no longer on ``n2`` as well: 3 selects, was 4."""
    from hlo_guard import explain

    sites = explain(l2_normalize, ROWS).guards
    assert sites and not [s for s in sites if s.primitive == "rsqrt"]
    assert _guard_selects(l2_normalize, ROWS) == 3
    f = lambda x: jnp.sum(l2_normalize(x) * jnp.arange(3.0))  # noqa: E731
    g = lambda x: jnp.sum(l2_normalize_oracle(x) * jnp.arange(3.0))  # noqa: E731
    for name, d in MODES.items():
        got, want = np.asarray(d(guard(f))(ROWS)), np.asarray(d(g)(ROWS))
        assert np.all(np.isfinite(want)), name
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7, err_msg=name)


def test_a_broadcast_that_replicates_is_still_lane_mixing():
    """The same chain through a broadcast that copies a row's norm to every
    lane of the row (``broadcast_in_dim`` to a wider shape) keeps its guard
    on ``n2``; the double where's gradient in every mode either way."""

    def spread(x):
        n2 = jnp.broadcast_to(jnp.sum(x * x, axis=-1)[:, None], x.shape)
        return jnp.where(n2 > 0, jnp.sqrt(n2) * x, 0.0)

    def spread_oracle(x):
        n2 = jnp.broadcast_to(jnp.sum(x * x, axis=-1)[:, None], x.shape)
        pos = n2 > 0
        return jnp.where(pos, jnp.sqrt(jnp.where(pos, n2, 1.0)) * x, 0.0)

    from hlo_guard.jax_frontend.graph import JaxprGraph
    from hlo_guard.jax_frontend.rules import RULES
    from passes import analyze

    jaxpr = jax.make_jaxpr(spread)(ROWS).jaxpr
    an = analyze(JaxprGraph(jaxpr), RULES)
    bcast = [n for n, e in enumerate(jaxpr.eqns) if e.primitive.name == "broadcast_in_dim"]
    rule = an.rules.get("broadcast_in_dim")
    apart = {
        (jaxpr.eqns[n].invars[0].aval.shape, jaxpr.eqns[n].outvars[0].aval.shape): (
            rule.keeps_lanes_apart(an, n)
        )
        for n in bcast
    }
    # `[:, None]` inserts an axis (apart); `broadcast_to` copies it (mixing)
    assert apart == {((3,), (3, 1)): True, ((3, 1), (3, 3)): False}
    f = lambda x: jnp.sum(spread(x) * jnp.arange(3.0))  # noqa: E731
    g = lambda x: jnp.sum(spread_oracle(x) * jnp.arange(3.0))  # noqa: E731
    for name, d in MODES.items():
        np.testing.assert_allclose(
            np.asarray(d(guard(f))(ROWS)),
            np.asarray(d(g)(ROWS)),
            rtol=1e-6,
            atol=1e-7,
            err_msg=name,
        )


def test_a_taken_zero_row_through_a_keepdims_sum_stays_a_genuine_singularity():
    """With ``n2 >= 0`` the all-zero row takes ``x * rsqrt(n2)``: ``rsqrt'(0)``
    is a genuine singularity on a live lane, and widening the region through
    the keepdims sum must not hide it (the double where is non-finite too)."""

    def taken(x):
        n2 = jnp.sum(x * x, axis=-1, keepdims=True)
        return jnp.sum(jnp.where(n2 >= 0, x * jax.lax.rsqrt(n2), 0.0) * jnp.arange(3.0))

    def taken_oracle(x):
        n2 = jnp.sum(x * x, axis=-1, keepdims=True)
        pos = n2 >= 0
        safe = jnp.where(pos, x * jax.lax.rsqrt(jnp.where(pos, n2, 1.0)), 0.0)
        return jnp.sum(safe * jnp.arange(3.0))

    got = np.asarray(jax.grad(guard(taken))(ROWS))
    want = np.asarray(jax.grad(taken_oracle)(ROWS))
    assert not np.isfinite(want[0]).all()
    np.testing.assert_array_equal(np.isfinite(got), np.isfinite(want))
    np.testing.assert_allclose(got[1:], want[1:], rtol=1e-6)


# -- an operand broadcast implicitly after a lane-local step --------------------
#
# ``w * log(X)`` with ``w`` of shape [D] and ``X`` of [B, D]: jnp promotes ``w``
# to [1, D] (``broadcast_in_dim``), and ``mul`` broadcasts the size-1 axis.  A
# weak-typed or lower-precision scalar gets a ``convert_element_type`` first.
# The op sums ``ct * log(X)`` over the dead rows into ``w``'s cotangent, so
# its guard must sit at that ``mul`` (at the output's shape); walking back over
# the lane-local step put it on ``w`` itself, where the mask is the OR over the
# broadcast rows (all true) and the select selected nothing -- a silent NaN in
# ``w``'s gradient (found with ``eqx.nn.LayerNorm``'s weight, 2026-11-26).

PADDED = jnp.array([[1.0, 2.0, 4.0], [0.0, 0.0, 0.0]])  # row 1 is padding
VALID = jnp.array([True, False])


def _weighted_log(w, x):
    return jnp.sum(jnp.where(VALID[:, None], w * jnp.log(x), 0.0))


def _weighted_log_oracle(w, x):
    return _weighted_log(w, jnp.where(VALID[:, None], x, 1.0))


def _scaled_ratio(q, r):
    return jnp.sum(jnp.where(r > 0, q / r, 0.0))


def _scaled_ratio_oracle(q, r):
    return jnp.sum(jnp.where(r > 0, q / jnp.where(r > 0, r, 1.0), 0.0))


WEIGHTS = {
    "vector": jnp.array([1.0, 0.5, 2.0]),
    "weak scalar": jnp.array(0.5),
    "python float": 0.5,
    "bfloat16 scalar": jnp.array(0.5, jnp.bfloat16),
}


@pytest.mark.parametrize("mode", ["grad", "jit_grad", "jacfwd_grad"])
@pytest.mark.parametrize("weight", sorted(WEIGHTS))
def test_an_operand_broadcast_after_a_lane_local_step_is_guarded_at_the_op(weight, mode):
    w = WEIGHTS[weight]
    if weight == "vector":
        f, oracle, args = _weighted_log, _weighted_log_oracle, (w, PADDED)
    else:
        f, oracle, args = _scaled_ratio, _scaled_ratio_oracle, (w, jnp.array([2.0, 4.0, 0.0]))
    d = {
        "grad": lambda h: jax.grad(h, argnums=(0, 1)),
        "jit_grad": lambda h: jax.jit(jax.grad(h, argnums=(0, 1))),
        "jacfwd_grad": lambda h: jax.jacfwd(jax.grad(h, argnums=0), argnums=1),
    }[mode]
    plain = d(f)(*args)
    assert not all(
        np.isfinite(np.asarray(leaf, np.float32)).all() for leaf in jax.tree.leaves(plain)
    )
    got, want = d(guard(f))(*args), d(oracle)(*args)
    for g, o in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_array_equal(np.asarray(g, np.float32), np.asarray(o, np.float32))
    np.testing.assert_array_equal(guard(f)(*args), f(*args))


def test_a_layer_norm_weight_under_padded_rows_gets_an_exact_gradient():
    """The user's view: a per-feature scale after a zero-variance padded row."""

    def layer_norm(x, weight):
        mean = jnp.mean(x, -1, keepdims=True)
        var = jnp.mean((x - mean) ** 2, -1, keepdims=True)
        return weight * ((x - mean) * jax.lax.rsqrt(var))

    def loss(weight, x):
        return jnp.sum(jnp.where(VALID[:, None], layer_norm(x, weight), 0.0))

    def oracle(weight, x):
        return loss(weight, jnp.where(VALID[:, None], x, jnp.arange(3.0)))

    w = jnp.array([1.0, 2.0, 3.0])
    assert np.isnan(np.asarray(jax.grad(loss)(w, PADDED))).all()
    np.testing.assert_array_equal(jax.grad(guard(loss))(w, PADDED), jax.grad(oracle)(w, PADDED))


# -- a body that hands its input straight back ------------------------------------
#
# ``x.real`` of a real array (also ``jnp.real``, ``x.conj()``, a no-op
# ``squeeze``/``ravel``) is ``jit(lambda a: a)``: no equation, so no use, and the
# placement's shortcut "no partly dead use here or below: nothing to guard"
# said the body's input had no hazard behind it, although the body's output
# was partly dead and read by a hazard.  Every guard upstream of the call was
# dropped and explain reported nothing to guard (found with optax's
# ``tree.norm`` and ``abs_sq``, 2026-11-26).

IDENTITIES = {
    "real": lambda x: x.real,
    "jnp.real": jnp.real,
    "conj": lambda x: x.conj(),
    "squeeze": jnp.squeeze,
    "ravel": jnp.ravel,
}


@pytest.mark.parametrize("mode", sorted(modes("grad", "hessian", "jacfwd_grad")))
@pytest.mark.parametrize("identity", sorted(IDENTITIES))
def test_an_identity_call_keeps_the_dead_region_it_forwards(identity, mode):
    ident = IDENTITIES[identity]

    def f(x):
        return jnp.sum(jnp.where(x > 0, jnp.sqrt(ident(x)), 0.0))

    def oracle(x):
        return jnp.sum(jnp.where(x > 0, jnp.sqrt(jnp.where(x > 0, x, 1.0)), 0.0))

    assert_like_double_where(modes("grad", "hessian", "jacfwd_grad")[mode], f, oracle, X, atol=0)


def test_an_identity_read_beside_a_direct_read_is_guarded_too():
    """``x.real * x``: both reads of ``x`` (one through the identity call) get
    the dead lanes of the ``maximum`` that clips the norm."""

    def f(x):
        return jnp.maximum(1.0, jnp.sqrt(jnp.sum(x.real * x)))

    def oracle(x):
        s = jnp.sum(x * x)
        return jnp.maximum(1.0, jnp.sqrt(jnp.where(s > 1.0, s, 1.0)))

    zero = jnp.zeros(3)
    assert np.isnan(np.asarray(jax.grad(f)(zero))).all()
    for d in (jax.grad, lambda h: jax.jit(jax.grad(h))):
        np.testing.assert_array_equal(d(guard(f))(zero), d(oracle)(zero))


SOFTMAX_ROWS = jnp.array([[0.5, 2.0, 1.0], [0.0, 1.0, 3.0], [4.0, 0.25, 1.0]])
SOFTMAX_KEEP = jnp.array([True, False, True])


def _masked_softmax_of_log(x):
    p = jax.nn.softmax(jnp.log(x), axis=-1)
    return jnp.sum(jnp.where(SOFTMAX_KEEP[:, None], p, 0.0) * jnp.arange(3.0))


def _masked_softmax_of_log_oracle(x):
    safe = jnp.where(SOFTMAX_KEEP[:, None], x, 1.0)
    p = jax.nn.softmax(jnp.log(safe), axis=-1)
    return jnp.sum(jnp.where(SOFTMAX_KEEP[:, None], p, 0.0) * jnp.arange(3.0))


def test_softmax_subtracting_a_stopped_max_is_inside_its_region():
    """``softmax`` subtracts ``stop_gradient(max)``, broadcast along the row:
    the cotangent summed into that operand goes nowhere, so the ``sub`` mixes
    no lanes and ``exp`` is inside the dead region that ``log``'s operand
    enters -- one guard where ``x`` enters protects ``log`` and ``exp`` both
    (was: a guard on ``exp``'s operand as well).  The double where's
    derivatives in every mode."""
    from hlo_guard import explain

    sites = explain(_masked_softmax_of_log, SOFTMAX_ROWS).guards
    assert [s.op for s in sites if s.op in ("exp", "log")] == ["log"]
    for name, d in MODES.items():
        got = np.asarray(d(guard(_masked_softmax_of_log))(SOFTMAX_ROWS))
        want = np.asarray(d(_masked_softmax_of_log_oracle)(SOFTMAX_ROWS))
        assert np.all(np.isfinite(want)), name
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7, err_msg=name)
