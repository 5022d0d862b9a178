"""A throwaway certificate authority for the TLS tests (``cryptography``): a CA, node
certificates naming loopback, and a second CA that signed none of them; and the flags of a
secured ring (TLS, client tokens, node identity)."""

from __future__ import annotations

import datetime
import ipaddress
import json
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["ADMIN", "TOKENS", "WRITER", "TlsFiles", "make_tls", "secured_args"]

ADMIN = "tls-admin-token-000000001"
WRITER = "tls-writer-token-00000001"
TOKENS = {
    ADMIN: {"queries": ["*"], "rights": ["read", "write", "admin"]},
    WRITER: {"queries": ["tls-*"], "rights": ["read", "write"]},
}


@dataclass(frozen=True)
class TlsFiles:
    ca: Path  # the ring's CA (PEM)
    cert: Path  # a node certificate for 127.0.0.1 and localhost, signed by ca
    key: Path  # its private key (PEM, unencrypted)
    other_ca: Path  # a CA that signed nothing here

    def node_args(self) -> list[str]:
        return ["--tls-cert", str(self.cert), "--tls-key", str(self.key), "--tls-ca", str(self.ca)]


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _ca(common: str) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(common))
        .issuer_name(_name(common))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def make_tls(directory: Path, san: bool = True) -> TlsFiles:
    """Write a CA, a node certificate and key for loopback, and an unrelated CA. ``san``
    False: the node certificate names 127.0.0.1 only as its common name (no subject
    alternative names), which a client checking host names as RFC 6125 says refuses."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key, ca_cert = _ca("statestore test CA")
    _, other = _ca("someone else's CA")
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name("statestore node" if san else "127.0.0.1"))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
    )
    if san:
        builder = builder.add_extension(
            x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
            ),
            critical=False,
        )
    cert = (
        builder.add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    files = TlsFiles(
        ca=directory / "ca.pem",
        cert=directory / "node.pem",
        key=directory / "node.key",
        other_ca=directory / "other-ca.pem",
    )
    files.ca.write_bytes(_pem(ca_cert))
    files.other_ca.write_bytes(_pem(other))
    files.cert.write_bytes(_pem(cert))
    files.key.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    files.key.chmod(0o600)
    return files


def secured_args(
    tmp_path: Path, tls: TlsFiles, tokens: dict[str, dict[str, list[str]]] = TOKENS
) -> list[str]:
    """Every security flag of ``statestore node``: TLS, client tokens, node identity."""
    secret = tmp_path / "cluster.secret"
    secret.write_bytes(os.urandom(32).hex().encode())
    auth = tmp_path / "tokens.json"
    auth.write_text(json.dumps(tokens))
    return [
        *tls.node_args(),
        "--auth-file",
        str(auth),
        "--cluster-secret-file",
        str(secret),
    ]
