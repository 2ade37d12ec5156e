"""Trace + analysis + rewrite time against ``make_jaxpr`` on synthetic chains.

The program is a chain of ``gt, sqrt, select_n, add`` steps written with
``lax`` (so the equation count is exact: 4 per step), where each ``sqrt`` is
partly dead -- one guard per step, the worst realistic density of guards.

"guarded" is ``jax.make_jaxpr(hlo_guard.guard(f))(x)`` on a fresh function and
a fresh guard object: it traces ``f`` itself (one ``make_jaxpr``), analyses the
jaxpr and traces the guarded re-evaluation.  "plain" is
``jax.make_jaxpr(f)(x)`` on a fresh function.  Both are interleaved per round.
Fresh functions matter: ``make_jaxpr`` and ``guard`` cache per function object.

The breakdown (trace / analyse / rewrite) calls the front end's pieces
directly; it is informational and skipped if those internals move.  It also
times re-tracing the *unchanged* jaxpr through ``eval_jaxpr`` (the floor for
a rewrite that re-binds every equation) and re-evaluating it with the
interpreter's own step, which copies unchanged equations (``compat.restage``):
the floor of the rewrite as it is.
"""

from __future__ import annotations

import cProfile
import gc
import io
import math
import pstats
import statistics
import time
from typing import Any

import jax
import jax.extend.core
import jax.numpy as jnp
from jax import lax

import hlo_guard

EQNS_PER_STEP = 4


