"""Guarded trace time against ``jax.jit`` trace time on real library functions.

Issue 17 item 5: a new user wraps a real library function in ``hlo_guard.guard``
and traces it.  This script prints, per function, the ratio
``jax.jit(hlo_guard.guard(f)).trace(x)`` / ``jax.jit(f).trace(x)`` (median of
interleaved rounds, a fresh function object each trial because ``jit`` and
``guard`` cache per function) and exits non-zero when a ratio exceeds
``--limit`` (default 3x).  It is a script, not a timed unit test.

distrax is not installed in the project's venv (``pip download --no-deps
distrax`` resolves 0.1.9, but it needs tensorflow-probability, which is not
installed either); equinox stands in as the third library.

    python -m benchmarks.trace_cost_libraries [--rounds N] [--limit 3.0]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

import hlo_guard
from benchmarks.library_cases import run_cases, skipped_row


def _numpyro_stick_breaking() -> tuple[Callable[[], Callable[..., Any]], tuple[Any, ...]]:
    from numpyro.distributions.transforms import StickBreakingTransform

    t = StickBreakingTransform()

    def make():
        return lambda x: t.log_abs_det_jacobian(x, t(x))

    return make, (jnp.linspace(-1.0, 1.0, 5),)


def _optax_clip_adam() -> tuple[Callable[[], Callable[..., Any]], tuple[Any, ...]]:
    import optax

    opt = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-3))
    params = {"w": jnp.ones((4, 3)), "b": jnp.zeros(3)}
    state = opt.init(params)

    def make():
        return lambda g: opt.update(g, state, params)[0]

    return make, (params,)


def _optax_losses() -> tuple[Callable[[], Callable[..., Any]], tuple[Any, ...]]:
    import optax

    labels = jax.nn.one_hot(jnp.arange(4) % 3, 3)

    def make():
        return lambda z: (
            optax.softmax_cross_entropy(z, labels).mean()
            + optax.huber_loss(z).mean()
            + optax.safe_norm(z, 1e-6).sum()
        )

    return make, (jnp.linspace(-2.0, 2.0, 12).reshape(4, 3),)


def _equinox_mlp() -> tuple[Callable[[], Callable[..., Any]], tuple[Any, ...]]:
    import equinox as eqx

    mlp = eqx.nn.MLP(8, 2, 16, 2, key=jax.random.PRNGKey(0))

    def make():
        return lambda x: jax.nn.log_softmax(mlp(x))

    return make, (jnp.linspace(-1.0, 1.0, 8),)


CASES: dict[str, Callable[[], tuple[Callable[[], Callable[..., Any]], tuple[Any, ...]]]] = {
    "numpyro StickBreakingTransform log-det-J": _numpyro_stick_breaking,
    "optax clip_by_global_norm+adam update": _optax_clip_adam,
    "optax softmax_xent+huber+safe_norm": _optax_losses,
    "equinox MLP log_softmax": _equinox_mlp,
}


def _seconds(fn: Callable[[], Any]) -> float:
    gc.collect()
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def measure(make: Callable[[], Callable[..., Any]], args: tuple[Any, ...], rounds: int) -> dict:
    """Median jit-trace seconds, plain and guarded, interleaved per round."""
    jax.jit(make()).trace(*args)  # warm the library's own first-use costs
    jax.jit(hlo_guard.guard(make())).trace(*args)
    plain, guarded = [], []
    for _ in range(rounds):
        plain.append(_seconds(lambda: jax.jit(make()).trace(*args)))
        guarded.append(_seconds(lambda: jax.jit(hlo_guard.guard(make())).trace(*args)))
    p, g = statistics.median(plain), statistics.median(guarded)
    return {"plain_s": p, "guarded_s": g, "ratio": g / p}


def run(rounds: int = 7) -> list[dict]:
    return run_cases(CASES, lambda make, args: measure(make, args, rounds))


def render(rows: list[dict], limit: float) -> str:
    lines = ["| function | jit trace | guarded trace | ratio |", "|---|---|---|---|"]
    for r in rows:
        skipped = skipped_row(r, 4)
        if skipped is not None:
            lines.append(skipped)
            continue
        flag = "" if r["ratio"] <= limit else f" (> {limit:g}x)"
        lines.append(
            f"| {r['case']} | {r['plain_s'] * 1e3:.1f} ms | {r['guarded_s'] * 1e3:.1f} ms"
            f" | {r['ratio']:.2f}x{flag} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--limit", type=float, default=3.0)
    a = p.parse_args(argv)
    rows = run(a.rounds)
    print(render(rows, a.limit))
    over = [r for r in rows if r.get("ratio", 0.0) > a.limit]
    if over:
        print(f"{len(over)} function(s) over {a.limit:g}x jax.jit trace time", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
