"""The admin commands: ``stores ls``, ``inspect`` and ``drop`` (docs/operations.md).

Each asks the ring's view from the first seed that answers, then every live member for what it
holds (``GET /v1/inventory``), and merges the answers with the same rules as the dashboard
(core/inventory.py). ``drop`` sends one ``POST /v1/queries/{query}/drop`` to a seed, which
purges the query on every member and records a tombstone (node/tombstones.py).

A bearer token, when the ring has client tokens, comes from ``STATESTORE_TOKEN`` or the file
named by ``STATESTORE_TOKEN_FILE``; ``drop`` needs the ``admin`` right on the query. On a ring
that serves TLS, nodes are verified against ``--tls-ca`` or ``STATESTORE_TLS_CA``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Sequence
from typing import Any

from statestore.cli.command import Subparsers, add_client_tls, add_seeds
from statestore.cli.http import token_headers
from statestore.core.errors import AccessDenied, NodeUnavailable, StateStoreError
from statestore.core.ids import StoreId
from statestore.core.inventory import inspect_store, merge_listings, summaries_json
from statestore.core.view import RingView
from statestore.net.tls import client_context, tls_ca_file

__all__ = ["add_parser", "drop_query", "inspect", "list_stores"]


def add_parser(sub: Subparsers) -> None:
    st = sub.add_parser("stores", help="stores on the ring (admin)")
    st_sub = st.add_subparsers(dest="stores_command", required=True)
    ls = st_sub.add_parser("ls", help="every store with its head and versions count")
    add_seeds(ls)
    ls.add_argument("--query", default=None, help="only this query's stores")
    ls.add_argument("--json", action="store_true")
    add_client_tls(ls)
    ls.set_defaults(run=_run_ls)

    ins = sub.add_parser(
        "inspect", help="one store: versions, chain, sizes, replicas and their copies"
    )
    add_seeds(ins)
    ins.add_argument("--store", required=True, metavar="QUERY/OPERATOR/PARTITION/NAME")
    ins.add_argument("--json", action="store_true")
    add_client_tls(ins)
    ins.set_defaults(run=_run_inspect)

    dr = sub.add_parser("drop", help="remove every store of a finished query everywhere")
    add_seeds(dr)
    dr.add_argument("--query", required=True)
    dr.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    add_client_tls(dr)
    dr.set_defaults(run=_run_drop)


def _run_ls(args: argparse.Namespace) -> int:
    return list_stores(args.seeds, args.query, args.json, tls_ca=args.tls_ca)


def _run_inspect(args: argparse.Namespace) -> int:
    return inspect(args.seeds, args.store, args.json, tls_ca=args.tls_ca)


def _run_drop(args: argparse.Namespace) -> int:
    return drop_query(args.seeds, args.query, args.yes, tls_ca=args.tls_ca)


class Admin:
    """One HTTP transport and the ring's view, for one command."""

    def __init__(self, seeds: Sequence[str], tls_ca: str | None = None) -> None:
        from statestore.net.http import HttpTransport  # aiohttp: only when a command runs

        self.seeds = list(seeds)
        ca = tls_ca_file(tls_ca)
        self.transport = HttpTransport(timeout=10.0, tls=client_context(ca) if ca else None)
        self.headers = token_headers()

    async def get(self, address: str, path: str) -> Any:
        resp = await self.transport.request("GET", address, path, headers=self.headers)
        return resp.json()

    async def view(self) -> tuple[str, RingView]:
        """The first seed that answers and its ring view."""
        errors = []
        for seed in self.seeds:
            try:
                return seed, RingView.from_json(await self.get(seed, "/v1/ring"))
            except AccessDenied:  # the ring answered: no token, or one without the right
                raise
            except StateStoreError as exc:
                errors.append(f"{seed}: {exc}")
        raise NodeUnavailable("no seed answered (" + "; ".join(errors) + "); check --seeds")

    async def ask_live(self, view: RingView, path: str) -> tuple[dict[str, Any], list[str]]:
        """``GET path`` on every live member: the answers by address, and who failed."""
        addresses = view.live_addresses()
        answers = await asyncio.gather(
            *(self.get(a, path) for a in addresses), return_exceptions=True
        )
        got: dict[str, Any] = {}
        failed: list[str] = []
        for address, answer in zip(addresses, answers, strict=True):
            if isinstance(answer, AccessDenied):  # not a node missing: the caller's rights
                raise answer
            if isinstance(answer, StateStoreError):
                failed.append(f"{address}: {answer}")
            elif isinstance(answer, BaseException):
                raise answer
            else:
                got[address] = answer
        return got, failed

    async def close(self) -> None:
        await self.transport.close()


def _warn(failed: list[str]) -> None:
    for f in failed:
        print(f"warning: no answer from {f}; the listing may miss what it holds", file=sys.stderr)


async def _list(
    seeds: Sequence[str], query: str | None, tls_ca: str | None
) -> tuple[list[dict[str, Any]], list[str]]:
    admin = Admin(seeds, tls_ca)
    try:
        _, view = await admin.view()
        path = "/v1/inventory" + (f"?query={query}" if query else "")
        listings, failed = await admin.ask_live(view, path)
        return summaries_json(merge_listings(listings, query)), failed
    finally:
        await admin.close()


