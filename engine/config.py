"""Settings: defaults, then a TOML file (--config), then environment, then flags."""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from engine.webhooks.egress import check_proxy_scheme, fingerprints
from engine.webhooks.retry import DEFAULT_SCHEDULE, parse_duration, parse_schedule
from engine.webhooks.targets import Allowance, IPNetwork, parse_allowed_networks

# A lease must outlive the longest request plus this much: time to flush results and for
# clocks to disagree. A lease shorter than a request means a second worker may send the
# same delivery while the first is still waiting for an answer.
LEASE_MARGIN_MS = 15_000


class ConfigError(ValueError):
    """A configuration the engine refuses to start with."""


@dataclass(frozen=True)
class Settings:
    dsn: str | None = None
    procs: int = field(default_factory=lambda: os.cpu_count() or 1)
    bind: str = "127.0.0.1:8080"
    # One ingress process: one commit stream makes larger group commits, so less CPU per
    # event and a lower latency than two (docs/decisions/0024).
    ingress_procs: int = 1
    # Added to the niceness of delivery worker children (0: same as ingress); see
    # supervisor._run_worker for why.
    worker_nice: int = 10
    # Whether a worker's commits (claims, results) wait for the WAL to reach the disk: a
    # lost one is sent again (engine/db/database.worker_dsn, docs/decisions/0037).
    worker_synchronous_commit: bool = False
    allow_private_targets: bool = False
    # Private ranges permitted as targets (an internal deployment's own network); every
    # other refusal stays. --allow-private-targets permits them all instead.
    allow_targets: tuple[IPNetwork, ...] = ()
    retry_schedule: tuple[float, ...] = DEFAULT_SCHEDULE
    # Per-request timeout bounds; a destination's timeout_ms must lie within them.
    default_timeout_ms: int = 10_000
    max_timeout_ms: int = 30_000
    lease_ms: int = 60_000
    # Concurrent requests per worker process: enough slots to wait on slow destinations
    # (docs/decisions/0023). The worker raises its open-file limit to match (loop.py).
    max_in_flight: int = 1024
    first_attempt_share: float = 0.25  # of a worker's slots kept for first attempts
    breaker_threshold: int = 5
    breaker_base_pause_ms: int = 30_000
    breaker_max_pause_ms: int = 3_600_000
    drain_deadline_s: float = 30.0
    max_body_bytes: int = 256 * 1024
    # History older than this is dropped by whole daily partitions (SPEC, "History and
    # retention"; engine/maintenance/partitions.py).
    retention_days: float = 30.0
    # Event payloads and attempts' response bodies older than this are cleared, the rest of
    # the history kept (engine/maintenance/payload_retention.py); 0: as retention_days.
    payload_retention_days: float = 0.0
    # A destination whose attempts have all failed this long is disabled (SPEC: 5 days).
    disable_after_s: float = 5 * 86400.0
    data_dir: Path = Path(".engine")
    api_token: str | None = None
    # Origins allowed to embed the customer portal (CSP frame-ancestors); none by default.
    portal_frame_ancestors: tuple[str, ...] = ()
    # An event whose type is not in the event-type catalog is refused (422), not only one
    # whose payload fails its type's schema (engine/ingress/catalog.py).
    strict_event_types: bool = False
    # Egress (SPEC, "Egress"): every delivery through this forward proxy (a destination's
    # own `proxy` wins), and these CAs trusted instead of the system's for every destination.
    egress_proxy: str | None = None
    ca_bundle: Path | None = None

    def validate(self) -> Settings:
        if self.procs < 1:
            raise ConfigError("procs must be at least 1")
        if self.lease_ms <= self.max_timeout_ms + LEASE_MARGIN_MS:
            raise ConfigError(
                f"lease_ms ({self.lease_ms}) must exceed max_timeout_ms ({self.max_timeout_ms})"
                f" plus a {LEASE_MARGIN_MS} ms margin: a shorter lease delivers twice"
            )
        if not 0 < self.default_timeout_ms <= self.max_timeout_ms:
            raise ConfigError("default_timeout_ms must be positive and at most max_timeout_ms")
        if not 0 <= self.first_attempt_share < 1:
            raise ConfigError("first_attempt_share must be in [0, 1)")
        if self.retention_days <= 0:
            raise ConfigError("retention_days must be positive")
        if not 0 <= self.payload_retention_days <= self.retention_days:
            raise ConfigError("payload_retention_days must be from 0 (as retention_days) to"
                              f" retention_days ({self.retention_days:g})")
        if self.disable_after_s <= 0:
            raise ConfigError("disable_after must be a positive duration")
        if self.max_in_flight < 1:
            raise ConfigError("max_in_flight must be at least 1")
        if not 0 <= self.worker_nice <= 19:
            raise ConfigError("worker_nice must be from 0 to 19")
        if self.egress_proxy is not None:
            try:
                check_proxy_scheme("egress_proxy", self.egress_proxy)
            except ValueError as exc:
                raise ConfigError(str(exc)) from None
        if self.ca_bundle is not None:
            try:
                fingerprints(self.ca_bundle.read_text())
            except (OSError, ValueError) as exc:
                raise ConfigError(f"ca_bundle: {self.ca_bundle}: {exc}") from None
        host, _, port = self.bind.rpartition(":")
        if not host or not port.isdigit() or not 0 <= int(port) <= 65535:
            raise ConfigError(f"bind must be HOST:PORT, got {self.bind!r}")
        return self

    @property
    def target_allowance(self) -> Allowance:
        """What engine.webhooks.targets may reach besides public addresses."""
        return True if self.allow_private_targets else self.allow_targets

    @property
    def payload_days(self) -> float:
        """How long payloads and response bodies are kept."""
        return self.payload_retention_days or self.retention_days

    @property
    def max_attempts(self) -> int:
        return len(self.retry_schedule) + 1


