"""A destination's egress settings (SPEC, "Egress"; docs/decisions/0034-egress.md): mutual
TLS and a private CA, a forward proxy, OAuth2 client credentials.

The checks here run when a destination is created or changed, shared by the API and the
CLI; each raises EgressError with a message that names its field, fit for a 422. What a
worker sends with is `EgressOptions` (engine/worker/http/transfer.py applies it).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from urllib.parse import urlsplit

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization

from engine.webhooks.targets import Allowance, TargetError, validate_url

MAX_CLIENT_SECRET_BYTES = 4096
PROXY_SCHEMES = ("http", "https")


class EgressError(ValueError):
    """An egress setting that fails validation; the message names the field."""


@dataclass(frozen=True)
class TlsFiles:
    """PEM text as stored (destinations.tls_*)."""

    client_cert: str | None
    client_key: str | None
    ca_bundle: str | None


def _certificates(field: str, pem: str) -> list[x509.Certificate]:
    try:
        certificates = x509.load_pem_x509_certificates(pem.encode())
    except ValueError as exc:
        raise EgressError(f"{field}: not a PEM certificate ({exc})") from None
    return certificates


def _public_key_der(key: object) -> bytes:
    return key.public_bytes(  # type: ignore[attr-defined]
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


def check_tls(client_cert: str | None, client_key: str | None,
              ca_bundle: str | None) -> TlsFiles:
    """Certificates that parse and a key that matches the certificate (the first of the
    chain): a mismatch fails every handshake, so it is refused here instead."""
    if (client_cert is None) != (client_key is None):
        raise EgressError("tls: client_cert and client_key go together")
    if client_cert is not None and client_key is not None:
        leaf = _certificates("tls.client_cert", client_cert)[0]
        try:
            key = serialization.load_pem_private_key(client_key.encode(), password=None)
        except TypeError:
            raise EgressError("tls.client_key: an encrypted key is not supported; "
                              "send it unencrypted (it is never returned)") from None
        except (ValueError, UnsupportedAlgorithm) as exc:
            raise EgressError(f"tls.client_key: not a PEM private key ({exc})") from None
        if _public_key_der(key.public_key()) != _public_key_der(leaf.public_key()):
            raise EgressError("tls.client_key: does not match tls.client_cert")
    if ca_bundle is not None:
        _certificates("tls.ca_bundle", ca_bundle)
    if client_cert is None and ca_bundle is None:
        raise EgressError("tls: give client_cert and client_key, ca_bundle, or both")
    return TlsFiles(client_cert, client_key, ca_bundle)


def fingerprints(pem: str) -> list[str]:
    """SHA-256 of each certificate's DER, hex, as `openssl x509 -fingerprint -sha256`
    shows it (without the colons): what reads show of stored certificates."""
    return [hashlib.sha256(cert.public_bytes(serialization.Encoding.DER)).hexdigest()
            for cert in x509.load_pem_x509_certificates(pem.encode())]


def check_proxy_scheme(field: str, url: str) -> str:
    """http:// or https:// with a host, and nothing after it but `/`."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (parses the port: ValueError when it is not one)
    except ValueError as exc:
        raise EgressError(f"{field}: malformed URL ({exc})") from None
    if parts.scheme.lower() not in PROXY_SCHEMES:
        raise EgressError(f"{field}: the scheme must be http or https, not "
                          f"{parts.scheme or 'none'!r}")
    if not parts.hostname:
        raise EgressError(f"{field}: no host")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise EgressError(f"{field}: a proxy URL has no path, query or fragment")
    return url


def check_proxy(url: str, allow_private: Allowance) -> str:
    """A destination's proxy: http(s), and an address the target policy allows, as for a
    destination's own URL: a tenant's proxy is a target like any other (only the operator's
    --egress-proxy is trusted whatever its address)."""
    check_proxy_scheme("proxy", url)
    try:
        normalised = validate_url(url, allow_private)
    except TargetError as exc:
        raise EgressError(f"proxy: {exc}".replace("url", "proxy URL")) from None
    return normalised.rstrip("/")


def check_token_url(url: str, allow_private: Allowance) -> str:
    try:
        return validate_url(url, allow_private)
    except TargetError as exc:
        raise EgressError(f"auth.token_url: {exc}".replace(" url ", " token_url ")) from None


def check_client_secret(secret: str) -> str:
    if len(secret.encode()) > MAX_CLIENT_SECRET_BYTES:
        raise EgressError(f"auth.client_secret: longer than {MAX_CLIENT_SECRET_BYTES} bytes")
    if not secret:
        raise EgressError("auth.client_secret: empty")
    return secret


@dataclass(frozen=True, eq=False)
class EgressOptions:
    """How a worker sends to one destination (one egress revision): the TLS blobs and
    the proxy, given to libcurl per request (engine/worker/http/transfer.py). Compared by
    identity: a worker makes one per destination and revision."""

    client_cert: bytes | None = None
    client_key: bytes | None = None
    ca_bundle: bytes | None = None
    proxy: str | None = None
    # The proxy is the operator's --egress-proxy (trusted whatever its address), not a
    # destination's own (checked against the target policy like its URL).
    proxy_trusted: bool = False

