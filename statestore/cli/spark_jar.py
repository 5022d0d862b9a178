"""``statestore spark-jar``: the Spark provider jar's path (spark_connector builds it with
``javac`` against pyspark's own jars on first use)."""

from __future__ import annotations

import argparse

from statestore.cli.command import Subparsers

__all__ = ["add_parser", "run"]


def add_parser(sub: Subparsers) -> None:
    sj = sub.add_parser(
        "spark-jar", help="print the Spark provider jar's path (built on first use)"
    )
    sj.add_argument("--rebuild", action="store_true")
    sj.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from spark_connector import main as spark_jar

    return spark_jar(["--rebuild"] if args.rebuild else [])
