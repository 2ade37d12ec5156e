"""Shared timing helper: alternating runs, medians, ratios.

Why alternating: on a shared 2-core machine the background load drifts over
seconds.  Timing variant A for ten seconds and then variant B would fold that
drift into the A/B ratio; interleaving one sample of every variant per round
(rotating the order each round) exposes all variants to the same drift, and the
per-round ratio A_r/B_r cancels most of it.

Only already-compiled executables are timed (``jax.jit(f).lower(...).compile()``),
so compilation never leaks into run times; compile time is measured separately
on *fresh* functions (:func:`time_compile_alternating`) because ``jax.jit``,
``make_jaxpr`` and ``guard`` all cache per function object.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import jax


@dataclass
class Samples:
    """Per-variant lists of seconds-per-call, one entry per round."""

    times: dict[str, list[float]] = field(default_factory=dict)
    calls_per_sample: dict[str, int] = field(default_factory=dict)

    def median(self, name: str) -> float:
        return statistics.median(self.times[name])

    def ratio(self, num: str, den: str) -> dict[str, float]:
        """Ratio of medians plus the quartiles of the paired per-round ratios."""
        paired = sorted(a / b for a, b in zip(self.times[num], self.times[den]))
        q = statistics.quantiles(paired, n=4) if len(paired) >= 2 else [paired[0]] * 3
        return {
            "ratio": self.median(num) / self.median(den),
            "paired_median": statistics.median(paired),
            "paired_q1": q[0],
            "paired_q3": q[2],
        }

    def as_json(self) -> dict[str, Any]:
        return {
            "calls_per_sample": self.calls_per_sample,
            "median_s": {k: self.median(k) for k in self.times},
            "samples_s": self.times,
        }


def _call(fn: Callable, args: Sequence[Any]) -> None:
    jax.block_until_ready(fn(*args))


def time_alternating(
    variants: dict[str, tuple[Callable, Sequence[Any]]],
    *,
    rounds: int = 15,
    warmup: int = 2,
    target_sample_s: float = 0.05,
) -> Samples:
    """Time each ``fn(*args)`` (already compiled) in interleaved rounds.

    Every call is followed by ``block_until_ready`` (JAX dispatches
    asynchronously; without it we would time the dispatch only).  One sample of
    a variant is ``calls_per_sample[name]`` back-to-back calls, chosen once per
    variant so that a sample lasts about ``target_sample_s`` (a 30x slower
    eager variant must not shrink the fast variants' samples to one call).
    """
    names = list(variants)
    for name in names:
        fn, args = variants[name]
        for _ in range(warmup):
            _call(fn, args)
    calls = {}
    for name in names:
        fn, args = variants[name]
        t0 = time.perf_counter()
        _call(fn, args)
        dt = time.perf_counter() - t0
        calls[name] = max(1, min(1000, int(target_sample_s / max(dt, 1e-7))))
    out = Samples({k: [] for k in names}, calls)
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            fn, args = variants[name]
            n = calls[name]
            t0 = time.perf_counter()
            for _ in range(n):
                _call(fn, args)
            out.times[name].append((time.perf_counter() - t0) / n)
    return out


@dataclass
class CompileStages:
    """Seconds per stage of getting an executable from a fresh function."""

    trace: list[float] = field(default_factory=list)  # Python trace (+ guard analysis/rewrite)
    lower: list[float] = field(default_factory=list)  # jaxpr -> StableHLO
    compile: list[float] = field(default_factory=list)  # XLA optimisation + codegen

    def total(self) -> list[float]:
        return [a + b + c for a, b, c in zip(self.trace, self.lower, self.compile)]

    def medians(self) -> dict[str, float]:
        return {
            "trace": statistics.median(self.trace),
            "lower": statistics.median(self.lower),
            "compile": statistics.median(self.compile),
            "total": statistics.median(self.total()),
        }


def time_compile_alternating(
    makers: dict[str, Callable[[], Callable]], args: Sequence[Any], *, trials: int = 3
) -> dict[str, CompileStages]:
    """Trace, lower and compile ``jax.jit(make())`` for each variant, interleaved.

    ``make`` must return a *new* function object every call (a fresh lambda, a
    fresh ``guard`` object) so that no trace cache is hit.
    """
    names = list(makers)
    stages = {k: CompileStages() for k in names}
    for r in range(trials):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            fn = makers[name]()
            t0 = time.perf_counter()
            traced = jax.jit(fn).trace(*args)
            t1 = time.perf_counter()
            lowered = traced.lower()
            t2 = time.perf_counter()
            lowered.compile()
            t3 = time.perf_counter()
            s = stages[name]
            s.trace.append(t1 - t0)
            s.lower.append(t2 - t1)
            s.compile.append(t3 - t2)
    return stages
