"""Unit tests of the framework-neutral engine in ``passes/``.

The engine must not need JAX or TensorFlow: these tests implement the
:class:`passes.Graph` protocol with a tiny hand-built graph of named values,
a toy rule table (select, a guarded "sqrt", a linear "neg"/"add", a static
"slice") and numpy masks, and check the lattice, the static analysis, guard
planning and :class:`passes.MaskResolver` against expectations worked out by
hand.
"""

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from passes import (
    ALL,
    LIVE,
    NO_DERIVATIVE,
    NONE,
    Level,
    MaskAlgebra,
    MaskResolver,
    Rule,
    RuleTable,
    analyze,
    dead_by,
    partial_by,
    plan_guards,
)
from passes.lattice import MAX_ORIGINS, join_all

# -- a fake front end -------------------------------------------------------------


@dataclass
class Node:
    op: str
    inputs: list[str | None]
    outputs: list[str | None]
    params: dict[str, Any] = field(default_factory=dict)


class FakeGraph:
    """Values are strings; ``int_values`` never carry a derivative."""

    def __init__(self, nodes: Sequence[Node], outputs: Sequence[str], int_values=()):
        self.nodes = list(nodes)
        self.outputs = list(outputs)
        self.int_values = set(int_values)

    def node_count(self):
        return len(self.nodes)

    def op_name(self, node):
        return self.nodes[node].op

    def node_inputs(self, node):
        return self.nodes[node].inputs

    def node_outputs(self, node):
        return self.nodes[node].outputs

    def graph_outputs(self):
        return self.outputs

    def carries_derivative(self, value):
        return value not in self.int_values

    def origin(self, node):
        return ("node", node)


class ToyRule(Rule):
    def masks(self, graph, node, out_masks):
        raise NotImplementedError


class Elementwise(ToyRule):
    kind = "elementwise"

    def __init__(self, guards):
        self.guards = guards

    def transfer(self, ctx, node, outs):
        return [join_all(outs)] * len(ctx.graph.node_inputs(node))

    def guards_input(self, ctx, node, index):
        return self.guards

    def masks(self, graph, node, out_masks):
        return [out_masks[0]] * len(graph.node_inputs(node))


class Select(ToyRule):
    """select(p, a, b): a where p, b elsewhere.  ``params['p']`` is the
    predicate as a numpy array, or a Python bool for a constant predicate."""

    kind = "selection"

    def transfer(self, ctx, node, outs):
        out = join_all(outs)
        origin = ctx.graph.origin(node)
        p = ctx.graph.nodes[node].params["p"]
        if not out.reaches_output:
            return [NO_DERIVATIVE] * 3
        if isinstance(p, bool):
            live, dead = (out, dead_by(origin))
            return [NO_DERIVATIVE] + ([live, dead] if p else [dead, live])
        return [NO_DERIVATIVE, partial_by(origin, out), partial_by(origin, out)]

    def masks(self, graph, node, out_masks):
        p = np.asarray(graph.nodes[node].params["p"])
        return [NONE, and_mask(out_masks[0], p), and_mask(out_masks[0], ~p)]


class Slice(ToyRule):
    """Keeps the lanes in ``params['keep']`` (a static boolean mask) and zeroes
    the rest: shape-preserving, so that masks stay simple."""

    kind = "structural"

    def transfer(self, ctx, node, outs):
        return [partial_by(ctx.graph.origin(node), join_all(outs))]

    def masks(self, graph, node, out_masks):
        keep = graph.nodes[node].params["keep"]
        return [and_mask(out_masks[0], keep)]


def and_mask(a, b):
    if a is NONE:
        return NONE
    b = np.asarray(b, dtype=bool)
    return normalize(b if a is ALL else np.logical_and(np.asarray(a, dtype=bool), b))


def normalize(m):
    if m is ALL or m is NONE:
        return m
    m = np.asarray(m, dtype=bool)
    if m.all():
        return ALL
    if not m.any():
        return NONE
    return m


class NumpyAlgebra(MaskAlgebra):
    def or_(self, a, b):
        return np.logical_or(a, b)

    def normalize(self, mask):
        return normalize(mask)


def toy_rules():
    table = RuleTable("toy")
    table.register(["sqrt", "log"], Elementwise(guards=True))
    table.register(["neg", "add"], Elementwise(guards=False))
    table.register("select", Select())
    table.register("slice", Slice())
    return table


