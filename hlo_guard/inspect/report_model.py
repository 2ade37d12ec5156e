"""The explain report: :mod:`passes.report`'s records with the fields users asked for.

``passes.report`` holds the framework-neutral records every front end fills
(``Report``, ``SiteRecord``, ``OriginRecord``).  These subclasses only *add*
fields (all defaulted), so a front end that fills the base records still
renders and serialises here, and JSON from either front end has the same keys:

* ``OriginInfo``: the selecting primitive, its nesting scope, which of its
  operands the guarded value reaches, whether its location was inherited from
  the enclosing library call (``jnp.where``'s inner ``select_n``);
* ``SiteInfo``: the guarded primitive, the rendered operand, the static level
  (``partial``/``dead``), a category for unguarded sites (``no-rule``,
  ``control-flow``, ``conservative``, ``skipped``) and the mask in words;
* ``ExplainReport``: counts by kind and by scope, the argument signature, and
  the dumps of the same program (``report.dumps(level, program)``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from passes.report import OriginRecord, Report, SiteRecord

#: unguarded-site categories, in the order the text report lists them
CATEGORIES = ("no-rule", "conservative", "control-flow", "skipped", "other")


@dataclass
class OriginInfo(OriginRecord):
    primitive: str = ""
    scope: str = ""
    operand: int | None = None  # which input of the selecting op is reached
    inherited_location: bool = False  # location is the enclosing call's


@dataclass
class SiteInfo(SiteRecord):
    primitive: str = ""
    operand_expr: str = ""  # the guarded input, rendered
    level: str = ""  # "partial" | "dead"
    category: str = ""  # unguarded sites only
    mask: str = ""  # the dead lanes in words
    node: int | None = None  # equation index within its scope's jaxpr
    output: int | None = None  # forward-mode guard: which output is guarded
    #: "reverse" (input guard), "forward" (output guard) or "contraction" (the
    #: operand's dead lanes zeroed in the other operand's derivative term)
    mode: str = "reverse"
    # ``protects`` (SiteRecord): "sqrt at f.py:3", the chain's singular ops


def _get(obj, name, default=""):
    return getattr(obj, name, default)


_LOCATION = re.compile(r"^(?P<file>.*?):(?P<line>\d+)(?::(?P<col>\d+))?")


def _location_key(location: str) -> tuple[Any, ...]:
    """Sort key of ``file:line:col (fn)``: program order within a file."""
    m = _LOCATION.match(location or "")
    if not m:
        return (location or "~", 0, 0)
    return (m.group("file"), int(m.group("line")), int(m.group("col") or 0))


def _origin_key(o: OriginRecord) -> tuple[Any, ...]:
    return (o.op, o.location, _get(o, "primitive"), _get(o, "scope"))


def _origin_head(o: OriginRecord) -> str:
    prim = _get(o, "primitive")
    name = o.op if not prim or prim == o.op else f"{o.op} [{prim}]"
    scope = _get(o, "scope")
    return f"{name} at {o.location or '?'}" + (f" [in {scope}]" if scope else "")


@dataclass
class ExplainReport(Report):
    signature: str = ""
    # ``notes`` (the base's): remarks on the function as a whole (an aux
    # output keeping lanes live)
    _dumps: Callable[..., Any] | None = field(default=None, repr=False, compare=False)

    def __post_init__(self):
        # guard sites in the order the text lists them (grouped by selection),
        # so that ``GUARD #n`` is ``report.guards[n - 1]``
        grouped = [s for _, sites in self.groups() for s in sites]
        self.sites = grouped + [s for s in self.sites if s.kind != "guard"]

    # -- counts -------------------------------------------------------------------
    def counts(self) -> dict[str, Any]:
        base = super().counts()
        guards = self.guards
        base["statically_dead"] = sum(1 for s in guards if s.statically_dead)
        base["partial"] = len(guards) - base["statically_dead"]
        base["forward_mode"] = sum(1 for s in guards if _get(s, "mode") == "forward")
        base["contraction"] = sum(1 for s in guards if _get(s, "mode") == "contraction")
        by_cat: dict[str, int] = {}
        for s in self.unguarded:
            cat = _get(s, "category") or "other"
            by_cat[cat] = by_cat.get(cat, 0) + 1
        base["unguarded_by_category"] = by_cat
        scopes: dict[str, int] = {}
        for s in guards:
            scopes[s.scope or "<top>"] = scopes.get(s.scope or "<top>", 0) + 1
        base["guards_by_scope"] = scopes
        return base

    def groups(self) -> list[tuple[list[OriginRecord], list[SiteRecord]]]:
        """Guard sites grouped by the selecting operation(s) that make their
        lanes dead, in program order: one ``where`` typically guards both its
        branches' singular operations."""
        by_key: dict[Any, tuple[list[OriginRecord], list[SiteRecord]]] = {}
        for s in self.guards:
            origins = sorted(s.origins, key=lambda o: (_location_key(o.location), _origin_key(o)))
            key = tuple(_origin_key(o) for o in origins)
            by_key.setdefault(key, (origins, []))[1].append(s)
        groups = list(by_key.values())
        for _, sites in groups:
            sites.sort(
                key=lambda s: (_location_key(s.location), _get(s, "mode", "reverse") == "forward")
            )
        groups.sort(  # a group without origins (a constant's zeroed lanes) goes last
            key=lambda g: (
                not g[0],
                _location_key(g[0][0].location) if g[0] else (),
                _location_key(g[1][0].location),
            )
        )
        return groups

    def to_dict(self) -> dict[str, Any]:
        d = super().to_dict()
        d["signature"] = self.signature
        d["notes"] = list(self.notes)
        index = {id(s): i for i, s in enumerate(self.sites)}
        d["groups"] = [
            {"origins": [asdict(o) for o in origins], "sites": [index[id(s)] for s in sites]}
            for origins, sites in self.groups()
        ]
        return d

    # -- text -----------------------------------------------------------------------
    def to_text(self) -> str:
        c = self.counts()
        head = f"hlo_guard explain: {self.function}({self.signature}) [{self.framework}]"
        groups = self.groups()
        lines = [
            head,
            f"  {c['guards']} guard site(s) behind {len(groups)} selecting "
            f"operation(s): {c['partial']} partly dead, "
            f"{c['statically_dead']} dead in every lane; "
            f"{c['unguarded']} unguarded site(s)",
        ]
        lines.extend("  " + note for note in self.notes)
        if not self.sites:
            lines.append("  no lane of any operation is dead: nothing to guard")
        n = 0
        for origins, sites in groups:
            lines.append("")
            if len(origins) == 1:
                lines.append(f"SELECTED BY {_origin_head(origins[0])}")
            elif origins:
                lines.append("SELECTED BY " + " and ".join(_origin_head(o) for o in origins))
            else:
                lines.append("SELECTED BY (unknown)")
            for s in sites:
                n += 1
                lines.extend("  " + line for line in self._site_lines(n, s, grouped=True))
        for n, s in enumerate(self.unguarded, 1):
            lines.append("")
            lines.extend(self._site_lines(n, s))
        return "\n".join(lines)

    @staticmethod
    def _site_lines(n: int, s: SiteRecord, grouped: bool = False) -> list[str]:
        scope = f" [in {s.scope}]" if s.scope else ""
        op = s.op or _get(s, "primitive")
        expr = _get(s, "operand_expr")
        if s.kind == "guard" and _get(s, "output", None) is not None:
            what = f" output {_get(s, 'output')}" + (f" (`{expr}`)" if expr else "")
            lines = [
                f"GUARD #{n}: {op}{what} at {s.location or '?'}{scope} [forward mode: its tangent]"
            ]
            if s.statically_dead:
                lines.append("    every lane is dead: the guard is a plain stop_gradient")
        elif s.kind == "guard" and _get(s, "mode") == "contraction":
            operand = f" operand {s.operand}" + (f" (`{expr}`)" if expr else "")
            lines = [
                f"GUARD #{n}: {op}{operand} at {s.location or '?'}{scope} "
                "[contraction: the other operand's derivative reads its dead lanes as zero]"
            ]
        elif s.kind == "guard":
            operand = f" operand {s.operand}" + (f" (`{expr}`)" if expr else "")
            lines = [f"GUARD #{n}: {op}{operand} at {s.location or '?'}{scope}"]
            if s.statically_dead:
                lines.append("    every lane is dead: the guard is a plain stop_gradient")
            protects = _get(s, "protects", None) or []
            if protects:
                lines.append("    protects the chain: " + ", ".join(protects))
        else:
            cat = _get(s, "category")
            lines = [
                f"UNGUARDED #{n}: {op} at {s.location or '?'}{scope}"
                + (f" ({cat})" if cat else ""),
                f"    reason: {s.reason}",
            ]
        origins = list(s.origins)
        if grouped:  # the group's header names the selection
            meanings = [o.meaning for o in origins if o.meaning]
            mask = _get(s, "mask") or "; ".join(dict.fromkeys(meanings))
            if mask and not s.statically_dead:
                lines.append(f"    dead lanes: {mask}")
        elif len(origins) == 1:
            mask = _get(s, "mask") or origins[0].meaning
            if mask:
                lines.append(f"    dead lanes: {mask}")
            lines.append(f"    selected by {_origin_head(origins[0])}")
        elif origins:
            lines.append("    dead lanes come from:")
            for o in origins:
                lines.append(f"      - {_origin_head(o)}" + (f": {o.meaning}" if o.meaning else ""))
        return lines

    # -- dumps --------------------------------------------------------------------------
    def dumps(self, level: str | None = None, program: str = "forward", show: str = "diff") -> str:
        """The program behind this report at ``level`` (``jaxpr``, ``stablehlo``,
        ``hlo``; default ``jaxpr`` for JAX, ``stablehlo`` for TensorFlow) for
        ``program`` (``forward``, ``grad``); ``show`` one of ``original``,
        ``guarded``, ``both``, ``diff``."""
        if self._dumps is None:
            raise ValueError("this report was not built with its program; use hlo_guard.dump")
        if level is None:
            return self._dumps(program=program, show=show)
        return self._dumps(level=level, program=program, show=show)