def make_chain(n_eqns: int):
    """A fresh function whose jaxpr has about ``n_eqns`` equations."""
    steps = max(1, n_eqns // EQNS_PER_STEP)

    def chain(x):
        for _ in range(steps):
            c = lax.gt(x, 0.5)
            s = lax.sqrt(x)
            x = lax.select(c, s, x)
            x = lax.add(x, 0.25)
        return x

    return chain


def _t(fn):
    """Seconds for one call; a full collection first so that a gen-2 GC pass
    triggered by the previous trial's garbage is not billed to this one."""
    gc.collect()
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def breakdown(n_eqns: int, x) -> dict[str, float]:
    """Seconds for trace, analysis and guarded re-trace, measured separately."""
    try:
        from hlo_guard.jax_frontend.graph import JaxprGraph
        from hlo_guard.jax_frontend.interpreter import run_guarded
        from hlo_guard.jax_frontend.rules import RULES
        from hlo_guard.jax_frontend.surgery import evaluate_by_surgery, spliced_program
        from passes.analysis import analyze
    except ImportError as exc:  # internals moved: the headline ratio still stands
        return {"error": str(exc)}
    f = make_chain(n_eqns)
    t_trace, closed = _t(lambda: jax.make_jaxpr(f)(x))
    t_analyze, analysis = _t(lambda: analyze(JaxprGraph(closed.jaxpr), RULES))

    # the rewrite as guard(f) does it under make_jaxpr: by surgery where the
    # installed JAX keeps calls until lowering, else by the interpreter
    # (placement and masks included: the plan is built lazily)
    def as_guard_does(y):
        outs = evaluate_by_surgery(analysis, closed.consts, [y], "gradient", "guarded_chain")
        return outs if outs is not None else run_guarded(analysis, closed.consts, [y])

    t_rewrite, guarded = _t(lambda: jax.make_jaxpr(as_guard_does)(x))
    # for reference, the interpreter's equation-by-equation rewrite, on a fresh
    # analysis (the plan is cached per analysis)
    fresh = analyze(JaxprGraph(closed.jaxpr), RULES)
    t_interpreter, _ = _t(
        lambda: jax.make_jaxpr(lambda y: run_guarded(fresh, closed.consts, [y]))(x)
    )
    # the floor of any rewrite that re-binds every equation: re-trace the jaxpr unchanged
    t_retrace, _ = _t(
        lambda: jax.make_jaxpr(lambda y: jax.core.eval_jaxpr(closed.jaxpr, closed.consts, y))(x)
    )
    # the floor of the rewrite as it is: every unchanged equation copied (compat.restage)
    t_copy, _ = _t(lambda: jax.make_jaxpr(lambda y: _copy_eval(closed, y))(x))
    return {
        "trace_s": t_trace,
        "analyze_s": t_analyze,
        "rewrite_s": t_rewrite,
        "interpreter_s": t_interpreter,
        "plain_retrace_s": t_retrace,
        "copy_s": t_copy,
        "guarded_eqns": len(spliced_program(guarded).jaxpr.eqns),
    }


def _copy_eval(closed, *args):
    """``eval_jaxpr`` with the interpreter's own per-equation step, which copies
    an unchanged equation into the trace instead of binding it."""
    from hlo_guard.jax_frontend.binding import bind_eqn

    env = dict(zip(closed.jaxpr.constvars, closed.consts))
    env.update(zip(closed.jaxpr.invars, args))
    for eqn in closed.jaxpr.eqns:
        invals = [v.val if isinstance(v, jax.extend.core.Literal) else env[v] for v in eqn.invars]
        env.update(zip(eqn.outvars, bind_eqn(eqn, invals)))
    return [env[v] for v in closed.jaxpr.outvars]


def profile_guarded(n_eqns: int, x, top: int = 20) -> str:
    """cProfile of one guarded ``make_jaxpr``: where the time goes.

    Earlier objects are frozen out of the GC as in :func:`measure_scaling`;
    a collection still lands in whatever allocation triggers it (typically
    ``newvar``/``bind``), which shows as their own time."""
    g = hlo_guard.guard(make_chain(n_eqns))
    gc.collect()
    gc.freeze()
    prof = cProfile.Profile()
    try:
        prof.enable()
        jax.make_jaxpr(g)(x)
        prof.disable()
    finally:
        gc.unfreeze()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(top)
    lines = [ln for ln in buf.getvalue().splitlines() if ln.strip()]
    start = next((i for i, ln in enumerate(lines) if ln.lstrip().startswith("ncalls")), 0)
    return "\n".join(lines[start : start + top + 1])


def measure_scaling(sizes: list[int], trials: dict[int, int]) -> dict[str, Any]:
    """Interleaved plain/guarded traces per size.

    Everything alive before we start (the earlier workloads' executables and
    jaxprs, JAX's caches) is frozen out of the cyclic GC, so that a collection
    triggered inside a trace only scans what the traces themselves allocate;
    otherwise the figure would depend on what ran earlier in the process.
    """
    x = jnp.linspace(0.0, 2.0, 8, dtype=jnp.float32)
    gc.collect()
    gc.freeze()
    try:
        return _measure_scaling(sizes, trials, x)
    finally:
        gc.unfreeze()


def _measure_scaling(sizes, trials, x) -> dict[str, Any]:
    rows = []
    for n in sizes:
        plain: list[float] = []
        guarded: list[float] = []
        eqns = None
        for r in range(trials.get(n, 1)):
            order = ("plain", "guarded") if r % 2 == 0 else ("guarded", "plain")
            for which in order:
                f = make_chain(n)
                if which == "plain":
                    dt, jx = _t(lambda: jax.make_jaxpr(f)(x))
                    plain.append(dt)
                    eqns = len(jx.jaxpr.eqns)
                else:
                    g = hlo_guard.guard(f)
                    dt, _ = _t(lambda: jax.make_jaxpr(g)(x))
                    guarded.append(dt)
        p, gmed = statistics.median(plain), statistics.median(guarded)
        rows.append(
            {
                "target_eqns": n,
                "eqns": eqns,
                "plain_s": p,
                "guarded_s": gmed,
                "ratio": gmed / p,
                "overhead_ratio": (gmed - p) / p,
                "plain_samples_s": plain,
                "guarded_samples_s": guarded,
                "breakdown": breakdown(n, x),
            }
        )
    # growth exponent between consecutive sizes: time ~ n^k, k = 1 is linear
    for a, b in zip(rows, rows[1:]):
        scale = math.log(b["eqns"] / a["eqns"])
        b["growth_exponent_guarded"] = math.log(b["guarded_s"] / a["guarded_s"]) / scale
        b["growth_exponent_plain"] = math.log(b["plain_s"] / a["plain_s"]) / scale
    return {"rows": rows}
