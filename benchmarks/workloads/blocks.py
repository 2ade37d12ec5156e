"""Building blocks the attention and transformer workloads share: padded
token batches, scaled weight matrices, causal + padding masks, multi-head
attention and the masked per-token mean.

Each workload still writes its own norm (the singular operation under
``where`` that the benchmark is about) and its own model; only what would
otherwise be copied between them lives here.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

#: the score given to masked-out keys (finite: a ``-inf`` would make the
#: softmax of a fully masked row NaN in every variant alike)
NEG = -1e9


def weight_init(rng):
    """``w(*shape)``: a float32 matrix with fan-in scaling, from ``rng``."""

    def w(*shape):
        return jnp.asarray(rng.normal(size=shape) / np.sqrt(shape[0]), jnp.float32)

    return w


def padded_tokens(rng, batch: int, seq: int, d: int):
    """(x, tok_mask): right-padded sequences of lengths in [seq/2, seq], the
    first one padded for sure; padding tokens are zero vectors, which is what
    makes an epsilon-free norm's ``rsqrt'(0)`` appear in the dead branch."""
    lengths = rng.integers(seq // 2, seq + 1, size=batch)
    lengths[0] = seq // 2
    tok_mask = np.arange(seq)[None, :] < lengths[:, None]
    x = rng.normal(size=(batch, seq, d)).astype(np.float32)
    x[~tok_mask] = 0.0
    return jnp.asarray(x), jnp.asarray(tok_mask)


def allowed_scores(tok_mask):
    """[batch, 1, query, key]: causal, and never attending to padding keys."""
    t = tok_mask.shape[1]
    causal = jnp.tril(jnp.ones((t, t), bool))
    return causal[None, None] & tok_mask[:, None, None, :]


def multi_head_attention(p, h, heads: int, mask, qk_norm=None, scale=None):
    """Attention of ``h`` with projections ``p['wq'|'wk'|'wv'|'wo']``; scores
    masked with ``where(allowed, s, NEG)``.  ``mask`` is ``allowed`` itself
    (shared by several layers) or a zero-argument function that builds it where
    the scores are masked.  ``qk_norm`` normalises queries and keys per head;
    ``scale`` multiplies the scores (default ``1/sqrt(d_head)``)."""
    b, t, d = h.shape
    dh = d // heads
    qk = qk_norm if qk_norm is not None else (lambda z: z)
    q = qk((h @ p["wq"]).reshape(b, t, heads, dh))
    k = qk((h @ p["wk"]).reshape(b, t, heads, dh))
    v = (h @ p["wv"]).reshape(b, t, heads, dh)
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k)
    s = s / np.sqrt(dh) if scale is None else scale * s
    allowed = mask() if callable(mask) else mask
    a = jax.nn.softmax(jnp.where(allowed, s, NEG), axis=-1)
    return jnp.einsum("bhqk,bkhd->bqhd", a, v).reshape(b, t, d) @ p["wo"]


def masked_token_mean(per_tok, tok_mask):
    """The mean of ``per_tok`` over real tokens, with ``where``."""
    return jnp.sum(jnp.where(tok_mask, per_tok, 0.0)) / jnp.maximum(jnp.sum(tok_mask), 1)
