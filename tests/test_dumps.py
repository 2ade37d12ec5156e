"""Dumps: jaxpr / StableHLO / optimized HLO of the original and the guarded program.

The golden checks read the IR text directly (a tiny SSA parser below), not
through hlo_guard's own marking:

* the StableHLO of the guarded *gradient* program selects the cotangent with
  the ``where`` condition (``compare GT, %arg0, 0``) after the ``sqrt``
  derivative, with zeros in the other lanes -- the guard, transposed;
* the optimized forward HLO of the guarded function equals the unguarded one
  once provenance (metadata, stack frames, module name, numeric suffixes) is
  stripped: the guard costs nothing in the forward program.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hlo_guard
from hlo_guard.errors import GuardUsageError
from hlo_guard.inspect.dumps import ProgramDumps, dump, dump_lowered
from hlo_guard.inspect.explain import explain
from hlo_guard.inspect.programs import Programs
from hlo_guard.inspect.textdiff import jaxpr_key, normalize_hlo, stablehlo_key

X = jnp.array([-1.0, 0.0, 1.0, 4.0])


def f_where(x):
    return jnp.where(x > 0, jnp.sqrt(x), 0.0)


FORWARD_CASES = {
    "where_sqrt": f_where,
    "maximum_log": lambda x: jnp.maximum(jnp.log(x), -5.0),
    "clip": lambda x: jnp.clip(1.0 / x, -1.0, 1.0),
    "slice": lambda x: jnp.sqrt(x)[:2] * 2.0,
    "reduce_max": lambda x: jnp.max(jnp.exp(x)),
    "gather": lambda x: jnp.log(x)[jnp.array([0, 2])],
    "at_set": lambda x: jnp.log(x).at[1:].set(0.0),
    "nested_where": lambda x: jnp.where(
        x > 0.5, jnp.arccos(jnp.where(x < 2, x / 2, 0.0)), jnp.minimum(x, 1.0)
    ),
    "norm": lambda x: jnp.linalg.norm(jnp.where(x > 0, x, 0.0)),
}


# -- a minimal StableHLO reader for the golden check ----------------------------------------

_OP = re.compile(r"^\s*(%[\w#]+)(?::\d+)? = (?:\"?)([\w.]+)\"?\s*(.*)$")


def main_ops(text):
    """{ssa name: (op, [operands])} of ``func.func public @main``."""
    body = text.split("func.func public @main", 1)[1]
    body = body.split("\n  func.func", 1)[0]
    ops = {}
    for line in body.splitlines():
        m = _OP.match(line)
        if m:
            name, op, rest = m.groups()
            operands = re.findall(r"%[\w#]+", rest.split(":")[0])
            ops[name] = (op, operands)
    return ops


def depends_on(ops, name, op_name, seen=None):
    seen = set() if seen is None else seen
    if name in seen or name not in ops:
        return False
    seen.add(name)
    op, operands = ops[name]
    return op == op_name or any(depends_on(ops, o, op_name, seen) for o in operands)


def is_zeros(text, ops, name):
    op, operands = ops.get(name, ("", []))
    if op != "stablehlo.broadcast_in_dim":
        return False
    const = operands[0]
    return re.search(rf"{re.escape(const)} = stablehlo.constant dense<0.0+e\+00>", text) is not None


def guard_selects(text):
    """selects in @main: pred is `compare GT, %arg0, <0>`, on_true depends on sqrt,
    on_false is zeros."""
    ops = main_ops(text)
    found = []
    for name, (op, operands) in ops.items():
        if op != "stablehlo.select" or len(operands) != 3:
            continue
        pred, on_true, on_false = operands
        pop, pargs = ops.get(pred, ("", []))
        if pop != "stablehlo.compare":
            continue
        line = next(l for l in text.splitlines() if l.strip().startswith(pred + " ="))
        if "GT" not in line or pargs[0] != "%arg0":
            continue
        if depends_on(ops, on_true, "stablehlo.sqrt") and is_zeros(text, ops, on_false):
            found.append(name)
    return found


def test_golden_guard_in_gradient_stablehlo():
    d = ProgramDumps(Programs.build(f_where, (X,), {}))
    guarded = d.text("guarded", "stablehlo", "grad")
    original = d.text("original", "stablehlo", "grad")
    sel = guard_selects(guarded)
    assert len(sel) == 1, guarded
    # the select is what main returns: the guard is the last word on the cotangent
    assert re.search(rf"return {re.escape(sel[0])} ", guarded)
    assert guard_selects(original) == []
    # and it is what makes the gradient right: compiled, lanes 0 and 1 are exact zeros
    g = jax.jit(Programs.build(f_where, (X,), {}).grad_program("guarded"))(X)[0]
    np.testing.assert_array_equal(np.asarray(g), [0.0, 0.0, 0.5, 0.25])


@pytest.mark.parametrize("name", sorted(FORWARD_CASES))
def test_optimized_forward_hlo_is_unchanged_by_the_guard(name):
    f = FORWARD_CASES[name]
    d = ProgramDumps(Programs.build(f, (X,), {}))
    original = d.text("original", "hlo", "forward")
    guarded = d.text("guarded", "hlo", "forward")
    assert "metadata" in original  # the normalisation below has something to strip
    assert normalize_hlo(guarded) == normalize_hlo(original)
    assert d.diff("hlo", "forward").startswith("(no difference")


def test_hlo_normalisation_still_sees_a_real_difference():
    """normalize_hlo must not equate different computations (the check above can fail)."""
    a = jax.jit(f_where).lower(X).compile().as_text()
    b = jax.jit(lambda x: jnp.where(x >= 0, jnp.sqrt(x), 0.0)).lower(X).compile().as_text()
    c = jax.jit(lambda x: jnp.where(x > 0, jnp.log(x), 0.0)).lower(X).compile().as_text()
    assert normalize_hlo(a) != normalize_hlo(b)
    assert normalize_hlo(a) != normalize_hlo(c)


def test_forward_jaxpr_guard_marked_and_diff_is_pure_insertion():
    d = ProgramDumps(Programs.build(f_where, (X,), {}))
    original = d.text("original", "jaxpr")
    assert original == str(jax.make_jaxpr(f_where)(X))
    marked = d.marked("jaxpr")
    guard_lines = [l for l in marked.splitlines() if "# hlo_guard: guard:" in l]
    assert len(guard_lines) == 1 and " select_n " in guard_lines[0]
    lines = marked.splitlines()
    sel = lines.index(guard_lines[0])
    sqrt_line = next(i for i, l in enumerate(lines) if " = sqrt " in l)
    assert sel < sqrt_line
    guarded_var = guard_lines[0].split(":")[0].strip()
    assert lines[sqrt_line].split("#")[0].rstrip().endswith(f"sqrt {guarded_var}")
    diff = d.diff("jaxpr")
    removed = [l for l in diff.splitlines() if l.startswith("-") and not l.startswith("---")]
    added = [l for l in diff.splitlines() if l.startswith("+") and not l.startswith("+++")]
    assert removed == []
    assert any("stop_gradient" in l for l in added) and any("select_n" in l for l in added)


def test_grad_jaxpr_marks_transposed_guard():
    marked = dump(f_where, X, level="jaxpr", program="grad", show="guarded")
    assert sum("hlo_guard: guard (transposed)" in l for l in marked.splitlines()) == 1


def test_show_modes_and_levels():
    both = dump(f_where, X, level="stablehlo", show="both")
    assert "==== f_where: original forward stablehlo ====" in both
    assert "==== f_where: guarded forward stablehlo ====" in both
    assert "hlo_guard: guard" in both
    orig = dump(f_where, X, level="stablehlo", show="original")
    assert "hlo_guard" not in orig and orig == jax.jit(f_where).lower(X).as_text().replace(
        'jax.result_info = "result"', 'jax.result_info = "result[0]"'
    )
    with pytest.raises(GuardUsageError, match="level must be one of"):
        dump(f_where, X, level="llvm")
    with pytest.raises(GuardUsageError, match="program must be one of"):
        dump(f_where, X, program="hessian")


def test_reachable_from_explain_report():
    r = explain(f_where, X)
    assert r.dumps("jaxpr") == dump(f_where, X, level="jaxpr")
    assert "hlo_guard: guard" in r.dumps("stablehlo", "forward", show="guarded")


def test_dump_lowered_from_guarded_jit():
    lowered = hlo_guard.guarded_jit(f_where).lower(X)
    text = dump_lowered(lowered)
    assert "hlo_guard: guard" in text and "stablehlo.sqrt" in text
    diff = dump_lowered(lowered, original=jax.jit(f_where).lower(X))
    added = [l for l in diff.splitlines() if l.startswith("+") and not l.startswith("+++")]
    assert len(added) == 1 and "stablehlo.select" in added[0]
    same = dump_lowered(lowered, level="hlo", original=jax.jit(f_where).lower(X))
    assert same.startswith("(no difference")


def test_pytree_and_static_arguments():
    def f(p, n):
        return {"y": jnp.where(p["x"] > n, jnp.log(p["x"]), 0.0)}

    g = hlo_guard.guard(f, static_argnums=1)
    text = dump(g, {"x": X}, 1, level="jaxpr", program="grad", show="guarded")
    assert "hlo_guard: guard" in text


def test_key_normalisers():
    assert jaxpr_key("    bh:f32[4] = select_n bf bg be") == "_:f32[4] = select_n _ _ _"
    assert (
        jaxpr_key("    d:f32[] = convert_element_type[new_dtype=float32 weak_type=False] b")
        == "_:f32[] = convert_element_type[new_dtype=float32 weak_type=False] _"
    )
    assert jaxpr_key("  in (d, e) }") == "in (_, _) }"
    assert (
        stablehlo_key("    %3 = stablehlo.sqrt %2 : tensor<4xf32>")
        == "% = stablehlo.sqrt % : tensor<4xf32>"
    )
