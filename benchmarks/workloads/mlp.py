"""Workload 3: a plain-JAX MLP training step with an L2-normalise layer and a
masked loss.

The batch is padded: padding rows are all-zero inputs with ``mask = False``.
The hidden layer is L2-normalised the way people write it "safely",
``where(n > 0, h / n, 0)`` with ``n = sqrt(sum(h^2))`` -- which is exactly the
trap: for a zero row ``sqrt'(0) = inf`` and ``d(h/n)/dn = 0/0``, so the plain
gradient of every weight is NaN as soon as one padding row exists.  The loss
(The activation is ``tanh``: a ``relu`` would hide the NaN by accident, its
derivative selects on ``h > 0`` and the zero rows have ``h = 0``.)  The loss
is a softmax cross-entropy averaged over the real rows with ``where``.
The gradient step is a full SGD update, what a training loop compiles.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.workloads.base import Workload

LR = 0.1


def _head(z, params, labels, mask):
    logits = z @ params["w2"] + params["b2"]
    nll = (
        jax.nn.logsumexp(logits, axis=-1)
        - jnp.take_along_axis(logits, labels[:, None], axis=-1)[:, 0]
    )
    per_row = jnp.where(mask, nll, 0.0)
    return jnp.sum(per_row) / jnp.maximum(jnp.sum(mask), 1)


def loss(params, x, labels, mask):
    h = jnp.tanh(x @ params["w1"])  # zero rows stay zero (no bias)
    n = jnp.sqrt(jnp.sum(h * h, axis=-1, keepdims=True))  # safe-norm, the usual way
    z = jnp.where(n > 0, h / n, 0.0)
    return _head(z, params, labels, mask)


def loss_dw(params, x, labels, mask):
    h = jnp.tanh(x @ params["w1"])
    ss = jnp.sum(h * h, axis=-1, keepdims=True)
    pos = ss > 0
    n = jnp.sqrt(jnp.where(pos, ss, 1.0))
    z = jnp.where(pos, h / n, 0.0)
    return _head(z, params, labels, mask)


def sgd_step(loss_fn):
    g = jax.grad(loss_fn)

    def step(params, x, labels, mask):
        grads = g(params, x, labels, mask)
        return jax.tree_util.tree_map(lambda p, d: p - LR * d, params, grads)

    return step


def make_inputs(size, seed=0):
    batch, d_in, hidden, classes = size
    rng = np.random.default_rng(seed)
    params = {
        "w1": jnp.asarray(rng.normal(size=(d_in, hidden)) / np.sqrt(d_in), jnp.float32),
        "w2": jnp.asarray(rng.normal(size=(hidden, classes)) / np.sqrt(hidden), jnp.float32),
        "b2": jnp.zeros((classes,), jnp.float32),
    }
    x = rng.normal(size=(batch, d_in)).astype(np.float32)
    mask = np.ones(batch, bool)
    mask[-max(1, batch // 8) :] = False  # last eighth is padding
    x[~mask] = 0.0
    labels = rng.integers(0, classes, size=batch).astype(np.int32)
    return params, jnp.asarray(x), jnp.asarray(labels), jnp.asarray(mask)


WORKLOAD = Workload(
    name="mlp",
    description="MLP SGD step, L2-normalise layer, masked loss",
    loss=loss,
    loss_dw=loss_dw,
    make_inputs=make_inputs,
    step=sgd_step,
    sizes={
        "tiny": [(16, 8, 16, 4)],
        "quick": [(256, 256, 512, 10)],
        "full": [(1024, 512, 1024, 10)],
    },
    size_label=lambda s: "B={},D={},H={},C={}".format(*s),
)