_DURATION_MS_KEYS = {"default_timeout", "max_timeout", "lease"}
_DURATION_S_KEYS = {"disable_after"}
_DURATION_KEYS = _DURATION_MS_KEYS | _DURATION_S_KEYS


def _coerce(key: str, value: Any) -> tuple[str, Any]:
    """Accept friendly forms: `retry_schedule = "5s,5m"`, `lease = "60s"`."""
    if key == "retry_schedule":
        if isinstance(value, str):
            return key, parse_schedule(value)
        return key, tuple(parse_duration(v) if isinstance(v, str) else float(v) for v in value)
    if key in _DURATION_MS_KEYS:
        seconds = parse_duration(value) if isinstance(value, str) else float(value)
        return f"{key}_ms", int(seconds * 1000)
    if key in _DURATION_S_KEYS:
        return f"{key}_s", parse_duration(value) if isinstance(value, str) else float(value)
    if key == "allow_targets":
        text = value if isinstance(value, str) else ",".join(value)
        try:
            return key, parse_allowed_networks(text)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    if key == "portal_frame_ancestors":
        return key, parse_frame_ancestors(value if isinstance(value, str) else ",".join(value))
    if key in ("data_dir", "ca_bundle"):
        return key, Path(value)
    return key, value


# An origin a page may be framed by: a scheme and host (a `*.` subdomain wildcard and a
# port allowed), or 'self'. Nothing else reaches the header: no `;` or quote could end
# the directive and add another.
_FRAME_ANCESTOR = re.compile(
    r"'self'|https?://(\*\.)?[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)*(:[0-9]{1,5})?")


def parse_frame_ancestors(text: str) -> tuple[str, ...]:
    origins = tuple(part for part in re.split(r"[,\s]+", text.strip()) if part)
    for origin in origins:
        if not _FRAME_ANCESTOR.fullmatch(origin):
            raise ConfigError(
                f"portal_frame_ancestors: {origin!r} is not an origin like"
                " https://app.example.com, https://*.example.com or 'self'")
    return origins
