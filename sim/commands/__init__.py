"""Subcommands of the ``decodesim`` CLI, one module each (discovered by sim.cli)."""
