"""What a workload is, and the three variants every JAX workload is measured in.

A workload is a scalar ``loss(params, *data)`` written the natural way (a
``where`` hides a singular branch in some lanes), the same loss written with
the hand-written double-where trick (``loss_dw``, the independent oracle and
the "best a careful human does" baseline), input builders per size, and the
"gradient step" built from a loss (``jax.grad`` by default, an SGD update for
the MLP).

Variants: ``jax.jit(loss)`` (unguarded; its gradient is NaN in the dead lanes,
which is why users need something), ``hlo_guard.guarded_jit(loss)``,
``jax.jit(loss_dw)`` and value mode, ``guarded_jit(loss, guard_mode="value")``.  Guards go on the primal, so the guarded gradient step is
``jax.jit(step(hlo_guard.guard(loss)))``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

import hlo_guard

VARIANTS = ("unguarded", "guarded", "double_where", "guarded_value")


def grad_step(loss: Callable) -> Callable:
    """Default gradient step: d loss / d params."""
    return jax.grad(loss)


@dataclass
class Workload:
    name: str
    description: str
    loss: Callable
    loss_dw: Callable
    #: (size, seed) -> argument tuple ``(params, *data)``; deterministic in ``seed``
    make_inputs: Callable[[Any, int], tuple[Any, ...]]
    sizes: dict[str, Sequence[Any]]  # keys: "tiny", "quick", "full"
    step: Callable[[Callable], Callable] = grad_step
    rtol: float = 1e-5
    atol: float = 1e-6
    size_label: Callable[[Any], str] = str

    # -- variants ---------------------------------------------------------------
    def forward_fns(self) -> dict[str, Callable]:
        """Fresh (uncompiled) forward functions, one per variant."""
        loss, loss_dw = self.loss, self.loss_dw
        return {
            "unguarded": lambda *a: loss(*a),
            "guarded": hlo_guard.guard(loss),
            "double_where": lambda *a: loss_dw(*a),
            "guarded_value": hlo_guard.guard(loss, mode="value"),
        }

    def gradient_fns(self) -> dict[str, Callable]:
        """Fresh (uncompiled) gradient-step functions, one per variant."""
        loss, loss_dw = self.loss, self.loss_dw
        return {
            "unguarded": self.step(lambda *a: loss(*a)),
            "guarded": self.step(hlo_guard.guard(loss)),
            "double_where": self.step(lambda *a: loss_dw(*a)),
            "guarded_value": self.step(hlo_guard.guard(loss, mode="value")),
        }

    def compiled(self, kind: str, args: Sequence[Any]) -> dict[str, Any]:
        """``jax.jit(f).lower(*args).compile()`` per variant ("forward"/"gradient")."""
        fns = self.forward_fns() if kind == "forward" else self.gradient_fns()
        jitted = {k: jax.jit(f) for k, f in fns.items()}
        if kind == "forward":  # literally the public entry point (= jax.jit(guard(f)))
            jitted["guarded"] = hlo_guard.guarded_jit(self.loss)
            jitted["guarded_value"] = hlo_guard.guarded_jit(self.loss, guard_mode="value")
        return {k: j.lower(*args).compile() for k, j in jitted.items()}

    # -- correctness --------------------------------------------------------------
    def check(self, size, seed: int = 0) -> dict[str, Any]:
        """Guarded forward == unguarded forward; guarded gradient finite and equal
        to the double-where gradient.  Raises AssertionError otherwise.

        Also reports whether the unguarded gradient is non-finite: a workload
        whose plain gradient is already finite would not exercise the guard.
        """
        args = self.make_inputs(size, seed)
        fwd = {k: f(*args) for k, f in self.compiled("forward", args).items()}
        grads = {k: f(*args) for k, f in self.compiled("gradient", args).items()}
        np.testing.assert_allclose(
            np.asarray(fwd["guarded"]),
            np.asarray(fwd["unguarded"]),
            rtol=1e-6,
            atol=0,
            err_msg=f"{self.name}: forward changed",
        )
        # Value mode's forward is the double-where's program: XLA may simplify it
        # differently (no 1/sqrt -> rsqrt across a select), so 1 ulp, not bitwise.
        np.testing.assert_allclose(
            np.asarray(fwd["guarded_value"]),
            np.asarray(fwd["unguarded"]),
            rtol=1e-6,
            atol=0,
            err_msg=f"{self.name}: value mode changed the forward",
        )
        np.testing.assert_allclose(
            np.asarray(fwd["guarded"]),
            np.asarray(fwd["double_where"]),
            rtol=self.rtol,
            atol=self.atol,
            err_msg=f"{self.name}: forward != double-where",
        )
        g_leaves = jax.tree_util.tree_leaves(grads["guarded"])
        dw_leaves = jax.tree_util.tree_leaves(grads["double_where"])
        u_leaves = jax.tree_util.tree_leaves(grads["unguarded"])
        v_leaves = jax.tree_util.tree_leaves(grads["guarded_value"])
        for g, dw in zip(v_leaves, dw_leaves, strict=True):
            np.testing.assert_allclose(
                np.asarray(g),
                np.asarray(dw),
                rtol=self.rtol,
                atol=self.atol,
                err_msg=f"{self.name}: value-mode gradient != double-where",
            )
        for g, dw in zip(g_leaves, dw_leaves, strict=True):
            g, dw = np.asarray(g), np.asarray(dw)
            assert np.all(np.isfinite(dw)), f"{self.name}: double-where gradient not finite"
            assert np.all(np.isfinite(g)), (
                f"{self.name}: guarded gradient has {np.sum(~np.isfinite(g))} non-finite lanes"
            )
            np.testing.assert_allclose(
                g,
                dw,
                rtol=self.rtol,
                atol=self.atol,
                err_msg=f"{self.name}: guarded gradient != double-where",
            )
        bad = int(sum(np.sum(~np.isfinite(np.asarray(u))) for u in u_leaves))
        return {
            "size": self.size_label(size),
            "forward_equal": True,
            "gradient_equal": True,
            "unguarded_nonfinite_lanes": bad,
        }
