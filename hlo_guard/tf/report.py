"""Reports and IR dumps for the TF front end, in the shared report model.

``report(f, *args)`` lists every guard (the guarded op, which operand, the
selecting ops that made its lanes dead and what that means) and every place
dead lanes reach without a guard, with the reason -- the same
:class:`passes.report.Report` the JAX front end produces, with
``framework="tensorflow"``.

``compiler_ir(f, *args, stage=...)`` is XLA's view of the guarded jit function
(or of its gradient), through ``experimental_get_compiler_ir``; stages
``hlo``, ``optimized_hlo`` and ``stablehlo`` (the last works in TF 2.21 although
TF's error text for a bad stage does not list it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import tensorflow as tf

from hlo_guard.errors import GuardUsageError
from hlo_guard.tf.rewrite import BuildRecord
from hlo_guard.tf.rules import RULES
from passes.report import OriginRecord, Report, SiteRecord

STAGES = ("hlo", "optimized_hlo", "stablehlo")

MEANINGS = {
    "SelectV2": "lanes the condition does not pick",
    "Select": "lanes the condition does not pick",
    "Maximum": "the losing side (x wins ties, as in TF's gradient)",
    "Minimum": "the losing side (x wins ties, as in TF's gradient)",
    "ClipByValue": "clipped lanes",
    "Max": "lanes that are not a maximum",
    "Min": "lanes that are not a minimum",
    "Relu": "lanes with a non-positive input",
    "Relu6": "lanes outside (0, 6)",
    "GatherV2": "elements the gather does not read",
    "GatherNd": "elements the gather does not read",
    "StridedSlice": "elements the slice does not read",
    "Slice": "elements the slice does not read",
}


def rule_names():
    """Every TF op type with a rule (anything else is treated as fully live)."""
    return RULES.names()


def _describe(graph, op_name: str) -> tuple:
    node = graph.index.get(op_name)
    op_type = graph.ops[node].type if node is not None else "?"
    user = graph.user_name(op_name)
    return f"{op_type} '{user}'", graph.location(op_name) or user, op_type


def _origins(graph, liveness):
    records = []
    for origin in liveness.origins:
        op, loc, op_type = _describe(graph, origin)
        records.append(OriginRecord(op, loc, MEANINGS.get(op_type, "")))
    return records


def build_report(record: BuildRecord, function: str) -> TFReport:
    if record.fallback:
        return TFReport(
            "tensorflow",
            function,
            [SiteRecord("unguarded", function, function, reason=record.fallback)],
            extra={"rule_table": RULES.name},
        )
    sites: list = []
    _collect(record, "", sites)
    return TFReport(
        "tensorflow",
        function,
        sites,
        extra={"ops": record.graph.node_count(), "rule_table": RULES.name},
    )


def _guard_record(graph, applied, scope: str, operand, reason: str = "") -> SiteRecord:
    """The report line of one applied guard: an input guard (``operand`` is the
    guarded input) or a forward-mode output guard (``operand`` None)."""
    site = applied.site
    op, loc, _ = _describe(graph, graph.ops[site.node].name)
    return SiteRecord(
        "guard",
        op,
        loc,
        scope=scope,
        operand=operand,
        statically_dead=applied.form == "stop_gradient",
        origins=_origins(graph, site.liveness),
        reason=reason,
    )


def _collect(record: BuildRecord, scope: str, sites: list) -> None:
    """Sites of one graph, then of its guarded control-flow bodies (with a scope)."""
    graph = record.graph
    for applied in record.applied:
        sites.append(_guard_record(graph, applied, scope, operand=applied.site.index))
    for applied in record.output_guards:
        index = applied.site.index
        reason = (
            f"output {index} guarded for forward mode: its tangent is selected where "
            "the inputs' is structurally zero"
        )
        sites.append(_guard_record(graph, applied, scope, operand=None, reason=reason))
    for site, reason in record.skipped:
        op, loc, _ = _describe(graph, graph.ops[site.node].name)
        sites.append(
            SiteRecord(
                "unguarded",
                op,
                loc,
                scope=scope,
                operand=site.index,
                origins=_origins(graph, site.liveness),
                reason=reason,
            )
        )
    for u in record.unguarded:
        op, loc, _ = _describe(graph, graph.ops[u.node].name)
        sites.append(
            SiteRecord(
                "unguarded",
                op,
                loc,
                scope=scope,
                origins=_origins(graph, u.liveness),
                reason=u.reason,
            )
        )
    for op_name, attr, sub in record.nested:
        inner = f"{graph.user_name(op_name)}.{attr}"
        _collect(sub, f"{scope}/{inner}" if scope else inner, sites)


def _guard_of(fn):
    from hlo_guard.tf.api import GuardedTFFunction

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
    guarded = _guard_of(fn)
    # guarded_function used as a method: tf.function bound ``self`` through a
    # TfMethodTarget, and the guard inside sees ``self`` as its first argument
    target = getattr(getattr(fn, "__wrapped__", None), "__self__", None)
    if hasattr(target, "target") and hasattr(target, "weakrefself_func__"):
        args = (target.target,) + tuple(args)
    result = build_report(guarded.record_for(*args, **kwargs), guarded.__name__)
    if not kwargs:  # XLA dumps take positional tensors
        from hlo_guard.inspect.explain_tf import TFDumps

        result._dumps = TFDumps(guarded, args).show
    return result


@dataclass
class TFReport(Report):
    """The TF guard report, with the dumps of the program it describes."""

    _dumps: Callable[..., str] | None = field(default=None, repr=False, compare=False)

    def dumps(self, level: str = "stablehlo", program: str = "forward", show: str = "diff") -> str:
        """XLA's view at ``level`` (``stablehlo`` as lowered, ``hlo`` optimized) of
        ``program`` (``forward``, or ``grad``: the gradient of the sum of the
        outputs); ``show`` one of ``diff``, ``original``, ``guarded``, ``both``."""
        if self._dumps is None:
            raise GuardUsageError(
                "dumps need the report of positional arguments: hlo_guard.tf.report(f, *args)"
            )
        return self._dumps(level=level, program=program, show=show)


def _sum_outputs(out):
    leaves = [
        t
        for t in tf.nest.flatten(out)
        if isinstance(t, tf.Tensor) and (t.dtype.is_floating or t.dtype.is_complex)
    ]
    return tf.add_n([tf.reduce_sum(tf.cast(t, tf.float64)) for t in leaves])


def compiler_ir(fn, *args, stage: str = "hlo", gradient: bool = False, guarded: bool = True):
    """XLA IR of the (guarded or plain) jit function, or of its gradient.

    ``gradient=True`` compiles ``tape.gradient(sum of outputs, float args)``;
    ``guarded=False`` gives the same for the user's original function, for a
    side-by-side diff.
    """
    if stage not in STAGES:
        raise GuardUsageError(f"stage must be one of {STAGES}, got {stage!r}")
    g = _guard_of(fn)
    body: Callable = g.wrapper if guarded else g._tracer  # pylint: disable=protected-access
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


def compiler_irs(fn, *args, stages: Sequence[str] = STAGES, gradient: bool = True):
    """{(guarded|plain, stage): text} for a side-by-side look."""
    out = {}
    for which in ("plain", "guarded"):
        for stage in stages:
            out[(which, stage)] = compiler_ir(
                fn, *args, stage=stage, gradient=gradient, guarded=which == "guarded"
            )
    return out
