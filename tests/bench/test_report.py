"""A benchmark's section of BENCHMARKS.md: its heading, the command that made it, then tables
and plots, and nothing else."""

from __future__ import annotations

from pathlib import Path

from bench.report import ROOT, Plot, Table, append_section, markdown_table, section


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
    assert blocks[0].startswith("## Thing (") and blocks[0].endswith(" UTC)")
    assert blocks[1].startswith("Command: `selectivity bench thing --quick` · commit ")
    assert blocks[2:] == [
        "### Figures",
        "| measure | value |\n|---|---|\n| x | 1 |",
        "| y |\n|---|\n| 2 |",
        "![a plot](bench/plots/x.png)",
    ]
    target = tmp_path / "BENCHMARKS.md"
    target.write_text("# Benchmarks\n\nkept\n")
    append_section("Thing", parts, command="c", path=target)
    append_section("Other", parts[:1], command="d", path=target)
    out = target.read_text()
    assert out.startswith("# Benchmarks\n\nkept\n\n## Thing (")
    assert out.index("## Thing") < out.index("## Other")
