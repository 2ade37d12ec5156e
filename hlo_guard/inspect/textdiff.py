"""Line diffs of IR text that ignore value names.

Inserting one guard renumbers every later value (``d`` becomes ``e`` in a
jaxpr, ``%3`` becomes ``%4`` in StableHLO), so a plain ``difflib`` diff of two
programs marks everything after the first guard as changed.  Here each line is
compared by a *key* with value names (and HLO metadata) normalised away, and
the hunks print the real lines: the diff shows exactly the inserted guards.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Sequence

JAXPR_KEYWORDS = {"lambda", "let", "in"}
_WORD = re.compile(r"^([(\[{]*)([a-z]+)([,)\]}]*)$")
_DECL = re.compile(r"\b[a-z]+:(?=[a-zA-Z])")


def jaxpr_key(line: str) -> str:
    """Value names in a jaxpr line replaced by ``_``; primitives and params kept."""
    line = _DECL.sub("_:", line)
    out = []
    prev = ""
    for tok in line.split():
        m = _WORD.match(tok)
        if m and prev != "=" and m.group(2) not in JAXPR_KEYWORDS:
            tok = f"{m.group(1)}_{m.group(3)}"
        out.append(tok)
        prev = tok
    return " ".join(out)


_SSA = re.compile(r"%[\w.\-]+")
_LOC = re.compile(r"\s*loc\([^()]*(\([^()]*\)[^()]*)*\)")
_LOC_DEF = re.compile(r"^#loc\d*\s*=.*$")


def stablehlo_key(line: str) -> str:
    if _LOC_DEF.match(line.strip()):
        return ""
    line = _LOC.sub("", line)
    line = re.sub(r"@jit_\w+", "@jit_", line)
    line = re.sub(r"^module @\S+", "module @", line.strip())
    return _SSA.sub("%", line).strip()


_METADATA = re.compile(r",?\s*metadata=\{[^{}]*\}")
_HLO_NAME = re.compile(r"%([\w\-]+?)(\.\d+)+\b")
_HLO_SECTIONS = ("FileNames", "FunctionNames", "FileLocations", "StackFrames")


def strip_hlo_debug(text: str) -> str:
    """Optimized HLO without what only records provenance: ``metadata={...}``,
    the stack-frame tables and the module header line."""
    lines = []
    skipping = False
    for line in text.splitlines():
        stripped = line.strip()
        if stripped in _HLO_SECTIONS:
            skipping = True
            continue
        if skipping:
            if stripped == "":
                skipping = False
            continue
        if stripped.startswith("HloModule "):
            line = "HloModule " + ",".join(stripped.split(",")[1:]).strip()
        lines.append(_METADATA.sub("", line))
    return "\n".join(lines)


_TF_PROGRAM = re.compile(r"_inference_\w*?_\d+_*")


def hlo_key(line: str) -> str:
    line = _METADATA.sub("", line)
    line = _TF_PROGRAM.sub("_inference_", line)  # TF numbers its traced programs
    return _HLO_NAME.sub(r"%\1", line).strip()


def normalize_hlo(text: str) -> str:
    """Optimized HLO with provenance and numeric name suffixes removed: two
    programs that compile to the same computation normalise to the same text."""
    return "\n".join(k for k in (hlo_key(l) for l in strip_hlo_debug(text).splitlines()) if k)


KEYS = {"jaxpr": jaxpr_key, "stablehlo": stablehlo_key, "hlo": hlo_key}


def diff_texts(
    level: str, original: str, guarded: str, fromfile: str = "original", tofile: str = "guarded"
) -> str:
    """The name-insensitive diff of two programs at ``level``, provenance dropped
    (HLO metadata and stack frames, StableHLO ``#loc`` definitions)."""
    if level == "hlo":
        original, guarded = strip_hlo_debug(original), strip_hlo_debug(guarded)
    a, b = original.splitlines(), guarded.splitlines()
    if level == "stablehlo":
        a = [l for l in a if not _LOC_DEF.match(l.strip())]
        b = [l for l in b if not _LOC_DEF.match(l.strip())]
    return keyed_diff(a, b, KEYS[level], fromfile=fromfile, tofile=tofile)


def keyed_diff(
    a: Sequence[str],
    b: Sequence[str],
    key: Callable[[str], str],
    fromfile: str = "original",
    tofile: str = "guarded",
    n: int = 3,
) -> str:
    """A unified diff of ``a`` and ``b`` matched by ``key(line)``, printing real lines."""
    ka, kb = [key(l) for l in a], [key(l) for l in b]
    matcher = difflib.SequenceMatcher(None, ka, kb, autojunk=False)
    out: list[str] = []
    for group in matcher.get_grouped_opcodes(n):
        if not out:
            out += [f"--- {fromfile}", f"+++ {tofile}"]
        i1, i2, j1, j2 = group[0][1], group[-1][2], group[0][3], group[-1][4]
        out.append(f"@@ -{i1 + 1},{i2 - i1} +{j1 + 1},{j2 - j1} @@")
        for tag, a1, a2, b1, b2 in group:
            if tag == "equal":
                out += [" " + l for l in b[b1:b2]]
                continue
            if tag in ("replace", "delete"):
                out += ["-" + l for l in a[a1:a2]]
            if tag in ("replace", "insert"):
                out += ["+" + l for l in b[b1:b2]]
    return "\n".join(out)


def inserted_lines(a: Sequence[str], b: Sequence[str], key: Callable[[str], str]) -> list[int]:
    """Indices of lines of ``b`` that have no counterpart in ``a``."""
    ka, kb = [key(l) for l in a], [key(l) for l in b]
    matcher = difflib.SequenceMatcher(None, ka, kb, autojunk=False)
    result: list[int] = []
    for tag, _, _, b1, b2 in matcher.get_opcodes():
        if tag in ("replace", "insert"):
            result.extend(range(b1, b2))
    return result
