"""``statestore node``: run one ring node daemon. Its flags come from node/settings.py (the
one table of node settings: flags, ``STATESTORE_`` variables and a TOML file)."""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys

from statestore.cli.command import Subparsers
from statestore.node.settings import HELP_EPILOG, add_node_arguments
from statestore.node.settings import resolve as resolve_settings

__all__ = ["NODE_PACKAGES", "add_parser", "missing_node_packages", "node_install_hint", "run"]


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


# what ``pip install '.[node]'`` adds to the client (pyproject.toml), by import name
NODE_PACKAGES = ("lmdb", "kademlia", "prometheus_client")


def missing_node_packages() -> list[str]:
    """The packages of the ``node`` extra this install cannot import (none: it can run a
    node). ``pip install .`` is the client only."""
    missing = []
    for name in NODE_PACKAGES:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            missing.append(name)
    return missing


def node_install_hint(missing: list[str]) -> str:
    return (
        f"this install has no {', '.join(missing)}: it is the client only (pip install .); "
        "a ring node needs the node extra: pip install '.[node]' (or "
        "pip install 'statestore[node]')"
    )


def run(args: argparse.Namespace) -> int:
    """Resolve the settings (a bad one: its name and source, exit code 2), then serve."""
    if missing := missing_node_packages():
        print(f"statestore node: {node_install_hint(missing)}", file=sys.stderr)
        return 1
    try:  # flag > STATESTORE_ variable > --config file > default (node/settings.py)
        settings = resolve_settings(args, os.environ)
    except ValueError as exc:  # names the setting and where it came from
        print(f"statestore node: {exc}", file=sys.stderr)
        return 2
    from statestore.node.logs import setup_logging
    from statestore.node.server import run_node

    setup_logging(settings.log_level, settings.log_format)  # stderr; stdout: lifecycle lines
    return run_node(settings.config)
