"""The command line: ``python -m hlo_guard`` (and the ``hlo-guard`` script).

Run as subprocesses, as scripts would: output on stdout, one-line errors on
stderr, never a traceback unless asked, and the documented exit codes
(0 ok, 1 contract violation, 2 usage, 3 --strict and not clean, 4 the function
raised).
"""

import json
import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from hlo_guard.argspec import SpecError, parse_arguments, parse_spec

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

MODEL = textwrap.dedent("""
    import itertools
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.experimental import io_callback

    def f(x):
        return jnp.where(x > 0, jnp.sqrt(x), 0.0)

    def singular(x):
        return jnp.where(x >= 0, jnp.sqrt(x), 0.0)

    def scaled(x, n, scale=1.0):
        return jnp.where(x > n, jnp.log(x), 0.0) * scale

    _counter = itertools.count()

    def drifting(x):
        # a different value on every run: compare must see the forward values differ
        bump = io_callback(lambda: np.float32(next(_counter)),
                           jax.ShapeDtypeStruct((), jnp.float32), ordered=True)
        return jnp.where(x > 0, jnp.sqrt(x), 0.0) + bump

    def boom(x):
        raise RuntimeError("kaboom")

    NOT_A_FUNCTION = 3
""")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli")
    (d / "model.py").write_text(MODEL)
    return d


def run(workdir, *argv, module=True):
    env = dict(
        os.environ,
        TF_CPP_MIN_LOG_LEVEL="2",
        PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
    )
    cmd = [sys.executable, "-m", "hlo_guard", *argv] if module else list(argv)
    return subprocess.run(cmd, cwd=workdir, env=env, capture_output=True, text=True, timeout=120)


def assert_clean_error(p, code, *needles):
    assert p.returncode == code, (p.returncode, p.stdout, p.stderr)
    assert "Traceback" not in p.stderr and p.stdout == ""
    for n in needles:
        assert n in p.stderr, p.stderr


def test_explain_text_with_a_file_path_target(workdir):
    p = run(workdir, "explain", "model.py:f", "f32[5]")
    assert p.returncode == 0, p.stderr
    assert "hlo_guard explain: f(x: f32[5]) [jax]" in p.stdout
    # model.py line 9 is `return jnp.where(x > 0, jnp.sqrt(x), 0.0)` in f
    assert "GUARD #1: sqrt operand 0 (`x`) at model.py:9:" in p.stdout
    assert "lanes where `x > 0` is false" in p.stdout
    assert "SELECTED BY where [select_n] at model.py:9:" in p.stdout  # sites grouped by it


def test_explain_json_with_module_target_static_and_keyword_args(workdir):
    p = run(
        workdir,
        "explain",
        "model:scaled",
        "[-1,0,1,4]",
        "0.5",
        "scale=2.0",
        "--static-argnums",
        "1",
        "--json",
    )
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert d["function"] == "scaled" and d["counts"]["guards"] >= 1
    log = [s for s in d["sites"] if s["op"] == "log"]
    assert log and log[0]["origins"][0]["meaning"] == "lanes where `x > 0.5` is false"


def test_compare_ok_and_strict_exit_codes(workdir):
    p = run(workdir, "compare", "model.py:f", "[-1,0,1,4]", "--strict")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "2 lane(s) changed: [0], [1]" in p.stdout
    # a genuine singularity (sqrt'(0) on the taken branch) stays inf: --strict says 3
    p = run(workdir, "compare", "model.py:singular", "[0,1]", "--strict", "--json")
    assert p.returncode == 3, p.stdout + p.stderr
    d = json.loads(p.stdout)
    assert d["ok"] is True and d["guarded_nonfinite"] == 1


def test_compare_reports_a_changed_forward_value_with_exit_1(workdir):
    p = run(workdir, "compare", "model.py:drifting", "f32[3]", "--transform", "none")
    assert p.returncode == 1, p.stdout + p.stderr
    assert "FAIL: the guarded program changed a forward value" in p.stdout


