"""The original and the guarded program at every level, and the diff between them.

Levels: ``jaxpr`` (``jax.make_jaxpr``), ``stablehlo`` (``jax.jit(f).lower(...)
.as_text()``, before any optimisation: the guards are visible) and ``hlo``
(``.compile().as_text()``, after XLA: in the forward program the guards have
been folded away, in the gradient program they are the ``select`` that zeroes
dead lanes).  Programs: ``forward`` (the function) and ``grad`` (the
cotangent ``ones`` on every floating output pulled back to every floating
input, i.e. ``jax.grad`` of the sum of all outputs).

In the guarded text every line with no counterpart in the original is marked:
guards (``select_n(mask, stop_gradient(x), x)`` in a jaxpr, a ``select`` of a
value with itself in forward StableHLO) say so, other inserted lines (mask
computations, the transposed guard in a gradient) are marked as added.
"""

from __future__ import annotations

import re

import jax

from hlo_guard.errors import GuardUsageError
from hlo_guard.inspect.dump_options import LEVELS, PROGRAMS, SHOWS, check_choice  # noqa: F401
from hlo_guard.inspect.programs import Programs
from hlo_guard.inspect.textdiff import KEYS, diff_texts, inserted_lines, strip_hlo_debug

_JAXPR_SG = re.compile(r"^\s*(\w+):\S+ = stop_gradient (\w+)\s*$")
_JAXPR_SEL = re.compile(r"^\s*\w+:\S+ = select_n (\w+) (\w+) (\w+)\s*$")
_SHLO_SEL = re.compile(r"stablehlo\.select (%[\w.#]+), (%[\w.#]+), (%[\w.#]+)\b")

GUARD_MARK = "hlo_guard: guard"
ADDED_MARK = "hlo_guard: added"


def mark_jaxpr(guarded: str, original: str) -> str:
    """``guarded`` with ``# hlo_guard: ...`` comments on guard and added lines."""
    lines = guarded.splitlines()
    stopped: dict[str, tuple[int, str]] = {}
    for i, line in enumerate(lines):
        m = _JAXPR_SG.match(line)
        if m:
            stopped[m.group(1)] = (i, m.group(2))
    notes: dict[int, str] = {}
    for i, line in enumerate(lines):
        m = _JAXPR_SEL.match(line)
        if m:
            pred, case0, case1 = m.groups()
            sg = stopped.get(case0)
            if sg is not None and sg[1] == case1:
                notes[i] = f"{GUARD_MARK}: derivative of {case1} kept only where {pred}"
                notes.setdefault(sg[0], f"{GUARD_MARK} (its stop_gradient half)")
    for i in inserted_lines(original.splitlines(), lines, KEYS["jaxpr"]):
        m = _JAXPR_SEL.match(lines[i])
        if m and i not in notes:
            notes[i] = (
                f"{GUARD_MARK} (transposed): cotangent {m.group(3)} kept only "
                f"where {m.group(1)}, else 0"
            )
        notes.setdefault(i, ADDED_MARK)
    return "\n".join(f"{l}  # {notes[i]}" if i in notes else l for i, l in enumerate(lines))


def mark_stablehlo(guarded: str, original: str | None = None) -> str:
    """``guarded`` with ``// hlo_guard: ...`` comments: a select of a value with
    itself is a guard as lowered in a forward program."""
    lines = guarded.splitlines()
    notes: dict[int, str] = {}
    for i, line in enumerate(lines):
        m = _SHLO_SEL.search(line)
        if m and m.group(2) == m.group(3):
            notes[i] = (
                f"{GUARD_MARK}: select(mask, x, stop_gradient(x)) lowered; "
                "identity in value, folded by XLA"
            )
    if original is not None:
        for i in inserted_lines(original.splitlines(), lines, KEYS["stablehlo"]):
            if i not in notes and _SHLO_SEL.search(lines[i]):
                notes[i] = f"{GUARD_MARK} (transposed): select(mask, cotangent, 0)"
            notes.setdefault(i, ADDED_MARK)
    return "\n".join(f"{l}  // {notes[i]}" if i in notes else l for i, l in enumerate(lines))


def mark_hlo(guarded: str, original: str) -> str:
    lines = guarded.splitlines()
    added = set(
        inserted_lines(
            strip_hlo_debug(original).splitlines(), [strip_hlo_debug(l) for l in lines], KEYS["hlo"]
        )
    )
    return "\n".join(
        f"{l}  // {ADDED_MARK}" if i in added and l.strip() else l for i, l in enumerate(lines)
    )


