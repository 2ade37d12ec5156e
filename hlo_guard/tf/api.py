"""The TF user API: ``guard`` and ``guarded_function``.

``guard(fn)`` returns a callable whose every call runs a wrapper
``tf.function``; tracing the wrapper traces ``fn`` (nested ``tf.function``s
inlined), imports its graph, analyses which lanes carry a derivative and
rewires guards in (:mod:`hlo_guard.tf.rewrite`).  Differentiate the result
with ``tf.GradientTape`` as usual, eagerly or inside
``tf.function(jit_compile=True)``.

``guarded_function(fn, jit_compile=True, ...)`` is ``tf.function(guard(fn),
jit_compile=True, ...)``: it returns TF's own ``tf.function`` object
(``get_concrete_function``, ``experimental_get_compiler_ir`` as usual), with
the guard reachable as its ``hlo_guard`` attribute.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from hlo_guard.errors import GuardUsageError
from hlo_guard.tf import compat, xla_gradient
from hlo_guard.tf.dumps import TFDumps, guard_compiler_ir
from hlo_guard.tf.records import BuildRecord
from hlo_guard.tf.report import TFReport, build_report
from hlo_guard.tf.rewrite import build_guarded
from hlo_guard.tf.tracing import pack_tensor_leaves, trace, unsupported_reason


def _check_callable(fn, who: str):
    if not callable(fn):
        raise GuardUsageError(f"{who} expects a callable, got {type(fn).__name__}: {fn!r}")


def _python_function(fn):
    return getattr(fn, "python_function", fn)


class GuardedTFFunction:
    """``fn`` with gradient guards, as a TF-traceable callable."""

    def __init__(self, fn: Callable, input_signature=None, has_aux: bool = False):
        _check_callable(fn, "hlo_guard.tf.guard")
        if not isinstance(has_aux, bool):
            raise GuardUsageError(
                f"hlo_guard.tf.guard: has_aux must be True or False, got {has_aux!r}"
            )
        self.fn = fn
        self.input_signature = input_signature
        self.has_aux = has_aux
        self.python_function = _python_function(fn)
        #: what runs when the guard cannot be applied: ``fn``, its aux stopped
        # the user's function as a tf.function, used only to trace it
        self._tracer = fn if hasattr(fn, "get_concrete_function") else tf.function(fn)
        self._unguarded = self.python_function
        if has_aux:
            # the user's tf.function (autograph converts it) called from a
            # wrapper autograph leaves alone, so a wrong result shape raises
            # our own error; the nested call is inlined when traced
            self._unguarded = _stop_aux_gradient(self._tracer)
            self._tracer = tf.function(self._unguarded, autograph=False)
        self._records: dict[str, BuildRecord] = {}
        self.last_record: BuildRecord | None = None

        def wrapper(*args, **kwargs):
            return self._build(args, kwargs)

        _copy_signature(wrapper, self.python_function)

        self._wrapped_build = wrapper
        #: in an XLA context or not -> the ``tf.function`` of ``wrapper``
        #: (:attr:`wrapper`)
        self._wrappers: dict[bool, Any] = {}
        # name and docs only: a ``__wrapped__`` would let autograph (in a caller's
        # tf.function) unwrap this object and call the unguarded ``fn``
        # (``__signature__`` also keeps ``inspect.signature`` working although
        # ``__get__`` makes instances look like method descriptors)
        _copy_signature(self, self.python_function)
        if not hasattr(self, "__name__"):  # a Keras model or layer, a callable object
            self.__name__ = getattr(fn, "name", None) or type(fn).__name__

    @property
    def wrapper(self):
        """The ``tf.function`` that builds the guarded program, one for XLA
        contexts and one for the rest.

        ``tf.function`` reuses a concrete function across XLA and non-XLA
        callers (its cache key separates XLA contexts only on TPU), and TF's
        gradient of a ``tf.cond`` *edits* the forward ``If`` op the first time
        it is differentiated: outside XLA its intermediates become
        ``Optional`` outputs, which XLA cannot compile.  A guard called eagerly
        (or in a plain ``tf.function``) and then under ``jit_compile=True``
        failed to compile wherever the program had a ``tf.cond``, where the
        user's own function -- traced inline by each caller -- works.  Each
        kind of context gets a wrapper of its own, as inline tracing does."""
        in_xla = compat.in_xla_context()
        found = self._wrappers.get(in_xla)
        if found is None:
            found = self._wrappers[in_xla] = tf.function(
                self._wrapped_build, input_signature=self.input_signature, autograph=False
            )
        return found

    # -- tracing ---------------------------------------------------------------------
    def _flat_tensor_args(self, args, kwargs):
        try:
            bound = inspect.signature(self.python_function).bind(*args, **kwargs)
            values = list(bound.arguments.values())
        except (TypeError, ValueError):
            values = [args, kwargs]
        flat = tf.nest.flatten(values, expand_composites=True)
        out = []
        for t in flat:
            if isinstance(t, tf.Variable):
                # a variable argument is a resource input of the traced graph
                compat.variable_accessed(t)
                out.append(tf.identity(t.handle))
            elif isinstance(t, tf.Tensor):
                out.append(t)
        return out

    def _build(self, args, kwargs, keep_record: bool = True):
        """The guarded program in the current graph.  ``keep_record=False``:
        a second build of a trace (the recomputing gradient of
        :mod:`hlo_guard.tf.xla_gradient`), whose record is not the call's."""
        traced = trace(self.original, args, kwargs)
        concrete = traced.concrete
        reason = unsupported_reason(traced)
        if reason:
            # conservative: the user's own program, traced in place, unguarded
            graph = tf.compat.v1.get_default_graph()
            record = BuildRecord(None, None, fallback=reason)
            if keep_record:
                self._records[graph.name] = record
                self.last_record = record
            return self._unguarded(*args, **kwargs)
        for var in concrete.variables:
            # the imported graph reads the variable through a captured handle;
            # tell the tapes, as ReadVariableOp would, so gradients are not None
            compat.variable_accessed(var)
        flat_args = self._flat_tensor_args(args, kwargs)
        if len(flat_args) != len(traced.arg_names):
            raise GuardUsageError(
                f"cannot match the {len(flat_args)} tensor argument(s) to the "
                f"{len(traced.arg_names)} inputs of the traced function"
            )
        outputs, record = build_guarded(
            traced, flat_args, localize_constants=_localizes(traced, args, kwargs)
        )
        if keep_record:
            graph = tf.compat.v1.get_default_graph()
            self._records[graph.name] = record
            self.last_record = record
        # the imported output tensors where the traced function had tensors
        return pack_tensor_leaves(concrete.structured_outputs, outputs)

    @tf.autograph.experimental.do_not_convert
    def __call__(self, *args, **kwargs):
        if xla_gradient.wanted():
            # the wrapper's own trace first: the user's function is traced
            # inside it, where its variable reads are reported to the tapes
            self.wrapper.get_concrete_function(*args, **kwargs)
            traced = trace(self.original, args, kwargs)
            reason = xla_gradient.why_not_recomputed(args, kwargs, traced.graph_def)
            if reason is not None:
                # the wrapper's gradient, its constants built locally at the
                # top level (hlo_guard.tf.local_constants); control-flow
                # bodies are not localized
                if traced.graph_def.library.function:
                    xla_gradient.warn_compiled_per_value(self.__name__, reason)
            else:
                # under XLA a nested function's own gradient recompiles for
                # every new input value (see the module)
                return xla_gradient.call_with_recomputed_gradient(
                    self.wrapper,
                    lambda a, k: self._build(a, k, keep_record=False),
                    traced.concrete.variables,
                    args,
                    kwargs,
                )
        return self.wrapper(*args, **kwargs)

    def __get__(self, obj, objtype=None):
        """Used as a method decorator: the guard of the method bound to ``obj``.

        Like ``tf.function``'s own binding: one guard per instance (cached on
        it), built on the bound method, so that ``input_signature`` describes
        the arguments after ``self``.  It is returned as a ``tf.function``
        calling the guard (``.hlo_guard`` is the guard), which is what
        ``tf.saved_model.save`` looks for on a ``tf.Module``; calling the
        guard, not its wrapper, keeps the gradient of
        :mod:`hlo_guard.tf.xla_gradient` under XLA.
        """
        if obj is None:
            return self
        cache = getattr(obj, "__dict__", None)
        if cache is None or not hasattr(self.fn, "__get__"):  # bind by hand, unsaveable
            import functools

            return functools.partial(self, obj)
        key = f"_hlo_guard_bound_{id(self)}"
        bound = cache.get(key)
        if bound is None:
            guarded = GuardedTFFunction(
                self.fn.__get__(obj, type(obj)), self.input_signature, self.has_aux
            )
            bound = _calling(guarded)
            bound.hlo_guard = guarded
            cache[key] = bound  # plain dict entry: not tracked by tf.Module/Keras
        return bound

    @property
    def original(self):
        """The user's function as a ``tf.function``: what the guard traces,
        and the unguarded side of dumps and comparisons."""
        return self._tracer

    def get_concrete_function(self, *args, **kwargs):
        return self.wrapper.get_concrete_function(*args, **kwargs)

    def record_for(self, *args, **kwargs) -> BuildRecord:
        """The build record (analysis, guards) of the trace these arguments use."""
        concrete = self.wrapper.get_concrete_function(*args, **kwargs)
        record = self._records.get(concrete.graph.name)
        if record is None:  # pragma: no cover - traced elsewhere (e.g. loaded)
            raise GuardUsageError("no guard record for this trace")
        return record

    def report(self, *args, **kwargs) -> TFReport:
        """A :class:`passes.report.Report` of the guards for these arguments;
        with positional arguments only, ``.dumps(level, program, show)`` shows
        XLA's view of the original and guarded programs."""
        result = build_report(self.record_for(*args, **kwargs), self.__name__)
        if not kwargs:  # XLA dumps take positional tensors
            result._dumps = TFDumps(self, args).show
        return result

    explain = report

    def __repr__(self):
        return f"hlo_guard.tf.guard({getattr(self.python_function, '__qualname__', self.fn)!r})"


