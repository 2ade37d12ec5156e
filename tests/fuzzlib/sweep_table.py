"""The curated function table of the transparency sweep (tests/test_transparency.py).

One row per public function: where to find it, how many array arguments it
takes, the input domain its ordinary inputs are drawn from, and -- when it
needs non-array arguments (an axis, an integer order, a shift) -- a small
adapter that fixes them.  Rows whose attribute does not exist in the installed
JAX are dropped by :func:`resolve` and the sweep asserts how many remain, so
the count reported is the count tested.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import jax.scipy.special as jss
from jax import lax


class Row(NamedTuple):
    module: str  # "jnp", "lax", "nn", "special"
    name: str  # public attribute name (dotted for jnp.linalg.*)
    arity: int  # number of float array arguments
    domain: str  # key of DOMAINS in test_transparency
    adapt: Callable | None = None  # fn -> callable taking `arity` arrays


def _fixed(*extra, **kw):
    """Adapter: call the function with trailing non-array arguments fixed."""
    return lambda fn: lambda *a: fn(*a, *extra, **kw)


def _lead(*extra):
    """Adapter: fixed non-array arguments *before* the arrays (order, n)."""
    return lambda fn: lambda *a: fn(*extra, *a)


R = Row
ROWS: list[Row] = []

# -- jax.numpy, elementwise --------------------------------------------------------
for n in [
    "abs",
    "absolute",
    "negative",
    "positive",
    "square",
    "sign",
    "exp",
    "exp2",
    "expm1",
    "sin",
    "cos",
    "tan",
    "arctan",
    "sinh",
    "cosh",
    "tanh",
    "arcsinh",
    "sinc",
    "deg2rad",
    "rad2deg",
    "degrees",
    "radians",
    "cbrt",
    "fabs",
    "rint",
    "round",
    "floor",
    "ceil",
    "trunc",
    "fix",
    "real",
    "conj",
    "conjugate",
    "i0",
    "nan_to_num",
    "around",
    "asinh",
    "atan",
    "acos",
    "asin",
]:
    ROWS.append(R("jnp", n, 1, "real"))
for n in ["sqrt", "log", "log2", "log10", "log1p", "reciprocal", "arccosh", "acosh"]:
    ROWS.append(R("jnp", n, 1, "pos"))
for n in ["arcsin", "arccos", "arctanh", "atanh"]:
    ROWS.append(R("jnp", n, 1, "unit"))
for n in [
    "add",
    "subtract",
    "multiply",
    "divide",
    "true_divide",
    "power",
    "float_power",
    "arctan2",
    "atan2",
    "hypot",
    "logaddexp",
    "logaddexp2",
    "maximum",
    "minimum",
    "fmax",
    "fmin",
    "copysign",
    "remainder",
    "mod",
    "fmod",
    "floor_divide",
    "heaviside",
    "nextafter",
    "pow",
]:
    ROWS.append(R("jnp", n, 2, "pos" if n in ("power", "float_power", "pow") else "real"))
ROWS += [
    R("jnp", "clip", 3, "real"),
    R("jnp", "where", 2, "real", lambda fn: lambda a, b: fn(a > b, a, b)),
]

# -- jax.numpy, reductions, scans and shape ops --------------------------------------
for n in [
    "sum",
    "prod",
    "mean",
    "var",
    "std",
    "max",
    "min",
    "amax",
    "amin",
    "ptp",
    "nansum",
    "nanmean",
    "nanmax",
    "nanmin",
    "nanprod",
    "nanvar",
    "nanstd",
    "median",
    "nanmedian",
    "cumsum",
    "cumprod",
    "nancumsum",
    "nancumprod",
    "cumulative_sum",
    "cumulative_prod",
    "sort",
    "flip",
    "ravel",
    "squeeze",
    "transpose",
    "diff",
    "ediff1d",
    "gradient",
    "trapezoid",
    "average",
    "atleast_1d",
    "atleast_2d",
    "array",
    "asarray",
    "copy",
    "unwrap",
]:
    ROWS.append(R("jnp", n, 1, "real"))
ROWS += [
    R("jnp", "roll", 1, "real", _fixed(2)),
    R("jnp", "quantile", 1, "real", _fixed(0.3)),
    R("jnp", "percentile", 1, "real", _fixed(70.0)),
    R("jnp", "nanquantile", 1, "real", _fixed(0.3)),
    R("jnp", "nanpercentile", 1, "real", _fixed(70.0)),
    R("jnp", "pad", 1, "real", _fixed((2, 1))),
    R("jnp", "tile", 1, "real", _fixed(2)),
    R("jnp", "repeat", 1, "real", _fixed(2)),
    R("jnp", "reshape", 1, "real", _fixed((2, -1))),
    R("jnp", "expand_dims", 1, "real", _fixed(0)),
    R("jnp", "take", 1, "real", _fixed(jnp.array([0, 3, 3, 5]))),
    R("jnp", "delete", 1, "real", _fixed(2)),
    R("jnp", "partition", 1, "real", _fixed(3)),
    R("jnp", "argsort", 1, "real", lambda fn: lambda a: a[fn(a)]),
    R("jnp", "argmax", 1, "real", lambda fn: lambda a: a[fn(a)]),
    R("jnp", "argmin", 1, "real", lambda fn: lambda a: a[fn(a)]),
    R("jnp", "nanargmax", 1, "real", lambda fn: lambda a: a[fn(a)]),
    R("jnp", "count_nonzero", 1, "real", lambda fn: lambda a: a * fn(a)),
    R("jnp", "linspace", 2, "real", lambda fn: lambda a, b: fn(a, b, 3)),
    R(
        "jnp",
        "interp",
        1,
        "real",
        lambda fn: lambda a: fn(a, jnp.array([-1.0, 0.0, 2.0]), jnp.array([0.0, 1.0, 3.0])),
    ),
    R("jnp", "polyval", 2, "real"),
    R("jnp", "concatenate", 2, "real", lambda fn: lambda a, b: fn([a, b])),
    R("jnp", "stack", 2, "real", lambda fn: lambda a, b: fn([a, b])),
    R("jnp", "hstack", 2, "real", lambda fn: lambda a, b: fn([a, b])),
    R("jnp", "vstack", 2, "real", lambda fn: lambda a, b: fn([a, b])),
    R("jnp", "append", 2, "real"),
    R("jnp", "dot", 2, "real"),
    R("jnp", "vdot", 2, "real"),
    R("jnp", "inner", 2, "real"),
    R("jnp", "outer", 2, "real"),
    R("jnp", "kron", 2, "real"),
    R("jnp", "convolve", 2, "real"),
    R("jnp", "correlate", 2, "real"),
    R("jnp", "matmul", 2, "real"),
    R("jnp", "tensordot", 2, "real", _fixed(1)),
    R("jnp", "einsum", 2, "real", lambda fn: lambda a, b: fn("i,i->", a, b)),
    R("jnp", "cross", 2, "real", lambda fn: lambda a, b: fn(a[:3], b[:3])),
    R("jnp", "select", 2, "real", lambda fn: lambda a, b: fn([a > 0, b > 0], [a, b], 0.0)),
    R(
        "jnp",
        "piecewise",
        1,
        "real",
        lambda fn: lambda a: fn(a, [a < 0, a >= 0], [jnp.sin, jnp.cos]),
    ),
    R("jnp", "isclose", 2, "real", lambda fn: lambda a, b: jnp.where(fn(a, b), a, b)),
    R("jnp", "ldexp", 1, "real", _fixed(3)),
    R("jnp", "diag", 1, "mat"),
    R("jnp", "diagonal", 1, "mat"),
    R("jnp", "trace", 1, "mat"),
    R("jnp", "tril", 1, "mat"),
    R("jnp", "triu", 1, "mat"),
    R("jnp", "fliplr", 1, "mat"),
    R("jnp", "flipud", 1, "mat"),
    R("jnp", "rot90", 1, "mat"),
    R("jnp", "cov", 1, "mat"),
    R("jnp", "corrcoef", 1, "mat"),
    R("jnp", "swapaxes", 1, "mat", _fixed(0, 1)),
    R("jnp", "moveaxis", 1, "mat", _fixed(0, 1)),
]
for n in [
    "norm",
    "det",
    "inv",
    "slogdet",
    "pinv",
    "eigvalsh",
    "svd",
    "qr",
    "matrix_norm",
    "vector_norm",
    "trace",
    "diagonal",
    "matrix_transpose",
]:
    ROWS.append(R("jnp", "linalg." + n, 1, "mat"))
ROWS += [
    R("jnp", "linalg.cholesky", 1, "spd"),
    R("jnp", "linalg.eigh", 1, "spd"),
    R("jnp", "linalg.solve", 2, "mat", lambda fn: lambda a, b: fn(a, b[:, 0])),
    R("jnp", "linalg.matrix_power", 1, "mat", _fixed(3)),
    R("jnp", "linalg.lstsq", 2, "mat", lambda fn: lambda a, b: fn(a, b[:, 0])[0]),
]

# -- jax.lax -------------------------------------------------------------------------
for n in [
    "abs",
    "neg",
    "sign",
    "exp",
    "exp2",
    "expm1",
    "sin",
    "cos",
    "tan",
    "atan",
    "sinh",
    "cosh",
    "tanh",
    "asinh",
    "cbrt",
    "erf",
    "erfc",
    "floor",
    "ceil",
    "round",
    "square",
    "logistic",
    "lgamma",
    "is_finite",
    "stop_gradient",
    "conj",
    "reciprocal",
]:
    ROWS.append(R("lax", n, 1, "real"))
for n in ["sqrt", "rsqrt", "log", "log1p", "digamma", "acosh", "bessel_i0e", "bessel_i1e"]:
    ROWS.append(R("lax", n, 1, "pos"))
for n in ["asin", "acos", "atanh", "erf_inv"]:
    ROWS.append(R("lax", n, 1, "unit"))
for n in ["add", "sub", "mul", "div", "rem", "max", "min", "atan2", "nextafter"]:
    ROWS.append(R("lax", n, 2, "real"))
for n in ["pow", "igamma", "igammac", "zeta", "random_gamma_grad"]:
    ROWS.append(R("lax", n, 2, "pos" if n != "zeta" else "gt1"))
ROWS += [
    R("lax", "clamp", 3, "real"),
    R("lax", "select", 2, "real", lambda fn: lambda a, b: fn(a > b, a, b)),
    R("lax", "integer_pow", 1, "real", _fixed(3)),
    R("lax", "polygamma", 1, "pos", lambda fn: lambda a: fn(jnp.ones_like(a), a)),
    R("lax", "betainc", 3, "prob"),
    R("lax", "cumsum", 1, "real"),
    R("lax", "cumprod", 1, "real"),
    R("lax", "cummax", 1, "real"),
    R("lax", "cummin", 1, "real"),
    R("lax", "cumlogsumexp", 1, "real"),
    R("lax", "reduce_max", 1, "real", _fixed((0,))),
    R("lax", "reduce_min", 1, "real", _fixed((0,))),
    R("lax", "reduce_sum", 1, "real", _fixed((0,))),
    R("lax", "reduce_prod", 1, "real", _fixed((0,))),
    R("lax", "sort", 1, "real"),
    R("lax", "top_k", 1, "real", lambda fn: lambda a: fn(a, 3)[0]),
    R("lax", "rev", 1, "real", _fixed((0,))),
    R("lax", "slice", 1, "real", _fixed((1,), (6,), (2,))),
    R("lax", "dynamic_slice", 1, "real", _fixed((jnp.int32(2),), (3,))),
    R(
        "lax",
        "dynamic_update_slice",
        2,
        "real",
        lambda fn: lambda a, b: fn(a, b[:3], (jnp.int32(1),)),
    ),
    R("lax", "pad", 1, "real", lambda fn: lambda a: fn(a, 0.0, [(1, -2, 1)])),
    R("lax", "concatenate", 2, "real", lambda fn: lambda a, b: fn([a, b], 0)),
    R("lax", "reshape", 1, "real", _fixed((2, 4))),
    R("lax", "expand_dims", 1, "real", _fixed((0,))),
    R("lax", "broadcast", 1, "real", _fixed((2,))),
    R("lax", "transpose", 1, "mat", _fixed((1, 0))),
    R("lax", "dot", 2, "real"),
    R("lax", "reduce_precision", 1, "real", _fixed(5, 10)),
    R("lax", "convert_element_type", 1, "real", _fixed(jnp.float32)),
    R(
        "lax",
        "reduce_window",
        1,
        "real",
        lambda fn: lambda a: fn(a, -jnp.inf, lax.max, (3,), (1,), "VALID"),
    ),
    R(
        "lax",
        "conv",
        2,
        "real",
        lambda fn: lambda a, b: fn(a[None, None], b[None, None, :3], (1,), "VALID"),
    ),
    R("lax", "cond", 1, "real", lambda fn: lambda a: fn(a[0] > 0, jnp.sqrt, jnp.exp, a)),
    R(
        "lax",
        "scan",
        1,
        "real",
        lambda fn: lambda a: fn(lambda c, x: (c * x, jnp.maximum(c, x)), 1.0, a)[1],
    ),
    R(
        "lax",
        "fori_loop",
        1,
        "real",
        lambda fn: lambda a: fn(0, 3, lambda i, c: jnp.sin(c) * 2.0, a),
    ),
    R("lax", "map", 1, "real", lambda fn: lambda a: fn(jnp.tanh, a)),
    R("lax", "associative_scan", 1, "real", lambda fn: lambda a: fn(jnp.maximum, a)),
]

# -- jax.nn --------------------------------------------------------------------------
for n in [
    "celu",
    "elu",
    "gelu",
    "glu",
    "hard_sigmoid",
    "hard_silu",
    "hard_swish",
    "hard_tanh",
    "leaky_relu",
    "log_sigmoid",
    "log_softmax",
    "logsumexp",
    "mish",
    "relu",
    "relu6",
    "selu",
    "sigmoid",
    "silu",
    "soft_sign",
    "softmax",
    "softplus",
    "sparse_plus",
    "sparse_sigmoid",
    "squareplus",
    "standardize",
    "swish",
    "tanh",
    "identity",
    "logmeanexp",
]:
    ROWS.append(R("nn", n, 1, "real"))
ROWS.append(R("nn", "log1mexp", 1, "pos"))

# -- jax.scipy.special ---------------------------------------------------------------
for n in [
    "erf",
    "erfc",
    "erfcx",
    "expit",
    "log_ndtr",
    "ndtr",
    "logsumexp",
    "softmax",
    "log_softmax",
    "dawsn",
    "i0",
    "i0e",
    "i1",
    "i1e",
    "entr",
    "spence",
]:
    ROWS.append(R("special", n, 1, "real"))
for n in ["digamma", "gammaln", "loggamma", "gamma", "exp1", "expi", "factorial", "gammasgn"]:
    ROWS.append(R("special", n, 1, "pos"))
for n in ["erfinv"]:
    ROWS.append(R("special", n, 1, "unit"))
for n in ["logit", "ndtri"]:
    ROWS.append(R("special", n, 1, "prob"))
for n in [
    "beta",
    "betaln",
    "gammainc",
    "gammaincc",
    "poch",
    "kl_div",
    "rel_entr",
    "xlogy",
    "xlog1py",
    "owens_t",
]:
    ROWS.append(R("special", n, 2, "pos"))
ROWS += [
    R("special", "zeta", 2, "gt1"),
    R("special", "betainc", 3, "prob"),
    R("special", "hyp1f1", 3, "prob"),
    R("special", "polygamma", 1, "pos", _lead(1)),
    R("special", "expn", 1, "pos", _lead(2)),
    R("special", "multigammaln", 1, "gt1", lambda fn: lambda a: fn(a + 1.0, 2)),
    R("special", "boxcox", 2, "pos"),
    R("special", "boxcox1p", 2, "pos"),
    R("special", "bessel_jn", 1, "pos", lambda fn: lambda a: fn(a, v=2)[-1]),
    R("special", "sici", 1, "pos", lambda fn: lambda a: fn(a)[0] + fn(a)[1]),
    R("special", "fresnel", 1, "real", lambda fn: lambda a: fn(a)[0] * fn(a)[1]),
]

MODULES = {
    "jnp": jnp,
    "lax": lax,
    "nn": jax.nn,
    "special": jss,
}


class Case(NamedTuple):
    label: str
    fn: Callable  # what the sweep calls (the public function, maybe adapted)
    arity: int
    domain: str
    public: Callable  # the public function object itself (aliases share one)


def _lookup(module: str, name: str):
    obj = MODULES[module]
    for part in name.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def resolve() -> list[Case]:
    """Deduplicated cases whose function exists in the installed JAX."""
    seen, cases = set(), []
    for row in ROWS:
        label = f"{row.module}.{row.name}"
        if label in seen:
            continue
        fn = _lookup(row.module, row.name)
        if fn is None:
            continue
        seen.add(label)
        cases.append(Case(label, row.adapt(fn) if row.adapt else fn, row.arity, row.domain, fn))
    return cases
