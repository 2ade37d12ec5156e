"""Cases built from optional libraries, measured one by one.

The scripts that try real library code (``trace_cost_libraries.py``,
``relu_networks.py``) build each case with a function that imports its
library; a library that is not installed is reported as skipped instead of
failing the whole run, and the rendered table says so in its row.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def run_cases(cases: dict[str, Callable[[], Any]], measure: Callable[..., dict]) -> list[dict]:
    """``{"case": name, **measure(*built)}`` per case, in order, or
    ``{"case": name, "skipped": reason}`` where building it needs a library
    that is not installed."""
    rows = []
    for name, build in cases.items():
        try:
            built = build()
        except ImportError as exc:
            rows.append({"case": name, "skipped": str(exc)})
            continue
        rows.append({"case": name, **measure(*built)})
    return rows


def skipped_row(row: dict, columns: int) -> str | None:
    """The table row of a skipped case (its reason in the second column), or
    None for a measured one."""
    if "skipped" not in row:
        return None
    return f"| {row['case']} | skipped: {row['skipped']} |" + " |" * (columns - 2)
