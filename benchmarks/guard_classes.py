"""Where the guarded gradient's extra HLO instructions come from, by guard class.

Issue 17 item 2 asks for gradient HLO within 1.10x of the hand double where.
The guarded program has three classes of guards, and only the first is what a
human writes as the inner ``where``:

* **boundary guards** (reverse mode): a select where a dead region meets live
  computation (docs/PLACEMENT.md), with the masks they need;
* **contraction guards**: a partly dead ``dot_general``/``conv`` whose operands'
  dead lanes are zeroed in the other operand's derivative term, because a dead
  row's *value* (an inf in a padded token) would otherwise meet the row's exact
  zero cotangent there (the hand double where does not do this);
* **forward-mode output guards**: a tangent mask after an op whose tangent may
  turn a structurally zero tangent lane into NaN (``jvp``/``jacfwd`` need them).
  They transpose to nothing (:mod:`hlo_guard.jax_frontend.tangent_guard`), so
  a gradient program carries none of them; until 2026-11-27 (twentieth
  session) it carried a select per output guard (attention: 875 -> 754), and
  this script had a column without them.

This script compiles each workload's gradient with all guards, then without
the contraction guards, and prints the optimized HLO instruction counts beside
the unguarded program and the hand double where.  The variant without them is
*not a correct program* (it may give NaN where the contract promises zero): it
only shows what the class costs.  It reaches into the front end's plan
(``plan.GUARDED_CONTRACTIONS``) and says so if that moved.

    python -m benchmarks.guard_classes [--size quick|tiny|full] [workload ...]
"""

from __future__ import annotations

import argparse
import sys
from contextlib import contextmanager

import jax

import hlo_guard
from benchmarks.hlo_stats import parse_hlo

DEFAULT = ("mlp", "attention", "transformer_block", "transformer_2layer")


def _instructions(fn, args) -> tuple[int, int]:
    text = jax.jit(jax.grad(fn)).lower(*args).compile().as_text()
    stats = parse_hlo(text)
    return sum(stats.opcodes.values()), stats.opcodes["select"]


@contextmanager
def _without_contraction_guards():
    from hlo_guard.jax_frontend import plan

    saved = plan.GUARDED_CONTRACTIONS
    try:
        plan.GUARDED_CONTRACTIONS = frozenset()
        yield
    finally:
        plan.GUARDED_CONTRACTIONS = saved


def measure(name: str, size: str) -> dict:
    from benchmarks.workloads import ALL

    workload = next((w for w in ALL if w.name == name), None)
    if workload is None:
        raise SystemExit(f"no workload {name!r}; known: {', '.join(w.name for w in ALL)}")
    args = workload.make_inputs(workload.sizes[size][0])
    row = {
        "workload": name,
        "unguarded": _instructions(workload.loss, args),
        "double where": _instructions(workload.loss_dw, args),
        "guarded": _instructions(hlo_guard.guard(workload.loss), args),
    }
    with _without_contraction_guards():
        row["no contraction guards"] = _instructions(hlo_guard.guard(workload.loss), args)
    return row


COLUMNS = ("unguarded", "double where", "guarded", "no contraction guards")


def render(rows: list[dict]) -> str:
    lines = [
        "| workload | " + " | ".join(COLUMNS) + " |",
        "|---|" + "---|" * len(COLUMNS),
    ]
    for r in rows:
        dw = r["double where"][0]
        cells = [f"{r[c][0]} ({r[c][0] / dw:.2f}x dw; {r[c][1]} selects)" for c in COLUMNS]
        lines.append(f"| {r['workload']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--size", default="quick")
    p.add_argument("workloads", nargs="*", default=list(DEFAULT))
    a = p.parse_args(argv)
    try:
        from hlo_guard.jax_frontend import plan

        plan.GUARDED_CONTRACTIONS  # noqa: B018
    except (ImportError, AttributeError) as exc:
        print(f"the front end's plan moved ({exc}); nothing measured", file=sys.stderr)
        return 1
    print(render([measure(w, a.size) for w in a.workloads]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
