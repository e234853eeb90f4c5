"""Standard Webhooks signing: secrets, the `webhook-signature` header, request headers."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets as _random
from collections.abc import Mapping, Sequence
from functools import lru_cache

from engine import __version__

SECRET_PREFIX = "whsec_"
SECRET_BYTES = 32
USER_AGENT = f"engine/{__version__}"


def generate_secret() -> str:
    """A fresh destination secret: `whsec_` + base64 of 32 random bytes."""
    return SECRET_PREFIX + base64.b64encode(_random.token_bytes(SECRET_BYTES)).decode("ascii")


# Cached: a worker signs thousands of requests per second with a handful of secrets.
@lru_cache(maxsize=4096)
def secret_key(secret: str) -> bytes:
    """The HMAC key inside a `whsec_<base64>` secret; ValueError if malformed."""
    if not secret.startswith(SECRET_PREFIX):
        raise ValueError(f"webhook secret must start with {SECRET_PREFIX!r}")
    encoded = secret[len(SECRET_PREFIX) :]
    try:
        key = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ValueError(f"webhook secret is not valid base64 after {SECRET_PREFIX!r}") from exc
    if not key:
        raise ValueError("webhook secret key is empty")
    return key


@lru_cache(maxsize=4096)
def _hmac_sha256_pads(secret: str) -> tuple[hashlib._Hash, hashlib._Hash]:
    """SHA-256 states after the HMAC key's inner and outer pad blocks (RFC 2104). Copying
    them per message costs half of OpenSSL's one-shot HMAC, which hashes both pads again
    each time (docs/decisions/0006-cached-hmac-pads.md)."""
    key = secret_key(secret)
    if len(key) > 64:  # the SHA-256 block size
        key = hashlib.sha256(key).digest()
    key = key.ljust(64, b"\0")
    return hashlib.sha256(key.translate(hmac.trans_36)), hashlib.sha256(
        key.translate(hmac.trans_5C))


def _hmac_sha256(secret: str, message: bytes) -> bytes:
    inner_pad, outer_pad = _hmac_sha256_pads(secret)
    inner = inner_pad.copy()
    inner.update(message)
    outer = outer_pad.copy()
    outer.update(inner.digest())
    return outer.digest()


def sign(secrets: Sequence[str], msg_id: str, timestamp: int, body: bytes) -> str:
    """The `webhook-signature` value: one `v1,<sig>` per secret, space separated."""
    if not secrets:
        raise ValueError("at least one secret is needed to sign")
    signed = f"{msg_id}.{timestamp}.".encode() + body
    return " ".join(
        "v1," + binascii.b2a_base64(_hmac_sha256(s, signed), newline=False).decode()
        for s in secrets
    )


def build_headers(
    secrets: Sequence[str], msg_id: str, timestamp: int, body: bytes,
    extra: Mapping[str, str] | None = None,
) -> list[str]:
    """curl-style header lines for one delivery attempt; `extra` are the destination's
    static headers, whose names never collide with these (engine/webhooks/destination_options.py
    refuses them), so they cannot replace the signature."""
    lines = [
        f"webhook-id: {msg_id}",
        f"webhook-timestamp: {timestamp}",
        f"webhook-signature: {sign(secrets, msg_id, timestamp, body)}",
        "content-type: application/json",
        f"user-agent: {USER_AGENT}",
        # An empty Expect stops curl waiting for `100 Continue` on bodies over 1 KiB.
        "Expect:",
    ]
    if extra:
        lines.extend(f"{name}: {value}" for name, value in extra.items())
    return lines