def resolver_for(analysis, out_masks=None, calls=None):
    graph = analysis.graph
    rules = analysis.rules
    if out_masks is None:
        out_masks = [ALL] * len(graph.graph_outputs())

    def hook(node, outs):
        if calls is not None:
            calls.append(node)
        return rules.get(graph.op_name(node)).masks(graph, node, outs)

    return MaskResolver(analysis, NumpyAlgebra(), out_masks, hook)


P = np.array([True, False, True, False])


def where_sqrt_graph(p=P):
    """y = select(p, sqrt(x), zero)."""
    return FakeGraph(
        [
            Node("sqrt", ["x"], ["s"]),
            Node("select", ["p", "s", "zero"], ["y"], {"p": p}),
        ],
        outputs=["y"],
        int_values={"p"},
    )


# -- lattice ------------------------------------------------------------------------


def test_join_is_or_over_lanes():
    a, b = dead_by("A"), partial_by("B")
    assert LIVE.join(a) is LIVE and a.join(LIVE) is LIVE
    ab = a.join(b)
    assert ab.level is Level.PARTIAL and set(ab.origins) == {"A", "B"}
    assert a.join(dead_by("C")).level is Level.DEAD
    assert NO_DERIVATIVE.join(a) == a
    assert join_all([]) == NO_DERIVATIVE
    assert join_all([a, LIVE, b]) is LIVE


def test_join_is_commutative_and_idempotent_on_levels():
    items = [LIVE, NO_DERIVATIVE, dead_by("A"), partial_by("B"), partial_by("C")]
    for x in items:
        assert x.join(x).level is x.level
        for y in items:
            assert x.join(y).level is y.join(x).level
            assert x.join(y).level is max(x.level, y.level)


def test_reaches_output():
    assert LIVE.reaches_output and partial_by("A").reaches_output
    assert dead_by("A").reaches_output  # dead *by a selection*: may need a guard
    assert not NO_DERIVATIVE.reaches_output  # never differentiated at all


def test_origins_are_capped_and_live_has_none():
    lv = NO_DERIVATIVE
    for k in range(3 * MAX_ORIGINS):
        lv = lv.join(dead_by(k))
    assert len(lv.origins) == MAX_ORIGINS
    assert LIVE.with_origin("X") is LIVE
    assert partial_by("A", partial_by("B")).origins == ("A", "B")
    assert partial_by("A", LIVE).origins == ("A",)


# -- analysis ------------------------------------------------------------------------


def test_analysis_levels_where_sqrt():
    g = where_sqrt_graph()
    an = analyze(g, toy_rules())
    assert an.value_liveness("y").level is Level.LIVE
    assert an.value_liveness("s").level is Level.PARTIAL
    assert an.value_liveness("x").level is Level.PARTIAL
    assert an.use(0, 0).level is Level.PARTIAL
    assert an.value_liveness("p") == NO_DERIVATIVE  # an integer never carries a derivative
    assert "p" not in an.values
    assert ("node", 1) in an.value_liveness("s").origins
    assert an.has_partial()


def test_a_live_use_makes_the_value_live():
    g = FakeGraph(
        [
            Node("sqrt", ["x"], ["s"]),
            Node("select", ["p", "s", "zero"], ["y"], {"p": P}),
            Node("add", ["y", "s"], ["z"]),
        ],
        outputs=["z"],
        int_values={"p"},
    )
    an = analyze(g, toy_rules())
    assert an.value_liveness("s").level is Level.LIVE
    assert an.value_liveness("x").level is Level.LIVE
    assert plan_guards(an)[0] == []


def test_constant_predicate_is_statically_dead():
    g = where_sqrt_graph(p=False)
    an = analyze(g, toy_rules())
    assert an.value_liveness("s").level is Level.DEAD
    assert an.value_liveness("s").reaches_output
    sites, _ = plan_guards(an)
    assert [(s.node, s.index, s.statically_dead) for s in sites] == [(0, 0, True)]


def test_unused_values_are_not_recorded():
    g = FakeGraph(
        [
            Node("sqrt", ["x"], ["unused"]),
            Node("neg", ["x"], ["y"]),
        ],
        outputs=["y"],
    )
    an = analyze(g, toy_rules())
    assert "unused" not in an.values
    assert an.value_liveness("x").is_live


