"""OAuth2 client credentials (RFC 6749 4.4) for a destination's `auth`: the token request
and what its answer means, and when a token stops being used. Pure: the worker's I/O is
engine/worker/egress.py.
"""

from __future__ import annotations

import base64
import json
from urllib.parse import quote, urlencode

# A token whose answer names no lifetime (expires_in is only RECOMMENDED) is used this long.
DEFAULT_LIFETIME_S = 300.0
MAX_REFRESH_MARGIN_S = 60.0
MAX_TOKEN_BYTES = 64 * 1024


class TokenError(Exception):
    """The token endpoint failed or answered something that is not a token."""


def refresh_after_s(lifetime_s: float) -> float:
    """How long a token is used: until a tenth of its lifetime, and at most 60 s, is left
    (a token that lives 2 s is used for 1.8 s)."""
    return lifetime_s - min(lifetime_s / 10, MAX_REFRESH_MARGIN_S)


def token_request(client_id: str, client_secret: str, scope: str | None
                  ) -> tuple[list[str], bytes]:
    """Headers and form body of the token request; the client authenticates with HTTP
    Basic, its id and secret form-encoded first (RFC 6749 2.3.1)."""
    basic = base64.b64encode(
        f"{quote(client_id, safe='')}:{quote(client_secret, safe='')}".encode()).decode()
    form = {"grant_type": "client_credentials"} | ({"scope": scope} if scope else {})
    headers = ["content-type: application/x-www-form-urlencoded",
               "accept: application/json", f"authorization: Basic {basic}", "Expect:"]
    return headers, urlencode(form).encode()


def parse_token(status: int | None, body: bytes) -> tuple[str, float]:
    """(access token, lifetime in seconds) from the endpoint's answer, or TokenError."""
    if status != 200:
        raise TokenError(f"token endpoint answered {status}")
    try:
        answer = json.loads(body)
    except ValueError:
        raise TokenError("token endpoint answered something that is not JSON") from None
    token = answer.get("access_token") if isinstance(answer, dict) else None
    if not isinstance(token, str) or not token or any(ch < " " for ch in token):
        raise TokenError("token endpoint answered no usable access_token")
    token_type = answer.get("token_type", "bearer")
    if not isinstance(token_type, str) or token_type.lower() != "bearer":
        raise TokenError("token endpoint answered a token that is not a bearer token")
    expires_in = answer.get("expires_in", DEFAULT_LIFETIME_S)
    if isinstance(expires_in, str) and expires_in.isdigit():
        expires_in = float(expires_in)
    if not isinstance(expires_in, int | float) or expires_in <= 0:
        raise TokenError("token endpoint answered no usable expires_in")
    return token, float(expires_in)
