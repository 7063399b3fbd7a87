"""`selectivity privacy k-anon`: the calculator on the command line."""

from __future__ import annotations

import pytest

from service.cli.entry import main


def test_delta_and_inverses(capsys: pytest.CaptureFixture[str]) -> None:
    main(["privacy", "k-anon", "--beta", "0.1", "--k", "10", "--epsilon", "1"])
    assert "delta=6.84041e-08" in capsys.readouterr().out
    main(["privacy", "k-anon", "--beta", "0.1", "--k", "5", "--epsilon", "2"])
    assert "delta=1e-05" in capsys.readouterr().out
    main(["privacy", "k-anon", "--beta", "0.1", "--epsilon", "1", "--delta", "1e-6"])
    assert "k=9 " in capsys.readouterr().out
    main(["privacy", "k-anon", "--k", "10", "--epsilon", "1", "--delta", "1e-6"])
    assert "solved for beta" in capsys.readouterr().out


def test_bad_input_names_the_field() -> None:
    with pytest.raises(SystemExit, match=r"epsilon: must be >= -ln\(1-beta\)"):
        main(["privacy", "k-anon", "--beta", "0.5", "--k", "10", "--epsilon", "0.1"])
    with pytest.raises(SystemExit, match="beta: Input should be less than or equal to 0.99"):
        main(["privacy", "k-anon", "--beta", "1.5", "--k", "10", "--epsilon", "1"])