def test_unknown_operation_is_conservative_and_recorded():
    g = FakeGraph(
        [
            Node("mystery", ["x"], ["m"]),
            Node("select", ["p", "m", "zero"], ["y"], {"p": P}),
        ],
        outputs=["y"],
        int_values={"p"},
    )
    an = analyze(g, toy_rules())
    assert an.value_liveness("x").level is Level.LIVE
    sites, unguarded = plan_guards(an)
    assert sites == []
    assert len(unguarded) == 1 and unguarded[0].node == 0
    assert "mystery" in unguarded[0].reason


# -- planning ------------------------------------------------------------------------


def test_planning_guards_only_nonlinear_uses():
    g = FakeGraph(
        [
            Node("sqrt", ["x"], ["s"]),
            Node("neg", ["s"], ["n"]),
            Node("select", ["p", "n", "zero"], ["y"], {"p": P}),
        ],
        outputs=["y"],
        int_values={"p"},
    )
    an = analyze(g, toy_rules())
    sites, unguarded = plan_guards(an)
    assert [(s.node, s.index) for s in sites] == [(0, 0)]  # sqrt, not neg
    assert not sites[0].statically_dead and unguarded == []
    assert an.value_liveness("n").level is Level.PARTIAL


def test_planning_is_sorted_and_per_use():
    g = FakeGraph(
        [
            Node("sqrt", ["x"], ["s"]),
            Node("log", ["x"], ["l"]),
            Node("select", ["p", "s", "l"], ["y"], {"p": P}),
        ],
        outputs=["y"],
        int_values={"p"},
    )
    an = analyze(g, toy_rules())
    sites, _ = plan_guards(an)
    assert [(s.node, s.index) for s in sites] == [(0, 0), (1, 0)]


# -- masks ------------------------------------------------------------------------------


def test_mask_of_a_selected_case():
    an = analyze(where_sqrt_graph(), toy_rules())
    r = resolver_for(an)
    np.testing.assert_array_equal(r.value_mask("s"), P)
    np.testing.assert_array_equal(r.use_mask(0, 0), P)
    np.testing.assert_array_equal(r.value_mask("x"), P)
    assert r.value_mask("y") is ALL
    assert r.value_mask(None) is NONE


def test_mask_is_or_over_uses():
    p2 = np.array([False, True, False, False])
    g = FakeGraph(
        [
            Node("sqrt", ["x"], ["s"]),
            Node("select", ["p", "s", "zero"], ["y1"], {"p": P}),
            Node("select", ["q", "s", "zero"], ["y2"], {"p": p2}),
        ],
        outputs=["y1", "y2"],
        int_values={"p", "q"},
    )
    an = analyze(g, toy_rules())
    r = resolver_for(an)
    np.testing.assert_array_equal(r.value_mask("s"), P | p2)
    np.testing.assert_array_equal(r.use_mask(1, 1), P)
    np.testing.assert_array_equal(r.use_mask(2, 1), p2)


def test_masks_through_a_static_slice_and_a_select():
    keep = np.array([True, True, False, False])
    g = FakeGraph(
        [
            Node("sqrt", ["x"], ["s"]),
            Node("slice", ["s"], ["t"], {"keep": keep}),
            Node("select", ["p", "t", "zero"], ["y"], {"p": P}),
        ],
        outputs=["y"],
        int_values={"p"},
    )
    an = analyze(g, toy_rules())
    r = resolver_for(an)
    np.testing.assert_array_equal(r.value_mask("t"), P)
    np.testing.assert_array_equal(r.value_mask("s"), P & keep)


def test_resolver_stops_at_a_live_use():
    """Once one use makes a value fully live no further use's mask is built."""
    every = np.ones(4, dtype=bool)
    g = FakeGraph(
        [
            Node("sqrt", ["x"], ["s"]),
            Node("select", ["p1", "s", "zero"], ["y1"], {"p": P}),
            Node("select", ["p2", "s", "zero"], ["y2"], {"p": every}),  # all-true at run time
            Node("select", ["p3", "s", "zero"], ["y3"], {"p": every}),
        ],
        outputs=["y1", "y2", "y3"],
        int_values={"p1", "p2", "p3"},
    )
    an = analyze(g, toy_rules())
    assert an.value_liveness("s").is_partial  # statically it cannot know
    calls = []
    r = resolver_for(an, calls=calls)
    assert r.value_mask("s") is ALL
    assert len(calls) <= 2, calls


