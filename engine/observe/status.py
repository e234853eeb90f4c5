"""`engine status [--json]`: what the queue and its tables look like now, and warnings
when something needs an operator (autovacuum behind, the reaper busy, a destination down
for hours, signs that the deployment has outgrown one database)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import msgspec
import psycopg
from psycopg.rows import dict_row

from engine.db import queries
from engine.db.queries import Statement
from engine.db.sql_params import StatusDestinationsParams, TenantTopParams

TOP_DESTINATIONS = 10
TOP_TENANTS = 10
# Warning thresholds.
EXPIRED_IN_FLIGHT_WARN = 100  # expired claims still in flight: the reaper is not keeping up
OPEN_FOR_HOURS_S = 3600.0
AUTOVACUUM_BEHIND_FACTOR = 2.0  # dead tuples this many times the trigger point
AUTOVACUUM_STALE_S = 3600.0  # no vacuum for this long while over the trigger point
AUTOVACUUM_BACK_TO_BACK_S = 300.0  # vacuumed this recently and still far behind
CLAIM_SHARE_WARN = 0.5  # of all statement time in pg_stat_statements
FANOUT_GROWTH_WARN = 1.5  # deliveries per event, last hour vs the day before


def _rows(conn: psycopg.Connection, statement: Statement, params: tuple | None = None
          ) -> list[dict]:
    return statement.run_sync(conn, params, row_factory=dict_row).fetchall()


def _has_pg_stat_statements(conn: psycopg.Connection) -> bool:
    row = queries.PG_STAT_STATEMENTS_INSTALLED.run_sync(conn).fetchone()
    return row is not None


def collect_status(conn: psycopg.Connection, top: int = TOP_DESTINATIONS) -> dict[str, Any]:
    """Everything `engine status` shows, read in one repeatable-read snapshot."""
    with conn.transaction():
        queries.SNAPSHOT_READ_ONLY.run_sync(conn)
        queue = {**_rows(conn, queries.STATUS_QUEUE)[0], **_rows(conn, queries.STATUS_FANOUT)[0]}
        breakers = _rows(conn, queries.STATUS_BREAKERS)[0]
        destinations = _rows(conn, queries.STATUS_DESTINATIONS, StatusDestinationsParams(top_n=top))
        tenants = _rows(conn, queries.STATUS_TENANTS, TenantTopParams(top_n=TOP_TENANTS))
        tables = _rows(conn, queries.STATUS_TABLES)
        indexes = _rows(conn, queries.STATUS_INDEXES)
        server_settings = _rows(conn, queries.STATUS_SETTINGS)[0]
        statements = None
        if _has_pg_stat_statements(conn):
            try:
                with conn.transaction():
                    statements = _rows(conn, queries.STATUS_STATEMENTS)[0]
            except psycopg.Error:  # installed but not preloaded
                statements = None
        now = queries.DATABASE_NOW.run_sync(conn).fetchone()
    status: dict[str, Any] = {
        "at": now[0] if now else None,
        "queue": queue,
        "breakers": breakers,
        "destinations": destinations,
        "tenants": tenants,
        "tables": tables,
        "indexes": indexes,
        "pg_stat_statements": statements,
        "settings": server_settings,
    }
    status["warnings"] = warnings(status)
    return status


def setting_warnings(settings: dict[str, Any]) -> list[str]:
    """Server settings that cost a queue its speed or its durability."""
    found = []
    if settings["jit_compiles"]:
        found.append(
            "JIT is on in the engine's sessions although the engine asks for jit=off when it"
            " connects (a pooler that drops startup options?): every claim and result write"
            " may be compiled again, several times the database CPU per delivery; run"
            " ALTER ROLE <engine role> SET jit = off"
        )
    if settings["synchronous_commit"] == "off":
        found.append(
            "synchronous_commit is off: events ingress acknowledged (202) and results it"
            " recorded can be lost in a server crash"
        )
    if not settings["fsync"] or not settings["full_page_writes"]:
        found.append(
            "fsync or full_page_writes is off: a server crash can corrupt the database,"
            " queue included"
        )
    if not settings["autovacuum"] or not settings["track_counts"]:
        found.append(
            "autovacuum (or track_counts, which it needs) is off: the deliveries table and"
            " its claim index bloat with every claim and result until claims slow down"
        )
    return found


def warnings(status: dict[str, Any]) -> list[str]:
    found = setting_warnings(status["settings"])
    queue = status["queue"]
    if queue["expired_in_flight"] >= EXPIRED_IN_FLIGHT_WARN:
        found.append(
            f"lease reaper busy: {queue['expired_in_flight']} in-flight deliveries have an"
            " expired lease (is a maintenance process running? hosts lost?)"
        )
    for dest in status["destinations"]:
        if (dest["breaker"] != "closed" and dest["open_for_s"] is not None
                and dest["open_for_s"] >= OPEN_FOR_HOURS_S):
            found.append(
                f"destination {dest['id']} ({dest['url']}) breaker {dest['breaker']} for"
                f" {dest['open_for_s'] / 3600:.1f} h, {dest['pending']} deliveries waiting"
            )
    listed = {d["id"] for d in status["destinations"] if d["breaker"] != "closed"
              and (d["open_for_s"] or 0) >= OPEN_FOR_HOURS_S}
    unlisted = status["breakers"]["open_for_hours"] - len(listed)
    if unlisted > 0:
        found.append(f"{unlisted} more destinations have had their breaker open for hours")
    for table in status["tables"]:
        dead, trigger = table["n_dead_tup"], table["vacuum_trigger"]
        if dead <= trigger:
            continue
        since = table["since_vacuum_s"]
        if dead >= AUTOVACUUM_BEHIND_FACTOR * trigger and since is not None \
                and since <= AUTOVACUUM_BACK_TO_BACK_S:
            found.append(
                f"autovacuum permanently behind on {table['name']}: {dead} dead tuples"
                f" (triggers at {trigger:.0f}) although it vacuumed {since:.0f} s ago;"
                " vacuum cannot keep up with this write rate on one database"
            )
        elif dead >= AUTOVACUUM_BEHIND_FACTOR * trigger or since is None \
                or since >= AUTOVACUUM_STALE_S:
            when = "never" if since is None else f"{since / 60:.0f} min ago"
            found.append(
                f"autovacuum behind on {table['name']}: {dead} dead tuples (triggers at"
                f" {trigger:.0f}), last vacuum {when}"
            )
    statements = status["pg_stat_statements"]
    if statements and statements["total_ms"] > 0:
        share = statements["claim_ms"] / statements["total_ms"]
        if share >= CLAIM_SHARE_WARN:
            found.append(
                f"the claim query takes {share:.0%} of all statement time"
                " (pg_stat_statements): claiming dominates this database"
            )
    recent, before = queue["fanout_last_hour"], queue["fanout_day_before"]
    if recent and before and recent >= FANOUT_GROWTH_WARN * before:
        found.append(
            f"fan-out growing: {recent:.1f} deliveries per event in the last hour,"
            f" {before:.1f} in the day before"
        )
    return found


def _encode(value: object) -> object:
    if isinstance(value, dt.datetime):
        return value.isoformat()
    raise NotImplementedError(type(value))


def to_json(status: dict[str, Any]) -> str:
    return msgspec.json.encode(status, enc_hook=_encode).decode()


def _size(n: int) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1024:
            return f"{n:.0f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return f"{n:.1f} TB"


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


def _when(value: dt.datetime | None) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S") if value else "never"


def to_text(status: dict[str, Any]) -> str:
    q = status["queue"]
    b = status["breakers"]
    lines = [
        f"queue: {q['pending']} pending ({q['pending_due']} due, {q['retrying']} retrying),"
        f" {q['in_flight']} in flight ({q['expired_in_flight']} expired), {q['dead']} dead",
        f"oldest pending: {_age(q['oldest_pending_age_s'])} old;"
        f" oldest due waiting {_age(q['oldest_due_lag_s'])}",
        f"breakers: {b['closed']} closed, {b['open']} open, {b['half_open']} half-open;"
        f" {b['disabled']} disabled, {b['paused']} paused",
        "",
        f"{'destination':<12} {'pending':>8} {'in flight':>9} {'breaker':<9} {'fails':>5}"
        "  state",
    ]
    for d in status["destinations"]:
        state = []
        if d["disabled"]:
            state.append("disabled")
        if d["paused"]:
            state.append("paused")
        if d["breaker"] != "closed":
            state.append(f"open for {_age(d['open_for_s'])}, until {_when(d['paused_until'])}")
        lines.append(
            f"{d['id']:<12} {d['pending']:>8} {d['in_flight']:>9} {d['breaker']:<9}"
            f" {d['consecutive_failures']:>5}  {', '.join(state)}  {d['url']}"
        )
    lines += ["", f"{'tenant':<24} {'pending':>8} {'in flight':>9}  oldest due waiting"]
    for t in status["tenants"]:
        lines.append(f"{t['uid']:<24} {t['pending']:>8} {t['in_flight']:>9}"
                     f"  {_age(t['oldest_due_age_s'])}")
    lines += ["", f"{'table':<20} {'total':>9} {'table':>9} {'indexes':>9} {'live':>10}"
              f" {'dead':>9}  last autovacuum / vacuum / autoanalyze"]
    for t in status["tables"]:
        lines.append(
            f"{t['name']:<20} {_size(t['total_bytes']):>9} {_size(t['table_bytes']):>9}"
            f" {_size(t['index_bytes']):>9} {t['n_live_tup']:>10} {t['n_dead_tup']:>9}"
            f"  {_when(t['last_autovacuum'])} / {_when(t['last_vacuum'])}"
            f" / {_when(t['last_autoanalyze'])}"
        )
    lines.append("")
    lines.append("indexes: " + ", ".join(
        f"{i['name']} {_size(i['bytes'])}" for i in status["indexes"]))
    if status["pg_stat_statements"]:
        s = status["pg_stat_statements"]
        share = s["claim_ms"] / s["total_ms"] if s["total_ms"] else 0.0
        lines.append(f"claim query: {share:.0%} of statement time ({s['claim_calls']} calls)")
    settings = status["settings"]
    lines.append(
        f"server: PostgreSQL {settings['server_version']}, jit {'on' if settings['jit'] else 'off'}"
        f"{' (compiles)' if settings['jit_compiles'] else ''},"
        f" synchronous_commit {settings['synchronous_commit']},"
        f" shared_buffers {settings['shared_buffers']}"
    )
    lines.append("")
    for warning in status["warnings"]:
        lines.append(f"WARNING: {warning}")
    if not status["warnings"]:
        lines.append("no warnings")
    return "\n".join(lines)