_BOOLEAN_WORDS = {"1": True, "true": True, "yes": True, "0": False, "false": False,
                  "no": False}


ENV_PREFIX = "ENGINE_"


def environment_settings(environ: Mapping[str, str]) -> dict[str, Any]:
    """Every setting from `ENGINE_<NAME>` (the TOML file's names in capitals:
    ENGINE_PROCS=4, ENGINE_LEASE=90s, ENGINE_RETRY_SCHEDULE=5s,1m, ENGINE_API_TOKEN=…),
    and the DSN from DATABASE_URL when ENGINE_DSN is not set: a container is configured
    by its environment alone (SPEC, "Deployment and tracing")."""
    defaults = Settings()
    values: dict[str, Any] = {}
    names = {f.name for f in fields(Settings)} | _DURATION_MS_KEYS | _DURATION_S_KEYS
    for name in sorted(names):
        variable = ENV_PREFIX + name.upper()
        text = environ.get(variable)
        if not text:
            continue
        default = getattr(defaults, name, None)
        value: Any = text
        if isinstance(default, bool):
            if text.lower() not in _BOOLEAN_WORDS:
                raise ConfigError(f"{variable} must be one of {', '.join(_BOOLEAN_WORDS)},"
                                  f" got {text!r}")
            value = _BOOLEAN_WORDS[text.lower()]
        elif isinstance(default, int | float) and name not in _DURATION_KEYS:
            kind = type(default)
            try:
                value = kind(text)
            except ValueError:
                raise ConfigError(f"{variable} must be {_TYPE_NAMES[kind]}, got {text!r}"
                                  ) from None
        key, value = _coerce(name, value)
        values[key] = value
    if "dsn" not in values and environ.get("DATABASE_URL"):
        values["dsn"] = environ["DATABASE_URL"]
    return values


def load_settings(config_file: Path | None = None, **overrides: Any) -> Settings:
    """Build Settings from defaults, the TOML file, the environment and `overrides`
    (flags; None values are ignored so unset flags do not mask the file)."""
    values: dict[str, Any] = {}
    known = {f.name for f in fields(Settings)}
    if config_file is not None:
        try:
            data = tomllib.loads(config_file.read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"cannot read config file {config_file}: {exc}") from exc
        for raw_key, raw_value in data.items():
            key, value = _coerce(raw_key.replace("-", "_"), raw_value)
            if key not in known:
                raise ConfigError(f"unknown setting {raw_key!r} in {config_file}")
            values[key] = value
    # The environment overrides the file, as flags override both.
    values.update(environment_settings(os.environ))
    for key, value in overrides.items():
        if value is None:
            continue
        key, value = _coerce(key, value)
        if key not in known:
            raise ConfigError(f"unknown setting {key!r}")
        values[key] = value
    defaults = Settings()
    for key, value in values.items():
        _check_type(key, value, getattr(defaults, key), config_file)
    try:
        return replace(defaults, **values).validate()
    except TypeError as exc:
        raise ConfigError(str(exc)) from exc


_TYPE_NAMES = {bool: "true or false", int: "an integer", float: "a number", str: "a string",
               tuple: "a list", Path: "a path"}


def _check_type(key: str, value: Any, default: Any, config_file: Path | None) -> None:
    """A value of the wrong type (`procs = "many"`) is named here, not left to fail later
    as a comparison between a str and an int."""
    if default is None:
        return  # optional settings check their own values
    expected = type(default)
    fits = isinstance(value, expected) and (expected is bool or not isinstance(value, bool))
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        fits = True
    if not fits:
        where = f" in {config_file}" if config_file is not None else ""
        raise ConfigError(
            f"setting {key!r}{where} must be {_TYPE_NAMES.get(expected, expected.__name__)},"
            f" got {value!r}"
        )
