"""``python -m service.cli.entry``: the ``selectivity`` command."""

from service.cli.entry import main

main()
