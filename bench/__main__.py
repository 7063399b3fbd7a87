"""``python -m bench <name> [options]`` (what ``selectivity bench <name>`` runs): the
benchmark ``bench.<name>``'s ``main(argv)``."""

from __future__ import annotations

import importlib
import sys

BENCHES = (
    "accuracy",
    "speed",
    "roll",
    "selection",
    "selection-acs",
    "seal",
    "anonymization",
    "reidentification",
    "scale",
    "dp-audit",
)


def main(argv: list[str]) -> None:
    if not argv or argv[0] not in BENCHES:
        sys.exit(f"usage: python -m bench {{{','.join(BENCHES)}}} [options]")
    try:
        module = importlib.import_module(f"bench.{argv[0].replace('-', '_')}")
    except ImportError as exc:
        sys.exit(f"benchmark {argv[0]!r} needs the bench extra: pip install -e '.[bench]' ({exc})")
    module.main(argv[1:])


if __name__ == "__main__":
    main(sys.argv[1:])
