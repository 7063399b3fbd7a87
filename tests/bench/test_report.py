"""A benchmark's section of BENCHMARKS.md: its heading, the command that made it, then tables
and plots, and nothing else."""

from __future__ import annotations

from pathlib import Path

from bench.report import ROOT, Plot, Table, markdown_table, section, slug, write_section


def test_markdown_table() -> None:
    assert markdown_table(["a", "b"], [[1, 0.123456]]) == "| a | b |\n|---|---|\n| 1 | 0.1235 |"


def test_a_section_is_tables_and_plots_under_its_command(tmp_path: Path) -> None:
    parts: list[Table | Plot] = [
        Table(["measure", "value"], [["x", 1]], "Figures"),
        Table(["y"], [[2]]),
        Plot("a plot", ROOT / "bench" / "plots" / "x.png"),
    ]
    text = section("Thing", parts, command="selectivity bench thing --quick")
    blocks = text.strip().split("\n\n")
    assert blocks[0] == "## Thing"
    assert blocks[1].startswith("Run 20")
    assert " UTC · command: `selectivity bench thing --quick` · commit " in blocks[1]
    assert blocks[2:] == [
        "### Figures",
        "| measure | value |\n|---|---|\n| x | 1 |",
        "| y |\n|---|\n| 2 |",
        "![a plot](bench/plots/x.png)",
    ]


def test_a_rerun_replaces_its_section_and_keeps_the_others(tmp_path: Path) -> None:
    target = tmp_path / "BENCHMARKS.md"
    target.write_text("# Benchmarks\n\nkept\n")
    write_section("Thing", [Table(["v"], [[1]])], command="c", path=target)
    write_section("Other: x (y)", [Table(["v"], [[2]])], command="d", path=target)
    write_section("Thing", [Table(["v"], [[3]])], command="c2", path=target)
    out = target.read_text()
    assert out.startswith("# Benchmarks\n\nkept\n\n<!-- bench:thing -->\n## Thing\n")
    assert out.count("## Thing") == 1 and "| 3 |" in out and "| 1 |" not in out
    assert "command: `c2`" in out and "command: `c`" not in out
    assert out.index("## Thing") < out.index("<!-- bench:other-x-y -->") < out.index("## Other")
    assert "| 2 |" in out


def test_benchmarks_md_is_one_section_per_benchmark_under_a_headline_screen() -> None:
    text = (ROOT / "BENCHMARKS.md").read_text()
    lines = text.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("<!-- bench:"))
    assert first <= 40, f"the headline takes {first} lines before the first section (at most 40)"
    marks = [line for line in lines if line.startswith("<!-- bench:")]
    keys = [line[len("<!-- bench:") : -len(" -->")] for line in marks]
    assert len(keys) == len(set(keys)), "a benchmark has two sections"
    for key in keys:
        assert text.count(f"<!-- /bench:{key} -->") == 1, key
    assert slug("Speed") in keys


def test_write_false_prints_the_section_and_leaves_the_file(tmp_path: Path) -> None:
    target = tmp_path / "BENCHMARKS.md"
    target.write_text("# Benchmarks\n")
    text = write_section("Thing", [Table(["v"], [[1]])], command="c", path=target, write=False)
    assert "## Thing" in text and target.read_text() == "# Benchmarks\n"
