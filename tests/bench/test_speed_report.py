"""The speed benchmark's bookkeeping: ratios against targets, and its lines in the shared
"Headline figures" list of BENCHMARKS.md (other benchmarks' lines are kept)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import report, speed


def test_row_ratio_and_targets() -> None:
    up = speed.Row("k", "x", 120.0, 100.0, "rows/s", "≥ 1.0×")
    assert up.ratio == pytest.approx(1.2) and up.met
    assert not speed.Row("k", "x", 20.0, 100.0, "rows/s", "≥ 0.3×").met
    assert speed.Row("k", "x", 1.9, 1.0, "ms", "≤ 2.0×").met
    assert not speed.Row("k", "x", 2.1, 1.0, "ms", "≤ 2.0×").met
    assert speed.Row("k", "x", 5.0, 1.0, "ms", "").met  # information only
    assert up.fmt(1234.4) == "1,234 rows/s"
    assert speed.Row("k", "x", 1, 1, "ms", "").fmt(1.5) == "1.50 ms"


def test_update_headlines_keeps_the_other_lines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "BENCHMARKS.md"
    path.write_text(
        "# Benchmarks\n\nintro\n\n## Headline figures\n\n"
        "(filled in as the benchmarks of issue 3 land)\n- Accuracy: 0.9 (theirs)\n"
        "- Speed: old line\n\n## Accuracy (2026)\n\nbody\n"
    )
    monkeypatch.setattr(report, "BENCHMARKS", path)
    speed.update_headlines(["- Speed: new line"])
    speed.update_headlines(["- Speed: newer line"])
    text = path.read_text()
    assert "- Accuracy: 0.9 (theirs)" in text
    assert "- Speed: newer line" in text and "old line" not in text and "new line\n" not in text
    assert "(filled in" not in text
    assert text.index("## Headline figures") < text.index("- Speed") < text.index("## Accuracy")
    assert text.startswith("# Benchmarks\n\nintro")
    assert text.endswith("## Accuracy (2026)\n\nbody\n")
