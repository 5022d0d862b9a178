"""The ``statestore`` command and the local ring launcher it shares with tests and benchmarks."""

from statestore.cli.main import main

__all__ = ["main"]
