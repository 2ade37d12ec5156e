"""Smoke test of the benchmark workloads: correctness only, never timings.

A benchmark of a wrong program is meaningless, so each workload's own check
runs here at tiny sizes: the guarded forward equals the unguarded one, the
guarded gradient is finite and equals the hand-written double-where gradient
(the independent oracle).  We also require the *unguarded* gradient to be
non-finite somewhere: a workload whose plain gradient is already clean would
not measure the guard at all.
"""

import os
import re
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from benchmarks.workloads import ALL  # noqa: E402


@pytest.mark.parametrize("workload", ALL, ids=lambda w: w.name)
def test_workload_guarded_gradient_matches_double_where(workload):
    result = workload.check(workload.sizes["tiny"][0])
    assert result["gradient_equal"] and result["forward_equal"]
    assert result["unguarded_nonfinite_lanes"] > 0, (
        f"{workload.name}: the plain gradient is finite, the workload does not exercise a guard"
    )


def test_hlo_parser_counts_selects_and_fusion_membership():
    """The select/fusion counts the report relies on, against a plain text count."""
    import jax
    import jax.numpy as jnp

    from benchmarks.hlo_stats import parse_hlo

    def f(x):
        return jnp.where(x > 0, jnp.sqrt(x), 0.0).sum()

    text = jax.jit(jax.grad(f)).lower(jnp.ones(64)).compile().as_text()
    stats = parse_hlo(text)
    assert stats.selects == len(re.findall(r"= \S+ select\(", text)) > 0
    assert stats.fusions == len(re.findall(r"= \S+ fusion\(", text))
    assert 0 < stats.fused_selects <= stats.selects


@pytest.mark.parametrize("name", ["elementwise", "mlp"])
def test_tf_workload_guarded_gradient_matches_double_where(name):
    pytest.importorskip("tensorflow")
    from benchmarks.tf_workloads import TF_WORKLOADS, check, load_tf_guard

    guard, why = load_tf_guard()
    if guard is None:
        pytest.skip(f"hlo_guard.tf not available yet: {why}")
    result = check(name, TF_WORKLOADS[name]["sizes"]["tiny"][0], guard)
    assert result["gradient_equal"]
    assert result["nonfinite_lanes"]["unguarded_xla"] > 0


def test_guard_class_breakdown_switches_each_class_off():
    """``benchmarks/guard_classes.py`` compiles the gradient without the
    contraction guards: the switch must remove instructions, else the script
    measures nothing."""
    from benchmarks.guard_classes import measure

    row = measure("attention", "tiny")
    counts = [row[k][0] for k in ("guarded", "no contraction guards")]
    assert counts[0] > counts[1] >= row["unguarded"][0]


def test_networks_without_the_bug_compile_to_the_unguarded_program():
    """``benchmarks/relu_networks.py``: an Equinox MLP, label cross-entropies
    by ``take_along_axis`` and by ``logp[arange(B), labels]``, and a Flax CNN
    have no dead-lane bug; the guard
    lists no site and the guarded gradient has the unguarded instruction and
    select counts (a library not installed is reported skipped)."""
    from benchmarks.relu_networks import run

    rows = [r for r in run() if "skipped" not in r]
    assert rows
    for r in rows:
        assert r["sites"] == 0, r["case"]
        assert r["guarded"] == r["plain"], r["case"]
