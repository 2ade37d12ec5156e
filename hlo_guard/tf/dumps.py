"""XLA's view of a guarded TF function: its compiler IR (or its gradient's)
through ``experimental_get_compiler_ir``, and the original-vs-guarded dumps
reports carry.

Everything here takes the :class:`~hlo_guard.tf.api.GuardedTFFunction`
itself (``hlo_guard.tf.api.guard_of`` finds it in a ``guarded_function``), so
this module sits below the API that attaches dumps to reports.  Stages:
``hlo``, ``optimized_hlo`` and ``stablehlo`` (the last works in TF 2.21
although TF's error text for a bad stage does not list it)."""

from __future__ import annotations

from collections.abc import Callable

import tensorflow as tf

from hlo_guard.errors import GuardUsageError
from hlo_guard.inspect.dump_options import LEVELS, PROGRAMS, SHOWS, check_choice
from hlo_guard.inspect.textdiff import diff_texts

STAGES = ("hlo", "optimized_hlo", "stablehlo")

#: dump levels (the JAX tools' names) -> TF compiler-IR stages
TF_STAGES = {"stablehlo": "stablehlo", "hlo": "optimized_hlo"}


def _sum_outputs(out):
    leaves = [
        t
        for t in tf.nest.flatten(out)
        if isinstance(t, tf.Tensor) and (t.dtype.is_floating or t.dtype.is_complex)
    ]
    return tf.add_n([tf.reduce_sum(tf.cast(t, tf.float64)) for t in leaves])


def guard_compiler_ir(
    guarded, args, stage: str = "hlo", gradient: bool = False, rewritten: bool = True
) -> str:
    """XLA IR of ``guarded``'s jit function (``rewritten=False``: of the
    user's original function), or of ``tape.gradient(sum of outputs, float
    args)`` with ``gradient=True``."""
    if stage not in STAGES:
        raise GuardUsageError(f"stage must be one of {STAGES}, got {stage!r}")
    body: Callable = guarded.wrapper if rewritten else guarded.original
    tensors = [tf.convert_to_tensor(a) for a in args]
    if gradient:

        def program(*xs):
            with tf.GradientTape() as tape:
                for x in xs:
                    if x.dtype.is_floating:
                        tape.watch(x)
                total = _sum_outputs(body(*xs))
            return tape.gradient(total, list(xs))
    else:

        def program(*xs):
            return body(*xs)

    jitted = tf.function(program, jit_compile=True, autograph=False)
    return jitted.experimental_get_compiler_ir(*tensors)(stage=stage)


class TFDumps:
    """The original and guarded programs of one guard at positional ``args``,
    compiled once per (program, level) and diffed like the JAX dumps."""

    def __init__(self, guarded, args):
        self.guarded = guarded
        self.args = args
        self._texts: dict = {}

    def text(self, which: str, level: str, program: str) -> str:
        if level not in TF_STAGES:
            raise GuardUsageError(
                "a TensorFlow program has no jaxpr; use level='stablehlo' or level='hlo'"
            )
        key = (which, level, program)
        if key not in self._texts:
            self._texts[key] = guard_compiler_ir(
                self.guarded,
                self.args,
                stage=TF_STAGES[level],
                gradient=program == "grad",
                rewritten=which == "guarded",
            )
        return self._texts[key]

    def show(self, level: str | None = None, program: str = "forward", show: str = "diff") -> str:
        level = level or "stablehlo"  # a TF program has no jaxpr
        check_choice("level", level, LEVELS)
        check_choice("program", program, PROGRAMS)
        check_choice("show", show, SHOWS)
        if show in ("original", "guarded"):
            return self.text(show, level, program)
        a, b = self.text("original", level, program), self.text("guarded", level, program)
        if show == "both":
            return (
                f"==== original {program} {level} ====\n{a}\n\n"
                f"==== guarded {program} {level} ====\n{b}"
            )
        diff = diff_texts(level, a, b)
        return diff or f"(no difference at {level}, ignoring value names and metadata)"
