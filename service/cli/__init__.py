"""The command line, one module per command group (``selectivity --help``)."""
