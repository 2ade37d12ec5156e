"""Random programs as small expression trees over 1-d float vectors.

A program is a tree of frozen dataclasses.  Every node has a static length;
the inputs ``x`` and ``y`` have length :data:`N`.  A program may also read a
third, 0-d differentiable input ``s`` (:class:`Scalar`, an operand of a
:class:`Binary`), passed as one of the :data:`SCALAR_KINDS` (weak-typed, a
Python float, float32, bfloat16 or float16).  The same tree is interpreted
twice, by code that shares nothing with hlo_guard:

* :mod:`fuzzlib.vectorized` -- the program under test, built from ``jnp``
  (``where``, ``maximum``, ``clip``, indexing, ...);
* :mod:`fuzzlib.oracle` -- lane by lane with Python ``if``, so a branch that is
  not taken is never evaluated and contributes nothing to ``jax.grad``.

The op tables below are shared by both interpreters (they name *what* to
compute on the lanes that are computed); the selections -- the only place the
two interpretations differ -- are written separately in each.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import jax.numpy as jnp
from jax import lax

#: length of the inputs ``x`` and ``y``
N = 4

# Elementwise ops: name -> function of jnp arrays (also applied to 0-d lanes).
UNARY = {
    "sqrt": jnp.sqrt,
    "rsqrt": lax.rsqrt,
    "cbrt": jnp.cbrt,
    "log": jnp.log,
    "log1p": jnp.log1p,
    "exp": jnp.exp,
    "expm1": jnp.expm1,
    "arccos": jnp.arccos,
    "arcsin": jnp.arcsin,
    "arctanh": jnp.arctanh,
    "arccosh": jnp.arccosh,
    "arcsinh": jnp.arcsinh,
    "arctan": jnp.arctan,
    "tanh": jnp.tanh,
    "sin": jnp.sin,
    "cos": jnp.cos,
    "tan": jnp.tan,
    "sinh": jnp.sinh,
    "reciprocal": jnp.reciprocal,
    "square": jnp.square,
    "cube": lambda a: a**3,
    "inv_square": lambda a: a**-2,
    "abs": jnp.abs,
    "neg": jnp.negative,
    "sigmoid": lambda a: 1.0 / (1.0 + jnp.exp(-a)),
    "logistic": lax.logistic,
    "erf": lax.erf,
    "lgamma": lax.lgamma,
}

BINARY = {
    "add": jnp.add,
    "sub": jnp.subtract,
    "mul": jnp.multiply,
    "div": jnp.divide,
    "pow": jnp.power,
    "arctan2": jnp.arctan2,
}

COMPARE = {
    "gt": lambda a, b: a > b,
    "ge": lambda a, b: a >= b,
    "lt": lambda a, b: a < b,
    "le": lambda a, b: a <= b,
    "eq": lambda a, b: a == b,
    "ne": lambda a, b: a != b,
}

REDUCE = ("sum", "mean", "max", "min")

#: Calls that hand a real 1-d array straight back: each traces to a ``jit``
#: whose body returns its input (``jit[name=real]{ lambda ; a. let in (a,) }``).
#: ``squeeze`` is a no-op only on a length > 1 vector (the generator keeps it so).
IDENTITY = {
    "real": lambda a: a.real,
    "jnp.real": jnp.real,
    "conj": lambda a: a.conj(),
    "squeeze": jnp.squeeze,
    "ravel": jnp.ravel,
}
IDENTITY_SOURCE = {
    "real": "{}.real",
    "jnp.real": "jnp.real({})",
    "conj": "{}.conj()",
    "squeeze": "jnp.squeeze({})",
    "ravel": "jnp.ravel({})",
}

#: How the scalar input ``s`` is passed: its dtype, and whether JAX inserts a
#: ``convert_element_type`` before it meets a float32 vector (all but ``f32``):
#:
#: * ``weak``: ``jnp.asarray(v)`` of a Python float (float32, weak_type=True);
#: * ``python``: the Python float itself, as an argument (traced weak float32);
#: * ``f32``: ``jnp.asarray(v, jnp.float32)`` (weak_type=False);
#: * ``bf16``/``f16``: a bfloat16/float16 scalar (promoted to float32, exactly).
SCALAR_KINDS = ("weak", "python", "f32", "bf16", "f16")
SCALAR_DTYPES = {
    "weak": jnp.float32,
    "python": jnp.float32,
    "f32": jnp.float32,
    "bf16": jnp.bfloat16,
    "f16": jnp.float16,
}


#: the body kinds as source, ``env`` the inputs' dict (``{}`` the subtree)
BODY_SOURCE = {
    "cond": "lax.cond(env['x'][0] == env['x'][0], f, f, env)  # f = lambda env: {}",
    "scan ys": "lax.scan(lambda c, _: (c, f(c)), env, None, length=1)[1][0]  # f: {}",
    "scan carry": "lax.scan(lambda c, _: ((c[0], f(c[0])), None), (env, zeros), None, "
    "length=1)[0][1]  # f: {}",
    "fori": "lax.fori_loop(0, 1, lambda i, acc: f(env), zeros)  # f: {}",
    "while": "lax.while_loop(lambda c: c[0] < 1, lambda c: (c[0] + 1, f(env)), (0, zeros))[1]"
    "  # f: {}",
    "jit": "jax.jit(f)(env)  # f: {}",
    "checkpoint": "jax.checkpoint(f)(env)  # f: {}",
}


def _py_float(v: float) -> str:
    return repr(v) if math.isfinite(v) else f"float({str(v)!r})"


@dataclass(frozen=True)
class ScalarInput:
    """The value of the input ``s`` and how it is passed.  ``value`` is exactly
    representable in the kind's dtype, so every kind promotes to the same
    float32 number: the oracle computes with that float32 value."""

    kind: str  # one of SCALAR_KINDS
    value: float

    def arg(self):
        """The argument handed to the program (and to ``jax.grad`` of it)."""
        if self.kind == "python":
            return self.value
        if self.kind == "weak":
            return jnp.asarray(self.value)
        return jnp.asarray(self.value, SCALAR_DTYPES[self.kind])

    def source(self) -> str:
        v = _py_float(self.value)
        if self.kind == "python":
            return v
        if self.kind == "weak":
            return f"jnp.asarray({v})"
        return f"jnp.asarray({v}, jnp.{jnp.dtype(SCALAR_DTYPES[self.kind]).name})"


@dataclass(frozen=True)
class Leaf:
    name: str  # "x" or "y"

    @property
    def length(self):
        return N


@dataclass(frozen=True)
class Const:
    value: float
    n: int

    @property
    def length(self):
        return self.n


@dataclass(frozen=True)
class Unary:
    op: str
    a: Node

    @property
    def length(self):
        return self.a.length


@dataclass(frozen=True)
class Scalar:
    """The 0-d input ``s``, as an operand of a :class:`Binary` of length ``n``:
    it broadcasts to each of the ``n`` lanes, and its derivative is the sum of
    the lanes' (the oracle differentiates a separate copy per lane)."""

    n: int

    @property
    def length(self):
        return self.n


