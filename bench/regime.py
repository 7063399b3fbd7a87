"""``python -m bench regime`` (``selectivity bench regime``): the accuracy regime curves of
``bench.accuracy.regime`` (issue 18, part 2)."""

from bench.accuracy.regime import main

__all__ = ["main"]
