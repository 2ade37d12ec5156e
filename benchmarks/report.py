"""Markdown tables and machine description from the results dictionary.

Targets from issue 5 are printed next to each column, and each cell that
misses its target is marked with a ``!`` so a reader sees it without
cross-checking numbers.
"""

from __future__ import annotations

import datetime
import os
import platform
from typing import Any

TARGETS = {"run": 1.02, "run_dw": 1.00, "compile": 1.05, "trace": 1.0, "memory": 1.0}
# guarded/double-where "~1.00": count it met within measurement noise of +-2 %
DW_TOLERANCE = 0.02
# memory sizes are exact; flag only real growth, not a few hundred bytes of masks
MEM_TOLERANCE = 0.005


def machine_info() -> dict[str, Any]:
    cpu = "unknown"
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    import jax
    import jaxlib

    info = {
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "python": platform.python_version(),
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        "backend": jax.default_backend(),
        "date_utc": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "loadavg_start": _loadavg(),
    }
    try:
        import tensorflow as tf

        info["tensorflow"] = tf.__version__
    except Exception:  # TF is optional for the JAX tables
        info["tensorflow"] = None
    return info


def _loadavg():
    try:
        return list(os.getloadavg())
    except OSError:
        return None


def _r(x: float, target: float = None, tol: float = 0.0) -> str:
    s = f"{x:.3f}"
    if target is not None and x > target + tol:
        s += " !"
    return s


def _rq(r: dict[str, float], target: float = None, tol: float = 0.0) -> str:
    """Median of the per-round paired ratios, with their quartiles."""
    return f"{_r(r['paired_median'], target, tol)} ({r['paired_q1']:.2f}-{r['paired_q3']:.2f})"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return out


def machine_md(m: dict[str, Any]) -> list[str]:
    load = m.get("loadavg_start")
    load_s = ", ".join(f"{v:.2f}" for v in load) if load else "n/a"
    load_end = m.get("loadavg_end")
    load_e = ", ".join(f"{v:.2f}" for v in load_end) if load_end else "n/a"
    return [
        f"Machine: {m['nproc']} cores ({m['cpu']}), Python {m['python']}, "
        f"jax/jaxlib {m['jax']}/{m['jaxlib']} ({m['backend']}), "
        f"TensorFlow {m.get('tensorflow')}; {m['date_utc']}; mode `{m.get('mode')}`; "
        f"XLA_FLAGS=`{m['xla_flags']}`; load average (1/5/15 min) at start {load_s}, "
        f"at end {load_e}."
    ]


