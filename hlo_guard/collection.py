"""Pausing Python's cyclic garbage collector while a guard traces and rewrites.

A guarded trace allocates a great many small, long-lived objects at once: the
traced jaxpr's equations and variables, the analysis's liveness per use, the
plan's sets and dicts, the rewritten jaxpr's equations.  Python's generational
collector is triggered by allocation counts, and each full collection walks
every tracked object in the process -- so while a large program is being
built, collections come often and each one costs in proportion to the program
traced so far.  On a 1k-equation chain that was about half the guarded trace
time (measured with ``benchmarks/trace_scaling.py``).  Reference counting
still frees every acyclic object at once; only cycles wait until the
collector runs again, right after the guard returns.

Eager evaluation is left alone: there the rewrite runs the program op by op
on device arrays, and pausing would only delay freeing what cycles hold.
"""

from __future__ import annotations

import contextlib
import gc

from hlo_guard.jax_frontend.compat import evaluating_eagerly


@contextlib.contextmanager
def collection_paused(tracing: bool = True):
    """Pause the cyclic collector for the block if it is running now and
    ``tracing`` (what is being done builds a program rather than running
    one); leave it as the caller had it either way (a caller that paused it
    already, or an enclosing guard, keeps it paused)."""
    if not tracing or not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def building_a_program() -> bool:
    """Whether operations bound now are staged into a program (a jaxpr trace,
    possibly under JVP or batching) rather than run eagerly."""
    return not evaluating_eagerly()
