"""``compare(fn, *args, transform="grad")``: plain and guarded, compiled side by side.

For every output value and every derivative the transform produces, both
programs are ``jax.jit``-compiled and run on the same arguments, and the
report gives NaN/inf counts on each side, the largest absolute difference on
lanes finite in both, and the lanes that changed.  It answers the two questions
a user has before trusting the rewrite: did any *value* change (it must not),
and which derivative lanes did the guard turn from NaN into a number?

Derivatives are taken with respect to every floating-point leaf of the
arguments (integer leaves are held fixed):

* ``grad``    -- the cotangent ``ones`` on every floating output, pulled back
  (``jax.grad`` of the sum of all outputs);
* ``vjp``     -- the same, per output (ones on that output, zeros elsewhere);
* ``jvp``     -- per input leaf, the tangent ``ones`` on that leaf pushed forward;
* ``jacfwd`` / ``jacrev`` -- full Jacobians, per output and input leaf;
* ``hessian`` -- the Hessian of the sum of all (real) outputs, per pair of leaves;
* ``none``    -- only the forward values.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from hlo_guard.errors import GuardUsageError
from hlo_guard.inspect.programs import Programs, function_name

TRANSFORMS = ("grad", "vjp", "jvp", "jacfwd", "jacrev", "hessian", "none")
#: relative tolerance for "a lane finite on both sides changed" (reassociation
#: in a differently fused program may move the last bits)
RTOL = 1e-5
#: lanes listed per entry in JSON (text lists fewer)
MAX_LANES = 1000
MAX_VALUES = 64


@dataclass
class Side:
    nan: int
    inf: int

    @property
    def nonfinite(self) -> int:
        return self.nan + self.inf


@dataclass
class Entry:
    """One output value or one derivative, plain vs guarded."""

    kind: str  # "value" or "derivative"
    name: str
    shape: tuple[int, ...]
    dtype: str
    plain: Side
    guarded: Side
    max_abs_diff: float | None  # on lanes finite in both; None if there are none
    changed: list[tuple[int, ...]]  # lanes whose values differ (NaN == NaN)
    n_changed: int
    bitwise_equal: bool
    fixed: int  # non-finite in plain, finite guarded
    introduced: int  # finite in plain, non-finite guarded
    drifted: int  # finite in both, differ beyond RTOL
    plain_values: Any = None
    guarded_values: Any = None

    def to_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["plain"], d["guarded"] = self.plain.__dict__, self.guarded.__dict__
        d["shape"] = list(self.shape)
        d["changed"] = [list(ix) for ix in self.changed]
        return d


def _json_number(x):
    x = float(x)
    if np.isnan(x):
        return "nan"
    if np.isinf(x):
        return "inf" if x > 0 else "-inf"
    return x


def _json_values(a: np.ndarray):
    """Small arrays as (nested) lists, NaN/inf as strings (JSON has neither);
    complex lanes as [re, im], flattened."""
    if a.size > MAX_VALUES:
        return None
    if np.iscomplexobj(a):
        return [[_json_number(v.real), _json_number(v.imag)] for v in a.ravel()]
    return np.vectorize(_json_number, otypes=[object])(a).tolist()


def compare_arrays(kind: str, name: str, plain, guarded) -> Entry:
    a, b = np.asarray(plain), np.asarray(guarded)
    if a.dtype == jax.dtypes.float0:
        a = b = np.zeros(a.shape, np.float32)
    inexact = np.issubdtype(a.dtype, np.inexact)
    fin_a = np.isfinite(a) if inexact else np.ones(a.shape, bool)
    fin_b = np.isfinite(b) if inexact else np.ones(b.shape, bool)
    nan_a = np.isnan(a) if inexact else np.zeros(a.shape, bool)
    nan_b = np.isnan(b) if inexact else np.zeros(b.shape, bool)
    both = fin_a & fin_b
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.abs(
            a.astype(np.complex128 if np.iscomplexobj(a) else np.float64)
            - b.astype(np.complex128 if np.iscomplexobj(b) else np.float64)
        )
        same = (a == b) | (nan_a & nan_b)
        drift = both & (
            diff > RTOL * np.abs(a.astype(np.complex128 if np.iscomplexobj(a) else np.float64))
        )
    changed_idx = np.argwhere(~same)
    return Entry(
        kind=kind,
        name=name,
        shape=tuple(a.shape),
        dtype=str(a.dtype),
        plain=Side(int(nan_a.sum()), int((~fin_a & ~nan_a).sum())),
        guarded=Side(int(nan_b.sum()), int((~fin_b & ~nan_b).sum())),
        max_abs_diff=float(diff[both].max()) if both.any() else None,
        changed=[tuple(int(i) for i in ix) for ix in changed_idx[:MAX_LANES]],
        n_changed=int(len(changed_idx)),
        bitwise_equal=a.shape == b.shape and a.tobytes() == b.tobytes(),
        fixed=int((~fin_a & fin_b).sum()),
        introduced=int((fin_a & ~fin_b).sum()),
        drifted=int(drift.sum()),
        plain_values=_json_values(a),
        guarded_values=_json_values(b),
    )


# -- the transformed programs ----------------------------------------------------------


def _transformed(progs: Programs, which: str, transform: str) -> tuple[Callable, list[str]]:
    """(fn(*leaves) -> list of arrays, their names) for one side."""
    f = progs.flat(which)
    xi, yi = progs.diff_leaf_indices(), progs.diff_output_indices()
    xnames = [progs.leaf_names()[i] for i in xi]
    onames = progs.output_names()
    ynames = [onames[j] for j in yi]
    if transform != "none" and (not xi or not yi):
        raise GuardUsageError(
            f"{progs.name} has no floating-point {'input' if not xi else 'output'} to "
            f"differentiate (transform={transform!r}); use transform='none'"
        )

    def restricted(leaves):
        def g(*diff):
            full = list(leaves)
            for i, d in zip(xi, diff):
                full[i] = d
            outs = f(*full)
            return [outs[j] for j in yi]

        return g

    if transform == "none":
        return (lambda *leaves: list(f(*leaves))), []
    if transform == "grad":
        names = [f"d(sum of outputs)/d {x}" for x in xnames]
        return (lambda *leaves: progs.grad_program(which)(*leaves)), names
    if transform == "vjp":
        names = [f"vjp[{y}] wrt {x}" for y in ynames for x in xnames]

        def vjp_fn(*leaves):
            outs, pull = jax.vjp(restricted(leaves), *[leaves[i] for i in xi])
            result = []
            for k in range(len(outs)):
                cts = [
                    jnp.ones_like(o) if m == k else jnp.zeros_like(o) for m, o in enumerate(outs)
                ]
                result.extend(pull(cts))
            return result

        return vjp_fn, names
    if transform == "jvp":
        names = [f"jvp[{y}] along {x}" for x in xnames for y in ynames]

        def jvp_fn(*leaves):
            primals = [leaves[i] for i in xi]
            result = []
            for k in range(len(xi)):
                tangents = [
                    jnp.ones_like(p) if m == k else jnp.zeros_like(p) for m, p in enumerate(primals)
                ]
                _, tout = jax.jvp(restricted(leaves), primals, tangents)
                result.extend(tout)
            return result

        return jvp_fn, names
    if transform in ("jacfwd", "jacrev"):
        jac = jax.jacfwd if transform == "jacfwd" else jax.jacrev
        names = [f"{transform}[{y}] wrt {x}" for y in ynames for x in xnames]

        def jac_fn(*leaves):
            J = jac(restricted(leaves), argnums=tuple(range(len(xi))))(*[leaves[i] for i in xi])
            return [J[k][m] for k in range(len(yi)) for m in range(len(xi))]

        return jac_fn, names
    if transform == "hessian":
        names = [f"hessian[{a}, {b}]" for a in xnames for b in xnames]

        def hess_fn(*leaves):
            g = restricted(leaves)

            def total(*diff):
                outs = g(*diff)
                if any(jnp.iscomplexobj(o) for o in outs):
                    raise GuardUsageError("hessian needs real outputs")
                return sum(jnp.sum(o) for o in outs)

            H = jax.hessian(total, argnums=tuple(range(len(xi))))(*[leaves[i] for i in xi])
            return [H[a][b] for a in range(len(xi)) for b in range(len(xi))]

        return hess_fn, names
    raise GuardUsageError(f"transform must be one of {', '.join(TRANSFORMS)}; got {transform!r}")


def _run(fn: Callable, leaves) -> list[np.ndarray]:
    compiled = jax.jit(fn).lower(*leaves).compile()
    return [np.asarray(x) for x in compiled(*leaves)]


# -- the report ------------------------------------------------------------------------


@dataclass
class Comparison:
    function: str
    signature: str
    transform: str
    entries: list[Entry] = field(default_factory=list)

    @property
    def values(self) -> list[Entry]:
        return [e for e in self.entries if e.kind == "value"]

    @property
    def derivatives(self) -> list[Entry]:
        return [e for e in self.entries if e.kind == "derivative"]

    def values_identical(self) -> bool:
        return all(e.bitwise_equal for e in self.values)

    def introduced(self) -> int:
        """Lanes finite in plain that the guarded program made non-finite (a bug)."""
        return sum(e.introduced for e in self.derivatives)

    def drifted(self) -> int:
        """Derivative lanes finite on both sides whose values differ beyond RTOL."""
        return sum(e.drifted for e in self.derivatives)

    def guarded_nonfinite(self) -> int:
        return sum(e.guarded.nonfinite for e in self.derivatives)

    def fixed(self) -> int:
        return sum(e.fixed for e in self.derivatives)

    def ok(self) -> bool:
        """The contract holds as far as this comparison can tell: values bitwise
        identical, no derivative lane made non-finite or moved."""
        return self.values_identical() and not self.introduced() and not self.drifted()

    def verdict(self) -> str:
        if not self.values_identical():
            return "FAIL: the guarded program changed a forward value"
        if self.introduced():
            return (
                f"FAIL: the guard made {self.introduced()} derivative lane(s) non-finite "
                "that were finite"
            )
        if self.drifted():
            return f"FAIL: {self.drifted()} finite derivative lane(s) changed value"
        left = self.guarded_nonfinite()
        tail = (
            f"; {left} derivative lane(s) are still NaN/inf in the guarded program "
            "(genuine singularities, or sites the report lists as unguarded)"
            if left
            else "; every guarded derivative lane is finite"
        )
        return (
            f"OK: values identical, {self.fixed()} derivative lane(s) fixed "
            f"(NaN/inf -> finite){tail}"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "function": self.function,
            "signature": self.signature,
            "transform": self.transform,
            "ok": self.ok(),
            "values_identical": self.values_identical(),
            "fixed": self.fixed(),
            "introduced": self.introduced(),
            "drifted": self.drifted(),
            "guarded_nonfinite": self.guarded_nonfinite(),
            "verdict": self.verdict(),
            "entries": [e.to_dict() for e in self.entries],
        }

    def to_json(self, **kwargs) -> str:
        kwargs.setdefault("indent", 2)
        return json.dumps(self.to_dict(), **kwargs)

    def to_text(self) -> str:
        lines = [
            f"hlo_guard compare: {self.function}({self.signature}), transform={self.transform}"
        ]
        for e in self.entries:
            shape = f"{e.dtype}{list(e.shape)}"
            lines.append(f"  {e.kind:<10} {e.name}  {shape}")
            lines.append(
                f"      plain:   nan {e.plain.nan:<4} inf {e.plain.inf:<4}" + _small(e.plain_values)
            )
            lines.append(
                f"      guarded: nan {e.guarded.nan:<4} inf {e.guarded.inf:<4}"
                + _small(e.guarded_values)
            )
            if e.bitwise_equal:
                lines.append("      identical (bitwise)")
                continue
            mad = "n/a" if e.max_abs_diff is None else f"{e.max_abs_diff:.3g}"
            shown = ", ".join(str(list(ix)) for ix in e.changed[:10])
            more = f" ... ({e.n_changed} in all)" if e.n_changed > 10 else ""
            lines.append(
                f"      max |diff| on lanes finite in both: {mad}; "
                f"{e.n_changed} lane(s) changed: {shown}{more}"
            )
        lines.append(self.verdict())
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.to_text()


def _small(values) -> str:
    if values is None:
        return ""
    flat = np.asarray(values, dtype=object).ravel()
    if flat.size > 8:
        return ""
    return (
        "  " + "[" + ", ".join(f"{v:.4g}" if isinstance(v, float) else str(v) for v in flat) + "]"
    )


def compare(fn, *args, transform: str = "grad", **kwargs) -> Comparison:
    """Run ``fn`` and ``guard(fn)`` compiled side by side under ``transform``.

    ``fn`` may be plain, ``guard(f)`` or ``guarded_jit(f)``; pass a guarded
    function to declare static arguments.  The forward values are always compared.
    """
    if transform not in TRANSFORMS:
        raise GuardUsageError(
            f"transform must be one of {', '.join(TRANSFORMS)}; got {transform!r}"
        )
    from hlo_guard.inspect.explain_tf import is_tf_guarded

    if is_tf_guarded(fn):
        raise GuardUsageError(
            "compare runs JAX functions; for a TensorFlow function compare "
            "tf.GradientTape results of fn and of its python function"
        )
    progs = Programs.build(fn, args, kwargs)
    leaves = progs.leaves
    result = Comparison(function_name(progs.guarded.fn), progs.signature(), transform)
    plain_out = _run(progs.flat("original"), leaves)
    guarded_out = _run(progs.flat("guarded"), leaves)
    for name, a, b in zip(progs.output_names(), plain_out, guarded_out):
        result.entries.append(compare_arrays("value", name, a, b))
    if transform != "none":
        plain_fn, names = _transformed(progs, "original", transform)
        guarded_fn, _ = _transformed(progs, "guarded", transform)
        for name, a, b in zip(names, _run(plain_fn, leaves), _run(guarded_fn, leaves)):
            result.entries.append(compare_arrays("derivative", name, a, b))
    return result
