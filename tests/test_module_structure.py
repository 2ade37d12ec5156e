"""Structure of the code base itself, checked over the AST of our modules.

* Framework internals (``jax._src``, ``tensorflow.python``, ...) are imported
  only by the two compat modules, so that a framework upgrade touches one file
  per front end and every private hook has its reason written next to it.
"""
from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGES = ("hlo_guard", "passes")

#: modules allowed to reach into framework internals
COMPAT = {"hlo_guard.jax_frontend.compat", "hlo_guard.tf.compat"}


def our_modules():
    """(dotted name, path) of every module in our packages."""
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            yield ".".join(parts), path


def imported_names(path):
    """Every module name an ``import`` statement in ``path`` names, with its line,
    anywhere in the file (function-local imports included)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module, node.lineno
            for alias in node.names:
                yield f"{node.module}.{alias.name}", node.lineno


def is_private_framework_module(name: str) -> bool:
    parts = name.split(".")
    if parts[0] not in ("jax", "jaxlib", "tensorflow", "keras", "tf_keras"):
        return False
    if parts[0] == "tensorflow" and len(parts) > 1 and parts[1] in ("python", "core"):
        return True
    if parts[0] == "keras" and len(parts) > 1 and parts[1] == "src":
        return True
    return any(p.startswith("_") for p in parts[1:])


def test_framework_internals_only_in_compat_modules():
    offenders = []
    for mod, path in our_modules():
        if mod in COMPAT:
            continue
        for name, line in imported_names(path):
            if is_private_framework_module(name):
                offenders.append(f"{path.relative_to(ROOT)}:{line}: {name}")
    assert not offenders, "private framework imports outside compat:\n" + "\n".join(
        sorted(set(offenders)))


def test_the_scan_sees_private_imports():
    """The scan itself must be able to fail."""
    assert is_private_framework_module("jax._src.core")
    assert is_private_framework_module("tensorflow.python.ops.math_ops")
    assert not is_private_framework_module("jax.extend.core")
    assert not is_private_framework_module("numpy.linalg")