def list_stores(
    seeds: Sequence[str], query: str | None, as_json: bool, *, tls_ca: str | None = None
) -> int:
    """``statestore stores ls``: every store on the ring, its head and how many versions."""
    if query is not None:
        StoreId(query, 0, 0, "x")  # a bad query name fails here, named
    stores, failed = asyncio.run(_list(seeds, query, tls_ca))
    _warn(failed)
    if as_json:
        print(json.dumps({"stores": stores, "unanswered": failed}, indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{len(stores)} store(s)" + (f" of query {query}" if query else ""))
    for col in ("store", "head", "epoch", "versions", "oldest", "held by"):
        table.add_column(col)
    for s in stores:
        head = s["head"] or {}
        table.add_row(
            s["store"],
            str(head.get("version", "-")),
            str(head.get("epoch", "-")),
            str(s["versions"]),
            str(s["oldest"] if s["oldest"] is not None else "-"),
            ", ".join(s["holders"]),
        )
    Console().print(table)
    return 0


async def _inspect(seeds: Sequence[str], store: StoreId, tls_ca: str | None) -> dict[str, Any]:
    admin = Admin(seeds, tls_ca)
    try:
        _, view = await admin.view()
        details, failed = await admin.ask_live(view, f"/v1/inventory/{store.path}")
        all_live: dict[str, Any] = dict.fromkeys(view.live_addresses())
        all_live.update(details)
        report = inspect_store(view, store, all_live)
        report["unanswered"] = failed
        return report
    finally:
        await admin.close()


def inspect(
    seeds: Sequence[str], store_path: str, as_json: bool, *, tls_ca: str | None = None
) -> int:
    """``statestore inspect``: one store's versions, head chain, sizes and replicas."""
    store = StoreId.parse(store_path)
    report = asyncio.run(_inspect(seeds, store, tls_ca))
    _warn(report["unanswered"])
    if as_json:
        print(json.dumps(report, indent=2))
        return 0 if all(r["complete"] for r in report["replicas"]) else 1
    from rich.console import Console
    from rich.table import Table

    console = Console()
    head = report["head"]
    console.print(
        f"[bold]{store}[/bold]  head "
        + (f"v{head['version']} (epoch {head['epoch']})" if head else "-")
        + f"  floor {report['floor']}  ring epoch {report['epoch']}"
    )
    chain = " <- ".join(f"v{c['version']} {c['kind']}" for c in reversed(report["chain"]))
    console.print(f"chain of the head: {chain or '-'}  ({report['chain_bytes']} bytes)")
    if report["chain_error"]:
        console.print(f"[red]chain broken: {report['chain_error']}[/red]")
    vt = Table(title="versions")
    for col in ("version", "kinds", "epoch", "chunks", "bytes", "raw bytes", "rows"):
        vt.add_column(col)
    for v in report["versions"]:
        vt.add_row(
            str(v["version"]),
            "+".join(v["kinds"]),
            str(v["epoch"]),
            str(v["chunks"]),
            str(v["bytes"]),
            str(v["raw_bytes"]),
            str(v["rows"]),
        )
    console.print(vt)
    rt = Table(title="replicas")
    for col in ("node", "status", "manifests", "chunks", "complete", "missing"):
        rt.add_column(col)
    for r in [*report["replicas"], *report["other_holders"]]:
        rt.add_row(
            r["address"] + ("" if r in report["replicas"] else " (not a replica)"),
            r["status"] if r["answered"] else f"{r['status']}, no answer",
            f"{r['manifests']['held']}/{r['manifests']['expected']}",
            f"{r['chunks']['held']}/{r['chunks']['expected']}",
            "yes" if r["complete"] else "NO",
            ", ".join(r["missing"]) or "-",
        )
    console.print(rt)
    return 0 if all(r["complete"] for r in report["replicas"]) else 1


async def _drop(seeds: Sequence[str], query: str, tls_ca: str | None) -> dict[str, Any]:
    admin = Admin(seeds, tls_ca)
    try:
        seed, _ = await admin.view()
        resp = await admin.transport.request(
            "POST", seed, f"/v1/queries/{query}/drop", headers=admin.headers, timeout=120.0
        )
        answer: dict[str, Any] = resp.json()
        return answer
    finally:
        await admin.close()


def drop_query(seeds: Sequence[str], query: str, yes: bool, *, tls_ca: str | None = None) -> int:
    """``statestore drop``: remove every store of ``query`` from every node, after asking."""
    StoreId(query, 0, 0, "x")  # a bad query name fails here, named
    if not yes:
        if not sys.stdin.isatty():
            print(
                f"statestore drop: refusing to drop query {query} without confirmation: "
                "run it on a terminal, or pass --yes",
                file=sys.stderr,
            )
            return 2
        stores, _ = asyncio.run(_list(seeds, query, tls_ca))
        print(f"query {query} has {len(stores)} store(s) on the ring; dropping deletes them all")
        answer = input(f"type the query name ({query}) to drop it: ").strip()
        if answer != query:
            print("not dropped", file=sys.stderr)
            return 1
    result = asyncio.run(_drop(seeds, query, tls_ca))
    for row in result["nodes"]:
        if "error" in row:
            print(f"  {row['address']} ({row['status']}): {row['error']}")
        else:
            p = row["purged"]
            print(
                f"  {row['address']}: {p['manifests']} manifests, {p['chunks']} chunks, "
                f"{p['heads']} heads, {p['floors']} floors deleted"
            )
    if result["complete"]:
        print(f"dropped query {query} on every member (tombstone {result['id']})")
        return 0
    print(
        f"dropped query {query} where it could: the members above with an error still hold "
        "it; a member that was down purges when it comes back, otherwise run the drop again",
        file=sys.stderr,
    )
    return 1
