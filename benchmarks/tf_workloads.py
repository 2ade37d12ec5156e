"""Workload 5: TensorFlow -- workloads 1 and 3, guarded XLA vs unguarded XLA vs eager.

The TF seed bug: under ``tf.function(jit_compile=True)`` the gradient of a
``tf.where``-masked singular branch is NaN, while eager kernels special-case a
zero upstream gradient for a few ops (Sqrt, Rsqrt, Reciprocal) only.  Variants:

* ``guarded_xla``   -- ``tf.function(jit_compile=True)`` around a tape over
  ``hlo_guard.tf.guard(loss)``;
* ``unguarded_xla`` -- the same around the plain loss (NaN gradients);
* ``double_where_xla`` -- the hand-written fix under XLA (the oracle);
* ``eager``         -- the plain loss and tape, no ``tf.function``.

Everything here degrades to a "pending" row when ``hlo_guard.tf`` is not
importable yet or fails, so the JAX benchmarks never depend on it.
"""

from __future__ import annotations

import os
import statistics
import time
import traceback
from collections.abc import Callable
from typing import Any

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from benchmarks.hlo_stats import parse_hlo  # noqa: E402
from benchmarks.timing import time_alternating  # noqa: E402

TF_VARIANTS = ("guarded_xla", "unguarded_xla", "double_where_xla", "eager")
LR = 0.1


def _tf():
    import tensorflow as tf

    # fresh tf.functions per compile trial are deliberate: silence the retracing warning
    tf.get_logger().setLevel("ERROR")
    return tf


def load_tf_guard():
    """``hlo_guard.tf.guard`` or the reason it is not usable."""
    try:
        from hlo_guard import tf as hg_tf

        return hg_tf.guard, None
    except Exception as exc:  # ImportError, or a half-built module
        return None, f"{type(exc).__name__}: {exc}"


# -- workload 1 in TF ---------------------------------------------------------------


def elementwise_loss(x):
    tf = _tf()
    pos = x > 0
    nz = tf.not_equal(x, 0.0)
    y = (
        tf.where(pos, tf.sqrt(x), 0.0)
        + tf.where(pos, tf.math.log(x), 0.0)
        + tf.where(nz, 1.0 / x, 0.0)
    )
    return tf.reduce_sum(y)


def elementwise_loss_dw(x):
    tf = _tf()
    pos = x > 0
    nz = tf.not_equal(x, 0.0)
    xp = tf.where(pos, x, 1.0)
    xn = tf.where(nz, x, 1.0)
    y = (
        tf.where(pos, tf.sqrt(xp), 0.0)
        + tf.where(pos, tf.math.log(xp), 0.0)
        + tf.where(nz, 1.0 / xn, 0.0)
    )
    return tf.reduce_sum(y)


def elementwise_inputs(n, seed=0):
    tf = _tf()
    rng = np.random.default_rng(seed)
    x = rng.integers(-20, 21, size=int(n)).astype(np.float32) / 10.0
    return (tf.constant(x),)


