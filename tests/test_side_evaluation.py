"""``passes.side_evaluation.evaluate_on_side`` on a toy graph: the walk both
front ends use to compute a mask's value that the guarded evaluation has not
reached.  Oracle: the values computed by plain Python recursion over the
same toy graph."""

from __future__ import annotations

import pytest

from passes.masks import ShadowUnavailable
from passes.side_evaluation import evaluate_on_side

#: node -> (operands, output, function); "x" is an input
TOY = {
    0: (["x"], "a", lambda x: x + 1),
    1: (["a", "x"], "b", lambda a, x: a * x),
    2: (["b", "a"], "c", lambda b, a: b - a),
    3: (["c"], "eff", None),  # effectful: must not run on the side
    4: (["eff", "a"], "d", lambda e, a: e + a),
}
PRODUCER = {out: node for node, (_, out, _) in TOY.items()}


def _run(target, known):
    values = dict(known)
    computed = []

    def compute(node):
        ins, out, fn = TOY[node]
        if fn is None:
            raise ShadowUnavailable(f"node {node} is effectful")
        computed.append(node)
        values[out] = fn(*(values[i] for i in ins))

    def leaf(v):
        raise ShadowUnavailable(f"no value for {v}")

    evaluate_on_side(
        target,
        available=lambda v: v in values,
        producer=lambda v: PRODUCER.get(v),
        operands=lambda node: TOY[node][0],
        leaf=leaf,
        compute=compute,
    )
    return values, computed


def _recursive(v, x):
    if v == "x":
        return x
    ins, _, fn = TOY[PRODUCER[v]]
    return fn(*(_recursive(i, x) for i in ins))


def test_computes_each_producer_once_in_dependency_order():
    values, computed = _run("c", {"x": 3.0})
    assert values["c"] == _recursive("c", 3.0)
    assert computed == [0, 1, 2]  # "a" is read twice but computed once


def test_available_values_are_not_recomputed():
    values, computed = _run("c", {"x": 3.0, "b": 100.0})
    assert computed == [0, 2]
    assert values["c"] == 100.0 - 4.0


def test_an_effectful_producer_refuses():
    with pytest.raises(ShadowUnavailable, match="effectful"):
        _run("d", {"x": 1.0})


def test_a_value_with_no_producer_goes_to_leaf():
    with pytest.raises(ShadowUnavailable, match="no value for x"):
        _run("c", {})


def test_long_chain_does_not_recurse():
    n = 100_000
    values = {0: 0}
    evaluate_on_side(
        n,
        available=lambda v: v in values,
        producer=lambda v: v,
        operands=lambda node: [node - 1],
        leaf=lambda v: None,
        compute=lambda node: values.__setitem__(node, values[node - 1] + 1),
    )
    assert values[n] == n
