"""What the guard adds to the gradient of ordinary relu networks.

The bench workloads are chosen to *have* dead lanes (their MLP uses ``tanh``
on purpose); this script looks at the other side: a network a user wraps in
``guarded_jit`` although it has no dead-lane bug, where every guard is cost.
It prints, per network, the guard sites ``explain`` lists and the optimized
HLO of ``jax.jit(jax.grad(loss))``, guarded against unguarded (instruction
and ``select`` counts): a count, not a time, so one run on a loaded machine
is exact.

* an Equinox MLP (depth 8, width 128) trained on its parameters with a
  one-hot cross-entropy: each relu's operand carries a live tangent;
* a two-layer relu MLP whose loss picks the label's log-probability with
  ``take_along_axis`` (Equinox's CNN tutorial writes it this way): the gather
  leaves the other logits dead, and ``log_softmax`` revives every row, which
  the analysis knows because the gather reads a lane of every row
  (``Liveness.covered``; benchmarks/RESULTS.md, seventeenth session);
* the same MLP with the hand-written ``logp[jnp.arange(B), labels]``: the
  row index is an ``iota`` the analysis reads (eighteenth session);
* a Flax linen CNN (SAME 3x3 convs, ``avg_pool``) with optax's
  integer-label cross-entropy: windows that read every lane drop none.

    python -m benchmarks.relu_networks
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

import hlo_guard
from benchmarks.hlo_stats import parse_hlo
from benchmarks.library_cases import run_cases, skipped_row

BATCH, FEATURES, HIDDEN, CLASSES = 32, 64, 128, 10


def _data():
    kx, ky = jax.random.split(jax.random.PRNGKey(1))
    x = jax.random.normal(kx, (BATCH, FEATURES))
    y = jax.random.randint(ky, (BATCH,), 0, CLASSES)
    return x, y


def _equinox_mlp() -> tuple[Callable[..., Any], tuple[Any, ...]]:
    import equinox as eqx

    model = eqx.nn.MLP(FEATURES, CLASSES, HIDDEN, 8, key=jax.random.PRNGKey(0))
    params, static = eqx.partition(model, eqx.is_array)

    def loss(params, x, y):
        logp = jax.nn.log_softmax(jax.vmap(eqx.combine(params, static))(x))
        return -jnp.mean(jnp.sum(logp * jax.nn.one_hot(y, CLASSES), -1))

    return loss, (params, *_data())


def _relu_mlp(pick) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """A two-layer relu MLP whose cross-entropy reads the label's
    log-probability with ``pick(logp, labels)``."""
    k = jax.random.split(jax.random.PRNGKey(0), 3)
    params = [
        jax.random.normal(k[0], (FEATURES, HIDDEN)) * 0.1,
        jnp.zeros(HIDDEN),
        jax.random.normal(k[1], (HIDDEN, HIDDEN)) * 0.1,
        jnp.zeros(HIDDEN),
        jax.random.normal(k[2], (HIDDEN, CLASSES)) * 0.1,
    ]

    def loss(p, x, y):
        h = jax.nn.relu(x @ p[0] + p[1])
        h = jax.nn.relu(h @ p[2] + p[3])
        return -jnp.mean(pick(jax.nn.log_softmax(h @ p[4]), y))

    return loss, (params, *_data())


def _take_along_axis_mlp() -> tuple[Callable[..., Any], tuple[Any, ...]]:
    return _relu_mlp(lambda logp, y: jnp.take_along_axis(logp, y[:, None], axis=1))


def _arange_index_mlp() -> tuple[Callable[..., Any], tuple[Any, ...]]:
    return _relu_mlp(lambda logp, y: logp[jnp.arange(logp.shape[0]), y])


def _flax_cnn() -> tuple[Callable[..., Any], tuple[Any, ...]]:
    import flax.linen as nn
    import optax

    class CNN(nn.Module):
        @nn.compact
        def __call__(self, x):
            x = nn.avg_pool(nn.relu(nn.Conv(8, (3, 3))(x)), (2, 2), (2, 2))
            x = nn.relu(nn.Conv(16, (3, 3))(x)).reshape((x.shape[0], -1))
            return nn.Dense(CLASSES)(nn.relu(nn.Dense(HIDDEN)(x)))

    model = CNN()
    x = jax.random.normal(jax.random.PRNGKey(2), (BATCH, 12, 12, 1))
    _, y = _data()
    params = model.init(jax.random.PRNGKey(0), x)

    def loss(params, x, y):
        logits = model.apply(params, x)
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    return loss, (params, x, y)


CASES = {
    "Equinox MLP depth 8, one-hot cross-entropy": _equinox_mlp,
    "2-layer relu MLP, take_along_axis(log_softmax)": _take_along_axis_mlp,
    "2-layer relu MLP, logp[arange(B), labels]": _arange_index_mlp,
    "Flax linen CNN (SAME convs, avg_pool), optax integer-label cross-entropy": _flax_cnn,
}


def _gradient_hlo(fn, args) -> tuple[int, int]:
    stats = parse_hlo(jax.jit(jax.grad(fn)).lower(*args).compile().as_text())
    return sum(stats.opcodes.values()), stats.opcodes["select"]


def measure(loss, args) -> dict:
    return {
        "sites": len(hlo_guard.explain(loss, *args).guards),
        "guarded": _gradient_hlo(hlo_guard.guard(loss), args),
        "plain": _gradient_hlo(loss, args),
    }


def run() -> list[dict]:
    return run_cases(CASES, measure)


def render(rows: list[dict]) -> str:
    lines = [
        "| network | guard sites | grad HLO instructions g / u | grad selects g / u |",
        "|---|---|---|---|",
    ]
    for r in rows:
        skipped = skipped_row(r, 4)
        if skipped is not None:
            lines.append(skipped)
            continue
        (gi, gs), (ui, us) = r["guarded"], r["plain"]
        lines.append(f"| {r['case']} | {r['sites']} | {gi} / {ui} ({gi / ui:.2f}x) | {gs} / {us} |")
    return "\n".join(lines)


def main() -> int:
    print(f"jax {jax.__version__}")
    print(render(run()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
