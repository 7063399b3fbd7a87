"""``selectivity bench accuracy``: count featurization on MovieLens 100K against LightGBM on the
raw data (the description and the options: ``bench.accuracy.cli``).

The package by concern: ``plan`` (operating point, privacy configurations, cuts, the sweep),
``http_arm`` (the service over HTTP, in process), ``core_arm`` (the same tables on
``service.core``), ``baselines`` (raw LightGBM and the label prior), ``runner`` (jobs in worker
processes), ``analysis`` (the figures), ``report`` and ``plots`` (tables and PNGs)."""

from bench.accuracy.cli import main

__all__ = ["main"]
