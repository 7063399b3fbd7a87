"""``selectivity bench scale``: one hot stream's counted ingest across worker processes,
partitions and Redis masters (a standalone redis-server and a three-master Redis Cluster),
against pipelined XADD in the same run, and featurize latency at 1 and 8 clients (the
description and the options: ``bench.scale.cli``).

The package: ``cli`` (options, the run), ``deploy`` (Redis, SQL, the processes, the counting
checks), ``load`` (the load generator's jobs and the XADD baseline), ``report`` (tables, the
projection to N cores, the plot)."""

from bench.scale.cli import main

__all__ = ["main"]
