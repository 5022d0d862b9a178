"""``statestore node``: run one ring node daemon. Its flags come from node/settings.py (the
one table of node settings: flags, ``STATESTORE_`` variables and a TOML file)."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from statestore.cli.command import Subparsers
from statestore.node.settings import HELP_EPILOG, add_node_arguments
from statestore.node.settings import resolve as resolve_settings

__all__ = ["add_parser", "run"]


def add_parser(sub: Subparsers) -> None:
    n = sub.add_parser(
        "node",
        help="run one ring node daemon",
        description="Run one ring node daemon. Its settings (statestore/node/settings.py) come "
        "from flags, STATESTORE_ variables and a TOML file: flag > environment > file > "
        "default.",
        epilog=HELP_EPILOG,
    )
    add_node_arguments(n)
    n.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Resolve the settings (a bad one: its name and source, exit code 2), then serve."""
    try:  # flag > STATESTORE_ variable > --config file > default (node/settings.py)
        settings = resolve_settings(args, os.environ)
    except ValueError as exc:  # names the setting and where it came from
        print(f"statestore node: {exc}", file=sys.stderr)
        return 2
    from statestore.node.server import run_node

    logging.basicConfig(
        level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    return run_node(settings.config)
