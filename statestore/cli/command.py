"""What every ``statestore`` command shares: the command protocol and its argument types.

A command module (``cli/ring.py``, ``cli/backup.py``, ...) exposes ``add_parser(sub)``: it
adds its subcommand(s) to ``sub`` and binds each to its run with ``set_defaults(run=...)``.
A run takes the parsed arguments and returns the exit code; it raises from the error tree
(core/errors.py) for anything it does not say itself, and cli/main.py turns that into one
line on stderr and exit code 1. A command module imports what is heavy (rich, aiohttp, the
client, Spark) inside its run: building the parser loads none of it.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import TypeAlias

from statestore.core.address import parse_seeds
from statestore.core.errors import InvalidAddress

__all__ = [
    "Run",
    "Subparsers",
    "add_client_tls",
    "add_seeds",
    "failer",
    "positive",
    "positive_float",
    "seeds",
]

# a command's run: the parsed arguments in, the exit code out
Run: TypeAlias = Callable[[argparse.Namespace], int]
# what ``add_parser`` adds its subcommands to: ``ArgumentParser.add_subparsers()``
Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
SEEDS = "HOST:PORT,..."


def seeds(text: str) -> list[str]:
    """``--seeds``: a comma-separated list of ``HOST:PORT``."""
    try:
        return parse_seeds(text)
    except InvalidAddress as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return int(text)


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number")
    return value


def add_seeds(p: argparse.ArgumentParser) -> None:
    """The required ``--seeds`` of a command that talks to a ring."""
    p.add_argument("--seeds", type=seeds, required=True, metavar=SEEDS)


def add_client_tls(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--tls-ca",
        default=None,
        metavar="F",
        help="PEM CA of a ring that serves TLS (default: $STATESTORE_TLS_CA; none = plain HTTP)",
    )


def failer(command: str) -> Callable[[str], int]:
    """``fail(why)``: print ``statestore <command>: why`` on stderr and return exit code 1
    (a command's own refusal: what the error tree does not name)."""

    def fail(why: str) -> int:
        print(f"statestore {command}: {why}", file=sys.stderr)
        return 1

    return fail
