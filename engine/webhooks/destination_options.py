"""Validation of a destination's per-destination delivery options (headers, retry_schedule,
rate_limit), shared by the API and the CLI so both refuse exactly the same input.

Each check raises OptionError with a message that starts with the field it is about, fit
for a 422 or a CLI error line.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence

from engine.webhooks.retry import parse_duration

MAX_HEADERS = 20
MAX_HEADER_VALUE_BYTES = 1024
MAX_RETRY_DELAYS = 50
MAX_RATE_LIMIT = 1_000_000.0
# RFC 9110 token characters.
HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,256}$")
# Names the engine sets itself (the signature and body framing), hop-by-hop headers that
# libcurl or the connection own, and `expect`, which changes how curl sends the body.
REFUSED_HEADERS = frozenset({
    "content-type", "content-length", "host", "user-agent", "connection",
    "transfer-encoding", "keep-alive", "proxy-connection", "te", "trailer", "upgrade",
    "expect",
})
REFUSED_PREFIX = "webhook-"
# Visible ASCII, spaces and tabs: no CR, LF, NUL or other controls, and no non-ASCII
# (obsolete in header values, RFC 9110 5.5, and libcurl takes header lines as ASCII).
_HEADER_VALUE = re.compile(r"^[\t\x20-\x7e]*$")
_UNIT_SECONDS = (("d", 86400.0), ("h", 3600.0), ("m", 60.0), ("s", 1.0))


class OptionError(ValueError):
    """A destination option that fails validation; the message names the field."""


def check_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The headers to send on every request, or OptionError naming the bad one."""
    if len(headers) > MAX_HEADERS:
        raise OptionError(f"headers: at most {MAX_HEADERS} headers")
    seen: set[str] = set()
    for name, value in headers.items():
        field = f"headers[{name!r}]"
        if not isinstance(name, str) or not HEADER_NAME.match(name):
            raise OptionError(f"{field}: a header name is an HTTP token (letters, digits,"
                              " and !#$%&'*+.^_`|~-)")
        lowered = name.lower()
        if lowered.startswith(REFUSED_PREFIX) or lowered in REFUSED_HEADERS:
            raise OptionError(f"{field}: the engine sets this header itself")
        if lowered in seen:
            raise OptionError(f"{field}: given twice (header names ignore case)")
        seen.add(lowered)
        if not isinstance(value, str):
            raise OptionError(f"{field}: the value must be a string")
        if "\r" in value or "\n" in value:
            raise OptionError(f"{field}: the value must not contain CR or LF")
        if not _HEADER_VALUE.match(value):
            raise OptionError(f"{field}: the value must be printable ASCII (no control"
                              " characters)")
        if len(value.encode()) > MAX_HEADER_VALUE_BYTES:
            raise OptionError(f"{field}: the value is over {MAX_HEADER_VALUE_BYTES} bytes")
    return dict(headers)


def check_retry_schedule(delays: Sequence[str]) -> list[float]:
    """Durations like ["10s", "1m"] -> seconds, with the global --retry-schedule's rules."""
    if not delays:
        raise OptionError("retry_schedule: at least one delay")
    if len(delays) > MAX_RETRY_DELAYS:
        raise OptionError(f"retry_schedule: at most {MAX_RETRY_DELAYS} delays")
    seconds: list[float] = []
    for index, text in enumerate(delays):
        try:
            delay = parse_duration(text)
        except ValueError as exc:
            raise OptionError(f"retry_schedule[{index}]: {exc}") from None
        if delay <= 0:
            raise OptionError(f"retry_schedule[{index}]: a delay must be positive")
        if seconds and delay < seconds[-1]:
            raise OptionError(f"retry_schedule[{index}]: delays must not decrease")
        seconds.append(delay)
    return seconds


def check_rate_limit(rate: float) -> float:
    """Requests per second: a finite number above 0."""
    if not math.isfinite(rate) or not 0 < rate <= MAX_RATE_LIMIT:
        raise OptionError(f"rate_limit: requests per second, above 0 and at most"
                          f" {MAX_RATE_LIMIT:g}")
    return float(rate)


def format_duration(seconds: float) -> str:
    """Seconds -> the largest unit that says it exactly: 60.0 -> '1m', 0.25 -> '250ms'."""
    for unit, size in _UNIT_SECONDS:
        count = seconds / size
        if count >= 1 and count == int(count):
            return f"{int(count)}{unit}"
    return f"{seconds * 1000:.3f}".rstrip("0").rstrip(".") + "ms"
