"""The user's function and its guarded version as flat functions of array leaves.

Dumps and ``compare`` need the *same* program twice -- as the user wrote it and
as ``guard`` rewrites it -- with static arguments bound and pytrees flattened,
so that ``jax.jit(...).lower(*leaves)`` and the derivative transforms see plain
positional arrays.  Both sides go through the public callables (the user's
``fn`` and the :class:`~hlo_guard.api.GuardedFunction`), so whatever the guard
does at call time is what is dumped and compared.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from hlo_guard.api import GuardedFunction, evaluating_the_inspected_program, guard
from hlo_guard.errors import GuardUsageError
from hlo_guard.jax_frontend.graph import is_inexact_aval
from hlo_guard.jax_frontend.tracing import merge_arguments, signature_of


def as_guarded(fn) -> GuardedFunction:
    """``fn`` itself if it is already guarded (also behind ``guarded_jit``'s
    ``jax.jit``), else ``guard(fn)``."""
    if isinstance(fn, GuardedFunction):
        return fn
    # only a ``jax.jit`` of a guarded function is that function: ``jax.grad``
    # and ``functools.wraps`` name what they wrap in ``__wrapped__`` too, and
    # ``jax.grad(guard(f))`` is the gradient, not ``f``
    inner = getattr(fn, "__wrapped__", None)
    if isinstance(inner, GuardedFunction) and _is_jit_wrapper(fn):
        return inner
    if not callable(fn):
        raise GuardUsageError(f"expected a callable, got {type(fn).__name__}: {fn!r}")
    return guard(fn)


def _is_jit_wrapper(fn) -> bool:
    """Whether ``fn`` is what ``jax.jit`` returns (``guarded_jit``'s result):
    it lowers and traces; the wrappers of other transformations do not."""
    return callable(getattr(fn, "lower", None)) and callable(getattr(fn, "trace", None))


def function_name(fn) -> str:
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)


@dataclass
class Programs:
    """One call signature of ``fn``: its leaves, their names, and flat callables."""

    guarded: GuardedFunction
    program: Any  # hlo_guard.jax_frontend.tracing.TracedProgram
    leaves: list[Any]
    static: Any
    n_args: int
    name: str

    @classmethod
    def build(cls, fn, args: Sequence[Any], kwargs: dict) -> Programs:
        g = as_guarded(fn)
        # the program a call outside any trace evaluates, whose calls name
        # the user's jnp functions; flat() evaluates the same one when traced
        program, leaves = g.traced_for(False, args, kwargs)
        _, _, _, _, static = signature_of(g.fn, args, kwargs, g.static_argnums, g.static_argnames)
        name = getattr(g.fn, "__name__", None) or "fn"
        return cls(g, program, list(leaves), static, len(args), name)

    # -- names -----------------------------------------------------------------------
    def leaf_names(self) -> list[str]:
        """``x``, ``params['w']``, ``args[2]`` ... one per dynamic leaf."""
        try:
            params = [
                p
                for p in inspect.signature(self.guarded.fn).parameters.values()
                if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
            ]
        except (TypeError, ValueError):
            params = []
        static_pos = {i for i, _ in self.static[0]}
        dyn_positions = [i for i in range(self.n_args) if i not in static_pos]
        tree = jax.tree_util.tree_unflatten(self.program.in_tree, self.leaves)
        names = []
        for path, _ in jax.tree_util.tree_flatten_with_path(tree)[0]:
            (group, *rest) = path
            head = getattr(group, "idx", 0)
            if head == 0 and rest:  # positional
                k = rest[0].idx
                pos = dyn_positions[k] if k < len(dyn_positions) else k
                base = params[pos].name if pos < len(params) else f"args[{pos}]"
                names.append(base + jax.tree_util.keystr(tuple(rest[1:])))
            elif rest:  # keyword
                key = getattr(rest[0], "key", rest[0])
                names.append(str(key) + jax.tree_util.keystr(tuple(rest[1:])))
            else:
                names.append(jax.tree_util.keystr(path))
        return names

    def output_names(self) -> list[str]:
        out_tree = self.program.out_tree
        n = out_tree.num_leaves
        tree = jax.tree_util.tree_unflatten(out_tree, list(range(n)))
        paths = jax.tree_util.tree_flatten_with_path(tree)[0]
        if n == 1 and not paths[0][0]:
            return ["out"]
        return ["out" + jax.tree_util.keystr(p) for p, _ in paths]

    def signature(self) -> str:
        parts = []
        for name, leaf in zip(self.leaf_names(), self.leaves):
            a = jax.typeof(leaf)
            parts.append(f"{name}: {a.str_short(short_dtypes=True)}")
        for k, v in self.static[1]:
            parts.append(f"{k}={v!r}")
        for i, v in self.static[0]:
            parts.append(f"[static {i}]={v!r}")
        return ", ".join(parts)

    # -- flat callables --------------------------------------------------------------------
    def flat(self, which: str) -> Callable:
        """(*leaves) -> list of output leaves, for ``which`` in original/guarded."""
        if which not in ("original", "guarded"):
            raise ValueError(f"which must be 'original' or 'guarded', got {which!r}")
        target = self.guarded if which == "guarded" else self.guarded.original
        layout, static, n_args = self.program.layout, self.static, self.n_args

        def flat_fn(*leaves):
            args, kwargs = merge_arguments(layout.unflatten(leaves), static, n_args)
            with evaluating_the_inspected_program():
                return jax.tree_util.tree_leaves(target(*args, **kwargs))

        flat_fn.__name__ = flat_fn.__qualname__ = self.name
        return flat_fn

    def diff_leaf_indices(self) -> list[int]:
        return [i for i, x in enumerate(self.leaves) if is_inexact_aval(jax.typeof(x))]

    def diff_output_indices(self) -> list[int]:
        # (not the state written back into the arguments, the last outputs)
        outs = self.program.closed_jaxpr.out_avals[: self.program.out_tree.num_leaves]
        return [j for j, a in enumerate(outs) if is_inexact_aval(a)]

    def grad_program(self, which: str) -> Callable:
        """(*leaves) -> cotangents of every inexact leaf, for the cotangent
        ``ones`` on every inexact output (= ``jax.grad`` of the sum of all outputs)."""
        f = self.flat(which)
        xi, yi = self.diff_leaf_indices(), self.diff_output_indices()
        if not xi or not yi:
            raise GuardUsageError(
                f"{self.name} has no floating-point {'input' if not xi else 'output'}: "
                "there is no gradient program to show"
            )

        def grad_fn(*leaves):
            def partial_fn(*diff):
                full = list(leaves)
                for i, d in zip(xi, diff):
                    full[i] = d
                outs = f(*full)
                return [outs[j] for j in yi]

            outs, vjp = jax.vjp(partial_fn, *[leaves[i] for i in xi])
            return list(vjp([jnp.ones_like(o) for o in outs]))

        grad_fn.__name__ = grad_fn.__qualname__ = f"grad_{self.name}"
        return grad_fn

    def program_fn(self, which: str, program: str) -> Callable:
        if program == "forward":
            return self.flat(which)
        if program == "grad":
            return self.grad_program(which)
        raise GuardUsageError(f"program must be 'forward' or 'grad', got {program!r}")


def leaves_as_arrays(leaves) -> tuple[Any, ...]:
    return tuple(x if isinstance(x, jax.Array) else np.asarray(x) for x in leaves)
