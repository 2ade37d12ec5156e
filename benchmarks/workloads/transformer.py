"""Workload 5: a transformer-style block -- RMS norm, masked attention, gradient.

Sequences are right-padded; padding tokens are zero vectors, and an input
projection (no bias) keeps them zero.  The RMS norm is
written without an epsilon and "made safe" with ``where(ms > 0, x * rsqrt(ms), 0)``,
so padding tokens hit ``rsqrt'(0) = inf`` in the dead branch and the plain
gradient is NaN.  Attention masks its scores with ``where(mask, s, -1e9)``
(causal and key padding): those dead lanes have finite derivatives, so they
show what the guard costs where it is not needed.  The loss averages over the
real tokens with ``where``.
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


def _rms_norm(x, g):
    ms = jnp.mean(x * x, axis=-1, keepdims=True)
    return jnp.where(ms > 0, x * jax.lax.rsqrt(ms), 0.0) * g


def _rms_norm_dw(x, g):
    ms = jnp.mean(x * x, axis=-1, keepdims=True)
    pos = ms > 0
    return jnp.where(pos, x * jax.lax.rsqrt(jnp.where(pos, ms, 1.0)), 0.0) * g


def _block(norm, params, x, tok_mask):
    heads = params["heads"].shape[0]
    x = x @ params["w_in"]
    h = norm(x, params["g1"])
    y = x + multi_head_attention(params, h, heads, lambda: allowed_scores(tok_mask))
    y = y + jax.nn.gelu(norm(y, params["g2"]) @ params["w_up"]) @ params["w_down"]
    return masked_token_mean(jnp.mean(y * y, axis=-1), tok_mask)


def loss(params, x, tok_mask):
    return _block(_rms_norm, params, x, tok_mask)


def loss_dw(params, x, tok_mask):
    return _block(_rms_norm_dw, params, x, tok_mask)


def make_inputs(size, seed=0):
    batch, seq, d, heads = size
    rng = np.random.default_rng(seed)
    w = weight_init(rng)
    params = {
        "g1": jnp.ones((d,), jnp.float32),
        "g2": jnp.ones((d,), jnp.float32),
        "w_in": w(d, d),
        "wq": w(d, d),
        "wk": w(d, d),
        "wv": w(d, d),
        "wo": w(d, d),
        "w_up": w(d, 4 * d),
        "w_down": w(4 * d, d),
        "heads": jnp.zeros((heads,), jnp.float32),
    }
    x, tok_mask = padded_tokens(rng, batch, seq, d)
    return params, x, tok_mask


WORKLOAD = Workload(
    name="transformer_block",
    description="transformer block: RMS norm, masked attention, MLP, grad",
    loss=loss,
    loss_dw=loss_dw,
    make_inputs=make_inputs,
    sizes={"tiny": [(2, 8, 16, 2)], "quick": [(4, 128, 128, 4)], "full": [(8, 256, 256, 4)]},
    rtol=1e-4,
    atol=1e-5,
    size_label=lambda s: "B={},T={},D={},H={}".format(*s),
)
