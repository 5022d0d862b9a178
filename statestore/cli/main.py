"""The ``statestore`` command, assembled from its command modules (nodetool-style: one module
per command or family, each owning its subparser and its run, cli/command.py):

``node`` (cli/node.py), ``local`` (cli/local.py), ``ring`` (cli/ring.py), ``decommission``
(cli/elastic.py), ``removenode`` (cli/removenode.py), ``rebalance`` (cli/rebalance.py),
``restore`` (cli/restore.py), ``outcomes`` (cli/outcomes.py), ``stores ls``, ``inspect`` and
``drop`` (cli/admin.py), ``backup`` and ``restore-backup`` (cli/backup.py), ``spark-jar``
(cli/spark_jar.py), ``spark-repartition`` (cli/spark_repartition.py), ``spark-savepoint`` and
``spark-restore-savepoint`` (cli/savepoint.py), ``demo`` (cli/demo.py).

Errors end here, at one place, as one line on stderr and never a trace: bad arguments with
argparse's usage message and exit code 2; an error of the tree (core/errors.py) a command
raised, or a file it cannot use, as ``statestore <command>: <message>`` and exit code 1.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from statestore.cli import (
    admin,
    backup,
    demo,
    elastic,
    local,
    node,
    outcomes,
    rebalance,
    removenode,
    restore,
    ring,
    savepoint,
    spark_jar,
    spark_repartition,
)
from statestore.core.errors import StateStoreError
from statestore.core.formats import DISK_FORMAT, DISK_FORMATS_READ, VERSION, WIRE_FORMAT

__all__ = ["COMMANDS", "build_parser", "main", "version_text"]

# the command modules, in the order ``statestore --help`` lists their commands
COMMANDS = (
    node,
    local,
    ring,
    elastic,
    removenode,
    rebalance,
    restore,
    outcomes,
    admin,
    backup,
    spark_jar,
    spark_repartition,
    savepoint,
    demo,
)


def version_text() -> str:
    """``statestore --version``: the package version and the formats (core/formats.py)."""
    return (
        f"statestore {VERSION} (wire format {WIRE_FORMAT}, disk format {DISK_FORMAT}; reads "
        f"disk formats {', '.join(map(str, sorted(DISK_FORMATS_READ)))})"
    )


class _Version(argparse.Action):
    """``--version``: :func:`version_text` on one line (argparse's own action wraps it at the
    terminal's width, which a script reading it does not expect)."""

    def __init__(self, option_strings: list[str], dest: str, **kw: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kw)

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> None:
        print(version_text())
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="statestore", description="DHT-backed state store")
    p.add_argument(
        "--version",
        action=_Version,
        help="print the version and the wire and disk formats it speaks and keeps, and exit",
    )
    sub = p.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.add_parser(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)  # a usage error: its message, exit code 2
    try:
        code: int = args.run(args)
    except (StateStoreError, ValueError) as exc:  # ValueError: e.g. a CA file it cannot use
        print(f"statestore {args.command}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return code
