"""Run every hlo_guard benchmark and print/write the ratios.

    .venv/bin/python benchmarks/run_all.py            # full run (~10 min on 2 busy cores)
    .venv/bin/python benchmarks/run_all.py --quick    # small sizes, a few minutes
    .venv/bin/python benchmarks/run_all.py --only elementwise mlp --skip-scaling

Prints a markdown table, writes JSON (``--json``, default
``benchmarks/results/latest.json``; ``latest-quick.json`` for ``--quick``) and, on full runs (or with
``--write-results``), replaces the generated section of ``benchmarks/RESULTS.md``
(the hand-written findings around it are kept).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if ROOT not in sys.path:  # run as a script: make ``benchmarks`` importable as a package
    sys.path.insert(0, ROOT)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

BEGIN = "<!-- BEGIN GENERATED (benchmarks/run_all.py) -->"
END = "<!-- END GENERATED -->"

MODES = {
    "quick": dict(
        rounds=7,
        compile_trials=2,
        target_sample_s=0.03,
        scaling_sizes=[1000, 10000],
        scaling_trials={1000: 3, 10000: 1},
    ),
    "full": dict(
        rounds=25,
        compile_trials=4,
        target_sample_s=0.05,
        scaling_sizes=[1000, 10000, 100000],
        scaling_trials={1000: 7, 10000: 5, 100000: 1},
    ),
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="small sizes, few rounds")
    p.add_argument(
        "--json",
        default=None,
        help="where to write the JSON results (default benchmarks/results/"
        "latest.json, or latest-quick.json with --quick so that a quick "
        "run never overwrites the full results RESULTS.md describes)",
    )
    p.add_argument("--only", nargs="*", default=None, help="JAX workloads to run (names)")
    p.add_argument("--skip-scaling", action="store_true")
    p.add_argument("--skip-tf", action="store_true")
    p.add_argument(
        "--skip-libraries", action="store_true", help="skip the library trace-cost ratios"
    )
    p.add_argument(
        "--write-results",
        action="store_true",
        help="update benchmarks/RESULTS.md even on a --quick run",
    )
    p.add_argument(
        "--no-write-results", action="store_true", help="never touch benchmarks/RESULTS.md"
    )
    return p.parse_args(argv)


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


#: the JAX line whose generated block uses the plain markers above (the
#: oldest supported release); every other line gets a block of its own
BASE_JAX_LINE = "0.10"


def jax_line() -> str:
    """``major.minor`` of the installed JAX: RESULTS.md keeps one generated
    block per line, so a run on jax 0.12 sits beside the 0.10.2 figures
    instead of replacing them."""
    import jax

    return ".".join(jax.__version__.split(".")[:2])


def markers(line: str) -> tuple[str, str]:
    if line == BASE_JAX_LINE:
        return BEGIN, END
    return (
        f"<!-- BEGIN GENERATED (benchmarks/run_all.py, jax {line}) -->",
        f"<!-- END GENERATED (jax {line}) -->",
    )


def update_results_md(table: str, path: str, line: str = BASE_JAX_LINE) -> None:
    begin, end = markers(line)
    block = f"{begin}\n{table}\n{end}"
    text = open(path).read() if os.path.exists(path) else ""
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        tail = rest.split(end, 1)[1]
        text = head + block + tail
    elif END in text:  # a new JAX line: right after the base line's block
        head, tail = text.split(END, 1)
        text = head + END + "\n\n" + block + tail
    else:
        text = "# hlo_guard benchmark results\n\n" + block + "\n" + text
    with open(path, "w") as fh:
        fh.write(text)


def main(argv=None) -> int:
    args = parse_args(argv)
    mode = "quick" if args.quick else "full"
    cfg = MODES[mode]
    line = jax_line()
    if args.json is None:
        suffix = "" if line == BASE_JAX_LINE else f"-jax{line}"
        args.json = os.path.join(
            HERE, "results", f"latest-quick{suffix}.json" if args.quick else f"latest{suffix}.json"
        )

    from benchmarks.measure import measure_workload
    from benchmarks.report import machine_info, render
    from benchmarks.trace_scaling import measure_scaling, profile_guarded
    from benchmarks.workloads import ALL

    t_start = time.perf_counter()
    results = {"mode": mode, "machine": machine_info(), "workloads": [], "checks": []}
    results["machine"]["mode"] = mode
    for w in ALL:
        if args.only and w.name not in args.only:
            continue
        for size in w.sizes[mode]:
            log(f"{w.name} {w.size_label(size)}")
            r = measure_workload(
                w,
                size,
                rounds=cfg["rounds"],
                compile_trials=cfg["compile_trials"],
                target_sample_s=cfg["target_sample_s"],
            )
            results["workloads"].append(r)
            results["checks"].append({"workload": w.name, **r["check"]})

    if not args.skip_scaling:
        log(f"trace scaling {cfg['scaling_sizes']}")
        scaling = measure_scaling(cfg["scaling_sizes"], cfg["scaling_trials"])
        at = [r for r in scaling["rows"] if r["eqns"] >= 10000]
        if any(r["ratio"] > 1.0 for r in at):  # target missed: say where the time goes
            import jax.numpy as jnp

            n = at[0]["target_eqns"]
            log(f"profiling the guarded trace at {n} equations")
            scaling["profile"] = profile_guarded(n, jnp.linspace(0.0, 2.0, 8))
            scaling["profile_eqns"] = n
        results["trace_scaling"] = scaling

    library_table = ""
    if not args.skip_libraries:
        log("trace cost on real library functions")
        from benchmarks import trace_cost_libraries

        results["trace_cost_libraries"] = trace_cost_libraries.run(rounds=5)
        library_table = trace_cost_libraries.render(results["trace_cost_libraries"], 3.0)

    if not args.skip_tf:
        log("tensorflow")
        from benchmarks.tf_workloads import run_tf

        results["tf"] = run_tf(mode, rounds=cfg["rounds"], compile_trials=cfg["compile_trials"])

    results["machine"]["loadavg_end"] = list(os.getloadavg())
    results["wall_s"] = time.perf_counter() - t_start
    table = render(results)
    if library_table:
        table += (
            "\n\n### Guarded trace ÷ `jax.jit` trace on real library functions (limit 3x)\n\n"
            "`benchmarks/trace_cost_libraries.py`: median of 5 paired rounds, fresh functions.\n\n"
            + library_table
        )
    print(table)
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as fh:
        json.dump(results, fh, indent=1, default=str)
    log(f"wrote {args.json} ({results['wall_s']:.0f} s)")
    if not args.no_write_results and (mode == "full" or args.write_results):
        update_results_md(table, os.path.join(HERE, "RESULTS.md"), line)
        log(f"updated benchmarks/RESULTS.md (jax {line} block)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
