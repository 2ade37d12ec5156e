"""hlo_guard: gradients through ``where``, ``maximum``, ``clip``, ``max`` and
indexing without the NaN that dead lanes leak.

    from hlo_guard import guarded_jit

    @guarded_jit
    def f(x):
        return jnp.where(x > 0, jnp.sqrt(x), 0.0)

    jax.grad(lambda x: f(x).sum())(jnp.array([-1., 0., 1., 4.]))  # [0, 0, .5, .25]
"""

from hlo_guard.api import GuardedFunction, guard, guarded_jit
from hlo_guard.errors import GuardUsageError, HloGuardError
from hlo_guard.inspect.compare import compare
from hlo_guard.inspect.diagnose import diagnose
from hlo_guard.inspect.dumps import dump, dump_lowered
from hlo_guard.inspect.explain import explain
from hlo_guard.jax_frontend.argument_tangents import UnguardedTangentWarning

__version__ = "0.1.0"

__all__ = [
    "guard",
    "guarded_jit",
    "GuardedFunction",
    "explain",
    "compare",
    "diagnose",
    "dump",
    "dump_lowered",
    "GuardUsageError",
    "HloGuardError",
    "UnguardedTangentWarning",
    "__version__",
]
