"""TLS for a node's API and for every HTTP call to a node (docs/security.md, "TLS").

A node started with ``--tls-cert F --tls-key F`` serves HTTPS only. With ``--tls-ca F`` it
verifies every node it calls (replica writes and reads, repair pushes, gossip, relay hops)
against the certificates in F, host name included: a node's certificate must name the host it
advertises. Nodes ask for no client certificate: node identity is the HMAC of
``--cluster-secret-file`` and clients present bearer tokens, so a client needs only the CA.
Clients (the SDK, the CLI, the Spark helper) verify nodes against ``tls_ca=`` or the file
named by ``STATESTORE_TLS_CA``.

Loading a context reads files: a file that cannot be used is a ``ValueError`` naming it and the
fix (the node prints it and exits 2; the SDK raises it from the constructor). A handshake that
fails at run time is :class:`~statestore.core.errors.TlsFailed` (:func:`tls_failure`).
"""

from __future__ import annotations

import os
import ssl

from statestore.core.errors import TlsFailed

__all__ = ["TLS_CA_ENV", "client_context", "server_context", "tls_ca_file", "tls_failure"]

TLS_CA_ENV = "STATESTORE_TLS_CA"


def tls_ca_file(explicit: str | None = None) -> str | None:
    """The CA file a client verifies nodes against: ``explicit``, else the file named by
    ``$STATESTORE_TLS_CA``, else None (the ring speaks plain HTTP)."""
    return explicit or os.environ.get(TLS_CA_ENV) or None


def client_context(ca_file: str | None) -> ssl.SSLContext:
    """A context that verifies nodes against the PEM certificates in ``ca_file`` (the system's
    trusted CAs when None), host names included, TLS 1.2 or newer.

    Raises:
        ValueError: ``ca_file`` cannot be read or holds no certificate.
    """
    try:
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca_file)
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(
            f"cannot use TLS CA file {ca_file}: {exc}; give a PEM file of the CA that signed "
            "the nodes' certificates"
        ) from exc
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    return ctx


def server_context(cert_file: str, key_file: str) -> ssl.SSLContext:
    """A node's server context: ``cert_file`` (PEM, the chain up to the CA may follow) and its
    private key; no client certificate asked; TLS 1.2 or newer.

    Raises:
        ValueError: a file cannot be read, is not PEM, or the key does not match.
    """
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(cert_file, key_file)
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(
            f"cannot use TLS certificate {cert_file} with key {key_file}: {exc}; give the "
            "node's PEM certificate (--tls-cert) and its unencrypted private key (--tls-key)"
        ) from exc
    return ctx


def tls_failure(address: str, exc: BaseException) -> TlsFailed:
    """What a failed handshake with the node at ``address`` is raised as: certificate
    verification failures name the CA to give; other failures ask whether it serves TLS."""
    reason = getattr(exc, "reason", None) or getattr(exc, "strerror", None) or str(exc)
    if "CERTIFICATE_VERIFY_FAILED" in repr(exc) or "certificate verify failed" in str(exc):
        return TlsFailed(
            f"TLS verification of node {address} failed ({reason}): give the CA file that "
            f"signed the ring's certificates as tls_ca= or {TLS_CA_ENV} (nodes: --tls-ca); "
            "each node's certificate must name the host it advertises"
        )
    return TlsFailed(
        f"TLS handshake with node {address} failed ({reason}): does it serve TLS "
        f"(--tls-cert)? Leave tls_ca= and {TLS_CA_ENV} unset for a ring on plain HTTP"
    )
