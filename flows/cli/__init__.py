"""The `flywheel` command line: `app` wires one module per command."""
