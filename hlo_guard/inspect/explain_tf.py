"""``explain`` and dumps for functions guarded by the TensorFlow front end.

The TF front end builds :class:`passes.report.Report` records itself
(``hlo_guard.tf.report``); here they are lifted into :class:`ExplainReport`
so that ``hlo_guard.inspect.explain`` prints, counts and serialises a TF function
exactly like a JAX one, and ``report.dumps(level, program)`` shows XLA's view
of the original and the guarded ``tf.function`` through
``experimental_get_compiler_ir`` (``stablehlo`` as lowered, ``hlo`` optimized).
TensorFlow is imported only when such a function is passed in.
"""
from __future__ import annotations

from hlo_guard.inspect.dump_options import LEVELS, PROGRAMS, SHOWS, check_choice
from hlo_guard.errors import GuardUsageError
from hlo_guard.inspect.report_model import ExplainReport
from hlo_guard.inspect.textdiff import diff_texts

TF_STAGES = {"stablehlo": "stablehlo", "hlo": "optimized_hlo"}


def is_tf_guarded(fn) -> bool:
    """A ``hlo_guard.tf.guard``/``guarded_function`` result (checked without
    importing TensorFlow)."""
    for obj in (fn, getattr(fn, "hlo_guard", None)):
        if obj is not None and type(obj).__module__.startswith("hlo_guard.tf"):
            return True
    return False


def lift(base) -> ExplainReport:
    """An :class:`ExplainReport` with the records of a base ``Report``."""
    return ExplainReport(framework=base.framework, function=base.function,
                         sites=list(base.sites), extra=dict(base.extra))


class TFDumps:
    def __init__(self, fn, args):
        self.fn = fn
        self.args = args
        self._texts = {}

    def text(self, which: str, level: str, program: str) -> str:
        if level not in TF_STAGES:
            raise GuardUsageError("a TensorFlow program has no jaxpr; use level='stablehlo' "
                                  "or level='hlo'")
        key = (which, level, program)
        if key not in self._texts:
            from hlo_guard.tf.report import compiler_ir
            self._texts[key] = compiler_ir(self.fn, *self.args, stage=TF_STAGES[level],
                                           gradient=program == "grad",
                                           guarded=which == "guarded")
        return self._texts[key]

    def show(self, level: str = "stablehlo", program: str = "forward",
             show: str = "diff") -> str:
        check_choice("level", level, LEVELS)
        check_choice("program", program, PROGRAMS)
        check_choice("show", show, SHOWS)
        if show in ("original", "guarded"):
            return self.text(show, level, program)
        a, b = self.text("original", level, program), self.text("guarded", level, program)
        if show == "both":
            return f"==== original {program} {level} ====\n{a}\n\n" \
                   f"==== guarded {program} {level} ====\n{b}"
        diff = diff_texts(level, a, b)
        return diff or f"(no difference at {level}, ignoring value names and metadata)"


def explain_tf(fn, *args, **kwargs) -> ExplainReport:
    from hlo_guard.tf.report import report
    result = lift(report(fn, *args, **kwargs))
    if not kwargs:
        result._dumps = TFDumps(fn, args).show
    return result