def jax_tables(workloads: list[dict[str, Any]]) -> list[str]:
    lines = [
        "### Run time (compiled), guarded ÷ other",
        "",
        "Median over rounds of the paired ratio (both variants timed back to back in "
        "each round, order rotating), in brackets its quartiles; the ratio of the "
        "plain medians is in the JSON. The last column times a second compilation of "
        "the unguarded program against the first: how far from 1.00 identical "
        "programs land on this machine at this moment. "
        f"Targets: ÷ unguarded ≤ {TARGETS['run']}, ÷ double-where ≈ 1.00. "
        "`!` marks a miss.",
        "",
    ]
    rows = []
    for w in workloads:
        f, g = w["forward"]["ratio"], w["gradient"]["ratio"]
        rows.append(
            [
                w["workload"],
                w["size"],
                _rq(f["unguarded"], TARGETS["run"]),
                _rq(f["double_where"], TARGETS["run_dw"], DW_TOLERANCE),
                _rq(g["unguarded"], TARGETS["run"]),
                _rq(g["double_where"], TARGETS["run_dw"], DW_TOLERANCE),
                f"{_rq(w['forward']['noise_ratio'])} / {_rq(w['gradient']['noise_ratio'])}",
            ]
        )
    lines += _table(
        [
            "workload",
            "size",
            "fwd ÷ unguarded",
            "fwd ÷ double-where",
            "grad step ÷ unguarded",
            "grad step ÷ double-where",
            "A/A noise: unguarded ÷ its own copy (fwd / grad)",
        ],
        rows,
    )
    lines += [
        "",
        "### Compile time and memory, guarded ÷ unguarded",
        "",
        "XLA = `lowered.compile()` only; total = trace (incl. guard analysis and "
        f"rewrite) + lower + compile, fresh functions. Target for compile ≤ "
        f"{TARGETS['compile']}. Peak = arguments + outputs + temporaries − aliased, "
        "from `compiled.memory_analysis()`.",
        "",
    ]
    rows = []
    for w in workloads:
        f, g = w["forward"], w["gradient"]
        rows.append(
            [
                w["workload"],
                w["size"],
                _r(f["compile_ratio"]["xla_compile"], TARGETS["compile"]),
                _r(f["compile_ratio"]["total"], TARGETS["compile"]),
                _r(g["compile_ratio"]["xla_compile"], TARGETS["compile"]),
                _r(g["compile_ratio"]["total"], TARGETS["compile"]),
                f"{g['compile_s']['unguarded']['total']:.2f}",
                _r(f["peak_memory_ratio"], TARGETS["memory"], MEM_TOLERANCE),
                _r(g["peak_memory_ratio"], TARGETS["memory"], MEM_TOLERANCE),
                _r(g["peak_memory_ratio_dw"], TARGETS["memory"], MEM_TOLERANCE),
                f"{g['memory']['unguarded']['peak'] / 2**20:.1f}",
            ]
        )
    lines += _table(
        [
            "workload",
            "size",
            "fwd XLA",
            "fwd total",
            "grad XLA",
            "grad total",
            "grad total, unguarded (s)",
            "peak mem fwd",
            "peak mem grad",
            "peak mem grad ÷ double-where",
            "grad peak, unguarded (MiB)",
        ],
        rows,
    )
    lines += [
        "",
        "### Optimized HLO",
        "",
        "Instruction counts (all computations) of the compiled programs. Forward "
        "target: guarded identical to unguarded. Gradient: `select` counts "
        "(in fusions / total) -- the extra selects of the guarded program are the "
        "guards; they cost nothing only when fused.",
        "",
    ]
    rows = []
    for w in workloads:
        f, g = w["forward"], w["gradient"]
        fd = f["hlo_diff_guarded_minus_unguarded"]
        same = (
            "identical"
            if not fd
            else "differs ! " + ", ".join(f"{k} {v:+d}" for k, v in fd.items())
        )
        gh = g["hlo"]
        extra = gh["guarded"]["selects"] - gh["unguarded"]["selects"]
        extra_fused = gh["guarded"]["fused_selects"] - gh["unguarded"]["fused_selects"]
        rows.append(
            [
                w["workload"],
                w["size"],
                f"{f['hlo']['guarded']['instructions']} / {f['hlo']['unguarded']['instructions']}",
                same,
                " / ".join(
                    f"{gh[k]['instructions']} ({gh[k]['opcodes'].get('dot', 0)})"
                    for k in ("guarded", "unguarded", "double_where")
                ),
                f"{extra} ({extra_fused} fused)" + ("" if extra == extra_fused else " !"),
                " / ".join(
                    f"{gh[k]['fused_selects']}/{gh[k]['selects']}"
                    for k in ("guarded", "unguarded", "double_where")
                ),
                " / ".join(str(gh[k]["fusions"]) for k in ("guarded", "unguarded", "double_where")),
            ]
        )
    lines += _table(
        [
            "workload",
            "size",
            "fwd instr g / u",
            "fwd HLO g vs u",
            "grad instr (dots) g / u / dw",
            "guard selects in grad (g − u)",
            "grad selects fused/total g / u / dw",
            "grad fusions g / u / dw",
        ],
        rows,
    )
    return lines + [""] + value_mode_table(workloads)