def _calling(guarded: GuardedTFFunction):
    """A ``tf.function`` (the guard's signature) that calls ``guarded``."""

    def call(*args, **kwargs):
        return guarded(*args, **kwargs)

    _copy_signature(call, guarded.python_function)
    return tf.function(call, input_signature=guarded.input_signature, autograph=False)


def _localizes(traced, args, kwargs) -> bool:
    """Whether the guarded program builds its gradients' integer constants
    itself (:mod:`hlo_guard.tf.local_constants`): when the XLA gradient cannot
    run it twice (a stateful op, a variable argument), unless it has
    functional control flow (whose bodies and TensorLists it leaves to TF;
    the call warns under XLA instead)."""
    if traced.graph_def.library.function:
        return False
    return xla_gradient.why_not_recomputed(args, kwargs, traced.graph_def) is not None


def _copy_signature(target, source):
    """Name, docs and call signature of ``source`` (so ``tf.function`` binds
    keyword arguments the same way), deliberately without ``__wrapped__``."""
    for attr in ("__module__", "__name__", "__qualname__", "__doc__"):
        if hasattr(source, attr):
            setattr(target, attr, getattr(source, attr))
    try:
        target.__signature__ = inspect.signature(source)
    except (TypeError, ValueError):
        pass


def _stop_aux_gradient(fn: Callable) -> Callable:
    """``fn`` returning ``(output, stop_gradient(aux))``: an aux output (the
    predictions beside a masked loss) is never differentiated, and as a
    differentiable output it would keep every lane the loss masks live."""
    import functools

    @functools.wraps(fn)
    def with_aux_stopped(*args, **kwargs):
        result = fn(*args, **kwargs)
        if not (isinstance(result, (tuple, list)) and len(result) == 2):
            raise GuardUsageError(
                f"{getattr(fn, '__qualname__', fn)} was guarded with has_aux=True, so it must "
                f"return a pair (output, aux); it returned {type(result).__name__}"
            )
        out, aux = result
        stopped = tf.nest.map_structure(
            lambda t: tf.stop_gradient(t) if isinstance(t, (tf.Tensor, tf.Variable)) else t, aux
        )
        return out, stopped

    return with_aux_stopped


