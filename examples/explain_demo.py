"""What did the guard pass do to my function?  explain, dumps and compare.

    python examples/explain_demo.py

The same from a shell:

    hlo-guard explain examples/explain_demo.py:loss "[-1,0,1,4]"
    hlo-guard dump    examples/explain_demo.py:loss f32[4] --level stablehlo --program grad
    hlo-guard compare examples/explain_demo.py:loss "[-1,0,1,4]" --transform hessian
"""

import jax
import jax.numpy as jnp

from hlo_guard import compare, dump, dump_lowered, explain, guarded_jit


def loss(x):
    safe_root = jnp.where(x > 0, jnp.sqrt(x), 0.0)  # sqrt'(0) = inf in the dead lanes
    floor_log = jnp.maximum(jnp.log(jnp.abs(x)), -5.0)  # log'(0) = inf on the losing side
    return (safe_root + floor_log).sum()


def main():
    x = jnp.array([-1.0, 0.0, 1.0, 4.0])

    report = explain(loss, x)
    print(report)  # or report.to_json()
    print()
    print(report.dumps(level="jaxpr", program="forward", show="diff"))
    print()
    print(dump(loss, x, level="stablehlo", program="grad", show="guarded"))
    print()
    print(dump(loss, x, level="hlo", program="forward"))  # the guards cost nothing
    print()
    lowered = guarded_jit(loss).lower(x)  # JAX's own Lowered
    print(dump_lowered(lowered, original=jax.jit(loss).lower(x)))
    print()
    print(compare(loss, x, transform="grad"))


if __name__ == "__main__":
    main()