@dataclass(frozen=True)
class Identity:
    """A call that hands its input straight back (``op`` in IDENTITY)."""

    op: str
    a: Node

    @property
    def length(self):
        return self.a.length


#: Control-flow and call bodies a subtree can be evaluated in, each computing
#: the same values as the subtree (so the per-lane oracle holds unchanged):
#: a ``cond`` whose branches are the same body, a one-iteration ``scan`` (the
#: value as its ``ys``, or as a carry), a ``fori_loop``/``while_loop``
#: writing it into a carry started from zeros, a ``jit``, a ``checkpoint``.
BODY_KINDS = ("cond", "scan ys", "scan carry", "fori", "while", "jit", "checkpoint")


@dataclass(frozen=True)
class Body:
    """The subtree ``a`` computed inside a body of kind ``kind``
    (:data:`BODY_KINDS`), the inputs passed in as operands (``fori``/``while``:
    closed over)."""

    kind: str
    a: Node

    @property
    def length(self):
        return self.a.length


@dataclass(frozen=True)
class Binary:
    """``op`` in BINARY, or ``maximum``/``minimum`` (selections)."""

    op: str
    a: Node
    b: Node

    @property
    def length(self):
        return max(self.a.length, self.b.length)


@dataclass(frozen=True)
class Where:
    cmp: str
    left: Node
    right: Node
    then: Node
    other: Node

    @property
    def length(self):
        return max(n.length for n in (self.left, self.right, self.then, self.other))


@dataclass(frozen=True)
class Clip:
    a: Node
    lo: Node
    hi: Node

    @property
    def length(self):
        return max(self.a.length, self.lo.length, self.hi.length)


