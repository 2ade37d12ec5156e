"""Resolve ``MODULE:FUNCTION`` and ``path/to/file.py:FUNCTION`` for the CLI.

A missing module, file or attribute is the user's typo, not a crash: it raises
:class:`TargetError` with a message that names what was looked for (and, for a
missing function, what the module does define).  An exception raised *while
importing* the user's module is passed through: that is the module's error.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from collections.abc import Callable


class TargetError(ValueError):
    pass


def _load_file(path: str):
    if not os.path.isfile(path):
        raise TargetError(f"no such file: {path}")
    directory = os.path.dirname(os.path.abspath(path))
    if directory not in sys.path:
        sys.path.insert(0, directory)  # so that the file's own sibling imports work
    name = "_hlo_guard_target_" + os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise TargetError(f"cannot import {path} as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _import(name: str):
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # console scripts do not put the cwd on sys.path
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if missing == name or name.startswith(missing + "."):
            raise TargetError(
                f"no module named {missing!r} (looked for {name!r}; give "
                "an importable module or a path to a .py file)"
            ) from None
        raise


def load_function(target: str) -> Callable:
    module_part, sep, attr = target.rpartition(":")
    if not sep or not module_part or not attr:
        raise TargetError(f"expected MODULE:FUNCTION or path/to/file.py:FUNCTION, got {target!r}")
    if module_part.endswith(".py") or os.sep in module_part or "/" in module_part:
        module = _load_file(module_part)
    else:
        module = _import(module_part)
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            available = sorted(
                n for n, v in vars(module).items() if callable(v) and not n.startswith("_")
            )[:12]
            hint = f"; callables defined there: {', '.join(available)}" if available else ""
            raise TargetError(f"{module_part} has no attribute {attr!r}{hint}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise TargetError(f"{target} is a {type(obj).__name__}, not a function")
    return obj
