"""``make bench`` keeps one generated block per JAX line in RESULTS.md: a run
on jax 0.12 lands beside the 0.10.2 figures and never overwrites them, and a
second run on the same line replaces only its own block (hand-written text
around the blocks is kept)."""

from __future__ import annotations

from benchmarks.run_all import BEGIN, END, markers, update_results_md


def test_a_new_jax_line_gets_its_own_block_after_the_base_one(tmp_path):
    path = tmp_path / "RESULTS.md"
    path.write_text(f"intro\n{BEGIN}\nold 0.10 table\n{END}\nfindings by hand\n")
    update_results_md("0.12 table", str(path), "0.12")
    text = path.read_text()
    assert "old 0.10 table" in text and "findings by hand" in text
    begin12, end12 = markers("0.12")
    assert text.index(END) < text.index(begin12) < text.index("0.12 table") < text.index(end12)
    assert text.index(end12) < text.index("findings by hand")

    update_results_md("new 0.12 table", str(path), "0.12")
    update_results_md("new 0.10 table", str(path), "0.10")
    text = path.read_text()
    assert "0.12 table\n" not in text.replace("new 0.12 table\n", "")
    assert "new 0.12 table" in text and "new 0.10 table" in text
    assert "old 0.10 table" not in text
    assert text.count(begin12) == 1 and text.count(BEGIN) == 1
    assert text.startswith("intro\n") and text.rstrip().endswith("findings by hand")