def value_mode_table(workloads: list[dict[str, Any]]) -> list[str]:
    """``guard_mode="value"`` (safe points in value-dead lanes) in the same run."""
    lines = [
        "### Value mode (`guarded_jit(f, guard_mode=\"value\")`), same run",
        "",
        "Timed in the same rounds as the variants above (paired ratios). Value mode "
        "substitutes safe points only where the dead lanes are value-dead; other sites "
        "keep gradient guards, so it is never worse-defined than the default.",
        "",
    ]
    rows = []
    for w in workloads:
        v = w["gradient"].get("value_mode")
        if v is None:
            continue
        fv = w["forward"]["value_mode"]
        gh = w["gradient"]["hlo"]
        rows.append(
            [
                w["workload"],
                w["size"],
                _rq(v["ratio"]["unguarded"], TARGETS["run"]),
                _rq(v["ratio"]["double_where"], TARGETS["run_dw"], DW_TOLERANCE),
                _rq(v["ratio_to_gradient_mode"]),
                _r(v["peak_memory_ratio"], TARGETS["memory"], MEM_TOLERANCE),
                _r(v["peak_memory_ratio_dw"], TARGETS["memory"], MEM_TOLERANCE),
                _r(v["xla_compile_ratio"], TARGETS["compile"]),
                f"{gh['guarded_value']['instructions']} "
                f"({gh['guarded_value']['opcodes'].get('dot', 0)}) / "
                f"{gh['guarded_value']['fusions']}",
                "identical" if not fv["hlo_diff_minus_unguarded"] else "differs",
            ]
        )
    return lines + _table(
        [
            "workload",
            "size",
            "grad ÷ unguarded",
            "grad ÷ double-where",
            "grad ÷ gradient mode",
            "peak mem grad ÷ unguarded",
            "peak mem grad ÷ double-where",
            "grad XLA compile ÷ unguarded",
            "grad instr (dots) / fusions",
            "fwd HLO vs unguarded",
        ],
        rows,
    )


def _k(x) -> str:
    return "–" if x is None else f"{x:.2f}"


def scaling_table(scaling: dict[str, Any]) -> list[str]:
    lines = [
        "### Trace + analysis + rewrite vs `make_jaxpr`",
        "",
        "Synthetic chains of `gt, sqrt, select_n, add` (one guard per 4 equations). "
        "ratio = `make_jaxpr(guard(f))` ÷ `make_jaxpr(f)` on fresh functions "
        "(the guarded figure includes tracing `f` once, so it is ≥ 1 by construction; "
        "overhead = ratio − 1 is the analysis + rewrite alone). Growth exponent k "
        "from time ∝ n^k between consecutive sizes (1 = linear). Breakdown: `make_jaxpr(f)`, "
        "`analyze`, the rewrite under `make_jaxpr` as `guard` does it (placement and masks "
        "included; jax 0.11+: by surgery, the user's equations kept, guards spliced in, one "
        "call staged; jax 0.10: the interpreter), and for reference the interpreter's "
        "equation-by-equation rewrite, "
        "re-tracing the unchanged jaxpr with `eval_jaxpr` (the floor for a rewrite that "
        "re-binds every equation) and re-evaluating it with the interpreter's copying step "
        "(`compat.restage`: the interpreter's floor).",
        "",
    ]
    rows = []
    for r in scaling["rows"]:
        b = r.get("breakdown", {})
        rows.append(
            [
                str(r["eqns"]),
                f"{r['plain_s']:.3f}",
                f"{r['guarded_s']:.3f}",
                _r(r["ratio"], TARGETS["trace"]),
                f"{r['overhead_ratio']:.2f}",
                _k(r.get("growth_exponent_plain")),
                _k(r.get("growth_exponent_guarded")),
                (
                    f"{b['trace_s']:.3f} / {b['analyze_s']:.3f} / {b['rewrite_s']:.3f}"
                    f" / {b.get('interpreter_s', float('nan')):.3f}"
                    f" / {b['plain_retrace_s']:.3f} / {b['copy_s']:.3f}"
                    if "copy_s" in b
                    else "n/a"
                ),
                str(b.get("guarded_eqns", "n/a")),
            ]
        )
    lines += _table(
        [
            "equations",
            "make_jaxpr (s)",
            "guarded (s)",
            "ratio",
            "overhead",
            "k plain",
            "k guarded",
            "trace / analyse / rewrite / interpreter / plain re-trace / copy (s)",
            "guarded jaxpr eqns",
        ],
        rows,
    )
    if scaling.get("profile"):
        lines += [
            "",
            f"cProfile of one guarded `make_jaxpr` at {scaling['profile_eqns']} "
            "equations (top entries by own time):",
            "",
            "```",
            scaling["profile"],
            "```",
        ]
    return lines