def test_statically_live_value_needs_no_mask_work():
    g = FakeGraph([Node("sqrt", ["x"], ["s"]), Node("neg", ["s"], ["y"])], outputs=["y"])
    calls = []
    r = resolver_for(analyze(g, toy_rules()), calls=calls)
    assert r.value_mask("x") is ALL and r.use_mask(0, 0) is ALL
    assert calls == []


def test_nested_graph_output_masks_seed_the_resolver():
    """A nested graph's outputs can be partly live: their masks come from the
    caller and are OR-ed with the masks of in-graph uses."""
    seed = np.array([False, False, False, True])
    g = FakeGraph(
        [
            Node("sqrt", ["x"], ["s"]),
            Node("select", ["p", "s", "zero"], ["y"], {"p": P}),
        ],
        outputs=["y", "s"],
        int_values={"p"},
    )
    an = analyze(g, toy_rules(), out_liveness=[LIVE, partial_by("caller")])
    assert an.value_liveness("s").is_partial
    r = resolver_for(an, out_masks=[ALL, seed])
    np.testing.assert_array_equal(r.value_mask("s"), P | seed)


def test_long_chain_no_recursion_error():
    """50k nodes: analysis and mask resolution must be iterative."""
    n = 50_000
    nodes = [Node("sqrt", ["x"], ["v0"])]
    for i in range(1, n):
        nodes.append(Node("neg", [f"v{i - 1}"], [f"v{i}"]))
    nodes.append(Node("select", ["p", f"v{n - 1}", "zero"], ["y"], {"p": P}))
    g = FakeGraph(nodes, outputs=["y"], int_values={"p"})
    limit = sys.getrecursionlimit()
    assert n > 10 * limit  # recursion would have to go this deep
    an = analyze(g, toy_rules())
    assert an.value_liveness("x").is_partial
    sites, _ = plan_guards(an)
    assert [(s.node, s.index) for s in sites] == [(0, 0)]
    r = resolver_for(an)
    np.testing.assert_array_equal(r.use_mask(0, 0), P)
    np.testing.assert_array_equal(r.value_mask("x"), P)


