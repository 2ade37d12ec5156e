"""Unit tests of :mod:`passes.fact_walk` on a hand-made diamond chain: node
``i`` reaches node ``i - 1`` twice, once adding the fact ``i`` (a select's
case) and once adding nothing.  Walked path by path that is ``2 ** n``
visits; fewest facts first, each node is settled by its first visit."""

from passes.fact_walk import walk_with_facts


def _diamonds(n, visited, stop_at=None):
    def step(node, facts):
        visited.append((node, facts))
        if node == stop_at:
            return None
        if node == 0:
            return []
        return [(node - 1, facts | {node}), (node - 1, facts)]

    return step


def test_a_chain_of_diamonds_is_walked_once_per_node():
    visited: list = []
    assert walk_with_facts(40, lambda n: True, lambda n: n, _diamonds(40, visited), limit=100)
    assert sorted(n for n, _ in visited) == list(range(41))
    assert all(not facts for _, facts in visited)  # the fact-free path settled each


def test_the_limit_ends_the_walk_unexcused():
    visited: list = []
    assert not walk_with_facts(40, lambda n: True, lambda n: n, _diamonds(40, visited), limit=20)
    assert len(visited) == 20


def test_a_step_that_ends_the_walk_fails_it():
    visited: list = []
    step = _diamonds(10, visited, stop_at=3)
    assert not walk_with_facts(10, lambda n: True, lambda n: n, step, limit=100)


def test_items_not_admitted_are_passed_over():
    visited: list = []
    assert walk_with_facts(10, lambda n: n >= 5, lambda n: n, _diamonds(10, visited), limit=100)
    assert sorted(n for n, _ in visited) == [5, 6, 7, 8, 9, 10]


def test_a_superset_of_facts_is_settled():
    """A node reached again with a superset of the facts it was walked with
    is settled by that walk."""
    seen: list = []

    def step(node, facts):
        seen.append((node, facts))
        if node == "start":
            return [("x", frozenset({2})), ("y", frozenset())]
        if node == "y":
            return [("x", frozenset({1, 2, 3}))]
        return []

    assert walk_with_facts("start", lambda n: True, lambda n: n, step, limit=10)
    # x is taken with {2} first (fewer facts than {1, 2, 3}); the later
    # superset is settled by it
    assert [f for n, f in seen if n == "x"] == [frozenset({2})]
