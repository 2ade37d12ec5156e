"""Every script in ``examples/`` runs, exits 0, and -- for the side-by-side
examples -- prints no NaN in the guarded column while the plain column shows
the NaN the example is about.

The side-by-side examples also compare themselves against their hand-written
double-where oracle and exit 1 on a mismatch (``examples/_side_by_side.py``),
so exit status 0 means the printed guarded gradients are right.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
SCRIPTS = sorted(p for p in EXAMPLES.glob("*.py") if not p.name.startswith("_"))
#: scripts printing "x | plain | ... | guarded" tables (the rest are owned by
#: other parts of the project and only have to run cleanly)
TABLE_SCRIPTS = {
    "quickstart.py",
    "where_sqrt.py",
    "safe_norm.py",
    "disk_intersection.py",
    "softplus.py",
    "max_log.py",
    "clip_arccos.py",
    "indexing.py",
    "custom_vjp.py",
}


def run_script(path: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", JAX_PLATFORMS="cpu")
    return subprocess.run(
        [sys.executable, str(path)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )


def table_rows(stdout: str):
    """(columns) of every table row: lines after a header naming the guarded column."""
    rows, in_table = [], False
    for line in stdout.splitlines():
        if " | " in line:
            cols = [c.strip() for c in line.split(" | ")]
            if cols[-1] in ("hlo_guard", "guarded_jit"):
                in_table = True
                continue
            if in_table:
                rows.append(cols)
        else:
            in_table = False
    return rows


def test_table_examples_exist():
    names = {p.name for p in SCRIPTS}
    assert TABLE_SCRIPTS <= names, TABLE_SCRIPTS - names


@pytest.mark.parametrize("path", SCRIPTS, ids=[p.name for p in SCRIPTS])
def test_example_runs(path):
    proc = run_script(path)
    assert proc.returncode == 0, f"{path.name} failed:\n{proc.stdout}\n{proc.stderr}"
    if path.name not in TABLE_SCRIPTS:
        return
    rows = table_rows(proc.stdout)
    assert rows, f"{path.name} printed no side-by-side table:\n{proc.stdout}"
    guarded = [r[-1] for r in rows]
    assert not any("nan" in g.lower() for g in guarded), proc.stdout
    plain = [r[1] for r in rows]
    assert any("nan" in p.lower() for p in plain), (
        f"{path.name} shows no NaN in the plain column: the example demonstrates nothing"
    )
