"""Re-identification audit benchmarks (issue 15): ``python -m bench reidentification``."""

from bench.reidentification.mnist import main

__all__ = ["main"]
