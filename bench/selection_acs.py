"""``selectivity bench selection-acs``: DP count-table selection on ACS employment
(``bench.accuracy.selection_acs``)."""

from bench.accuracy.selection_acs import main

__all__ = ["main"]
