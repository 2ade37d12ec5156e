"""Boundary placement (issue 17, DESIGN.md step 3) on toy graphs.

``plan_boundary_guards`` guards a partly dead use only where its dead lanes'
cotangent could reach a live lane (a graph input, a value with another use, a
lane-mixing producer) and only when the dead region behind it holds a hazard.
The oracle is the hand-placed double where: one guard where a human writes the
inner ``where``.
"""

from __future__ import annotations

from test_passes_engine import Elementwise, Node, P, Select
from test_passes_engine import FakeGraph as _FakeGraph

from passes import RuleTable, analyze
from passes.planning import hazard_behind, plan_boundary_guards, plan_guards


class FakeGraph(_FakeGraph):
    def graph_inputs(self):
        """Every value no node produces."""
        made = {v for n in self.nodes for v in n.outputs}
        return list(dict.fromkeys(v for n in self.nodes for v in n.inputs if v not in made))


class LaneLocal(Elementwise):
    """An elementwise toy op of one shape: never mixes lanes."""

    def keeps_lanes_apart(self, ctx, node):
        return True


class Mixing(Elementwise):
    """A toy contraction/broadcast: may sum a dead lane into a live one."""


def rules():
    table = RuleTable("toy-boundary")
    table.register(["sqrt", "log", "recip"], LaneLocal(guards=True))
    table.register(["neg", "add", "mul"], LaneLocal(guards=False))
    table.register(["dot", "bcast"], Mixing(guards=False))
    table.register("select", Select())
    return table


def sites(g):
    return [(s.node, s.index) for s in plan_boundary_guards(analyze(g, rules()))[0]]


def test_lane_wise_chain_gets_one_guard_where_it_enters():
    # where(p, recip(log(sqrt(x))), 0): old placement guards three hazards
    g = FakeGraph(
        [
            Node("sqrt", ["x"], ["s"]),
            Node("log", ["s"], ["l"]),
            Node("recip", ["l"], ["r"]),
            Node("select", ["p", "r", "zero"], ["y"], {"p": P}),
        ],
        outputs=["y"],
        int_values={"p"},
    )
    assert sites(g) == [(0, 0)]
    assert len(plan_guards(analyze(g, rules()))[0]) == 3


def test_chain_without_hazard_needs_no_guard():
    g = FakeGraph(
        [Node("neg", ["x"], ["n"]), Node("select", ["p", "n", "zero"], ["y"], {"p": P})],
        outputs=["y"],
        int_values={"p"},
    )
    assert sites(g) == []
    assert hazard_behind(analyze(g, rules()))[(0, 0)] is False


def test_join_guards_the_dead_use_not_the_live_one():
    # sum-like live use of t beside a masked sqrt(t): t's sqrt use is the boundary
    g = FakeGraph(
        [
            Node("neg", ["x"], ["t"]),
            Node("sqrt", ["t"], ["s"]),
            Node("select", ["p", "s", "zero"], ["y"], {"p": P}),
            Node("add", ["y", "t"], ["z"]),
        ],
        outputs=["z"],
        int_values={"p"},
    )
    assert sites(g) == [(1, 0)]


def test_mixing_producer_output_is_guarded():
    # sqrt(dot(a, b)) under a where: the dot's output is the boundary
    g = FakeGraph(
        [
            Node("dot", ["a", "b"], ["d"]),
            Node("neg", ["d"], ["n"]),
            Node("sqrt", ["n"], ["s"]),
            Node("select", ["p", "s", "zero"], ["y"], {"p": P}),
        ],
        outputs=["y"],
        int_values={"p"},
    )
    assert sites(g) == [(1, 0)]


def test_hazard_beyond_a_mixing_consumer_still_counts():
    # bcast feeding a masked log: the region continues through the dot's input
    g = FakeGraph(
        [
            Node("neg", ["x"], ["n"]),
            Node("bcast", ["n"], ["b"]),
            Node("log", ["b"], ["l"]),
            Node("select", ["p", "l", "zero"], ["y"], {"p": P}),
        ],
        outputs=["y"],
        int_values={"p"},
    )
    # b comes from a mixing op: its log use is guarded; n's use by bcast is
    # an interior use of a lane-local producer with one use
    assert sites(g) == [(2, 0)]


def test_unknown_consumer_is_a_hazard():
    g = FakeGraph(
        [
            Node("neg", ["x"], ["n"]),
            Node("mystery", ["n"], ["m"]),
            Node("select", ["p", "m", "zero"], ["y"], {"p": P}),
        ],
        outputs=["y"],
        int_values={"p"},
    )
    assert hazard_behind(analyze(g, rules()))[(1, 0)] is True


class CountingLaneLocal(LaneLocal):
    """LaneLocal that counts the nodes the placement asks about."""

    def __init__(self, guards):
        super().__init__(guards)
        self.asked: list[int] = []

    def keeps_lanes_apart(self, ctx, node):
        self.asked.append(node)
        return True

    def guards_input(self, ctx, node, index):
        self.asked.append(node)
        return super().guards_input(ctx, node, index)


def test_placement_asks_nothing_about_the_fully_live_part_of_a_program():
    # 40 live ops whose result is also returned, and the one dead region:
    # sqrt behind a select; the live prefix has no partly dead use, so no rule
    # is asked about it (on a large program those per-node rule calls were
    # most of the placement's time)
    live = CountingLaneLocal(guards=False)
    table = rules()
    table.register(["neg", "add"], live)
    nodes = [Node("neg", ["x"], ["v0"])]
    nodes += [Node("add", [f"v{k}", f"v{k}"], [f"v{k + 1}"]) for k in range(40)]
    nodes += [Node("sqrt", ["v40"], ["s"]), Node("select", ["p", "s", "zero"], ["y"], {"p": P})]
    g = FakeGraph(nodes, outputs=["y", "v40"], int_values={"p"})
    analysis = analyze(g, table)
    got = [(s.node, s.index) for s in plan_boundary_guards(analysis)[0]]
    # the guard sits where the region meets live computation: sqrt's operand
    # (v40 is also returned, a live read)
    assert got == [(41, 0)]
    # only v40's producer (node 40, whose output the dead region reads) is asked
    assert set(live.asked) <= {40}
