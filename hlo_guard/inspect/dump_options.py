"""The choices a dump offers (IR level, program, what to show), shared by the
JAX dumps (:mod:`hlo_guard.inspect.dumps`) and the TF ones (:mod:`hlo_guard.inspect.explain_tf`)
without either importing the other."""

from __future__ import annotations

from hlo_guard.errors import GuardUsageError

LEVELS = ("jaxpr", "stablehlo", "hlo")
PROGRAMS = ("forward", "grad")
SHOWS = ("diff", "guarded", "original", "both")


def check_choice(name: str, value: str, choices) -> str:
    if value not in choices:
        raise GuardUsageError(f"{name} must be one of {', '.join(choices)}; got {value!r}")
    return value