class ProgramDumps:
    """Texts of one call signature, computed on demand and cached."""

    def __init__(self, progs: Programs):
        self.progs = progs
        self._texts: dict[tuple[str, str, str], str] = {}
        self._lowered: dict[tuple[str, str], object] = {}

    def _lower(self, which: str, program: str):
        key = (which, program)
        if key not in self._lowered:
            fn = self.progs.program_fn(which, program)
            self._lowered[key] = jax.jit(fn).lower(*self.progs.leaves)
        return self._lowered[key]

    def text(self, which: str, level: str = "jaxpr", program: str = "forward") -> str:
        """The unmarked text of the ``original`` or ``guarded`` program."""
        check_choice("level", level, LEVELS)
        check_choice("program", program, PROGRAMS)
        key = (which, level, program)
        if key not in self._texts:
            if level == "jaxpr":
                fn = self.progs.program_fn(which, program)
                text = str(jax.make_jaxpr(fn)(*self.progs.leaves))
            elif level == "stablehlo":
                text = self._lower(which, program).as_text()
            else:
                text = self._lower(which, program).compile().as_text()
            self._texts[key] = text
        return self._texts[key]

    def marked(self, level: str = "jaxpr", program: str = "forward") -> str:
        guarded = self.text("guarded", level, program)
        original = self.text("original", level, program)
        if level == "jaxpr":
            return mark_jaxpr(guarded, original)
        if level == "stablehlo":
            return mark_stablehlo(guarded, original)
        return mark_hlo(guarded, original)

    def diff(self, level: str = "jaxpr", program: str = "forward") -> str:
        original = self.text("original", level, program)
        guarded = self.text("guarded", level, program)
        name = self.progs.name
        diff = diff_texts(
            level,
            original,
            guarded,
            fromfile=f"{name} original {program} {level}",
            tofile=f"{name} guarded {program} {level}",
        )
        if not diff:
            return (
                f"(no difference between original and guarded {program} {level} of "
                f"{name}, ignoring value names and metadata)"
            )
        return diff

    def show(self, level: str = "jaxpr", program: str = "forward", show: str = "diff") -> str:
        check_choice("show", show, SHOWS)
        check_choice("level", level, LEVELS)
        check_choice("program", program, PROGRAMS)
        if show == "diff":
            return self.diff(level, program)
        if show == "original":
            return self.text("original", level, program)
        if show == "guarded":
            return self.marked(level, program)
        name = self.progs.name
        return "\n".join(
            [
                f"==== {name}: original {program} {level} ====",
                self.text("original", level, program),
                "",
                f"==== {name}: guarded {program} {level} ====",
                self.marked(level, program),
            ]
        )


def dump(
    fn, *args, level: str = "jaxpr", program: str = "forward", show: str = "diff", **kwargs
) -> str:
    """Text of ``fn`` (plain, ``guard(f)`` or ``guarded_jit(f)``) at these arguments:
    ``show='diff'`` (default), ``'guarded'`` (marked), ``'original'`` or ``'both'``.
    A TensorFlow-guarded function is dumped through XLA's compiler IR."""
    from hlo_guard.inspect.explain_tf import is_tf_guarded, tf_dumps

    if is_tf_guarded(fn):
        if kwargs:
            raise GuardUsageError("dumps of a TensorFlow function take positional arguments")
        return tf_dumps(fn, args).show(level, program, show)
    from hlo_guard.inspect.explain_tf import refuse_plain_tf

    with refuse_plain_tf(fn, args, kwargs, tool="hlo_guard.dump"):
        return ProgramDumps(Programs.build(fn, args, kwargs)).show(level, program, show)


def dump_lowered(lowered, level: str = "stablehlo", original=None) -> str:
    """Text of a ``jax.stages.Lowered`` (e.g. ``guarded_jit(f).lower(x)``):
    ``stablehlo`` as lowered, or ``hlo`` as compiled.  With ``original`` (the
    ``Lowered`` of the unguarded function, ``jax.jit(f).lower(x)``) the result is
    the name-insensitive diff from it instead."""
    check_choice("level", level, ("stablehlo", "hlo"))

    def text_of(low):
        return low.as_text() if level == "stablehlo" else low.compile().as_text()

    text = text_of(lowered)
    if original is None:
        return mark_stablehlo(text) if level == "stablehlo" else text
    diff = diff_texts(level, text_of(original), text)
    return diff or f"(no difference at {level}, ignoring value names and metadata)"


def levels_available() -> list[str]:
    return list(LEVELS)
