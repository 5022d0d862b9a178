"""Node addresses (pure): the one parser of ``HOST:PORT`` for the CLI, the SDK, the node and
the Spark helper.

A host is a name or an IPv4 address, or an IPv6 address in brackets (``[::1]:7400``); a port
is 1-65535 in ASCII digits (``0`` only where the caller binds, e.g. ``--listen``).

Addresses carry no scheme: seeds, ring views and gossip say ``HOST:PORT``. Whether a ring
speaks HTTPS is a property of the whole ring, known to whoever holds its CA (``--tls-ca``,
``tls_ca=``), and :func:`node_url` is the one place that turns an address into a URL.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from statestore.core.errors import InvalidAddress

__all__ = ["node_url", "parse_address", "parse_seeds"]

_ADDRESS = re.compile(r"^(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+):(?P<port>[0-9]{1,5})$")


def parse_address(text: str, *, what: str = "address", bind: bool = False) -> tuple[str, int]:
    """``(host, port)`` of ``text``; raises InvalidAddress naming ``what`` and the fix.

    ``bind=True`` accepts port 0 (let the system pick), for addresses we listen on.
    """
    m = _ADDRESS.fullmatch(text.strip()) if isinstance(text, str) else None
    port = int(m.group("port")) if m else -1
    if m is None or not (0 if bind else 1) <= port <= 65535:
        raise InvalidAddress(f"{what} {text!r} is not HOST:PORT, e.g. 127.0.0.1:7400")
    return m.group("host"), port


def parse_seeds(seeds: Iterable[str] | str) -> list[str]:
    """Seed addresses from a list and/or comma-separated strings, checked, in order.

    Raises InvalidAddress for a malformed seed or when none is given.
    """
    items = [seeds] if isinstance(seeds, str) else list(seeds)
    out = []
    for item in items:
        for part in str(item).split(","):
            if part.strip():
                host, port = parse_address(part, what="seed")
                out.append(f"{host}:{port}")
    if not out:
        raise InvalidAddress("give at least one seed HOST:PORT of a running node")
    return out


def node_url(address: str, path: str, *, tls: bool) -> str:
    """The URL of ``path`` (starting with ``/``) on the node at ``address`` (``HOST:PORT``):
    ``https`` on a ring that serves TLS, ``http`` otherwise."""
    return f"{'https' if tls else 'http'}://{address}{path}"
