"""Differential fuzzing of hlo_guard against a lane-by-lane Python-``if`` oracle.

``program`` defines the expression trees, ``strategies`` draws them (and
adversarial inputs) with hypothesis, ``vectorized`` turns a tree into the jnp
program under test, ``oracle`` evaluates it lane by lane taking only the
branches that are selected, and ``checks`` compares the two.
"""
