"""Structure of the code base itself, checked over the AST of our modules.

* No import cycles among our modules (function-local imports count: they
  hide a cycle, they do not remove it).
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
        sorted(set(offenders))
    )


def test_the_scan_sees_private_imports():
    """The scan itself must be able to fail."""
    assert is_private_framework_module("jax._src.core")
    assert is_private_framework_module("tensorflow.python.ops.math_ops")
    assert not is_private_framework_module("jax.extend.core")
    assert not is_private_framework_module("numpy.linalg")


# -- import cycles among our modules -------------------------------------------


def our_imports(mod: str, path, known):
    """Our modules that ``mod`` imports (module-level and function-local alike:
    a function-local import hides a cycle, it does not remove it)."""
    found = set()
    tree = ast.parse(path.read_text(), filename=str(path))
    type_only = {
        id(n)
        for block in ast.walk(tree)
        if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test)
        for stmt in block.body
        for n in ast.walk(stmt)
    }  # never run
    for node in ast.walk(tree):
        if id(node) in type_only:
            continue
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # ``from pkg import sub`` imports the module pkg.sub; ``from pkg import
            # name`` the package itself
            names = [
                f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in known else node.module
                for a in node.names
            ]
        for name in names:
            if name in known and name != mod:
                found.add(name)
            # importing pkg.sub first runs pkg/__init__ -- unless ``mod`` is
            # inside pkg, whose __init__ has then already started
            parts = name.split(".")
            for k in range(1, len(parts)):
                parent = ".".join(parts[:k])
                if parent in known and not (mod == parent or mod.startswith(parent + ".")):
                    found.add(parent)
    return found


def import_cycles():
    """Strongly connected components of more than one module (Tarjan)."""
    modules = dict(our_modules())
    graph = {m: our_imports(m, p, modules) for m, p in modules.items()}
    index, low, stack, on, comps = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return comps


#: cycles not yet broken: none.  A ratchet: any new cycle fails the test.  The
#: last three were broken by leaf modules that hold what both sides needed
#: (``jax_frontend.binding``, ``jax_frontend.bodies``, ``jax_frontend.rule_table``,
#: ``tf.records``, ``tf.dumps``) and by passing the body builder into
#: ``tf.control.guard_bodies``.
KNOWN_CYCLES: list = []


def test_no_import_cycles():
    cycles = import_cycles()
    assert sorted(cycles) == sorted(KNOWN_CYCLES), "import cycles among our modules:\n" + "\n".join(
        " <-> ".join(c) for c in cycles
    )
