"""Portal tokens: what a portal link carries (SPEC, "Customer portal and event-type
catalog"; docs/decisions/0031-portal-links.md).

    ept_<key id>.<tenant id>.<expires, unix s>.<rw|ro>.<signature>

The signature is HMAC-SHA256, keyed with the engine's live portal signing key
(schema/021_portal.sql), over everything before it, in unpadded base64url. The token
names its tenant, its expiry and whether it may change anything; nothing else of it is
trusted until the signature matches. Pure: the time and the key come in as arguments.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
from dataclasses import dataclass

PORTAL_PREFIX = "ept_"
DEFAULT_EXPIRES_IN_S = 3600
MAX_EXPIRES_IN_S = 7 * 86400
_SHAPE = re.compile(
    r"ept_(?P<key>[0-9]{1,18})\.(?P<tenant>[0-9]{1,18})\.(?P<expires>[0-9]{1,12})"
    r"\.(?P<mode>rw|ro)\.(?P<signature>[A-Za-z0-9_-]{43})")


@dataclass(frozen=True)
class PortalGrant:
    """What a valid token allows: one tenant, until `expires_at` (unix s), reading only
    or also changing its destinations and replaying its deliveries."""

    key_id: int
    tenant_id: int
    expires_at: int
    read_only: bool


class PortalTokenRefused(Exception):
    """A token that names nobody. `reason` is shown to whoever holds the link: the token
    is theirs, and which of these it is tells them what to ask for."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


EXPIRED = "the portal link has expired: ask for a new one"
TAMPERED = ("the portal link is not valid: it was changed, or the engine's portal key was"
            " rotated since it was made")
OTHER_TENANT = "the portal link is for another tenant"


def _signature(secret: bytes, signed: str) -> str:
    digest = hmac.new(secret, signed.encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def sign(grant: PortalGrant, secret: bytes) -> str:
    signed = (f"{PORTAL_PREFIX}{grant.key_id}.{grant.tenant_id}.{grant.expires_at}"
              f".{'ro' if grant.read_only else 'rw'}")
    return f"{signed}.{_signature(secret, signed)}"


def key_id_of(token: str) -> int | None:
    """The signing key a token names (not yet trusted), or None if it is not one."""
    shape = _SHAPE.fullmatch(token)
    return int(shape["key"]) if shape else None


def verify(token: str, key_id: int | None, secret: bytes | None, now: float) -> PortalGrant:
    """The grant of a token signed with the live key (`key_id`, `secret`; None before the
    first link) and not expired at `now` (unix s); else PortalTokenRefused saying why.
    The signature is checked before the expiry, so a changed expiry reads as changed."""
    shape = _SHAPE.fullmatch(token)
    if shape is None or secret is None or int(shape["key"]) != key_id:
        raise PortalTokenRefused(TAMPERED)
    signed, _, signature = token.rpartition(".")
    if not hmac.compare_digest(signature, _signature(secret, signed)):
        raise PortalTokenRefused(TAMPERED)
    grant = PortalGrant(int(shape["key"]), int(shape["tenant"]), int(shape["expires"]),
                        shape["mode"] == "ro")
    if now >= grant.expires_at:
        raise PortalTokenRefused(EXPIRED)
    return grant
