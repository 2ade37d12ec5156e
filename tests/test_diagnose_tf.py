"""``diagnose`` on TensorFlow: the plain derivative is TF's XLA gradient (eager
TF's is right), classified against the hand-written double where under XLA."""

from __future__ import annotations

import os

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from hlo_guard import diagnose  # noqa: E402
from hlo_guard.errors import GuardUsageError  # noqa: E402

THIS = os.path.basename(__file__)


def f(x):
    return tf.where(x > 0, tf.sqrt(x), 0.0) + tf.sqrt(x + 2.0)  # L-tf


def f_double_where(x):
    return tf.where(x > 0, tf.sqrt(tf.where(x > 0, x, 1.0)), 0.0) + tf.sqrt(x + 2.0)


def xla_gradient(fn, x):
    @tf.function(jit_compile=True)
    def run(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = tf.reduce_sum(fn(x))
        return tape.gradient(y, x)

    return run(x).numpy()


X = tf.constant([-2.0, -1.0, 0.0, 1.0, 4.0])


def lanes_of(report, kind):
    return sorted(int(i[0]) for g in report.groups if g.kind == kind for i in g.indices)


def test_tf_where_sqrt_under_xla_leak_and_genuine():
    plain = xla_gradient(f, X)
    hand = xla_gradient(f_double_where, X)
    want_leak = np.flatnonzero(~np.isfinite(plain) & np.isfinite(hand)).tolist()
    want_genuine = np.flatnonzero(~np.isfinite(hand)).tolist()
    assert want_leak == [1, 2] and want_genuine == [0]
    r = diagnose(f, X)
    assert r.framework == "tensorflow"
    assert lanes_of(r, "leak") == want_leak and lanes_of(r, "genuine") == want_genuine
    causes = [c for g in r.groups if g.kind == "leak" for c in g.causes]
    assert any(c["primitive"].startswith("Sqrt") for c in causes)
    line = [i for i, s in enumerate(open(__file__), 1) if s.rstrip().endswith("# L-tf")][0]
    assert any(f"{THIS}:{line}" in c["location"] for c in causes)
    assert any(sel[0].startswith("SelectV2") for c in causes for sel in c["selections"])
    assert r.summary().startswith("3 non-finite lane(s) in d/dx: 2 leak through SelectV2")


def test_tf_finite_and_bad_input():
    r = diagnose(lambda x: tf.sin(x), X)
    assert r.finite and "finite in all 5 lane(s)" in r.summary()
    with pytest.raises(GuardUsageError, match="reverse"):
        diagnose(f, X, mode="forward")
    with pytest.raises(GuardUsageError, match="dtype"):
        diagnose(lambda n: tf.sqrt(tf.cast(n, tf.float32)), tf.constant([1, 2]))