def test_engine_imports_no_framework():
    """``passes`` is framework-neutral: importing it pulls in neither JAX nor TF."""
    import subprocess

    code = (
        "import sys, passes; "
        "bad = [m for m in ('jax', 'tensorflow', 'hlo_guard') if m in sys.modules]; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# -- select partitions: a value reaching every case of one select is live -----


def test_partition_join_of_all_cases_is_the_select_output_liveness():
    from passes.lattice import LIVE, Level, case_of

    sel = "select#1"
    c0 = case_of(sel, 0, 2, LIVE)
    c1 = case_of(sel, 1, 2, LIVE)
    assert c0.level is Level.PARTIAL and c1.level is Level.PARTIAL
    assert c0.join(c1) is LIVE
    three = [case_of(sel, k, 3, LIVE) for k in range(3)]
    assert three[0].join(three[1]).level is Level.PARTIAL
    assert three[0].join(three[1]).join(three[2]) is LIVE


def test_partition_of_different_selects_does_not_combine():
    from passes.lattice import LIVE, Level, case_of

    a = case_of("select#1", 0, 2, LIVE)
    b = case_of("select#2", 1, 2, LIVE)
    joined = a.join(b)
    assert joined.level is Level.PARTIAL and joined.partition is None


def test_partition_is_dropped_by_lane_moving_operations():
    from passes.lattice import LIVE, Level, case_of

    moved = case_of("select#1", 0, 2, LIVE).without_partition()
    other = case_of("select#1", 1, 2, LIVE)
    assert moved.join(other).level is Level.PARTIAL


# -- covered lines: every row holds a live lane ------------------------------------


def _rows_covered(origin="gather#1"):
    from passes.lattice import Liveness

    return Liveness(Level.PARTIAL, (origin,), None, (frozenset({1}), (4, 5)))


def test_covered_lines_answer_for_sums_over_a_superset_of_their_axes():
    rows = _rows_covered()
    assert rows.covers_lines_along([1], (4, 5))
    assert rows.covers_lines_along([0, 1], (4, 5))
    assert not rows.covers_lines_along([0], (4, 5))  # a column may be all dead
    assert not rows.covers_lines_along([1], (5, 4))  # another value's axes


def test_covered_lines_survive_joins_and_origins_but_not_moved_lanes():
    rows = _rows_covered()
    dead = dead_by("where#1")
    assert rows.join(dead).covered == rows.covered
    assert dead.join(rows).covered == rows.covered
    assert rows.join(partial_by("slice#1")).covered == rows.covered
    assert rows.with_origin("where#2").covered == rows.covered
    assert rows.join(LIVE) is LIVE
    assert rows.without_partition().covered is None
    assert rows.without_cover().covered is None
    assert rows.without_cover().level is Level.PARTIAL


def test_joined_covered_lines_keep_the_fact_over_fewer_axes():
    from passes.lattice import Liveness

    wide = Liveness(Level.PARTIAL, ("g#2",), None, (frozenset({0, 1}), (4, 5)))
    assert wide.join(_rows_covered()).covered == _rows_covered().covered
    assert _rows_covered().join(wide).covered == _rows_covered().covered


# -- shared structural transfer: select partitions do not survive moved lanes ----


class _FakeGraph:
    def __init__(self, item):
        self.item = item
        self.eqns = [item]

    def op(self, node):
        return self.item

    def node_inputs(self, node):
        return list(getattr(self.item, "inputs", getattr(self.item, "invars", ())))

    def origin(self, node):
        return ("node", node)


class _FakeAnalysis:
    def __init__(self, item):
        self.graph = _FakeGraph(item)


def _structural_rules():
    """Both front ends' structural rule, each with a one-input node of its own kind."""
    from types import SimpleNamespace

    rules = []
    tf = pytest.importorskip("tensorflow")
    from hlo_guard.tf.rules.structural import Structural as TFStructural

    op = SimpleNamespace(inputs=[SimpleNamespace(dtype=tf.float32)], type="ReverseV2")
    rules.append((TFStructural(), _FakeAnalysis(op)))
    jax = pytest.importorskip("jax")
    from hlo_guard.jax_frontend.rules.structural import Structural as JaxStructural

    x = jax.make_jaxpr(lambda a: jax.lax.rev(a, (0,)))(np.zeros(2, np.float32))
    rules.append((JaxStructural(), _FakeAnalysis(x.jaxpr.eqns[0])))
    return rules


def test_structural_transfer_drops_select_partition_in_both_front_ends():
    """``where(p, x, rev(x))``: case 0 reads x directly, case 1 through a
    reverse.  If the reverse kept case 1's partition, joining the two uses of x
    would say "as live as the select" although lane i is dead when neither
    p[i] nor not p[rev(i)] holds.  The two front ends once disagreed here (TF
    kept the partition); both now share passes.rules.StructuralTransfer."""
    from passes.lattice import case_of

    out = LIVE
    case0 = case_of("sel", 0, 2, out)
    case1 = case_of("sel", 1, 2, out)
    assert case0.join(case1) is out  # the shortcut the partition enables
    for rule, analysis in _structural_rules():
        through_rev = rule.transfer(analysis, 0, [case1])[0]
        assert through_rev.partition is None, type(rule).__module__
        assert not case0.join(through_rev).is_live, type(rule).__module__


def test_implements_answers_like_isinstance_and_memoises_per_class():
    """``implements`` is the engine's protocol check: the same answer as
    ``isinstance`` for rules with and without the optional methods, asked of
    the class once (a runtime-checkable protocol check is slow)."""
    from passes import rules as engine_rules

    class WithForward:
        def forward(self, analysis, node, ins):
            return ins

        def guards_output(self, analysis, node, index):
            return False

    class Without:
        pass

    for rule in (WithForward(), Without(), WithForward()):
        assert engine_rules.implements(rule, engine_rules.ForwardRule) == isinstance(
            rule, engine_rules.ForwardRule
        )
    assert (WithForward, engine_rules.ForwardRule) in engine_rules._IMPLEMENTS
    assert engine_rules._IMPLEMENTS[(Without, engine_rules.ForwardRule)] is False
