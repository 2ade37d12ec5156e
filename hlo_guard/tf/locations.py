"""Where in the user's code a TF op was created (``file:line (function)``),
for reports and error messages; used by tracing and by the inner-gradient
check, which tracing itself imports."""

from __future__ import annotations

import os
import sys

import tensorflow as tf


def _library_dirs():
    """Frames in these directories are library code, not the user's line."""
    modules = [tf, sys.modules.get("keras"), sys.modules.get("hlo_guard")]
    return tuple(
        os.path.dirname(os.path.abspath(m.__file__)) + os.sep
        for m in modules
        if m is not None and getattr(m, "__file__", None)
    )


def user_location(op) -> str:
    """``file:line (function)`` of the innermost user frame that created ``op``."""
    try:
        frames = list(op.traceback)
    except Exception:  # pragma: no cover - ops without a Python traceback
        return ""
    library = _library_dirs()
    for fr in reversed(frames):
        filename = os.path.abspath(fr.filename)
        if filename.startswith(library) or "site-packages" in filename or filename.startswith("<"):
            continue
        return f"{fr.filename}:{fr.lineno} ({fr.name})"
    return ""
