"""tensorflow #118674: the gradient of where(x > 0, sqrt(x), 0) under XLA.

Eager TF gives [0, 0, 0.5, 0.25]; the same program under
tf.function(jit_compile=True) gives [nan, nan, 0.5, 0.25].  With
hlo_guard.tf.guarded_function the compiled gradient is the eager (and
double-where) one.  Run:  python examples/tf_where_sqrt.py
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import sys  # noqa: E402

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import hlo_guard.tf as hg  # noqa: E402


def f(x):
    return tf.where(x > 0, tf.sqrt(x), 0.0)


def double_where(x):
    """The hand-written fix, the oracle the guarded gradient must equal."""
    return tf.where(x > 0, tf.sqrt(tf.where(x > 0, x, 1.0)), 0.0)


def xla_gradient(fn, x):
    @tf.function(jit_compile=True)
    def run(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = tf.reduce_sum(fn(x))
        return tape.gradient(y, x)

    return run(x).numpy()


def eager_gradient(fn, x):
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = tf.reduce_sum(fn(x))
    return tape.gradient(y, x).numpy()


def main():
    x = tf.constant([-1.0, 0.0, 1.0, 4.0])
    guarded = hg.guarded_function(f)
    print(f"x                          {x.numpy()}")
    print(f"eager TF gradient          {eager_gradient(f, x)}")
    print(f"plain XLA gradient         {xla_gradient(f, x)}")
    got = xla_gradient(guarded, x)
    expected = xla_gradient(double_where, x)
    print(f"guarded XLA gradient       {got}")
    print(f"double-where XLA gradient  {expected}")
    print()
    print(hg.report(guarded, x).to_text())
    hlo = hg.compiler_ir(guarded, x, stage="optimized_hlo", gradient=True)
    print(
        f"\noptimized HLO of the guarded gradient: {len(hlo.splitlines())} lines, "
        f"{hlo.count(' select(')} select(s)"
    )
    if not np.array_equal(got, expected):
        print("MISMATCH: guarded gradient differs from the double-where oracle")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
