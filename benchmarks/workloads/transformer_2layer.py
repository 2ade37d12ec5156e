"""Workload 6: a two-layer pre-LayerNorm transformer with a masked
cross-entropy loss -- the "real model" shape of issue 11.

Layer norm is written without an epsilon and made safe with
``where(var > 0, (x - mu) * rsqrt(var), 0)``; padding tokens are zero vectors
(no input bias), so their variance is 0 and the plain gradient is NaN.  The
attention scores are masked with ``where`` (causal and key padding), the GELU
MLP is residual, and the loss is a next-token cross entropy averaged over the
real tokens with ``where``.  Differs from ``transformer_block`` (one block,
RMS norm, squared-output loss) in depth, the norm's mean subtraction, and the
``log_softmax`` loss.
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

LAYERS = 2


def _layer_norm(x):
    mu = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean((x - mu) ** 2, axis=-1, keepdims=True)
    return jnp.where(var > 0, (x - mu) * jax.lax.rsqrt(var), 0.0)


def _layer_norm_dw(x):
    mu = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean((x - mu) ** 2, axis=-1, keepdims=True)
    pos = var > 0
    return jnp.where(pos, (x - mu) * jax.lax.rsqrt(jnp.where(pos, var, 1.0)), 0.0)


def _model(norm, params, x, targets, tok_mask):
    heads = params["heads"].shape[0]
    allowed = allowed_scores(tok_mask)
    h = x @ params["w_in"]
    for p in params["layers"]:
        h = h + multi_head_attention(p, norm(h) * p["g1"], heads, allowed)
        h = h + jax.nn.gelu(norm(h) * p["g2"] @ p["w_up"]) @ p["w_down"]
    logits = (norm(h) * params["g_out"]) @ params["w_vocab"]
    logp = jax.nn.log_softmax(logits, axis=-1)
    nll = -jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
    return masked_token_mean(nll, tok_mask)


def loss(params, x, targets, tok_mask):
    return _model(_layer_norm, params, x, targets, tok_mask)


def loss_dw(params, x, targets, tok_mask):
    return _model(_layer_norm_dw, params, x, targets, tok_mask)


def make_inputs(size, seed=0):
    batch, seq, d, heads, vocab = size
    rng = np.random.default_rng(seed)
    w = weight_init(rng)

    layers = [
        {
            "g1": jnp.ones((d,), jnp.float32),
            "g2": jnp.ones((d,), jnp.float32),
            "wq": w(d, d),
            "wk": w(d, d),
            "wv": w(d, d),
            "wo": w(d, d),
            "w_up": w(d, 4 * d),
            "w_down": w(4 * d, d),
        }
        for _ in range(LAYERS)
    ]
    params = {
        "w_in": w(d, d),
        "layers": layers,
        "g_out": jnp.ones((d,), jnp.float32),
        "w_vocab": w(d, vocab),
        "heads": jnp.zeros((heads,), jnp.float32),
    }
    x, tok_mask = padded_tokens(rng, batch, seq, d)
    targets = rng.integers(0, vocab, size=(batch, seq)).astype(np.int32)
    return params, x, jnp.asarray(targets), tok_mask


WORKLOAD = Workload(
    name="transformer_2layer",
    description="2-layer pre-LN transformer, masked attention, masked cross entropy, grad",
    loss=loss,
    loss_dw=loss_dw,
    make_inputs=make_inputs,
    sizes={
        "tiny": [(2, 8, 16, 2, 11)],
        "quick": [(4, 64, 128, 4, 256)],
        "full": [(8, 128, 256, 4, 1024)],
    },
    rtol=1e-4,
    atol=1e-5,
    size_label=lambda s: "B={},T={},D={},H={},V={}".format(*s),
)
