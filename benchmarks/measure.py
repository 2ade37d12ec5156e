"""Measure one JAX workload at one size: run time, compile time, memory, HLO.

Everything is a ratio between variants measured in the same process:
guarded/unguarded (what switching ``jax.jit`` to ``guarded_jit`` costs) and
guarded/double-where (what the automatic guard costs against the careful
hand-written fix).
"""

from __future__ import annotations

import statistics
from typing import Any

import jax

from benchmarks.hlo_stats import diff_opcodes, parse_hlo
from benchmarks.timing import time_alternating, time_compile_alternating
from benchmarks.workloads.base import VARIANTS, Workload


def memory_of(compiled) -> dict[str, int]:
    """Sizes XLA assigned; ``peak`` = arguments + outputs + temporaries - aliased."""
    m = compiled.memory_analysis()
    arg, out, tmp = m.argument_size_in_bytes, m.output_size_in_bytes, m.temp_size_in_bytes
    alias = m.alias_size_in_bytes
    return {
        "argument": arg,
        "output": out,
        "temp": tmp,
        "alias": alias,
        "peak": arg + out + tmp - alias,
    }


def _ratios(samples, num="guarded"):
    return {den: samples.ratio(num, den) for den in ("unguarded", "double_where")}


def _value_mode(samples, mem, hlo, stages) -> dict[str, Any]:
    """Value mode (``guard_mode="value"``) against the same baselines."""
    return {
        "ratio": _ratios(samples, "guarded_value"),
        "ratio_to_gradient_mode": samples.ratio("guarded_value", "guarded"),
        "peak_memory_ratio": mem["guarded_value"]["peak"] / mem["unguarded"]["peak"],
        "peak_memory_ratio_dw": mem["guarded_value"]["peak"] / mem["double_where"]["peak"],
        "xla_compile_ratio": statistics.median(stages["guarded_value"].compile)
        / statistics.median(stages["unguarded"].compile),
        "hlo_diff_minus_unguarded": diff_opcodes(
            hlo["guarded_value"].opcodes, hlo["unguarded"].opcodes
        ),
    }


def measure_workload(
    w: Workload, size, *, rounds: int, compile_trials: int, target_sample_s: float = 0.05
) -> dict[str, Any]:
    args = w.make_inputs(size, 0)
    result: dict[str, Any] = {
        "workload": w.name,
        "description": w.description,
        "size": w.size_label(size),
        "check": w.check(size),
    }
    for kind in ("forward", "gradient"):

        def fresh(variant, kind=kind):
            """A new, never-traced function object for ``variant``."""
            fns = w.forward_fns() if kind == "forward" else w.gradient_fns()
            return fns[variant]

        compiled = w.compiled(kind, args)
        # A/A control: a second, separately compiled unguarded executable.  Its ratio
        # to the first is the noise floor of this machine at this moment.
        control = jax.jit(fresh("unguarded")).lower(*args).compile()
        timed = {k: (compiled[k], args) for k in VARIANTS}
        timed["unguarded_copy"] = (control, args)
        samples = time_alternating(timed, rounds=rounds, target_sample_s=target_sample_s)
        hlo = {k: parse_hlo(compiled[k].as_text()) for k in VARIANTS}
        mem = {k: memory_of(compiled[k]) for k in VARIANTS}
        makers = {v: (lambda v=v: fresh(v)) for v in ("unguarded", "guarded", "guarded_value")}
        stages = time_compile_alternating(makers, args, trials=compile_trials)
        comp = {k: s.medians() for k, s in stages.items()}
        result[kind] = {
            "time": samples.as_json(),
            "ratio": _ratios(samples),
            "noise_ratio": samples.ratio("unguarded_copy", "unguarded"),
            "compile_s": comp,
            "compile_ratio": {
                "xla_compile": statistics.median(stages["guarded"].compile)
                / statistics.median(stages["unguarded"].compile),
                "trace": comp["guarded"]["trace"] / comp["unguarded"]["trace"],
                "total": comp["guarded"]["total"] / comp["unguarded"]["total"],
            },
            "memory": mem,
            "peak_memory_ratio": mem["guarded"]["peak"] / mem["unguarded"]["peak"],
            "peak_memory_ratio_dw": mem["guarded"]["peak"] / mem["double_where"]["peak"],
            "hlo": {k: h.as_json() for k, h in hlo.items()},
            "hlo_diff_guarded_minus_unguarded": diff_opcodes(
                hlo["guarded"].opcodes, hlo["unguarded"].opcodes
            ),
            "hlo_diff_guarded_minus_double_where": diff_opcodes(
                hlo["guarded"].opcodes, hlo["double_where"].opcodes
            ),
            "value_mode": _value_mode(samples, mem, hlo, stages),
        }
    return result
