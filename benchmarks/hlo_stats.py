"""Reading optimized HLO text: opcode histograms, selects and fusions.

The issue's target for the forward program is "identical HLO": the guard is
``select(mask, x, stop_gradient(x))`` = ``x`` in every lane, so XLA's
simplifier should remove it completely.  We compare opcode histograms (names,
metadata and layouts differ between any two compilations and mean nothing).

For the gradient program the guards become ``select(mask, ct, 0)``; they cost
nothing only if XLA fuses them into the surrounding elementwise loop.  We
count every ``select`` and say whether it sits in a fused computation (the
body of a ``fusion`` instruction) or at the top level, where it would be its
own pass over memory.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

# "  %name = f32[3]{0} opcode(" or "  ROOT name = (f32[], s32[]) opcode(" -- the shape may
# be a tuple with spaces, so match the opcode as the last word before "(" after "= ".
_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%?(?P<name>[\w.\-]+)\s*=\s*(?P<rest>.*)$")
_OPCODE = re.compile(r"(?:\}|\]|\)|\s)\s*(?P<op>[a-z][\w\-]*)\(")
_COMP = re.compile(r"^(?P<entry>ENTRY\s+)?%?(?P<name>[\w.\-]+)\s*(?:\(.*\))?.*\{\s*$")
_CALLS = re.compile(r"calls=%?(?P<name>[\w.\-]+)")


def _opcode(rest: str) -> str:
    # The shape comes first; the opcode is the first lowercase word directly followed by "(".
    m = _OPCODE.search(" " + rest)
    return m.group("op") if m else "?"


@dataclass
class HloStats:
    opcodes: Counter = field(default_factory=Counter)  # every instruction, all computations
    entry_opcodes: Counter = field(default_factory=Counter)  # top level only
    fused_opcodes: Counter = field(default_factory=Counter)  # inside fusion bodies
    fusions: int = 0

    @property
    def instructions(self) -> int:
        return sum(self.opcodes.values())

    @property
    def selects(self) -> int:
        return self.opcodes["select"]

    @property
    def fused_selects(self) -> int:
        return self.fused_opcodes["select"]

    def as_json(self) -> dict:
        return {
            "instructions": self.instructions,
            "fusions": self.fusions,
            "selects": self.selects,
            "fused_selects": self.fused_selects,
            "unfused_selects": self.selects - self.fused_selects,
            "opcodes": dict(sorted(self.opcodes.items())),
        }


def parse_hlo(text: str) -> HloStats:
    """Histogram the instructions of an optimized HLO module's text."""
    comps: dict[str, list[str]] = {}
    entry = None
    current = None
    called_by_fusion = set()
    for line in text.splitlines():
        if current is None:
            m = _COMP.match(line)
            if m and "=" not in line.split("(")[0]:
                current = m.group("name")
                comps[current] = []
                if m.group("entry"):
                    entry = current
            continue
        if line.strip() == "}":
            current = None
            continue
        m = _INSTR.match(line)
        if not m:
            continue
        op = _opcode(m.group("rest"))
        comps[current].append(op)
        if op == "fusion":
            c = _CALLS.search(line)
            if c:
                called_by_fusion.add(c.group("name"))
    stats = HloStats()
    # fusion bodies may themselves contain fusions (nested); close over them
    for name, ops in comps.items():
        stats.opcodes.update(ops)
        if name == entry:
            stats.entry_opcodes.update(ops)
        if name in called_by_fusion:
            stats.fused_opcodes.update(ops)
    stats.fusions = stats.opcodes["fusion"]
    return stats


def diff_opcodes(a: Counter, b: Counter) -> dict[str, int]:
    """Opcodes whose counts differ, as a - b (empty when identical)."""
    return {k: a[k] - b[k] for k in sorted(set(a) | set(b)) if a[k] != b[k]}
