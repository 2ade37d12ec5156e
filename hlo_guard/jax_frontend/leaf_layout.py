"""Which argument leaves are traced and which are static.

An Equinox module, a Flax NNX graph state or a Linen ``apply`` closure is a
pytree whose leaves are not all arrays: activation functions, strings, enum
members, ``None``-like markers.  ``eqx.filter_jit`` and friends trace the
array leaves and treat every other leaf as static, and users pass such
pytrees straight to ``guard(loss)(model, x, y)``.  The guard does the same:

* traced: JAX arrays and tracers, numeric numpy arrays and scalars, and Python
  ints, floats and complex numbers passed as arguments or in containers (as
  ``jax.jit`` traces them; ``eqx.filter_jit`` would make them static, but a
  number passed in is data, and static it would re-trace on every new value);
* static: a Python number that is an *attribute* of a registered object (its
  path holds a ``GetAttrKey``: an Equinox module's field, a registered
  dataclass's).  There it is the model's configuration, and library code
  branches on it in Python as ``eqx.filter_jit`` lets it: ``eqx.nn.Dropout``
  with ``p = 0.0`` (inside every default ``MultiheadAttention``) skips itself
  only while ``p`` is a Python float, and traced it demanded a key;
* static: Python bools.  A bool carries no derivative and is nearly
  always a flag (``training=True``, a ``double_where`` switch) that the
  function branches on in Python; traced, it would raise a
  ``TracerBoolConversionError`` -- which is what happened when ``nnx.grad``
  passed a function's default ``flag=False`` explicitly;
* an error: a numpy array of a dtype JAX cannot trace (strings, objects).
  The user meant an array there, and turning it into a static leaf would bake
  it into the trace silently;
* static: functions (activation functions, ``custom_jvp`` objects,
  partials; not callable instances of user classes, which have state),
  values -- objects whose class defines equality (strings, enum members,
  dtypes, frozen dataclasses) --, and stateless objects (no instance
  attributes: sentinels).  A static leaf is part of the trace cache key, by
  value where it is hashable and by identity where it is not; the key holds
  the leaf, so an identity can never be reused by another object while a
  trace keyed on it is cached (the cache's own bounds limit what is kept);
* an error: any other object -- an instance with attributes and identity
  semantics (a model class nobody registered as a pytree).  Static, its
  attributes would be baked into the trace: its arrays would get no
  derivative, and a later change to it would not be seen by a cached trace,
  both silently wrong.  The message says to register the class, or to pass it
  through ``static_argnums`` (an explicit promise not to mutate it).
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

from hlo_guard.errors import GuardUsageError


class StaticLeaf:
    """A static leaf as a cache-key item: by value if hashable, else by identity."""

    __slots__ = ("value", "_by_value")

    def __init__(self, value: Any):
        self.value = value
        try:
            hash(value)
            self._by_value = True
        except TypeError:
            self._by_value = False

    def __hash__(self) -> int:
        if self._by_value:
            return hash((type(self.value), self.value))
        return id(self.value)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, StaticLeaf):
            return NotImplemented
        if self._by_value and other._by_value:
            if type(self.value) is not type(other.value):
                return False
            try:
                return bool(self.value == other.value)
            except Exception:  # noqa: BLE001 -- an odd __eq__ must not break a cache lookup
                return self.value is other.value
        return self.value is other.value

    def __repr__(self) -> str:
        return repr(self.value)


def is_traced_leaf(x: Any) -> bool:
    """Whether ``x`` is a leaf the guard traces (see the module docstring)."""
    if isinstance(x, bool):
        return False
    return isinstance(x, (jax.Array, jax.core.Tracer, np.ndarray, np.generic, int, float, complex))


@dataclass(frozen=True)
class LeafLayout:
    """The full pytree of the dynamic arguments and its static leaves.

    ``tree`` is the structure of *all* leaves; ``static`` the positions (among
    all leaves) of the static ones with their values.  Hashable: it is part of
    the trace cache key."""

    tree: Any
    static: tuple[tuple[int, StaticLeaf], ...]

    @property
    def n_leaves(self) -> int:
        return self.tree.num_leaves

    def unflatten(self, traced_leaves: Sequence[Any]) -> Any:
        """The dynamic arguments from the traced leaves (static ones put back)."""
        if not self.static:
            return jax.tree_util.tree_unflatten(self.tree, traced_leaves)
        at = dict(self.static)
        it = iter(traced_leaves)
        leaves = [at[i].value if i in at else next(it) for i in range(self.n_leaves)]
        return jax.tree_util.tree_unflatten(self.tree, leaves)

    @property
    def traced_tree(self) -> Any:
        """The structure of the traced leaves alone (static ones as ``None``):
        what reports walk to name each traced leaf by its path."""
        if not self.static:
            return self.tree
        at = {i for i, _ in self.static}
        marked = [None if i in at else 0 for i in range(self.n_leaves)]
        return jax.tree_util.tree_structure(jax.tree_util.tree_unflatten(self.tree, marked))


#: function objects a pytree holds as configuration (an activation): static.
#: A callable *instance* of a user class (a model with ``__call__``) is not
#: among them: it has state, and is judged like any other object.
_FUNCTIONS = (
    types.FunctionType,
    types.BuiltinFunctionType,
    types.MethodType,
    types.BuiltinMethodType,
    functools.partial,
    np.ufunc,
    type,
)


def _configuration_number(path, leaf) -> bool:
    """A Python number held as an attribute of a registered object (see the
    module docstring): static, as ``eqx.filter_jit`` keeps it."""
    if not isinstance(leaf, (int, float, complex)) or isinstance(leaf, bool):
        return False
    return any(isinstance(k, jax.tree_util.GetAttrKey) for k in path)


def may_be_static(x: Any) -> bool:
    """Whether a non-array leaf is safe to bake into a trace (see the module
    docstring): a callable, a value, or an object without state."""
    if isinstance(x, _FUNCTIONS) or type(x).__module__.split(".")[0] in ("jax", "jaxlib"):
        return True  # functions, and JAX's own function objects (custom_jvp, jit)
    if type(x).__eq__ is not object.__eq__:
        return True  # a value: equal objects give the same trace
    attrs = getattr(x, "__dict__", None)
    return not attrs and not getattr(type(x), "__slots__", ())


def split_leaves(
    leaves_with_paths: Sequence[tuple[Any, Any]], tree: Any, describe: Callable[[Any], str]
) -> tuple[list[tuple[Any, Any]], LeafLayout]:
    """(the traced leaves with their paths, the layout that puts the static
    ones back).  ``describe(path)`` names a leaf in error messages."""
    traced = []
    static: list[tuple[int, StaticLeaf]] = []
    for i, (path, leaf) in enumerate(leaves_with_paths):
        if is_traced_leaf(leaf) and not _configuration_number(path, leaf):
            traced.append((path, leaf))
        elif not may_be_static(leaf):
            raise GuardUsageError(
                f"{describe(path)} is a {type(leaf).__name__}, not an array, a number or "
                "a pytree of them, and not a value the trace could be keyed on: its "
                "attributes would be baked into the trace (its arrays with no derivative, "
                "later changes unseen); register its class as a pytree "
                "(jax.tree_util.register_dataclass, an equinox.Module, a flax struct) so that "
                "its arrays are traced, or mark it static with static_argnums/static_argnames "
                "(hashable; its contents are then baked into the trace)"
            )
        else:
            static.append((i, StaticLeaf(leaf)))
    return traced, LeafLayout(tree, tuple(static))
