"""hlo_guard benchmarks: side-by-side timing scripts, not tests.

Run ``make bench`` (or ``.venv/bin/python benchmarks/run_all.py [--quick]``).
Every figure is a *ratio* of variants measured in the same process with
alternating runs, so that machine load shifts all variants alike.
"""
