"""k-anonymisation (SaNGreeA, ``service.core.anonymity.sangreea``) benchmarks: ``adult`` (the data
and
its hierarchies), ``speed`` (time and NGIL against n, ours vs the exhaustive greedy vs the
authors' AnonymizationJS run with node through ``anonymizationjs_driver.js``), ``utility`` (the
paper's F1-against-k experiment, with ``mondrian`` as the baseline partitioning).

``python -m bench anonymization [options]`` runs ``speed``; ``python -m bench anonymization
utility [options]`` runs ``utility``."""

from __future__ import annotations

from bench.anonymization import speed, utility


def main(argv: list[str]) -> None:
    if argv[:1] == ["utility"]:
        utility.main(argv[1:])
    else:
        speed.main(argv)


__all__ = ["main"]
