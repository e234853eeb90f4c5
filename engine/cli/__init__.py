"""The `engine` command: the supervisor by default, plus operator subcommands."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import psycopg

from engine import __version__, demo
from engine.cli import deliveries, destinations, event_types, portal, tenants
from engine.cli.errors import CommandError, check_bind, database_error
from engine.cli.parent_link import exit_with_parent
from engine.cli.parsing import OneLineParser
from engine.config import ConfigError, Settings, load_settings
from engine.db.database import describe, open_database
from engine.db.embedded import EmbeddedError
from engine.db.migrate import SchemaTooNew, migrate, schema_version
from engine.observe import autovacuum_advice


def _add_common(parser: argparse.ArgumentParser, *, on_subcommand: bool = True) -> None:
    # On a subcommand, SUPPRESS keeps an unset flag from overwriting one given before it.
    default = argparse.SUPPRESS if on_subcommand else None
    parser.add_argument(
        "--dsn", default=default,
        help="PostgreSQL URL (else ENGINE_DSN, DATABASE_URL, else an embedded server)",
    )
    parser.add_argument(
        "--config", type=Path, default=default, help="TOML settings file; flags override it"
    )


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="engine", description="Webhook delivery engine on PostgreSQL."
    )
    parser.add_argument("--version", action="version", version=f"engine {__version__}")
    _add_common(parser, on_subcommand=False)
    parser.add_argument("--procs", type=int, help="delivery worker processes (default: CPUs)")
    parser.add_argument("--bind", help="ingress HOST:PORT (default 127.0.0.1:8080)")
    parser.add_argument("--ingress-procs", type=int, help="ingress processes (default 1)")
    parser.add_argument(
        "--worker-nice", type=int,
        help="niceness added to delivery workers so accepting events comes first (default 10,"
             " 0: off; env ENGINE_WORKER_NICE)",
    )
    parser.add_argument(
        "--allow-private-targets", action="store_true", default=None,
        help="allow loopback/private destination addresses (demo, bench, tests)",
    )
    parser.add_argument(
        "--allow-targets", metavar="CIDR[,CIDR...]",
        help="permit only these private ranges as destinations (e.g. 10.1.0.0/16); every"
             " other private, loopback or reserved target stays refused",
    )
    parser.add_argument(
        "--strict-event-types", action="store_true", default=None,
        help="refuse (422) an event whose type is not in the event-type catalog"
             " (env ENGINE_STRICT_EVENT_TYPES=1)",
    )
    parser.add_argument(
        "--worker-synchronous-commit", action="store_true", default=None,
        help="workers' commits wait for the WAL to reach the disk (default: they do not; a"
             " claim or result lost in a server crash is sent again; env"
             " ENGINE_WORKER_SYNCHRONOUS_COMMIT=1)",
    )
    parser.add_argument(
        "--egress-proxy", metavar="URL",
        help="send every delivery through this http:// or https:// forward proxy (a"
             " destination's own proxy wins; env ENGINE_EGRESS_PROXY)",
    )
    parser.add_argument(
        "--ca-bundle", metavar="FILE",
        help="PEM file of the CAs trusted for every destination instead of the system's"
             " (env ENGINE_CA_BUNDLE)",
    )
    parser.add_argument("--retry-schedule", help="comma-separated delays, e.g. 5s,5m,30m,2h")
    parser.add_argument(
        "--disable-after",
        help="disable a destination whose attempts have all failed this long (default 5d)",
    )
    parser.add_argument(
        "--retention-days", type=float,
        help="drop history (events, finished deliveries, attempts) older than this, by"
             " whole daily partitions (default 30; env ENGINE_RETENTION_DAYS)",
    )
    parser.add_argument(
        "--payload-retention-days", type=float,
        help="clear event payloads and response bodies older than this, keeping the rest"
             " (at most --retention-days; default: the same; env"
             " ENGINE_PAYLOAD_RETENTION_DAYS)",
    )
    parser.add_argument("--max-in-flight", type=int, help="concurrent requests per worker")
    parser.add_argument("--lease", help="claim lease, e.g. 60s (must exceed max timeout + 15s)")
    parser.add_argument("--max-timeout", help="longest per-destination request timeout, e.g. 30s")
    parser.add_argument("--drain-deadline", type=float, help="seconds to drain on SIGTERM")
    parser.add_argument(
        "--portal-frame-ancestors", metavar="ORIGIN[,ORIGIN...]",
        help="origins allowed to embed the customer portal in a frame (CSP frame-ancestors;"
             " default: none)",
    )
    sub = parser.add_subparsers(dest="command")
    _add_common(sub.add_parser("run", help="run the engine (the default)"))
    _add_common(sub.add_parser("migrate", help="apply database migrations and exit"))
    _add_common(sub.add_parser(
        "maintenance", help="run only the maintenance process (reaper, retention; one leader)"
    ))
    status = sub.add_parser("status", help="queue depth, destinations, tables, warnings")
    _add_common(status)
    status.add_argument("--json", action="store_true", help="one JSON document")
    status.add_argument("--top", type=int, default=10, help="destinations listed (default 10)")
    destinations.register(sub, _add_common)
    deliveries.register(sub, _add_common)
    tenants.register(sub, _add_common)
    portal.register(sub, _add_common)
    event_types.register(sub, _add_common)
    demo.register(sub)
    autovacuum_advice.add_parser(sub, _add_common)
    return parser


# Settings given as top-level flags: the Settings field, then the flag's attribute in args.
_SETTING_FLAGS = {
    "procs": "procs", "bind": "bind", "ingress_procs": "ingress_procs",
    "worker_nice": "worker_nice", "allow_private_targets": "allow_private_targets",
    "allow_targets": "allow_targets", "disable_after": "disable_after",
    "retry_schedule": "retry_schedule", "max_in_flight": "max_in_flight", "lease": "lease",
    "max_timeout": "max_timeout", "drain_deadline_s": "drain_deadline",
    "portal_frame_ancestors": "portal_frame_ancestors",
    "strict_event_types": "strict_event_types",
    "worker_synchronous_commit": "worker_synchronous_commit",
    "egress_proxy": "egress_proxy", "ca_bundle": "ca_bundle",
    "retention_days": "retention_days", "payload_retention_days": "payload_retention_days",
}


def settings_from_args(args: argparse.Namespace) -> Settings:
    # A subcommand's namespace lacks the top-level flags given after it: getattr's None.
    flags = {field: getattr(args, flag, None) for field, flag in _SETTING_FLAGS.items()}
    return load_settings(args.config, dsn=args.dsn, **flags)


def cmd_migrate(settings: Settings, args: argparse.Namespace) -> int:
    database = open_database(settings)
    try:
        print(f"database {describe(database.dsn)}")
        started = time.perf_counter()
        applied = migrate(
            database.dsn,
            progress=lambda name, seconds: print(f"applied {name} in {seconds:.2f} s"),
        )
        version, name = schema_version(database.dsn)
    finally:
        database.close()
    if applied:
        count = f"{len(applied)} migration{'s' if len(applied) > 1 else ''}"
        print(f"schema at version {version} ({name}): {count} applied in "
              f"{time.perf_counter() - started:.2f} s")
    else:
        print(f"schema at version {version} ({name}): up to date, nothing applied")
    return 0


def cmd_run(settings: Settings, args: argparse.Namespace) -> int:
    from engine.supervisor import run_supervisor

    # Before the database starts: a port in use is the commonest first mistake.
    check_bind(settings.bind)
    return run_supervisor(settings)


def cmd_maintenance(settings: Settings, args: argparse.Namespace) -> int:
    from engine.maintenance import run_maintenance

    database = open_database(settings)
    try:
        run_maintenance(settings, database.dsn)
    finally:
        database.close()
    return 0


def cmd_status(settings: Settings, args: argparse.Namespace) -> int:
    from engine.observe.status import collect_status, to_json, to_text

    database = open_database(settings, announce=False)
    try:
        with psycopg.connect(database.dsn, autocommit=True, connect_timeout=10) as conn:
            status = collect_status(conn, args.top)
    finally:
        database.close()
    print(to_json(status) if args.json else to_text(status))
    return 0


def cmd_operator(settings: Settings, args: argparse.Namespace) -> int:
    """The subcommands that go through the API's own handlers (engine/cli/): their
    parsers name the action in `operator_command`."""
    from engine.cli.local_api import api_session

    with api_session(settings) as api:
        return args.operator_command(api, args)


# Every subcommand, by name; no subcommand is `run`.
COMMANDS: dict[str, Callable[[Settings, argparse.Namespace], int]] = {
    "run": cmd_run,
    "migrate": cmd_migrate,
    "maintenance": cmd_maintenance,
    "status": cmd_status,
    "destinations": cmd_operator,
    "send": cmd_operator,
    "deliveries": cmd_operator,
    "replay": cmd_operator,
    "tenants": cmd_operator,
    "keys": cmd_operator,
    "portal": cmd_operator,
    "event-types": cmd_operator,
    "demo": demo.run_demo,
    "tune-autovacuum": autovacuum_advice.cmd_tune_autovacuum,
}


def main(argv: Sequence[str] | None = None) -> int:
    exit_with_parent()
    parser = build_parser()
    args = parser.parse_args(argv)
    settings: Settings | None = None
    try:
        settings = settings_from_args(args)
        return COMMANDS[args.command or "run"](settings, args)
    except (CommandError, ConfigError, EmbeddedError, SchemaTooNew, ValueError) as exc:
        print(f"engine: {exc}", file=sys.stderr)
        return 2
    except psycopg.OperationalError as exc:
        print(f"engine: {database_error(settings and settings.dsn, exc)}", file=sys.stderr)
        return 2