def elementwise_grad_step(loss):
    tf = _tf()

    def step(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = loss(x)
        return tape.gradient(y, x)

    return step


# -- workload 3 in TF ---------------------------------------------------------------


def _mlp_head(z, w2, b2, labels, mask):
    tf = _tf()
    logits = tf.matmul(z, w2) + b2
    nll = tf.reduce_logsumexp(logits, axis=-1) - tf.gather(logits, labels, axis=1, batch_dims=1)
    per_row = tf.where(mask, nll, 0.0)
    return tf.reduce_sum(per_row) / tf.maximum(tf.reduce_sum(tf.cast(mask, tf.float32)), 1.0)


def mlp_loss(w1, w2, b2, x, labels, mask):
    tf = _tf()
    h = tf.tanh(tf.matmul(x, w1))
    n = tf.sqrt(tf.reduce_sum(h * h, axis=-1, keepdims=True))
    z = tf.where(n > 0, h / n, 0.0)
    return _mlp_head(z, w2, b2, labels, mask)


def mlp_loss_dw(w1, w2, b2, x, labels, mask):
    tf = _tf()
    h = tf.tanh(tf.matmul(x, w1))
    ss = tf.reduce_sum(h * h, axis=-1, keepdims=True)
    pos = ss > 0
    n = tf.sqrt(tf.where(pos, ss, 1.0))
    z = tf.where(pos, h / n, 0.0)
    return _mlp_head(z, w2, b2, labels, mask)


def mlp_inputs(size, seed=0):
    tf = _tf()
    batch, d_in, hidden, classes = size
    rng = np.random.default_rng(seed)
    w1 = rng.normal(size=(d_in, hidden)) / np.sqrt(d_in)
    w2 = rng.normal(size=(hidden, classes)) / np.sqrt(hidden)
    x = rng.normal(size=(batch, d_in)).astype(np.float32)
    mask = np.ones(batch, bool)
    mask[-max(1, batch // 8) :] = False
    x[~mask] = 0.0
    labels = rng.integers(0, classes, size=batch).astype(np.int32)
    return (
        tf.constant(w1, tf.float32),
        tf.constant(w2, tf.float32),
        tf.zeros((classes,), tf.float32),
        tf.constant(x),
        tf.constant(labels),
        tf.constant(mask),
    )


def mlp_grad_step(loss):
    tf = _tf()

    def step(w1, w2, b2, x, labels, mask):
        params = [w1, w2, b2]
        with tf.GradientTape() as tape:
            for p in params:
                tape.watch(p)
            y = loss(w1, w2, b2, x, labels, mask)
        grads = tape.gradient(y, params)
        return [p - LR * g for p, g in zip(params, grads)]

    return step


TF_WORKLOADS = {
    "elementwise": dict(
        loss=elementwise_loss,
        loss_dw=elementwise_loss_dw,
        inputs=elementwise_inputs,
        step=elementwise_grad_step,
        sizes={"tiny": [64], "quick": [10**6], "full": [10**6, 10**7]},
        label=lambda n: f"n=1e{len(str(n)) - 1}" if str(n).strip("0") == "1" else f"n={n}",
        rtol=1e-5,
        atol=1e-6,
    ),
    "mlp": dict(
        loss=mlp_loss,
        loss_dw=mlp_loss_dw,
        inputs=mlp_inputs,
        step=mlp_grad_step,
        sizes={
            "tiny": [(16, 8, 16, 4)],
            "quick": [(256, 256, 512, 10)],
            "full": [(1024, 512, 1024, 10)],
        },
        label=lambda s: "B={},D={},H={},C={}".format(*s),
        rtol=1e-5,
        atol=1e-6,
    ),
}


def variant_fns(spec, guard, kind: str) -> dict[str, Callable]:
    """Fresh callables per variant; ``kind`` is "forward" or "gradient"."""
    tf = _tf()
    loss, loss_dw = spec["loss"], spec["loss_dw"]
    wrap = (lambda f: f) if kind == "forward" else spec["step"]
    return {
        "guarded_xla": tf.function(wrap(guard(loss)), jit_compile=True),
        "unguarded_xla": tf.function(wrap(lambda *a: loss(*a)), jit_compile=True),
        "double_where_xla": tf.function(wrap(lambda *a: loss_dw(*a)), jit_compile=True),
        "eager": wrap(lambda *a: loss(*a)),
    }


def _np_leaves(x) -> list[np.ndarray]:
    if isinstance(x, (list, tuple)):
        return [np.asarray(v) for v in x]
    return [np.asarray(x)]


def check(name: str, size, guard) -> dict[str, Any]:
    spec = TF_WORKLOADS[name]
    args = spec["inputs"](size, 0)
    fwd = {k: f(*args) for k, f in variant_fns(spec, guard, "forward").items()}
    grads = {k: _np_leaves(f(*args)) for k, f in variant_fns(spec, guard, "gradient").items()}
    np.testing.assert_allclose(
        np.asarray(fwd["guarded_xla"]),
        np.asarray(fwd["unguarded_xla"]),
        rtol=1e-6,
        err_msg=f"tf {name}: forward changed",
    )
    for g, dw in zip(grads["guarded_xla"], grads["double_where_xla"], strict=True):
        assert np.all(np.isfinite(dw)), f"tf {name}: double-where gradient not finite"
        assert np.all(np.isfinite(g)), f"tf {name}: guarded gradient not finite"
        np.testing.assert_allclose(
            g,
            dw,
            rtol=spec["rtol"],
            atol=spec["atol"],
            err_msg=f"tf {name}: guarded gradient != double-where",
        )
    nonfinite = {
        k: int(sum(np.sum(~np.isfinite(v)) for v in grads[k])) for k in ("unguarded_xla", "eager")
    }
    return {"size": spec["label"](size), "gradient_equal": True, "nonfinite_lanes": nonfinite}


def measure(
    name: str, size, guard, *, rounds: int, compile_trials: int, target_sample_s: float = 0.05
) -> dict[str, Any]:
    """Run-time ratios (TF on CPU executes synchronously, so a returned tensor
    is a finished one) and first-call ratios of fresh functions."""
    spec = TF_WORKLOADS[name]
    args = spec["inputs"](size, 0)
    out: dict[str, Any] = {
        "workload": name,
        "size": spec["label"](size),
        "check": check(name, size, guard),
    }
    for kind in ("forward", "gradient"):
        fns = variant_fns(spec, guard, kind)
        # compile time = first call of a fresh tf.function: trace + (guard rewrite) + XLA
        first = {"guarded_xla": [], "unguarded_xla": []}
        for r in range(compile_trials):
            order = list(first) if r % 2 == 0 else list(first)[::-1]
            for k in order:
                f = variant_fns(spec, guard, kind)[k]
                t0 = time.perf_counter()
                f(*args)
                first[k].append(time.perf_counter() - t0)
        hlo = {}
        for k in ("guarded_xla", "unguarded_xla", "double_where_xla"):
            try:
                text = fns[k].experimental_get_compiler_ir(*args)(stage="optimized_hlo")
                hlo[k] = parse_hlo(text).as_json()
            except Exception as exc:  # informational only
                hlo[k] = {"error": f"{type(exc).__name__}: {exc}"}
        samples = time_alternating(
            {k: (fns[k], args) for k in TF_VARIANTS}, rounds=rounds, target_sample_s=target_sample_s
        )
        out[kind] = {
            "new_values_ratio": _new_values_ratio(fns, spec, size),
            "time": samples.as_json(),
            "ratio": {
                den: samples.ratio("guarded_xla", den)
                for den in ("unguarded_xla", "double_where_xla", "eager")
            },
            "first_call_s": {k: statistics.median(v) for k, v in first.items()},
            "first_call_ratio": statistics.median(first["guarded_xla"])
            / statistics.median(first["unguarded_xla"]),
            "hlo": hlo,
        }
    return out


def _new_values_ratio(fns, spec, size, calls: int = 3) -> dict[str, float]:
    """Per compiled variant: a call with new input values (same shapes) ÷ a
    repeated call.  About 1 unless XLA compiles again for every new value --
    which TF does when a step's arguments end up folded into constants (a
    nested function's gradient, see ``hlo_guard.tf.xla_gradient``); a
    benchmark that repeats one input would never see it."""
    out = {}
    for k in ("guarded_xla", "unguarded_xla"):
        f = fns[k]
        f(*spec["inputs"](size, 0))
        steady, fresh = [], []
        for seed in range(1, calls + 1):
            args = spec["inputs"](size, seed)
            t0 = time.perf_counter()
            f(*args)
            fresh.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            f(*args)
            steady.append(time.perf_counter() - t0)
        out[k] = statistics.median(fresh) / statistics.median(steady)
    return out


def run_tf(mode: str, rounds: int, compile_trials: int) -> dict[str, Any]:
    """All TF rows, or a pending marker with the reason."""
    guard, why = load_tf_guard()
    if guard is None:
        return {"status": "pending", "reason": f"hlo_guard.tf not available ({why})"}
    rows = []
    for name, spec in TF_WORKLOADS.items():
        for size in spec["sizes"][mode]:
            try:
                rows.append(
                    measure(name, size, guard, rounds=rounds, compile_trials=compile_trials)
                )
            except Exception as exc:
                rows.append(
                    {
                        "workload": name,
                        "size": spec["label"](size),
                        "status": "pending",
                        "reason": f"hlo_guard.tf failed: {type(exc).__name__}: {exc}",
                        "traceback": traceback.format_exc(limit=5),
                    }
                )
    return {"status": "ok", "rows": rows}
