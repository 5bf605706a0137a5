"""The ``kbroker`` command line: one module per subcommand, listed in :mod:`kbroker.cli.main`."""