@dataclass(frozen=True)
class Reduce:
    op: str
    a: Node

    @property
    def length(self):
        return 1


@dataclass(frozen=True)
class Slice:
    a: Node
    start: int
    stop: int
    step: int

    @property
    def length(self):
        return len(range(self.start, self.stop, self.step))


@dataclass(frozen=True)
class Gather:
    """``a[jnp.array(idx)]``: lanes not in ``idx`` are dropped, repeats summed."""

    a: Node
    idx: tuple[int, ...]

    @property
    def length(self):
        return len(self.idx)


@dataclass(frozen=True)
class Concat:
    a: Node
    b: Node

    @property
    def length(self):
        return self.a.length + self.b.length


@dataclass(frozen=True)
class SetAt:
    """``a.at[idx].set(b)``: the overwritten lanes of ``a`` are dead."""

    a: Node
    idx: tuple[int, ...]  # distinct
    b: Node  # length len(idx) or 1

    @property
    def length(self):
        return self.a.length


@dataclass(frozen=True)
class SegmentMax:
    """``jax.ops.segment_max`` (``op="max"``) or ``segment_min`` of ``a`` over
    the static segment ids ``ids`` (one per lane of ``a``): a lane that is
    not its segment's extremum is dead.  An empty segment holds the identity
    (-inf for max, inf for min), a constant; when every lane of a segment is
    that identity, the constant ties with them (JAX's ``scatter-max`` JVP
    counts it)."""

    op: str
    a: Node
    ids: tuple[int, ...]
    n_segments: int

    @property
    def length(self):
        return self.n_segments


Node = (
    Leaf
    | Const
    | Scalar
    | Unary
    | Identity
    | Body
    | Binary
    | Where
    | Clip
    | Reduce
    | Slice
    | Gather
    | Concat
    | SetAt
    | SegmentMax
)


def children(node):
    return [v for v in vars(node).values() if isinstance(v, Node.__args__)]


def size(node) -> int:
    return 1 + sum(size(c) for c in children(node))


def nodes_of(node):
    """Every node of the tree, ``node`` first."""
    yield node
    for c in children(node):
        yield from nodes_of(c)


def uses_scalar(node) -> bool:
    """Whether the program reads the scalar input ``s`` (then it is ``f(x, y, s)``)."""
    return any(isinstance(n, Scalar) for n in nodes_of(node))


def to_source(node) -> str:
    """The jnp program as Python source (for failure messages and regression tests)."""
    t = type(node).__name__
    if isinstance(node, Leaf):
        return node.name
    if isinstance(node, Const):
        return f"jnp.full({node.n}, {node.value!r}, jnp.float32)"
    if isinstance(node, Scalar):
        return "s"
    if isinstance(node, Unary):
        return f"{node.op}({to_source(node.a)})"
    if isinstance(node, Identity):
        return IDENTITY_SOURCE[node.op].format(to_source(node.a))
    if isinstance(node, Body):
        return BODY_SOURCE[node.kind].format(to_source(node.a))
    if isinstance(node, Binary):
        return f"{node.op}({to_source(node.a)}, {to_source(node.b)})"
    if isinstance(node, Where):
        return (
            f"jnp.where({node.cmp}({to_source(node.left)}, {to_source(node.right)}), "
            f"{to_source(node.then)}, {to_source(node.other)})"
        )
    if isinstance(node, Clip):
        return f"jnp.clip({to_source(node.a)}, {to_source(node.lo)}, {to_source(node.hi)})"
    if isinstance(node, Reduce):
        return f"jnp.{node.op}({to_source(node.a)}, keepdims=True)"
    if isinstance(node, Slice):
        return f"{to_source(node.a)}[{node.start}:{node.stop}:{node.step}]"
    if isinstance(node, Gather):
        return f"{to_source(node.a)}[jnp.array({list(node.idx)})]"
    if isinstance(node, Concat):
        return f"jnp.concatenate([{to_source(node.a)}, {to_source(node.b)}])"
    if isinstance(node, SetAt):
        return f"{to_source(node.a)}.at[jnp.array({list(node.idx)})].set({to_source(node.b)})"
    if isinstance(node, SegmentMax):
        return (
            f"jax.ops.segment_{node.op}({to_source(node.a)}, jnp.array({list(node.ids)}), "
            f"num_segments={node.n_segments})"
        )
    raise TypeError(t)