def guard(fn: Callable | None = None, input_signature=None, has_aux: bool = False):
    """Return ``fn`` with gradient guards (usable as ``@guard``, ``guard(f)`` or
    ``@guard(input_signature=[...])``).  ``has_aux=True``: ``fn`` returns
    ``(output, aux)`` and ``aux`` is returned gradient-stopped -- never
    differentiated, so it does not keep the lanes ``output`` masks live."""
    if fn is None:
        return lambda f: GuardedTFFunction(f, input_signature, has_aux)
    return GuardedTFFunction(fn, input_signature, has_aux)


def guarded_function(
    fn: Callable | None = None,
    *,
    jit_compile=True,
    input_signature=None,
    has_aux: bool = False,
    **tf_function_kwargs,
):
    """``tf.function(guard(fn), jit_compile=jit_compile, ...)``.

    Returns TF's own ``tf.function`` object; ``.hlo_guard`` is the guard (for
    ``report``).  Accepts every ``tf.function`` keyword.
    """
    if fn is None:
        return lambda f: guarded_function(
            f,
            jit_compile=jit_compile,
            input_signature=input_signature,
            has_aux=has_aux,
            **tf_function_kwargs,
        )
    _check_callable(fn, "hlo_guard.tf.guarded_function")
    known = set(inspect.signature(tf.function).parameters)
    unknown = sorted(set(tf_function_kwargs) - known)
    if unknown:
        raise GuardUsageError(
            f"guarded_function got unexpected keyword argument(s) {unknown}; "
            f"tf.function accepts {sorted(known - {'func'})}"
        )
    # the signature is the outer tf.function's: it also knows, used as a method
    # decorator, that it describes the arguments after ``self``
    guarded = GuardedTFFunction(fn, None, has_aux)

    def call(*args, **kwargs):
        return guarded.wrapper(*args, **kwargs)

    _copy_signature(call, guarded.python_function)
    # tf.function copies it onto the Function it binds to an instance (methods)
    call.hlo_guard = guarded  # type: ignore[attr-defined]  # a function attribute, read by guard_of

    # ``call`` has no Python control flow to convert, and autograph would try to
    # parse it as a lambda when the user's function is one (it carries the name
    # ``<lambda>``), logging a warning; the user's own function is converted
    # when the guard traces it
    tf_function_kwargs.setdefault("autograph", False)
    outer = tf.function(
        call, jit_compile=jit_compile, input_signature=input_signature, **tf_function_kwargs
    )
    outer.hlo_guard = guarded
    return outer


