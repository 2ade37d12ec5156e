"""Argument specs for the command line: ``f32[4]``, ``f64[2,3]``, ``i32[]``,
literals ``[-1,0,1,4]`` / ``0.5``, typed literals ``f64:[1,2]``.

A shape spec is filled deterministically (``--fill``) so that a command line
reproduces the same numbers on every machine.  Untyped numeric literals become
float32 -- derivatives are taken with respect to floating-point arguments, and
``[-1,0,1,4]`` is what people type for a float vector; write ``i32:[1,2]`` for
integers.  64-bit dtypes switch on ``jax_enable_x64`` (as JAX requires).
"""

from __future__ import annotations

import ast
import re
from typing import Any

import numpy as np

DTYPES: dict[str, Any] = {
    "f16": np.float16,
    "bf16": "bfloat16",
    "f32": np.float32,
    "f64": np.float64,
    "c64": np.complex64,
    "c128": np.complex128,
    "i8": np.int8,
    "i16": np.int16,
    "i32": np.int32,
    "i64": np.int64,
    "u8": np.uint8,
    "u16": np.uint16,
    "u32": np.uint32,
    "u64": np.uint64,
    "bool": np.bool_,
    "pred": np.bool_,
}
WIDE = {"f64", "c128", "i64", "u64"}
FILLS = ("linspace", "zeros", "ones", "arange", "normal")

_SHAPE = re.compile(r"^(?P<dtype>[a-z]+\d*)\[(?P<dims>[\d,\s]*)\]$")
_TYPED = re.compile(r"^(?P<dtype>[a-z]+\d*):(?P<lit>.+)$", re.S)


class SpecError(ValueError):
    """A spec that cannot be parsed; the message says what is expected."""


HELP = (
    "an argument is a shape spec DTYPE[DIMS] (e.g. f32[4], f64[2,3], i32[]), a literal "
    "(0.5, [-1,0,1,4]: float32), a typed literal (f64:[1,2], i32:3), or NAME=SPEC "
    "for a keyword argument; dtypes: " + ", ".join(DTYPES)
)


def _dtype(name: str, spec: str):
    if name not in DTYPES:
        raise SpecError(f"unknown dtype {name!r} in {spec!r}; known: {', '.join(DTYPES)}")
    dt = DTYPES[name]
    if dt == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(dt)


def fill(shape: tuple[int, ...], dtype: np.dtype, how: str) -> np.ndarray:
    """Deterministic contents for a shape spec."""
    if how not in FILLS:
        raise SpecError(f"unknown fill {how!r}; choose one of {', '.join(FILLS)}")
    size = int(np.prod(shape)) if shape else 1
    flat: np.ndarray
    if how == "zeros":
        flat = np.zeros(size)
    elif how == "ones":
        flat = np.ones(size)
    elif how == "arange":
        flat = np.arange(size, dtype=np.float64)
    elif how == "normal":
        flat = np.random.default_rng(0).standard_normal(size)
    else:  # linspace over [-1, 1]: negative, (for odd sizes) zero and positive lanes
        if dtype == np.bool_:
            flat = np.arange(size) % 2 == 0
        elif np.issubdtype(dtype, np.integer):
            flat = np.arange(size) - size // 2
        else:
            flat = np.linspace(-1.0, 1.0, size)
    return np.asarray(flat).astype(dtype).reshape(shape)


def _literal(text: str, spec: str):
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        raise SpecError(f"cannot parse argument {spec!r}. {HELP}") from None


def parse_spec(spec: str, how: str = "linspace") -> np.ndarray:
    """One positional spec -> a numpy array."""
    s = spec.strip()
    m = _SHAPE.match(s)
    if m:
        dtype = _dtype(m.group("dtype"), spec)
        dims = [d.strip() for d in m.group("dims").split(",") if d.strip()]
        shape = tuple(int(d) for d in dims)
        return fill(shape, dtype, how)
    m = _TYPED.match(s)
    if m and m.group("dtype") in DTYPES:
        dtype = _dtype(m.group("dtype"), spec)
        value = _literal(m.group("lit"), spec)
        return _as_array(value, dtype, spec)
    value = _literal(s, spec)
    if isinstance(value, bool) or (isinstance(value, list) and _all_bool(value)):
        return _as_array(value, np.dtype(np.bool_), spec)
    return _as_array(value, np.dtype(np.float32), spec)


def _all_bool(v) -> bool:
    if isinstance(v, list):
        return bool(v) and all(_all_bool(x) for x in v)
    return isinstance(v, bool)


def _as_array(value, dtype, spec) -> np.ndarray:
    if not isinstance(value, (int, float, complex, bool, list, tuple)):
        raise SpecError(
            f"argument {spec!r} is a {type(value).__name__}, not a number or a "
            f"list of numbers. {HELP}"
        )
    try:
        arr = np.asarray(value)
    except ValueError:
        raise SpecError(f"argument {spec!r} is a ragged list (rows of different lengths)") from None
    if arr.dtype == object or arr.dtype.kind not in "biufc":
        raise SpecError(f"argument {spec!r} must hold only numbers. {HELP}")
    if np.iscomplexobj(arr) and dtype.kind != "c":
        raise SpecError(f"argument {spec!r} is complex; give a complex dtype (c64:...)")
    return arr.astype(dtype)


def needs_x64(specs: list[str]) -> bool:
    for spec in specs:
        body = spec.split("=", 1)[1] if _is_keyword(spec) else spec
        m = _SHAPE.match(body.strip()) or _TYPED.match(body.strip())
        if m and m.group("dtype") in WIDE:
            return True
    return False


def _is_keyword(spec: str) -> bool:
    head = spec.split("=", 1)[0]
    return "=" in spec and head.isidentifier() and not spec.startswith("[")


def parse_arguments(
    specs: list[str], how: str = "linspace", static_argnums=()
) -> tuple[list[Any], dict[str, Any]]:
    """Positional and keyword arguments from specs; a static position takes the
    Python literal as it is (or the raw string when it is not a literal)."""
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    for spec in specs:
        if _is_keyword(spec):
            name, body = spec.split("=", 1)
            if name in kwargs:
                raise SpecError(f"keyword argument {name!r} given twice")
            kwargs[name] = parse_spec(body, how)
            continue
        if kwargs:
            raise SpecError(f"positional argument {spec!r} after keyword arguments")
        if len(args) in static_argnums:
            try:
                args.append(ast.literal_eval(spec))
            except (ValueError, SyntaxError):
                args.append(spec)
            continue
        args.append(parse_spec(spec, how))
    return args, kwargs
