"""TensorFlow front end of hlo_guard (imported only by ``import hlo_guard.tf``).

import hlo_guard.tf as hg

@hg.guarded_function               # tf.function(jit_compile=True) with guards
def f(x):
    return tf.where(x > 0, tf.sqrt(x), 0.0)

with tf.GradientTape() as tape:
    tape.watch(x)
    y = f(x)
tape.gradient(y, x)                # [0, 0, .5, .25] at [-1, 0, 1, 4]
"""

from hlo_guard.errors import GuardUsageError
from hlo_guard.tf.api import GuardedTFFunction, compiler_ir, guard, guarded_function, report
from hlo_guard.tf.report import build_report, rule_names

__all__ = [
    "guard",
    "guarded_function",
    "GuardedTFFunction",
    "report",
    "build_report",
    "compiler_ir",
    "rule_names",
    "GuardUsageError",
]


def __getattr__(name):
    # ``hlo_guard.tf.keras`` (Keras fit integration) is imported on first use:
    # importing Keras is slow and not every TF user has it
    if name == "keras":
        import importlib

        return importlib.import_module("hlo_guard.tf.keras")
    raise AttributeError(f"module 'hlo_guard.tf' has no attribute {name!r}")
