"""``selectivity bench scale``: throughput against the number of API processes and workers, on a
standalone Redis and on a three-master Redis Cluster (the description and the options:
``bench.scale.cli``).

The package: ``cli`` (options, the run), ``deploy`` (Redis, SQL and the processes), ``worker``
(the worker for the cluster runs), ``load`` (the load generator's jobs), ``report`` (tables and
the plot)."""

from bench.scale.cli import main

__all__ = ["main"]
