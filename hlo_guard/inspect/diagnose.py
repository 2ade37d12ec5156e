"""``diagnose(f, *args)``: why is the plain derivative of ``f`` NaN here?

For users who will not put a rewriting pass into production but want the
answer ``jax_debug_nans`` cannot give: which selection's dead lanes carried
the NaN, which operation made it, and whether it is a bug at all.

Every non-finite lane of the plain derivative is classified by computing, not
by guessing:

* **input** -- the argument's own lane is already NaN/inf (reverse mode);
* **leak** -- ``guard(f)``'s derivative is finite in that lane: the NaN came
  from a dead lane of a ``where``/``maximum``/indexing (the guarded
  derivative is actually computed to check it);
* **genuine** -- still non-finite under the guard: a taken path through a
  point where the derivative is infinite (real math, not a bug).

The operations are named by :mod:`hlo_guard.inspect.nan_origins`, which
re-runs the derivative equation by equation on the program's own values and
records where a non-finite derivative is *created* from finite ones.
"""

from __future__ import annotations

from dataclasses import asdict

import jax
import numpy as np

from hlo_guard.errors import GuardUsageError
from hlo_guard.inspect.diagnose_report import (
    MODES,
    SHOWN,
    DiagnoseReport,
    LaneGroup,
    argument_name,
    check_argnums,
)
from hlo_guard.inspect.diagnose_tf import diagnose_tf, looks_like_tf
from hlo_guard.inspect.nan_origins import Creation, creations
from hlo_guard.inspect.programs import function_name

__all__ = ["diagnose", "DiagnoseReport", "LaneGroup"]


def diagnose(fn, *args, argnums=0, mode: str = "reverse") -> DiagnoseReport:
    """Diagnose the non-finite lanes of ``fn``'s plain derivative at ``args``.

    ``argnums`` (int or tuple) picks the arguments differentiated (pytrees
    allowed); ``mode="reverse"`` differentiates the sum of every output
    (``grad`` for a scalar ``fn``), ``mode="forward"`` pushes a tangent of
    ones on those arguments (``jvp``).  ``fn`` may be jitted.  Returns a
    :class:`DiagnoseReport` (``str(report)``, ``report.to_json()``).  With
    TensorFlow tensors (or a function from ``hlo_guard.tf``) the plain
    derivative is TF's XLA gradient (:mod:`hlo_guard.inspect.diagnose_tf`).
    """
    if not callable(fn):
        raise GuardUsageError(f"diagnose needs a callable, got {type(fn).__name__}")
    if mode not in MODES:
        raise GuardUsageError(f"mode must be one of {MODES}, got {mode!r}")
    if looks_like_tf(fn, args):
        return diagnose_tf(fn, *args, argnums=argnums, mode=mode)
    nums = check_argnums(argnums, len(args))
    from hlo_guard.api import guard

    diff = [args[i] for i in nums]
    leaves, tree = jax.tree_util.tree_flatten(diff)
    if not leaves:
        raise GuardUsageError("the differentiated arguments hold no arrays")
    leaves = [np.asarray(x) if not hasattr(x, "dtype") else x for x in leaves]
    for i, x in enumerate(leaves):
        if not np.issubdtype(np.asarray(x).dtype, np.inexact):
            raise GuardUsageError(
                f"argument leaf {i} of argnums={argnums} has dtype {np.asarray(x).dtype}: "
                "only floating-point arguments have a derivative"
            )
    names = _leaf_names(fn, args, nums, tree)

    def flat(f):
        def run(*xs):
            full = list(args)
            for i, v in zip(nums, jax.tree_util.tree_unflatten(tree, list(xs))):
                full[i] = v
            outs = jax.tree_util.tree_leaves(f(*full))
            return [o for o in outs if np.issubdtype(np.result_type(o), np.inexact)]

        return run

    plain = _derivative(flat(fn), leaves, mode)
    guarded = _derivative(flat(guard(fn)), leaves, mode)
    report = DiagnoseReport(
        framework="jax",
        function=function_name(fn),
        mode=mode,
        lanes=int(sum(np.size(d) for d in plain)),
        nonfinite_inputs=_nonfinite_args(fn, args),
    )
    if all(np.all(np.isfinite(d)) for d in plain):
        return report
    found = creations(jax.make_jaxpr(flat(fn))(*leaves), leaves, mode)
    report.unknown_primitives = sorted({c.primitive for c in found if c.unknown})
    labels = names if mode == "reverse" else [f"jvp out[{k}]" for k in range(len(plain))]
    for k, (p, g) in enumerate(zip(plain, guarded)):
        p, g = np.asarray(p), np.asarray(g)
        bad = ~np.isfinite(p)
        if not bad.any():
            continue
        own = mode == "reverse" and p.shape == np.shape(leaves[k])
        is_input = bad & ~np.isfinite(np.asarray(leaves[k])) if own else bad & False
        leak = bad & ~is_input & np.isfinite(g)
        genuine = bad & ~is_input & ~np.isfinite(g)
        for kind, lanes in (("input", is_input), ("leak", leak), ("genuine", genuine)):
            if lanes.any():
                report.groups.append(_group(kind, labels[k], lanes, found))
    return report


def _group(kind: str, derivative: str, lanes, found: list[Creation]) -> LaneGroup:
    causes = [asdict(c) for c in found if c.kind == kind] if kind != "input" else []
    note = ""
    if kind == "leak" and not causes:
        note = (
            "guard(f) makes these lanes finite, but the operation that made the NaN was not "
            "found outside control flow or a custom-derivative call"
        )
    if kind == "genuine" and not causes:
        note = "the non-finite derivative comes from non-finite values, not from one operation"
    idx = np.argwhere(lanes)[:SHOWN].tolist() if np.ndim(lanes) else [[]]
    return LaneGroup(kind, derivative, int(np.sum(lanes)), idx, causes, note)


def _derivative(f, leaves, mode):
    if mode == "forward":
        tangents = [np.ones_like(x) for x in leaves]
        _, outs_t = jax.jvp(f, list(leaves), tangents)
        return list(outs_t)
    outs, vjp = jax.vjp(f, *leaves)
    return list(vjp([np.ones_like(o) for o in outs]))


def _leaf_names(fn, args, nums, tree) -> list[str]:
    names = []
    for i in nums:
        base = argument_name(fn, i)
        paths = jax.tree_util.tree_flatten_with_path(args[i])[0]
        for path, _ in paths:
            names.append("d/d" + base + jax.tree_util.keystr(path))
    return names


def _nonfinite_args(fn, args) -> list[str]:
    found = []
    for i, a in enumerate(args):
        base = argument_name(fn, i)
        for path, leaf in jax.tree_util.tree_flatten_with_path(a)[0]:
            arr = np.asarray(leaf)
            if np.issubdtype(arr.dtype, np.inexact) and not np.all(np.isfinite(arr)):
                found.append(base + jax.tree_util.keystr(path))
    return found
