"""``guard(f, has_aux=True)``: ``f`` returns ``(output, aux)`` and ``aux`` is
not differentiated, as for ``jax.grad(..., has_aux=True)``.

Without it the predictions returned beside a masked loss are a live output in
every lane and nothing upstream of them is guarded.  Oracle: the hand double
where.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hlo_guard as hg
from hlo_guard.errors import GuardUsageError

X = jnp.array([0.0, 1.0, 4.0])
MASK = X > 0


def loss_and_predictions(w, x, mask):
    pred = jnp.sqrt(x * w)  # sqrt'(0) = inf at the padded lane
    return jnp.sum(jnp.where(mask, pred, 0.0)), {"pred": pred, "n": jnp.sum(mask)}


def loss_and_predictions_oracle(w, x, mask):
    pred = jnp.sqrt(jnp.where(mask, x, 1.0) * w)
    return jnp.sum(jnp.where(mask, pred, 0.0)), None


@pytest.mark.parametrize("wrap", [hg.guard, hg.guarded_jit])
def test_aux_does_not_keep_masked_lanes_live(wrap):
    plain = jax.grad(loss_and_predictions, has_aux=True)(2.0, X, MASK)[0]
    assert np.isnan(plain)
    guarded = wrap(loss_and_predictions, has_aux=True)
    (value, aux), grad = jax.value_and_grad(guarded, has_aux=True)(2.0, X, MASK)
    want = jax.grad(loss_and_predictions_oracle, has_aux=True)(2.0, X, MASK)[0]
    np.testing.assert_allclose(grad, want, rtol=1e-6)
    # values unchanged, aux included
    ref_value, ref_aux = loss_and_predictions(2.0, X, MASK)
    np.testing.assert_array_equal(value, ref_value)
    np.testing.assert_array_equal(aux["pred"], ref_aux["pred"])
    assert int(aux["n"]) == 2


def test_forward_mode_and_second_order_with_aux():
    guarded = hg.guard(loss_and_predictions, has_aux=True)
    got = jax.jacfwd(guarded, has_aux=True)(2.0, X, MASK)[0]
    want = jax.jacfwd(loss_and_predictions_oracle, has_aux=True)(2.0, X, MASK)[0]
    np.testing.assert_allclose(got, want, rtol=1e-6)

    def d_loss(w):
        return jax.grad(guarded, has_aux=True)(w, X, MASK)[0]

    def d_loss_oracle(w):
        return jax.grad(loss_and_predictions_oracle, has_aux=True)(w, X, MASK)[0]

    np.testing.assert_allclose(jax.grad(d_loss)(2.0), jax.grad(d_loss_oracle)(2.0), rtol=1e-6)


def test_without_has_aux_the_aux_output_is_live_and_explain_says_what_to_do():
    """The reason for the flag: the aux output keeps every lane live, so the
    gradient is NaN and no guard is placed -- and ``explain`` says that
    ``has_aux=True`` would place the missing guards."""
    assert np.isnan(jax.grad(hg.guard(loss_and_predictions), has_aux=True)(2.0, X, MASK)[0])
    report = hg.explain(hg.guard(loss_and_predictions), 2.0, X, MASK)
    assert "nothing to guard" in str(report)
    [note] = report.notes
    assert "guard(f, has_aux=True) places 3 more guard site(s)" in note
    assert note in str(report) and report.to_dict()["notes"] == [note]
    with_aux = hg.explain(hg.guard(loss_and_predictions, has_aux=True), 2.0, X, MASK)
    assert "nothing to guard" not in str(with_aux) and not with_aux.notes


def test_no_note_when_the_second_output_keeps_nothing_live():
    def loss_and_count(w, x, mask):
        return jnp.sum(jnp.where(mask, jnp.sqrt(x * w), 0.0)), jnp.sum(mask)

    assert not hg.explain(loss_and_count, 2.0, X, MASK).notes


def test_a_function_that_returns_no_pair_is_refused():
    with pytest.raises(GuardUsageError, match="has_aux=True.*pair"):
        hg.guard(lambda x: jnp.sqrt(x), has_aux=True)(X)
    with pytest.raises(GuardUsageError, match="has_aux"):
        hg.guard(loss_and_predictions, has_aux="yes")
    with pytest.raises(GuardUsageError, match="has_aux"):
        hg.guarded_jit(loss_and_predictions, has_aux=1)


def test_decorator_and_method_forms_keep_has_aux():
    class Model:
        @hg.guard(has_aux=True)
        @classmethod
        def loss(cls, w, x, mask):
            return loss_and_predictions(w, x, mask)

    grad = jax.grad(Model.loss, has_aux=True)(2.0, X, MASK)[0]
    assert np.isfinite(grad)
    assert "has_aux=True" in repr(hg.guard(loss_and_predictions, has_aux=True))


def test_compare_differentiates_neither_sides_aux():
    """``compare`` of a has_aux guard compares against the function as the
    guard traces it (aux stopped too): otherwise every lane of d(aux) would
    count as "moved" by the guard."""
    result = hg.compare(hg.guard(loss_and_predictions, has_aux=True), 2.0, X, MASK)
    assert result.ok(), str(result)
    assert result.fixed() >= 1  # the NaN d/dw is the lane the guard fixes
