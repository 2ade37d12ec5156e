"""Workload 4: multi-head attention alone, with QK-norm, masked, gradient.

Sequences are right-padded with zero vectors.  Queries and keys are
L2-normalised per head (QK-norm) and the norm is "made safe" the natural way,
``where(n2 > 0, k * rsqrt(n2), 0)``: padding tokens hit ``rsqrt'(0) = inf`` in
the dead branch, so the plain gradient is NaN.  Scores are masked with
``where(allowed, s, -1e9)`` (causal and key padding).  Unlike the transformer
block (``transformer.py``) there is no MLP and no residual: the dots of the
attention itself dominate, so duplicated forward dots show up here first.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.workloads.base import Workload
from benchmarks.workloads.blocks import (
    allowed_scores,
    masked_token_mean,
    multi_head_attention,
    padded_tokens,
    weight_init,
)

SCALE = 8.0


def _l2norm(z):
    n2 = jnp.sum(z * z, axis=-1, keepdims=True)
    return jnp.where(n2 > 0, z * jax.lax.rsqrt(n2), 0.0)


def _l2norm_dw(z):
    n2 = jnp.sum(z * z, axis=-1, keepdims=True)
    pos = n2 > 0
    return jnp.where(pos, z * jax.lax.rsqrt(jnp.where(pos, n2, 1.0)), 0.0)


def _attention(norm, params, x, tok_mask):
    heads = params["heads"].shape[0]
    o = multi_head_attention(
        params, x, heads, lambda: allowed_scores(tok_mask), qk_norm=norm, scale=SCALE
    )
    return masked_token_mean(jnp.mean(o * o, axis=-1), tok_mask)


def loss(params, x, tok_mask):
    return _attention(_l2norm, params, x, tok_mask)


def loss_dw(params, x, tok_mask):
    return _attention(_l2norm_dw, params, x, tok_mask)


def make_inputs(size, seed=0):
    batch, seq, d, heads = size
    rng = np.random.default_rng(seed)
    w = weight_init(rng)
    params = {
        "wq": w(d, d),
        "wk": w(d, d),
        "wv": w(d, d),
        "wo": w(d, d),
        "heads": jnp.zeros((heads,), jnp.float32),
    }
    x, tok_mask = padded_tokens(rng, batch, seq, d)
    return params, x, tok_mask


WORKLOAD = Workload(
    name="attention",
    description="multi-head attention with QK-norm, causal + padding mask, grad",
    loss=loss,
    loss_dw=loss_dw,
    make_inputs=make_inputs,
    sizes={"tiny": [(2, 8, 16, 2)], "quick": [(4, 128, 128, 4)], "full": [(8, 256, 256, 4)]},
    rtol=1e-4,
    atol=1e-5,
    size_label=lambda s: "B={},T={},D={},H={}".format(*s),
)
