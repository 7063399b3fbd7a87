"""What `selectivity audit reidentify` prints for a finished audit (no server): the release's
whole-record guarantee in one line, and per attack the accuracy over the draws with its s.d.
and range, precision, recall and the gains over the prior."""

from __future__ import annotations

from typing import Any

from rich.console import Console

from service.cli.audit import guarantee_line, table


def _out(**over: Any) -> dict[str, Any]:
    spread = {"mean": 0.72, "sd": 0.031, "min": 0.69, "max": 0.76}
    out: dict[str, Any] = {
        "id": "ra_" + "1" * 32,
        "epsilon": 0.5,
        "guarantee": {
            "epsilon": 0.5,
            "neighbours": "add or remove one record",
            "unit": "the whole record (all 12 coordinates)",
            "epsilon_sum": 0.45,
            "epsilon_count": 0.05,
            "domain": {"kind": "one_hot", "tables": 3},
            "l1_bound": 3.0,
            "source": "the first 240 records (at most 20000) of the hot period of epoch 2",
        },
        "results": {
            "growpu": {
                "accuracy": 0.72,
                "precision": 0.81,
                "recall": 0.64,
                "accuracy_gain": 0.12,
                "precision_gain": 0.41,
                "draws": 5,
                "spread": {"accuracy": spread},
                "seconds": 3.2,
            },
            "prior": {"accuracy": 0.6, "precision": None, "recall": 0.0, "draws": 1},
        },
    }
    out.update(over)
    return out


def _render(obj: Any) -> str:
    console = Console(record=True, width=140)
    console.print(obj)
    return console.export_text()


def test_the_guarantee_is_for_the_whole_record() -> None:
    line = guarantee_line(_out())
    assert line.startswith(
        "guarantee: ε = 0.5 for the whole record (all 12 coordinates), add or remove one record "
        "(ε 0.45 to the sum, 0.05 to the count; one-hot, 3 tables, L1 bound 3)"
    ), line
    assert line.endswith(
        "source: the first 240 records (at most 20000) of the hot period of epoch 2"
    )
    assert guarantee_line(_out(epsilon=None, guarantee=None)) == (
        "guarantee: none (the exact release)"
    )


def test_the_table_has_precision_recall_gains_and_the_spread() -> None:
    text = _render(table(_out()))
    for head in ("accuracy", "s.d.", "range", "precision", "recall", "gain (accuracy)", "draws"):
        assert head in text, text
    row = next(line for line in text.splitlines() if "growPU" in line)
    cells = [c.strip() for c in row.split("│")[1:-1]]
    assert cells == [
        "growPU",
        "72.0 %",
        "3.1",
        "69.0-76.0",
        "81.0 %",
        "64.0 %",
        "+12.0",
        "+41.0",
        "5",
        "3.2",
    ]
    prior = next(line for line in text.splitlines() if "prior" in line)
    assert [c.strip() for c in prior.split("│")[1:-1]][:6] == [
        "prior (majority class)",
        "60.0 %",
        "",
        "",
        "",
        "0.0 %",
    ]