def test_dump_levels(workdir):
    p = run(
        workdir,
        "dump",
        "model.py:f",
        "f32[4]",
        "--level",
        "stablehlo",
        "--program",
        "grad",
        "--show",
        "guarded",
    )
    assert p.returncode == 0, p.stderr
    assert "hlo_guard: guard (transposed)" in p.stdout and "stablehlo.sqrt" in p.stdout
    p = run(workdir, "dump", "model.py:f", "f32[4]", "--level", "hlo", "--json")
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert d["level"] == "hlo" and d["text"].startswith("(no difference")


def test_usage_errors_exit_2_without_traceback(workdir):
    assert_clean_error(
        run(workdir, "explain", "no_such_module:f", "f32[2]"), 2, "no module named 'no_such_module'"
    )
    assert_clean_error(
        run(workdir, "explain", "model.py:g", "f32[2]"), 2, "has no attribute 'g'", "f, "
    )
    assert_clean_error(run(workdir, "explain", "model.py:f", "q32[2]"), 2, "unknown dtype 'q32'")
    assert_clean_error(
        run(workdir, "explain", "missing.py:f", "f32[2]"), 2, "no such file: missing.py"
    )
    p = run(workdir, "explain", "model.py:f", "f32[2]", "--level", "hlo")
    assert p.returncode == 2 and "unrecognized arguments" in p.stderr


def test_function_errors_exit_4(workdir):
    assert_clean_error(
        run(workdir, "explain", "model.py:boom", "f32[2]"), 4, "RuntimeError: kaboom", "--traceback"
    )
    p = run(workdir, "explain", "model.py:boom", "f32[2]", "--traceback")
    assert p.returncode == 4 and "Traceback" in p.stderr


def test_console_script(workdir):
    script = shutil.which("hlo-guard", path=os.path.dirname(sys.executable))
    if script is None:
        pytest.skip("hlo-guard console script not installed (pip install -e .)")
    p = run(workdir, script, "explain", "model.py:NOT_A_FUNCTION", "f32[2]", module=False)
    assert_clean_error(p, 2, "is a int, not a function")


# -- argument specs (in process) -------------------------------------------------------------


def test_shape_specs_are_filled_deterministically():
    a = parse_spec("f32[4]")
    assert a.dtype == np.float32 and a.tolist() == pytest.approx([-1, -1 / 3, 1 / 3, 1])
    b = parse_spec("f64[2,3]", "arange")
    assert b.dtype == np.float64 and b.shape == (2, 3) and b[1, 2] == 5
    assert parse_spec("i32[]").shape == () and parse_spec("i32[]").dtype == np.int32
    assert parse_spec("bool[3]").tolist() == [True, False, True]
    assert parse_spec("f32[2]", "ones").tolist() == [1, 1]
    np.testing.assert_array_equal(parse_spec("f32[3]", "normal"), parse_spec("f32[3]", "normal"))


def test_literal_specs():
    a = parse_spec("[-1,0,1,4]")
    assert a.dtype == np.float32 and a.tolist() == [-1, 0, 1, 4]
    assert parse_spec("0.5").shape == () and parse_spec("0.5").dtype == np.float32
    assert parse_spec("i32:[1,2]").dtype == np.int32
    assert parse_spec("f64:[[1,2],[3,4]]").shape == (2, 2)
    assert parse_spec("[True, False]").dtype == np.bool_
    args, kwargs = parse_arguments(["f32[2]", "3", "scale=0.5"], static_argnums=(1,))
    assert args[1] == 3 and isinstance(args[1], int) and kwargs["scale"] == np.float32(0.5)


@pytest.mark.parametrize(
    "bad", ["f32[2", "[1,", "'text'", "[[1,2],[3]]", "x64[2]", "{1: 2}", "1+2j"]
)
def test_bad_specs_raise_a_clear_error(bad):
    with pytest.raises(SpecError):
        parse_spec(bad)
