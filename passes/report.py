"""Report records shared by every front end.

``explain`` and ``compare`` in both front ends speak this model, so that a user
reads the same text and the same JSON whether the program was a jaxpr or a TF
graph.  Records are plain data: front ends fill in operation names, source
locations and the meaning of each mask in words.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class OriginRecord:
    """A selecting operation that makes some lanes dead."""

    op: str
    location: str
    meaning: str = ""


@dataclass
class SiteRecord:
    """One guarded use, or one place dead lanes reach without a guard."""

    kind: str  # "guard" or "unguarded"
    op: str  # the guarded (or unfollowed) operation
    location: str
    scope: str = ""  # nesting path, e.g. "jit(norm)"
    operand: int | None = None  # which input of ``op`` is guarded
    statically_dead: bool = False  # every lane dead: the guard is a stop_gradient
    # Sequence: a front end's richer records (``SiteInfo``'s ``OriginInfo``) fit
    origins: Sequence[OriginRecord] = field(default_factory=list)
    reason: str = ""
    #: a boundary guard: the singular operations of the dead chain behind it
    #: ("Sqrt 'Sqrt' at f.py:3"), whose NaN its select discards
    protects: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Report:
    framework: str
    function: str
    sites: Sequence[SiteRecord] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    #: what the user should know beside the sites (a custom gradient set aside)
    notes: Sequence[str] = field(default_factory=list)

    @property
    def guards(self) -> list[SiteRecord]:
        return [s for s in self.sites if s.kind == "guard"]

    @property
    def unguarded(self) -> list[SiteRecord]:
        return [s for s in self.sites if s.kind == "unguarded"]

    def counts(self) -> dict[str, Any]:
        return {"guards": len(self.guards), "unguarded": len(self.unguarded)}

    def to_dict(self) -> dict[str, Any]:
        return {
            "framework": self.framework,
            "function": self.function,
            "counts": self.counts(),
            "sites": [s.to_dict() for s in self.sites],
            **({"notes": list(self.notes)} if self.notes else {}),
            **({"extra": self.extra} if self.extra else {}),
        }

    def to_json(self, **kwargs) -> str:
        kwargs.setdefault("indent", 2)
        return json.dumps(self.to_dict(), **kwargs)

    def to_text(self) -> str:
        c = self.counts()
        lines = [
            f"hlo_guard report for {self.function} ({self.framework}): "
            f"{c['guards']} guard(s), {c['unguarded']} unguarded site(s)"
        ]
        for s in self.guards:
            where = f" in {s.scope}" if s.scope else ""
            dead = " [every lane dead: stop_gradient]" if s.statically_dead else ""
            lines.append(f"  GUARD  {s.op} operand {s.operand} at {s.location}{where}{dead}")
            if s.reason:
                lines.append(f"         {s.reason}")
            if s.protects:
                lines.append("         protects the chain: " + ", ".join(s.protects))
            for o in s.origins:
                meaning = f": {o.meaning}" if o.meaning else ""
                lines.append(f"         dead lanes from {o.op} at {o.location}{meaning}")
        for s in self.unguarded:
            where = f" in {s.scope}" if s.scope else ""
            lines.append(f"  UNGUARDED  {s.op} at {s.location}{where}: {s.reason}")
            for o in s.origins:
                meaning = f": {o.meaning}" if o.meaning else ""
                lines.append(f"         dead lanes from {o.op} at {o.location}{meaning}")
        lines.extend(f"  NOTE  {note}" for note in self.notes)
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.to_text()
