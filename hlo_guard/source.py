"""Source locations of jaxpr equations, as short ``file:line:col (function)`` strings.

Reports and dumps name the user's code, not JAX's: JAX already records, for
every equation, the innermost frame outside its own sources.  Equations traced
inside library wrappers (the ``select_n`` in ``jnp.where``'s nested ``jit``, the
``max``/``min`` in ``jnp.clip``) have no such frame; callers then fall back to
the location of the enclosing call, which *is* the user's ``jnp.where`` line.
"""

from __future__ import annotations

import os
import re

from jax.extend import source_info_util

_LOC = re.compile(r"^(?P<path>.*?):(?P<line>\d+)(?::(?P<col>\d+))?(?P<rest>.*)$")


def short_path(path: str) -> str:
    """``path`` relative to the working directory when it lies under it;
    ``pkg/module.py`` for installed packages; unchanged otherwise."""
    if not path or path.startswith("<"):
        return path
    try:
        absolute = os.path.abspath(path)
        cwd = os.getcwd()
        if absolute.startswith(cwd + os.sep):
            return os.path.relpath(absolute, cwd)
    except (OSError, ValueError):  # cwd removed, different drive ...
        pass
    for marker in ("site-packages" + os.sep, "dist-packages" + os.sep):
        i = path.rfind(marker)
        if i >= 0:
            return path[i + len(marker) :]
    return path


def short_location(summary: str) -> str:
    """Shorten the path part of a ``file:line:col (function)`` summary."""
    m = _LOC.match(summary or "")
    if not m:
        return summary or ""
    col = f":{m.group('col')}" if m.group("col") else ""
    return f"{short_path(m.group('path'))}:{m.group('line')}{col}{m.group('rest')}"


def eqn_location(eqn) -> str:
    """The user's ``file:line:col (function)`` of ``eqn``, or ``""`` when every
    frame of its traceback is inside JAX (library wrappers)."""
    info = getattr(eqn, "source_info", None)
    if info is None:
        return ""
    try:
        summary = source_info_util.summarize(info)
    except Exception:  # a foreign source_info object: no location rather than a crash
        return ""
    if not summary or summary == "unknown":
        return ""
    return short_location(summary)


def in_installed_package(eqn) -> bool:
    """Whether ``eqn``'s location is inside an installed package (a library's
    internals, not the user's own code)."""
    info = getattr(eqn, "source_info", None)
    try:
        summary = source_info_util.summarize(info) if info is not None else ""
    except Exception:  # a foreign source_info object
        return False
    return any(m + os.sep in summary for m in ("site-packages", "dist-packages"))


def traced_function(fun) -> tuple[str, str, bool]:
    """``(name, short file:line, defined inside JAX)`` of the function a jaxpr
    (or a ``ClosedJaxpr``, or a traced rule) was traced from, read from its
    debug info ("sqrtC at /path/f.py:6"); ``("", "", False)`` where there is
    none.  A function inside JAX (``jnp.where``'s ``_where``, ``defjvps``'s
    rule) gets no location: its line is JAX's, not the user's."""
    info = getattr(getattr(fun, "jaxpr", fun), "debug_info", None)
    text = getattr(info, "func_src_info", None)
    if not isinstance(text, str) or " at " not in text:
        return "", "", False
    name, _, where = text.partition(" at ")
    if "jax/_src/" in where.replace("\\", "/"):
        return name, "", True
    return name, short_location(where), False
