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

import json
from dataclasses import asdict, dataclass, field
from typing import Any

import jax
import numpy as np

from hlo_guard.errors import GuardUsageError
from hlo_guard.inspect.nan_origins import Creation, creations
from hlo_guard.inspect.programs import function_name

MODES = ("reverse", "forward")
#: lanes listed per group
_SHOWN = 8


@dataclass
class LaneGroup:
    """Non-finite lanes of one kind in one derivative."""

    kind: str  # "leak" | "genuine" | "input"
    derivative: str  # "d/dx", "d/dparams['w']", "jvp out[0]"
    lanes: int
    indices: list[list[int]] = field(default_factory=list)  # the first few lanes
    causes: list[dict] = field(default_factory=list)  # Creation records as dicts
    note: str = ""


@dataclass
class DiagnoseReport:
    framework: str
    function: str
    mode: str
    lanes: int  # lanes of the derivative, all leaves together
    groups: list[LaneGroup] = field(default_factory=list)
    #: arguments holding NaN/inf, by path
    nonfinite_inputs: list[str] = field(default_factory=list)
    #: primitives without an hlo_guard rule that created a non-finite derivative
    unknown_primitives: list[str] = field(default_factory=list)

    @property
    def finite(self) -> bool:
        return not self.groups

    def count(self, kind: str) -> int:
        return sum(g.lanes for g in self.groups if g.kind == kind)

    def summary(self) -> str:
        """One line, the answer first."""
        what = "d/d(args)" if self.mode == "reverse" else "the jvp"
        if self.finite:
            return f"{what} of {self.function} is finite in all {self.lanes} lane(s): nothing to diagnose"
        n = sum(g.lanes for g in self.groups)
        derivs = ", ".join(dict.fromkeys(g.derivative for g in self.groups))
        parts = []
        for kind in ("leak", "genuine", "input"):
            groups = [g for g in self.groups if g.kind == kind]
            if not groups:
                continue
            count = sum(g.lanes for g in groups)
            causes = [c for g in groups for c in g.causes]
            sep = ":" if kind == "genuine" and causes else ""
            parts.append(
                f"{count} {kind}{sep}" + (f" {_cause_text(kind, causes)}" if causes else "")
            )
            if kind == "input" and self.nonfinite_inputs:
                parts[-1] += f" ({', '.join(self.nonfinite_inputs)} non-finite)"
        return f"{n} non-finite lane(s) in {derivs}: " + "; ".join(parts)

    def to_text(self) -> str:
        lines = [f"hlo_guard diagnose: {self.function} [{self.framework}, {self.mode} mode]"]
        lines.append("  " + self.summary())
        for g in self.groups:
            lines.append("")
            lines.append(f"{g.kind.upper()}: {g.lanes} lane(s) of {g.derivative}")
            if g.indices and all(len(i) == 0 for i in g.indices):
                lines.append("    lanes: the scalar itself")
            elif g.indices:
                shown = ", ".join(str(tuple(i)) if len(i) != 1 else str(i[0]) for i in g.indices)
                more = " ..." if g.lanes > len(g.indices) else ""
                lines.append(f"    lanes: {shown}{more}")
            for c in g.causes:
                lines.extend("    " + t for t in _cause_lines(g.kind, c))
            if g.note:
                lines.append(f"    {g.note}")
        if self.unknown_primitives:
            lines.append("")
            lines.append(
                "no hlo_guard rule for: "
                + ", ".join(self.unknown_primitives)
                + " (guard(f) leaves such operations unguarded)"
            )
        return "\n".join(lines)

    __str__ = to_text

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["summary"] = self.summary()
        d["finite"] = self.finite
        return d

    def to_json(self, **kwargs) -> str:
        return json.dumps(self.to_dict(), **kwargs)


def _cause_text(kind: str, causes: list[dict]) -> str:
    """``through where at m.py:12 → sqrt at m.py:10`` for the summary line."""
    texts = []
    for c in causes[:2]:
        op = f"{c['primitive']} at {c['location'] or '?'}"
        if kind == "leak" and c["selections"]:
            sel = " and ".join(f"{n} at {loc or '?'}" for n, loc in c["selections"][:2])
            texts.append(f"through {sel} → {op}")
        elif kind == "genuine" and c["examples"]:
            texts.append(f"{c['examples'][0]} at {c['location'] or '?'}")
        else:
            texts.append(op)
    more = f" (+{len(causes) - 2} more)" if len(causes) > 2 else ""
    return ", ".join(texts) + more


def _cause_lines(kind: str, c: dict) -> list[str]:
    loc = c["location"] or "? (inside a library call)"
    head = f"{c['primitive']} at {loc}" + (f": {c['lanes']} lane(s) created" if c["lanes"] else "")
    lines = [head]
    if c["examples"]:
        lines.append("  at " + ", ".join(c["examples"]))
    if kind == "leak":
        for n, sloc in c["selections"]:
            lines.append(f"  carried by the dead lanes of {n} at {sloc or '?'}")
        lines.append("  guard(f) gives a finite derivative in these lanes (computed)")
    elif kind == "genuine":
        lines.append("  on a taken path: the derivative is infinite there (real math, not a leak)")
    if c.get("unknown"):
        lines.append(f"  hlo_guard has no rule for primitive '{c['primitive']}'")
    return lines


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
    from hlo_guard.inspect.diagnose_tf import diagnose_tf, looks_like_tf

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
    idx = np.argwhere(lanes)[:_SHOWN].tolist() if np.ndim(lanes) else [[]]
    return LaneGroup(kind, derivative, int(np.sum(lanes)), idx, causes, note)


def _derivative(f, leaves, mode):
    if mode == "forward":
        tangents = [np.ones_like(x) for x in leaves]
        _, outs_t = jax.jvp(f, list(leaves), tangents)
        return list(outs_t)
    outs, vjp = jax.vjp(f, *leaves)
    return list(vjp([np.ones_like(o) for o in outs]))


def check_argnums(argnums, n: int) -> tuple[int, ...]:
    nums = (argnums,) if isinstance(argnums, int) else tuple(argnums)
    if not nums or not all(isinstance(i, int) for i in nums):
        raise GuardUsageError(f"argnums must be an int or a tuple of ints, got {argnums!r}")
    for i in nums:
        if not -n <= i < n:
            raise GuardUsageError(f"argnums={argnums!r} is out of range for {n} argument(s)")
    return tuple(i % n for i in nums)


def _leaf_names(fn, args, nums, tree) -> list[str]:
    import inspect

    try:
        params = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        params = []
    names = []
    for i in nums:
        base = params[i] if i < len(params) else f"args[{i}]"
        paths = jax.tree_util.tree_flatten_with_path(args[i])[0]
        for path, _ in paths:
            names.append("d/d" + base + jax.tree_util.keystr(path))
    return names


def _nonfinite_args(fn, args) -> list[str]:
    import inspect

    try:
        params = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        params = []
    found = []
    for i, a in enumerate(args):
        base = params[i] if i < len(params) else f"args[{i}]"
        for path, leaf in jax.tree_util.tree_flatten_with_path(a)[0]:
            arr = np.asarray(leaf)
            if np.issubdtype(arr.dtype, np.inexact) and not np.all(np.isfinite(arr)):
                found.append(base + jax.tree_util.keystr(path))
    return found