# -- functions of any guarded TF function ----------------------------------------------


def guard_of(fn) -> GuardedTFFunction:
    """The guard behind ``fn``: ``fn`` itself (``guard``) or the one a
    ``guarded_function`` carries as ``.hlo_guard``; anything else is a usage
    error naming what was passed."""
    if isinstance(fn, GuardedTFFunction):
        return fn
    inner = getattr(fn, "hlo_guard", None)
    if isinstance(inner, GuardedTFFunction):
        return inner
    raise GuardUsageError(
        f"expected a function made by hlo_guard.tf.guard or guarded_function, got {fn!r}"
    )


def report(fn, *args, **kwargs) -> TFReport:
    """The guard report of ``fn`` (a guard or guarded_function) for these arguments;
    ``.dumps(level, program, show)`` shows XLA's view of the original and guarded
    programs, as the JAX report does."""
    guarded = guard_of(fn)
    # guarded_function used as a method: tf.function bound ``self`` through a
    # TfMethodTarget, and the guard inside sees ``self`` as its first argument
    target = getattr(getattr(fn, "__wrapped__", None), "__self__", None)
    if target is not None and hasattr(target, "target") and hasattr(target, "weakrefself_func__"):
        args = (target.target,) + tuple(args)
    return guarded.report(*args, **kwargs)


def compiler_ir(fn, *args, stage: str = "hlo", gradient: bool = False, guarded: bool = True):
    """XLA IR of the (guarded or plain) jit function, or of its gradient.

    ``gradient=True`` compiles ``tape.gradient(sum of outputs, float args)``;
    ``guarded=False`` gives the same for the user's original function, for a
    side-by-side diff.
    """
    return guard_compiler_ir(guard_of(fn), args, stage=stage, gradient=gradient, rewritten=guarded)
