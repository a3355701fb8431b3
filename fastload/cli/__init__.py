"""The ``fastload`` command: ``main`` parses the command line (``fastload.cli.command``); ``describe``
and ``demo`` hold those subcommands' work."""

from fastload.cli.command import main

__all__ = ["main"]
