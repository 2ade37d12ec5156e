"""The static liveness lattice.

Every use of a value gets one of three levels:

* ``DEAD``    -- no lane carries a derivative to an output;
* ``PARTIAL`` -- some lanes may, some may not: a per-lane mask is needed;
* ``LIVE``    -- every lane may.

Joining uses is an OR over lanes, i.e. the maximum level.  A dead or partial
liveness remembers which *selecting operations* (a ``where``, a ``max``, a
slice ...) made its lanes dead: those are the "origins" a report names.  The
origin list is capped, because a long chain of selections would otherwise make
every join quadratic; the nearest origins are the useful ones anyway.
"""

from __future__ import annotations

import enum
from collections.abc import Hashable
from dataclasses import dataclass

MAX_ORIGINS = 4


class Level(enum.IntEnum):
    DEAD = 0
    PARTIAL = 1
    LIVE = 2


@dataclass(frozen=True)
class Liveness:
    """Level plus the selections that made lanes dead.

    ``partition``, when set, is ``(select, cases, n_cases, out)``: these lanes
    are the ones where ``select`` takes one of ``cases``, and ``out`` is the
    liveness of the select's output.  It survives only lane-preserving
    operations (elementwise ones), so that a value reaching *every* case of the
    same select -- ``where(p, x, sqrt(x))`` uses ``x`` directly in one case and
    through ``sqrt`` in the other -- is recognised statically as being as live
    as the select's output.  Without it the mask ``or(not p, p)`` would be
    built at run time, and ``p`` may sit downstream.

    ``covered``, when set, is ``(axes, shape)``: of a value of that shape,
    every line of lanes along ``axes`` (every coordinate of the other axes)
    holds at least one live lane.  A gather that reads a lane of every batch
    row makes it (``take_along_axis`` of a cross-entropy: each row's label).
    An operation that sums each line into one lane -- a broadcast of a
    row-wise value back over the row, as ``logsumexp`` is broadcast in
    ``log_softmax`` -- then has a fully live operand, although the lanes
    themselves are only partly live: that every row has a live lane is known
    while tracing, not only at run time.  Like ``partition`` it survives only
    operations that keep every lane where it is (the shape is recorded so
    that a consumer can check that the axes still mean what they meant).
    """

    level: Level
    origins: tuple[Hashable, ...] = ()
    partition: tuple | None = None
    covered: tuple | None = None

    @property
    def is_live(self) -> bool:
        return self.level is Level.LIVE

    @property
    def is_dead(self) -> bool:
        return self.level is Level.DEAD

    @property
    def is_partial(self) -> bool:
        return self.level is Level.PARTIAL

    @property
    def reaches_output(self) -> bool:
        """True unless no derivative flows at all (unused or non-differentiable).

        A use that is DEAD *because of a selection* still reaches an output in
        the forward program; its derivative is structurally zero and the use may
        need a guard.  A use that is DEAD with no origin is simply never
        differentiated.
        """
        return self.level is not Level.DEAD or bool(self.origins)

    def join(self, other: Liveness) -> Liveness:
        if self is other:
            return self
        if self.level is Level.LIVE or other.level is Level.LIVE:
            return LIVE
        if not self.reaches_output:
            return other
        if not other.reaches_output:
            return self
        a, b = self.partition, other.partition
        covered = _joined_cover(self.covered, other.covered)
        if a is not None and b is not None and a[0] == b[0]:
            cases = a[1] | b[1]
            if len(cases) == a[2]:
                return a[3]
            return Liveness(
                Level.PARTIAL,
                merge_origins(self.origins, other.origins),
                (a[0], cases, a[2], a[3]),
                covered,
            )
        level = max(self.level, other.level)
        return Liveness(level, merge_origins(self.origins, other.origins), None, covered)

    def with_origin(self, origin: Hashable) -> Liveness:
        """The same liveness, additionally blamed on ``origin``."""
        if self.level is Level.LIVE:
            return self
        return Liveness(self.level, merge_origins((origin,), self.origins), None, self.covered)

    def without_partition(self) -> Liveness:
        """For operations that move lanes around (transpose, slice, concat ...):
        neither the select partition nor the covered lines survive them."""
        if self.partition is None and self.covered is None:
            return self
        return Liveness(self.level, self.origins)

    def without_cover(self) -> Liveness:
        """For an operand whose lanes do not line up with the value's: an
        implicitly broadcast operand of an elementwise op."""
        if self.covered is None:
            return self
        return Liveness(self.level, self.origins, self.partition)

    def covers_lines_along(self, axes, shape) -> bool:
        """Whether, of this value of ``shape``, every line along ``axes``
        holds a live lane (``covered`` names a subset of them): an operation
        that sums each such line into one lane reads a live lane in each."""
        if self.covered is None or self.level is not Level.PARTIAL:
            return False
        own_axes, own_shape = self.covered
        return tuple(own_shape) == tuple(shape) and own_axes <= frozenset(axes)

    def __repr__(self) -> str:  # compact, for debugging dumps
        return f"{self.level.name}{list(self.origins) if self.origins else ''}"


def _joined_cover(a: tuple | None, b: tuple | None) -> tuple | None:
    """Lanes live in either use: a line with a live lane in one use has one
    in the join, so either fact holds of it; the one over fewer axes is kept
    (a sum over more axes reads every line of it too)."""
    if a is None:
        return b
    if b is None or len(a[0]) <= len(b[0]):
        return a
    return b


def merge_origins(a: tuple, b: tuple) -> tuple:
    if not a:
        return b[:MAX_ORIGINS]
    if not b:
        return a[:MAX_ORIGINS]
    merged = list(a)
    for o in b:
        if o not in merged:
            merged.append(o)
    return tuple(merged[:MAX_ORIGINS])


LIVE = Liveness(Level.LIVE)
NO_DERIVATIVE = Liveness(Level.DEAD)


def dead_by(origin: Hashable) -> Liveness:
    """Statically dead because ``origin`` selects none of its lanes."""
    return Liveness(Level.DEAD, (origin,))


def partial_by(origin: Hashable, downstream: Liveness | None = None) -> Liveness:
    """Partly dead because ``origin`` drops some lanes (and whatever ``downstream`` dropped)."""
    base = Liveness(Level.PARTIAL, (origin,))
    if downstream is None or downstream.level is Level.LIVE:
        return base
    return Liveness(Level.PARTIAL, merge_origins((origin,), downstream.origins))


def case_of(select: Hashable, case: int, n_cases: int, out: Liveness) -> Liveness:
    """Liveness of case ``case`` of an ``n_cases``-way select whose output has
    liveness ``out`` (partly dead, remembering which case it is)."""
    origins = merge_origins((select,), out.origins)
    return Liveness(Level.PARTIAL, origins, (select, frozenset([case]), n_cases, out))


def dropped_by(origin: Hashable, out: Liveness) -> Liveness:
    """The liveness of an input some of whose lanes ``origin`` drops (a slice, a
    gather, the losing side of a max), given the liveness ``out`` of its output."""
    if not out.reaches_output:
        return NO_DERIVATIVE
    if out.level is Level.DEAD:
        return out.with_origin(origin)
    return partial_by(origin, out)


def join_all(items) -> Liveness:
    result = NO_DERIVATIVE
    for item in items:
        result = result.join(item)
        if result.level is Level.LIVE:
            return LIVE
    return result
