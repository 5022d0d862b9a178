"""The bearer token a client sends (the SDK and the CLI alike): the one given, else
``$STATESTORE_TOKEN``, else the content of the file named by ``$STATESTORE_TOKEN_FILE``."""

from __future__ import annotations

import os

from statestore.core.errors import SetupError

__all__ = ["TOKEN_ENV", "TOKEN_FILE_ENV", "client_token"]

TOKEN_ENV = "STATESTORE_TOKEN"
TOKEN_FILE_ENV = "STATESTORE_TOKEN_FILE"


def client_token(explicit: str | None = None) -> str | None:
    """``explicit``, ``$STATESTORE_TOKEN`` or ``$STATESTORE_TOKEN_FILE``'s content, stripped
    (None: no token). Raises SetupError when the token file cannot be read."""
    token = (explicit or os.environ.get(TOKEN_ENV, "")).strip()
    path = os.environ.get(TOKEN_FILE_ENV, "")
    if not token and path:
        try:
            with open(path) as f:
                token = f.read().strip()
        except OSError as exc:
            raise SetupError(
                f"cannot read the token file {TOKEN_FILE_ENV}={path} ({exc}): give a "
                "readable file holding the ring's client token"
            ) from exc
    return token or None
