"""``explain`` and dumps for functions guarded by the TensorFlow front end.

The TF front end builds :class:`passes.report.Report` records itself
(``hlo_guard.tf.report``, dumps in ``hlo_guard.tf.dumps``); here they are lifted into :class:`ExplainReport`
so that ``hlo_guard.inspect.explain`` prints, counts and serialises a TF function
exactly like a JAX one, and ``report.dumps(level, program)`` shows XLA's view
of the original and the guarded ``tf.function`` through
``experimental_get_compiler_ir`` (``stablehlo`` as lowered, ``hlo`` optimized).
TensorFlow is imported only when such a function is passed in.
"""

from __future__ import annotations

import contextlib
import os
import sys

from hlo_guard.errors import GuardUsageError
from hlo_guard.inspect.report_model import ExplainReport


def is_tf_guarded(fn) -> bool:
    """A ``hlo_guard.tf.guard``/``guarded_function`` result (checked without
    importing TensorFlow)."""
    for obj in (fn, getattr(fn, "hlo_guard", None)):
        if obj is not None and type(obj).__module__.startswith("hlo_guard.tf"):
            return True
    return False


class PlainTFFunctionError(GuardUsageError):
    """A plain (unguarded) TensorFlow function or Keras model reached the JAX
    tools: they guard a JAX function themselves, a TF one must come guarded."""

    def __init__(self, fn, kind: str, tool: str = "hlo_guard.explain"):
        self.name = _display_name(fn)
        self.kind = kind
        super().__init__(
            f"{self.name} is {kind}, not a JAX function; wrap it with the TensorFlow front "
            f"end first: {tool}(hlo_guard.tf.guard({self.name}), *args)"
        )


def _display_name(fn) -> str:
    name = getattr(fn, "__name__", None) or getattr(fn, "name", None) or type(fn).__name__
    return "fn" if name == "<lambda>" else str(name)


def _from(obj, package: str) -> bool:
    return type(obj).__module__.split(".")[0] == package


def plain_tf_kind(fn, args=(), kwargs=None) -> str:
    """What TF thing ``fn`` is ('' if it does not look like TF), judged
    without importing TensorFlow: a ``tf.function``, a Keras model or layer,
    or any function called with TF tensors."""
    if _from(fn, "tensorflow"):
        return "a plain tf.function"
    if _from(fn, "keras") or _from(fn, "tf_keras"):
        return f"a Keras {type(fn).__name__} (TensorFlow)"
    for a in list(args) + list((kwargs or {}).values()):
        if _from(a, "tensorflow"):
            return "a function called with TensorFlow tensors"
    return ""


def _raised_in_tensorflow(exc: BaseException) -> bool:
    tf_mod = sys.modules.get("tensorflow")
    tf_file = getattr(tf_mod, "__file__", None) if tf_mod is not None else None
    if not tf_file:
        return False
    tf_dir = os.path.dirname(os.path.abspath(tf_file)) + os.sep
    tb = exc.__traceback__
    while tb is not None:
        if os.path.abspath(tb.tb_frame.f_code.co_filename).startswith(tf_dir):
            return True
        tb = tb.tb_next
    return False


@contextlib.contextmanager
def refuse_plain_tf(fn, args=(), kwargs=None, tool: str = "hlo_guard.explain"):
    """Raise :class:`PlainTFFunctionError` for a TF function given to the JAX
    tools: up front when it is recognisably TF, else when tracing it with JAX
    fails inside TensorFlow (a Python function calling ``tf.*`` ops)."""
    kind = plain_tf_kind(fn, args, kwargs)
    if kind:
        raise PlainTFFunctionError(fn, kind, tool)
    try:
        yield
    except GuardUsageError:
        raise
    except Exception as exc:
        if _raised_in_tensorflow(exc):
            raise PlainTFFunctionError(fn, "a plain TensorFlow function", tool) from exc
        raise


def lift(base) -> ExplainReport:
    """An :class:`ExplainReport` with the records of a base ``Report``."""
    return ExplainReport(
        framework=base.framework,
        function=base.function,
        sites=list(base.sites),
        extra=dict(base.extra),
    )


def tf_dumps(fn, args):
    """The dumps of a TF-guarded ``fn`` at positional ``args`` (imports TF)."""
    from hlo_guard.tf.api import guard_of
    from hlo_guard.tf.dumps import TFDumps

    return TFDumps(guard_of(fn), args)


def explain_tf(fn, *args, **kwargs) -> ExplainReport:
    from hlo_guard.tf.api import report

    result = lift(report(fn, *args, **kwargs))
    if not kwargs:
        result._dumps = tf_dumps(fn, args).show
    return result
