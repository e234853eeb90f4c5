"""The customer portal's side of ingress, a mixin of IngressApp (app.py): portal links
(POST /v1/tenants/{tenant}/portal, the admin's), the portal page (GET /portal/{tenant}),
and who a token is (GET /v1/session), which the console's code asks to know what to show.

The portal is the console's own page and scripts restricted to one tenant: the page is
console.html marked `data-mode="portal"`, and the token's tenant and scopes restrict every
request it makes, as a tenant key's do (app.py `_check_access`, `_tenant_of`).
docs/decisions/0031-portal-links.md.
"""

from __future__ import annotations

import datetime as dt
import html
import secrets
import time
from typing import Any
from urllib.parse import quote

from engine.config import Settings
from engine.db import queries
from engine.db.sql_params import PortalKeyParams
from engine.ingress import errors, portal_tokens
from engine.ingress import schemas as s
from engine.ingress.console.api import page_security_headers
from engine.ingress.http import Request, Response, json_response
from engine.ingress.keys import KeyRing
from engine.ingress.portal_tokens import PortalGrant

_HTML = [(b"content-type", b"text/html; charset=utf-8")]
_PORTAL_MARK = b'<html lang="en">'


def frame_ancestors(allowed: tuple[str, ...]) -> bytes:
    """The CSP frame-ancestors source list: 'none' unless --portal-frame-ancestors names
    the origins allowed to embed the portal."""
    return (" ".join(allowed) if allowed else "'none'").encode()


def refused_page(reason: str) -> bytes:
    """The 401 page of a portal link that names nobody: what is wrong, in words."""
    return (
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">"
        "<title>Portal link refused</title>"
        "<link rel=\"stylesheet\" href=\"/console/console.css\"></head><body>"
        "<main id=\"main\"><h1>This portal link cannot be used</h1>"
        f"<p class=\"notice error\" id=\"portal-refused\">{html.escape(reason)}.</p>"
        "<p class=\"muted\">Portal links are short-lived. Ask whoever sent it for a new one."
        "</p></main></body></html>"
    ).encode()


class PortalApi:
    """Needs `settings`, `keys`, `_connection()` and `_asset()` from the app."""

    settings: Settings
    keys: KeyRing

    def _connection(self) -> Any:
        raise NotImplementedError

    def _asset(self, name: str) -> Response:
        raise NotImplementedError

    async def create_portal_link(self, request: Request) -> Response:
        body: s.PortalLinkCreate = await request.decode(s.PortalLinkCreate)
        key = await self._portal_signing_key()
        expires_in = body.expires_in or portal_tokens.DEFAULT_EXPIRES_IN_S
        expires_at = int(time.time()) + expires_in
        tenant = request.tenant
        token = portal_tokens.sign(
            PortalGrant(key[0], tenant.id, expires_at, body.read_only), key[1])
        url = f"{_origin(request)}/portal/{quote(tenant.uid, safe='')}?token={token}"
        return json_response(201, s.PortalLink(
            url, dt.datetime.fromtimestamp(expires_at, dt.UTC), tenant.uid, body.read_only))

    async def _portal_signing_key(self) -> tuple[int, bytes]:
        """The live signing key, made by the first link ever asked for. Read fresh: a
        key rotated a moment ago through another process must not sign a new link (links
        are rare; the refresh is one small query when nothing moved)."""
        await self.keys.refresh()
        if self.keys.portal_key is None:
            async with self._connection() as conn:
                await queries.PORTAL_KEY_ENSURE.run(
                    conn, PortalKeyParams(secret=secrets.token_bytes(32)))
            await self.keys.refresh(since=time.monotonic())
        if self.keys.portal_key is None:  # pragma: no cover - the insert above made one
            raise errors.unavailable("the portal signing key could not be read")
        return self.keys.portal_key

    async def rotate_portal_key(self, request: Request) -> Response:
        """A new signing key; every link made before stops working on every ingress
        process within keys.REFRESH_S."""
        async with self._connection() as conn:
            row = await (await queries.PORTAL_KEY_ROTATE.run(
                conn, PortalKeyParams(secret=secrets.token_bytes(32)))).fetchone()
        await self.keys.refresh(since=time.monotonic())
        assert row is not None
        return json_response(200, s.PortalKeyRotated(row[0], row[1]))

    async def portal_page(self, request: Request) -> Response:
        """The console's page in portal mode for a valid link, else a 401 page saying
        which of expired, changed or another tenant's it is."""
        token = request.query({"token"}).get("token")
        headers = page_security_headers(frame_ancestors(self.settings.portal_frame_ancestors))
        reason = "the portal link has no token"
        if token is not None:
            try:
                caller = await self.keys.portal_caller(token)
            except errors.ApiError as refused:
                reason = refused.message
            else:
                assert caller.tenant is not None
                if request.tenant_ref not in (caller.tenant.uid, str(caller.tenant.id)):
                    reason = portal_tokens.OTHER_TENANT
                else:
                    page = self._asset("console.html").body.replace(
                        _PORTAL_MARK, b'<html lang="en" data-mode="portal">', 1)
                    return Response(200, page, [*_HTML, *headers])
        return Response(401, refused_page(reason), [*_HTML, *headers])

    async def read_session(self, request: Request) -> Response:
        caller = request.caller
        assert caller is not None
        grant = caller.portal
        kind = "admin" if caller.admin else "portal" if grant else "key"
        return json_response(200, s.Session(
            kind, request.tenant.uid, sorted(caller.scopes),
            grant.read_only if grant else False,
            dt.datetime.fromtimestamp(grant.expires_at, dt.UTC) if grant else None))


def _origin(request: Request) -> str:
    """scheme://host of this request, for the link: the Host header as the client sent
    it (behind a proxy, the proxy's own when it passes Host on)."""
    host = request.header(b"host")
    server = request.scope.get("server") or ("localhost", 8080)
    where = host.decode("latin-1") if host else f"{server[0]}:{server[1]}"
    return f"{request.scope.get('scheme', 'http')}://{where}"
