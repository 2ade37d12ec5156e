"""The report ``diagnose`` returns, for both front ends: lane groups by
kind (leak, genuine, input) with their causes, a one-line summary first,
text and JSON.  A leaf module: ``diagnose`` (JAX) and ``diagnose_tf`` both
build it."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from hlo_guard.errors import GuardUsageError

MODES = ("reverse", "forward")
#: lanes listed per group
SHOWN = 8


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


def argument_name(fn, i: int) -> str:
    """``fn``'s name for positional argument ``i`` (``args[i]`` without one)."""
    from hlo_guard.jax_frontend.tracing import positional_names

    names = positional_names(fn)
    return names[i] if i < len(names) else f"args[{i}]"


def check_argnums(argnums, n: int) -> tuple[int, ...]:
    nums = (argnums,) if isinstance(argnums, int) else tuple(argnums)
    if not nums or not all(isinstance(i, int) for i in nums):
        raise GuardUsageError(f"argnums must be an int or a tuple of ints, got {argnums!r}")
    for i in nums:
        if not -n <= i < n:
            raise GuardUsageError(f"argnums={argnums!r} is out of range for {n} argument(s)")
    return tuple(i % n for i in nums)
