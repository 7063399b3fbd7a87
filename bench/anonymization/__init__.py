"""k-anonymisation (SaNGreeA, ``service.core.sangreea``) benchmarks: ``adult`` (the data and
its hierarchies), ``speed`` (time and NGIL against n, ours vs the exhaustive greedy vs the
authors' AnonymizationJS run with node through ``anonymizationjs_driver.js``)."""

from bench.anonymization.speed import main

__all__ = ["main"]
