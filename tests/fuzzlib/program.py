"""Random programs as small expression trees over 1-d float vectors.

A program is a tree of frozen dataclasses.  Every node has a static length;
the inputs ``x`` and ``y`` have length :data:`N`.  The same tree is interpreted
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


Node = Leaf | Const | Unary | Binary | Where | Clip | Reduce | Slice | Gather | Concat | SetAt


def children(node):
    return [v for v in vars(node).values() if isinstance(v, Node.__args__)]


def size(node) -> int:
    return 1 + sum(size(c) for c in children(node))


def to_source(node) -> str:
    """The jnp program as Python source (for failure messages and regression tests)."""
    t = type(node).__name__
    if isinstance(node, Leaf):
        return node.name
    if isinstance(node, Const):
        return f"jnp.full({node.n}, {node.value!r}, jnp.float32)"
    if isinstance(node, Unary):
        return f"{node.op}({to_source(node.a)})"
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
    raise TypeError(t)
