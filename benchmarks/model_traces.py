"""Guarded trace time against plain trace time on the benchmark's models.

``trace_scaling.py`` measures the guard on a synthetic chain and
``trace_cost_libraries.py`` on small library functions; this script measures
what a user of the workloads' models pays when tracing, at their tiny sizes
(where tracing, not compiling, is what a first call costs):

* forward: ``jax.make_jaxpr(guard(loss))`` ÷ ``jax.make_jaxpr(loss)`` -- the
  program ``guarded_jit`` stages (by surgery on jax 0.11+), which
  ``jax.grad(guarded_jit(loss))`` then differentiates;
* gradient: ``jax.make_jaxpr(jax.grad(guard(loss)))`` ÷
  ``jax.make_jaxpr(jax.grad(loss))`` -- ``jax.jit(jax.grad(guard(loss)))``,
  where the guard runs under JAX's linearize trace (the interpreter).

Fresh function objects each trial (``make_jaxpr`` and ``guard`` cache per
function), plain and guarded interleaved, the median of ``--rounds``; earlier
objects are frozen out of the cyclic GC as in ``trace_scaling.py``.

    python -m benchmarks.model_traces [--rounds N] [--only NAME ...]
"""

from __future__ import annotations

import argparse
import gc
import importlib
import statistics
import time

import jax

import hlo_guard

#: workload name -> its module under ``benchmarks.workloads``
WORKLOADS = {
    "lennard_jones": "lennard_jones",
    "mlp": "mlp",
    "attention": "attention",
    "transformer_block": "transformer",
    "transformer_2layer": "transformer_2layer",
}


def _seconds(fn) -> float:
    gc.collect()
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def measure(name: str, rounds: int) -> dict:
    workload = importlib.import_module(f"benchmarks.workloads.{WORKLOADS[name]}").WORKLOAD
    args = workload.make_inputs(workload.sizes["tiny"][0])

    def fresh():
        return lambda *a: workload.loss(*a)

    variants = {
        "forward": (
            lambda: jax.make_jaxpr(fresh()),
            lambda: jax.make_jaxpr(hlo_guard.guard(fresh())),
        ),
        "gradient": (
            lambda: jax.make_jaxpr(jax.grad(fresh())),
            lambda: jax.make_jaxpr(jax.grad(hlo_guard.guard(fresh()))),
        ),
    }
    row: dict = {"workload": name}
    for kind, (plain, guarded) in variants.items():
        # warm JAX's own caches of jnp's wrappers
        plain()(*args)
        guarded()(*args)
        p, g = [], []
        for r in range(rounds):
            pair = [(p, plain), (g, guarded)]
            for samples, make in pair if r % 2 == 0 else pair[::-1]:
                traced = make()
                samples.append(_seconds(lambda: traced(*args)))
        row[kind] = (statistics.median(p), statistics.median(g))
    return row


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--only", nargs="*", default=list(WORKLOADS), choices=list(WORKLOADS))
    opts = parser.parse_args(argv)
    gc.collect()
    gc.freeze()
    try:
        rows = [measure(name, opts.rounds) for name in opts.only]
    finally:
        gc.unfreeze()
    print(f"jax {jax.__version__}, tiny sizes, median of {opts.rounds} interleaved rounds")
    print(
        "| workload | forward: plain / guarded (ms) | ratio | gradient: plain / guarded (ms) | ratio |"
    )
    print("|---|---|---|---|---|")
    for row in rows:
        (fp, fg), (gp, gg) = row["forward"], row["gradient"]
        print(
            f"| {row['workload']} | {fp * 1e3:.1f} / {fg * 1e3:.1f} | {fg / fp:.2f}x "
            f"| {gp * 1e3:.1f} / {gg * 1e3:.1f} | {gg / gp:.2f}x |"
        )


if __name__ == "__main__":
    main()