def _tf_hlo(h: dict[str, Any]) -> str:
    keys = ("guarded_xla", "unguarded_xla", "double_where_xla")
    if not h or any("instructions" not in h.get(k, {}) for k in keys):
        return "n/a"
    return " / ".join(f"{h[k]['instructions']} ({h[k]['opcodes'].get('dot', 0)})" for k in keys)


def _new_values(kind: dict[str, Any]) -> str:
    found = kind.get("new_values_ratio")
    if not found:
        return "n/a"
    return f"{found['guarded_xla']:.1f} / {found['unguarded_xla']:.1f}"


def tf_table(tf: dict[str, Any]) -> list[str]:
    lines = [
        "### TensorFlow (workloads 1 and 3), guarded XLA ÷ other",
        "",
        "guarded XLA = `tf.function(jit_compile=True)` around a `GradientTape` over "
        "`hlo_guard.tf.guard(loss)`; XLA = the same around the plain loss; dw XLA = the "
        "hand-written double-where under XLA; eager = plain loss and tape, no "
        "`tf.function`. First call = trace (+ guard rewrite) + XLA compile of a fresh "
        "`tf.function`. New values = a call with new input values of the same shapes ÷ "
        "a repeated call, guarded / unguarded (about 1 when nothing is compiled again; "
        "hundreds when XLA compiles per value). Same paired-ratio convention as above.",
        "",
    ]
    if tf.get("status") != "ok":
        return lines + [f"pending ({tf.get('reason', 'not run')})"]
    rows = []
    for r in tf["rows"]:
        if r.get("status") == "pending":
            rows.append([r["workload"], r["size"]] + [f"pending ({r['reason']})"] + [""] * 9)
            continue
        f, g = r["forward"]["ratio"], r["gradient"]["ratio"]
        rows.append(
            [
                r["workload"],
                r["size"],
                _rq(f["unguarded_xla"], TARGETS["run"]),
                _rq(f["double_where_xla"], TARGETS["run_dw"], DW_TOLERANCE),
                _rq(f["eager"]),
                _rq(g["unguarded_xla"], TARGETS["run"]),
                _rq(g["double_where_xla"], TARGETS["run_dw"], DW_TOLERANCE),
                _rq(g["eager"]),
                f"{r['forward']['first_call_ratio']:.2f} / {r['gradient']['first_call_ratio']:.2f}",
                _new_values(r["gradient"]),
                str(r["check"]["nonfinite_lanes"]["unguarded_xla"])
                + " / "
                + str(r["check"]["nonfinite_lanes"]["eager"]),
                _tf_hlo(r["gradient"].get("hlo", {})),
            ]
        )
    lines += _table(
        [
            "workload",
            "size",
            "fwd ÷ XLA",
            "fwd ÷ dw XLA",
            "fwd ÷ eager",
            "grad ÷ XLA",
            "grad ÷ dw XLA",
            "grad ÷ eager",
            "first call ÷ XLA (fwd / grad)",
            "grad new values ÷ repeat (g / u)",
            "NaN lanes unguarded XLA / eager",
            "grad HLO instr (dots) g / u / dw",
        ],
        rows,
    )
    return lines


def render(results: dict[str, Any]) -> str:
    lines = machine_md(results["machine"]) + [""]
    if results.get("checks"):
        lines += [
            "Correctness checks (guarded forward = unguarded, guarded gradient finite "
            "and = double-where): "
            + ", ".join(
                f"{c['workload']} {c['size']}: ok (unguarded NaN/inf lanes "
                f"{c['unguarded_nonfinite_lanes']})"
                for c in results["checks"]
            ),
            "",
        ]
    if results.get("workloads"):
        lines += jax_tables(results["workloads"]) + [""]
    if results.get("trace_scaling"):
        lines += scaling_table(results["trace_scaling"]) + [""]
    if results.get("tf"):
        lines += tf_table(results["tf"]) + [""]
    return "\n".join(lines)
