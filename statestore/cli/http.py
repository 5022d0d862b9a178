"""The one HTTP helper of the operator commands: a blocking JSON request to one node.

``ring``, ``decommission``, ``rebalance`` and ``removenode`` ask one node at a time and wait
(urllib: no event loop, no aiohttp on a client-only install); ``stores``, ``inspect``,
``drop`` and ``backup`` fan out and use the transport seam (net/http.py) instead.
:func:`request_json` maps failures onto the error tree as the seam does, with the seam's own
mapping: an error answer ``{"error": {"code", "message"}}`` becomes the class the node raised
(net/transport.error_from_answer), a TLS handshake that fails is TlsFailed
(net/tls.tls_failure), no answer is NodeUnavailable, a deadline RequestTimeout, an answer
that is not JSON MalformedData, and a CA or token file that cannot be used SetupError.

:func:`open_node` is the same request without the mapping (urllib's own errors: an
``HTTPError`` carries the status): the local-ring harness and its tests read statuses
(cli/local.py's ``http_json``).

A bearer token comes from ``token=``, else ``STATESTORE_TOKEN``, else the file named by
``STATESTORE_TOKEN_FILE``; nodes are verified against ``tls_ca=``, else
``STATESTORE_TLS_CA`` (none: plain HTTP).
"""

from __future__ import annotations

import http.client
import json
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import Any

from statestore.core.address import node_url
from statestore.core.errors import (
    MalformedData,
    NodeUnavailable,
    RequestTimeout,
    SetupError,
    StateStoreError,
)
from statestore.core.view import RingView
from statestore.net.credentials import client_token
from statestore.net.tls import TLS_CA_ENV, client_context, tls_ca_file, tls_failure
from statestore.net.transport import error_from_answer

__all__ = ["MAX_ANSWER", "first_view", "open_node", "request_json", "token_headers"]

# the largest answer a command reads from a node (a ring view of 4,096 members, a removal's
# progress: well under it), and of an error answer
MAX_ANSWER = 64 << 20
MAX_ERROR = 1 << 20


def token_headers(token: str | None = None) -> dict[str, str]:
    """``Authorization`` from ``token``, ``STATESTORE_TOKEN`` or ``STATESTORE_TOKEN_FILE``
    (or none). Raises SetupError when the token file cannot be read."""
    token = client_token(token)  # the SDK's rule too (net/credentials.py)
    return {"Authorization": f"Bearer {token}"} if token else {}


def _prepare(
    address: str, path: str, body: object, tls_ca: str | None, token: str | None
) -> tuple[urllib.request.Request, ssl.SSLContext | None]:
    """The request and its TLS context; raises SetupError for a CA or token file it cannot
    use."""
    ca = tls_ca_file(tls_ca)
    try:
        context = client_context(ca) if ca else None
    except ValueError as exc:  # names the file and what to give instead
        raise SetupError(str(exc)) from exc
    headers = token_headers(token)
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    req = urllib.request.Request(
        node_url(address, path, tls=ca is not None),
        data=data,
        method="GET" if body is None else "POST",
        headers=headers,
    )
    return req, context


def open_node(
    address: str,
    path: str,
    body: object = None,
    *,
    timeout: float = 5.0,
    tls_ca: str | None = None,
    token: str | None = None,
) -> bytes:
    """GET ``path`` (or POST ``body`` as JSON) on the node at ``address``; the answer's body.

    Raises urllib's errors (``HTTPError`` for an error answer, another OSError when no
    answer came, TimeoutError when the whole answer took longer than ``timeout``: urllib's
    own timeout bounds each read, and a node sending a byte a second never hits it),
    MalformedData for an answer past :data:`MAX_ANSWER` bytes and SetupError for a CA or
    token file it cannot use.
    """
    req, context = _prepare(address, path, body, tls_ca, token)
    deadline = time.monotonic() + timeout
    with urllib.request.urlopen(req, timeout=timeout, context=context) as resp:
        parts, size = [], 0
        while chunk := resp.read1(1 << 16):
            size += len(chunk)
            if size > MAX_ANSWER:
                raise MalformedData(
                    f"node {address} answered {path} with more than {MAX_ANSWER} bytes: is "
                    "that address a statestore node?"
                )
            if time.monotonic() > deadline:
                raise TimeoutError(f"the answer took longer than {timeout:.1f}s")
            parts.append(chunk)
        return b"".join(parts)


def request_json(
    address: str,
    path: str,
    body: object = None,
    *,
    timeout: float = 5.0,
    tls_ca: str | None = None,
    token: str | None = None,
) -> Any:
    """GET ``path`` (or POST ``body`` as JSON) on the node at ``address``; the decoded answer.

    Raises from the error tree (module docstring): the class the node answered with,
    NodeUnavailable (TlsFailed) or RequestTimeout when no answer came, MalformedData for
    an answer that is not JSON, SetupError for a CA or token file it cannot use.
    """
    try:
        data = open_node(address, path, body, timeout=timeout, tls_ca=tls_ca, token=token)
    except urllib.error.HTTPError as exc:
        raise error_from_answer(exc.code, exc.read(MAX_ERROR), address) from exc
    except (OSError, http.client.HTTPException) as exc:
        raise _unanswered(address, path, timeout, tls_ca, exc) from exc
    try:
        return json.loads(data)
    except ValueError as exc:
        raise MalformedData(
            f"node {address} answered {path} with something that is not JSON ({exc}): is "
            "that address a statestore node?"
        ) from exc


def _unanswered(
    address: str, path: str, timeout: float, tls_ca: str | None, exc: BaseException
) -> NodeUnavailable | RequestTimeout:
    """The error tree's name for a request to ``address`` that got no answer."""
    reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
    if isinstance(reason, TimeoutError):
        return RequestTimeout(
            f"node {address} did not answer {path} within {timeout:.1f}s: it is slow or stuck"
        )
    if isinstance(reason, ssl.SSLError):
        return tls_failure(address, reason)
    hint = "check that it runs and that the address is right"
    if tls_ca_file(tls_ca) is None and isinstance(reason, ConnectionResetError):
        # what a node serving HTTPS does to a plain HTTP request: it hangs up
        hint = f"if the ring serves TLS, give its CA file as --tls-ca or {TLS_CA_ENV}; " + hint
    return NodeUnavailable(f"node {address} is unreachable ({reason}); {hint}")


def first_view(
    seeds: Sequence[str], tls_ca: str | None = None, timeout: float = 3.0
) -> tuple[str, dict[str, Any]]:
    """The first seed that answers ``GET /v1/ring`` and its view. Raises NodeUnavailable
    naming what each seed answered when none gave a view."""
    errors = []
    for seed in seeds:
        try:
            view = request_json(seed, "/v1/ring", timeout=timeout, tls_ca=tls_ca)
        except StateStoreError as exc:
            errors.append(f"{seed}: {exc}")
            continue
        try:
            RingView.from_json(view)  # the shape every command reads it by
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            errors.append(f"{seed}: answered something that is not a ring view ({exc!r:.80})")
            continue
        return seed, view
    raise NodeUnavailable("no seed answered (" + "; ".join(errors) + "); check --seeds")
