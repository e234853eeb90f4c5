"""tenant-migration: the tenants' migrations (schema/016_tenants.sql, 017_tenant_indexes.sql)
applied to a large database under a running engine, as an operator upgrading does it
(README: run the new version's `engine migrate`, then restart the hosts one at a time).

    python -m bench tenant-migration [--rows 1000000] [--old-engine PATH] [--procs 2]
                                     [--dsn URL | --stock-pg15]

A database migrated up to 015 (the last migration before tenants) gets --rows events
delivered long ago, each with its finished delivery, over a few destinations. The engine
from before tenants (the parent of the commit that added schema/016, unpacked with
`git archive`; or the checkout --old-engine names) runs on it: ingress, --procs workers
and the maintenance leader, delivering to engine/testing/fakedest.mjs. While it runs, three
probes each fire every 10 ms: an event POSTed to its ingress (the steady stream of new
events, 100/s), a statement reading a row of each altered table (it waits exactly when the
engine's statements would), and a sample of pg_locks (who waits for a lock, for how long).
After a warm-up this checkout's migrate() applies 016 and 017; the engine keeps running for
a while after.

Reported: each migration's duration; the longest probe and ingest latency before, during
and after the migration; the longest lock wait of the engine's sessions and of the
migrator's; events accepted and deliveries finished during the migration; any ingest answer
other than 202 and after the migration whether the engine still finishes deliveries (the
old engine writes no tenant_id); then that every row written before reads tenant 1 and
every index is valid. A report folder under bench/reports/.
"""

from __future__ import annotations

import argparse
import datetime as dt
import http.client
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from bench.harness import stack
from bench.harness.migration_log import MigrationLog
from bench.harness.report import REPORTS, Report, figure
from engine.db.migrate import SCHEMA_DIR, migrate
from engine.testing.fakedest import FakeDestination

SQL = Path(__file__).with_name("sql")
FILL = (SQL / "migration_fill.sql").read_text()
PROBE = (SQL / "migration_probe.sql").read_text()
LOCK_WAIT_AGES = (SQL / "lock_wait_ages.sql").read_text()
WINDOW = (SQL / "migration_window.sql").read_text()
CHECK = (SQL / "migration_check.sql").read_text()
INDEX_VALIDITY = (SQL / "index_validity.sql").read_text()

# The last migration before tenants: the database starts there.
BEFORE_TENANTS = 15
FIRST_TENANT_FILE = "schema/016_tenants.sql"
DESTINATIONS = 3
FILL_CHUNK = 250_000
HISTORY_PAYLOAD = '{"order": 42, "note": "' + "x" * 100 + '"}'
PROBE_EVERY_S = 0.010
WARM_UP_S = 8.0
AFTER_S = 15.0
MIGRATOR_NAME = "tenant-migration"


def old_engine_revision() -> str:
    """The commit before the one that added schema/016_tenants.sql."""
    out = subprocess.run(
        ["git", "log", "-1", "--diff-filter=A", "--format=%H", "--", FIRST_TENANT_FILE],
        cwd=stack.ROOT, capture_output=True, text=True, check=True).stdout.strip()
    if not out:
        raise stack.BenchError(f"git does not know when {FIRST_TENANT_FILE} was added:"
                               " give --old-engine")
    return f"{out}^"


@contextmanager
def old_engine_checkout(path: Path | None, revision: str | None = None) -> Iterator[Path]:
    """An older engine: `path`, else `revision` (default: the parent of the commit that
    added schema/016) unpacked from git into a temporary folder."""
    if path is not None:
        yield path
        return
    folder = Path(tempfile.mkdtemp(prefix="engine-old-"))
    try:
        archive = subprocess.run(["git", "archive", revision or old_engine_revision(),
                                  "engine", "schema"],
                                 cwd=stack.ROOT, capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(folder)], input=archive, check=True)
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


class OldEngine(stack.Engine):
    """stack.Engine run from another checkout (PYTHONPATH and working folder)."""

    def __init__(self, checkout: Path, dsn: str, procs: int, log: Path) -> None:
        super().__init__(dsn, procs)
        self.checkout, self.log = checkout, log

    def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if k != "ENGINE_API_TOKEN"}
        env["PYTHONPATH"] = str(self.checkout)
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(self.argv, cwd=self.checkout, env=env,
                                         stdout=log, stderr=log)

    def error_lines(self) -> dict[str, int]:
        """The distinct lines of its output that name an error, each with its count."""
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        counts: dict[str, int] = {}
        for line in text.splitlines():
            if "rror" in line:
                counts[line[:300]] = counts.get(line[:300], 0) + 1
        return counts


def schema_before_tenants(folder: Path) -> Path:
    """A schema folder holding this checkout's migrations up to BEFORE_TENANTS."""
    for path in sorted(SCHEMA_DIR.glob("[0-9][0-9][0-9]_*.sql")):
        if int(path.name[:3]) <= BEFORE_TENANTS:
            shutil.copy(path, folder / path.name)
    return folder


@dataclass
class Samples:
    """(monotonic time issued, latency s, outcome) of one probe, appended by its thread."""

    name: str
    rows: list[tuple[float, float, str]] = field(default_factory=list)

    def between(self, start: float, end: float) -> list[tuple[float, float, str]]:
        return [r for r in self.rows if start <= r[0] < end]


def every(stop: threading.Event, period: float) -> Iterator[float]:
    """Instants `period` apart until `stop`, without drifting; a late probe is not
    repeated to catch up (its lateness is what it measured)."""
    due = time.monotonic()
    while not stop.is_set():
        now = time.monotonic()
        if now < due:
            time.sleep(due - now)
            continue
        yield now
        due = max(due + period, time.monotonic())


def probe_ingest(base_url: str, samples: Samples, stop: threading.Event) -> None:
    """POST one event every PROBE_EVERY_S on a kept-alive connection; the outcome is the
    status code, or the error's name."""
    host, port = base_url.removeprefix("http://").split(":")
    body = json.dumps({"type": "order.created", "payload": {"order": 7}}).encode()
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    for began in every(stop, PROBE_EVERY_S):
        try:
            conn.request("POST", "/v1/events", body, {"content-type": "application/json"})
            response = conn.getresponse()
            response.read()
            outcome = str(response.status)
        except (OSError, http.client.HTTPException) as exc:
            outcome = type(exc).__name__
            conn.close()
            conn = http.client.HTTPConnection(host, int(port), timeout=30)
        samples.rows.append((began, time.monotonic() - began, outcome))
    conn.close()


def probe_tables(dsn: str, last_id: int, destination: int, samples: Samples,
                 stop: threading.Event) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for began in every(stop, PROBE_EVERY_S):
            try:
                stack.run_sql(conn, PROBE, (random.randint(1, last_id), destination))
                outcome = "ok"
            except psycopg.Error as exc:
                outcome = type(exc).__name__
            samples.rows.append((began, time.monotonic() - began, outcome))


def sample_locks(dsn: str, samples: Samples, stop: threading.Event) -> None:
    """Each waiting lock request as (time, waited s, 'who|locktype|mode|relation')."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for began in every(stop, PROBE_EVERY_S):
            for who, locktype, mode, relation, waited_ms in stack.run_sql(conn, LOCK_WAIT_AGES):
                role = "migrator" if who == MIGRATOR_NAME else "engine"
                samples.rows.append((began, float(waited_ms or 0) / 1000,
                                     f"{role}|{locktype}|{mode}|{relation}"))


def with_application_name(dsn: str, name: str) -> str:
    params = conninfo_to_dict(dsn)
    params["application_name"] = name
    return make_conninfo(**params)


def server_now(dsn: str) -> dt.datetime:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT clock_timestamp()").fetchone()
    assert row is not None
    return row[0]


def fill_history(dsn: str, rows: int, destinations: list[int]) -> tuple[int, int]:
    """`rows` events and finished deliveries; returns the last event and delivery ids."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for start in range(0, rows, FILL_CHUNK):
            stack.run_sql(conn, FILL, (min(FILL_CHUNK, rows - start), destinations,
                                       HISTORY_PAYLOAD))
        conn.execute("VACUUM ANALYZE events")
        conn.execute("VACUUM ANALYZE finished_deliveries")
        row = conn.execute("SELECT (SELECT max(id) FROM events),"
                           " (SELECT max(id) FROM finished_deliveries)").fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def latency_summary(rows: Sequence[tuple[float, float, str]]) -> dict[str, Any]:
    latencies = sorted(r[1] for r in rows)
    outcomes: dict[str, int] = {}
    for r in rows:
        outcomes[r[2]] = outcomes.get(r[2], 0) + 1

    def q(p: float) -> float | None:
        if not latencies:
            return None
        return round(latencies[min(len(latencies) - 1, int(p * len(latencies)))] * 1000, 1)

    return {"count": len(rows), "p50_ms": q(0.5), "p99_ms": q(0.99),
            "max_ms": round(latencies[-1] * 1000, 1) if latencies else None,
            "outcomes": outcomes}


def lock_summary(rows: Sequence[tuple[float, float, str]]) -> dict[str, Any]:
    """The longest wait seen per waiter role, and what it waited for."""
    found: dict[str, Any] = {}
    for role in ("engine", "migrator"):
        mine = [r for r in rows if r[2].startswith(role + "|")]
        longest = max(mine, key=lambda r: r[1], default=None)
        instants = {r[0] for r in mine}
        found[role] = {
            "samples_waiting": len(instants),
            "max_wait_ms": round(longest[1] * 1000, 1) if longest else 0.0,
            "longest_wait_on": longest[2].split("|", 1)[1] if longest else None,
            "max_waiters_at_once": max(
                (sum(1 for r in mine if r[0] == t) for t in instants), default=0),
        }
    return found


def run(args: argparse.Namespace, report: Report) -> None:
    started = time.monotonic()
    with (stack.server(args.dsn, stock_pg15_cluster=args.stock_pg15) as admin_dsn,
          stack.fresh_database(admin_dsn, "engine_bench_tenant_migration",
                               migrated=False) as dsn,
          old_engine_checkout(args.old_engine) as checkout,
          tempfile.TemporaryDirectory(prefix="engine-schema-015-") as early):
        migrate(dsn, schema_before_tenants(Path(early)))
        report.data["postgres"] = stack.pg_settings(dsn)
        with FakeDestination(extra_args=["--keep", "0"]) as dest:
            with psycopg.connect(dsn, autocommit=True) as conn:
                # The schema before tenants has no destinations.tenant_id for
                # stack.add_destination to name.
                destinations = [int(row[0]) for i in range(DESTINATIONS) for row in [
                    conn.execute("INSERT INTO destinations (url, secret) VALUES (%s, %s)"
                                 " RETURNING id", (dest.url(f"fast/d{i}"), stack.SECRET)
                                 ).fetchone() or (0,)]]
            began = time.monotonic()
            last_event, last_delivery = fill_history(dsn, args.rows, destinations)
            report.data["fill_s"] = round(time.monotonic() - began, 1)
            print(f"history: {args.rows:,} events and finished deliveries in "
                  f"{report.data['fill_s']} s", file=sys.stderr)
            migrated_dsn = with_application_name(dsn, MIGRATOR_NAME)
            engine = OldEngine(checkout, dsn, args.procs, Path(early) / "engine.log")
            with engine:
                result = under_load(engine, dsn, migrated_dsn, dest, destinations[0],
                                    last_event)
            # The old engine's own account of what went wrong, if it said anything.
            result["old_engine_error_lines"] = engine.error_lines()
            result["delivered_to_fake"] = stack.destination_totals(dest)
        with psycopg.connect(dsn, autocommit=True) as conn:
            (events, events_default, finished, finished_default, dest_other,
             queue_other, finished_other, tenant_1) = stack.run_sql(
                conn, CHECK, (last_event, last_delivery))[0]
            indexes = stack.run_sql(conn, INDEX_VALIDITY)
        result["after"] = {
            "history_events": events, "history_events_tenant_1": events_default,
            "history_finished": finished, "history_finished_tenant_1": finished_default,
            "destinations_not_tenant_1": dest_other, "deliveries_not_tenant_1": queue_other,
            "finished_not_tenant_1": finished_other, "tenant_1_uid": tenant_1,
            "indexes": [{"index": i, "table": t, "valid": v, "ready": r}
                        for i, t, v, r in indexes],
        }
    report.data.update(result)
    report.data["elapsed_s"] = round(time.monotonic() - started, 1)
    write(report, result)


def under_load(engine: OldEngine, dsn: str, migrator_dsn: str, dest: FakeDestination,
               destination: int, last_event: int) -> dict[str, Any]:
    ingest, tables, locks = Samples("ingest"), Samples("probe"), Samples("locks")
    stop = threading.Event()
    threads = [
        threading.Thread(target=probe_ingest, args=(engine.base_url, ingest, stop)),
        threading.Thread(target=probe_tables, args=(dsn, last_event, destination, tables, stop)),
        threading.Thread(target=sample_locks, args=(dsn, locks, stop)),
    ]
    for t in threads:
        t.start()
    try:
        time.sleep(WARM_UP_S)
        delivered_before = dest.stats()["totals"].get("delivered_ids", 0)
        from_time, mig_start = server_now(dsn), time.monotonic()
        log = MigrationLog(mig_start)
        migrations, lock_timeouts = log.migrations, log.lock_timeouts
        migrate(migrator_dsn, SCHEMA_DIR, log.progress, log.gave_up)
        mig_end, to_time = time.monotonic(), server_now(dsn)
        delivered_during = dest.stats()["totals"].get("delivered_ids", 0) - delivered_before
        time.sleep(AFTER_S)
        delivered_after = (dest.stats()["totals"].get("delivered_ids", 0) - delivered_before
                           - delivered_during)
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    with psycopg.connect(dsn, autocommit=True) as conn:
        accepted, finished = stack.run_sql(conn, WINDOW, (from_time, to_time))[0]
        after_from = to_time
        after_accepted, after_finished = stack.run_sql(
            conn, WINDOW, (after_from, after_from + dt.timedelta(seconds=AFTER_S)))[0]
    windows = {"before": (0.0, mig_start), "during": (mig_start, mig_end),
               "after": (mig_end, float("inf"))}
    per_file = {}
    for m in migrations:
        start, end = mig_start + m["start_s"], mig_start + m["end_s"]
        per_file[m["name"]] = {
            "ingest": latency_summary(ingest.between(start, end)),
            "probe": latency_summary(tables.between(start, end)),
            "locks": lock_summary(locks.between(start, end)),
        }
    return {
        "migrations": migrations, "migration_s": round(mig_end - mig_start, 3),
        "lock_timeouts": lock_timeouts,
        "ingest": {k: latency_summary(ingest.between(*w)) for k, w in windows.items()},
        "probe": {k: latency_summary(tables.between(*w)) for k, w in windows.items()},
        "locks": {k: lock_summary(locks.between(*w)) for k, w in windows.items()},
        "per_migration": per_file,
        "during": {"events_accepted": accepted, "deliveries_finished": finished,
                   "delivered_to_fake": delivered_during},
        "after_migration": {"seconds": AFTER_S, "events_accepted": after_accepted,
                            "deliveries_finished": after_finished,
                            "delivered_to_fake": delivered_after},
        "timeline": {"migration_start_s": round(mig_start - ingest.rows[0][0], 3)
                     if ingest.rows else 0.0,
                     "ingest": [(round(t - mig_start, 3), round(lat * 1000, 2), o)
                                for t, lat, o in ingest.rows],
                     "probe": [(round(t - mig_start, 3), round(lat * 1000, 2), o)
                               for t, lat, o in tables.rows]},
    }


def write(report: Report, r: dict[str, Any]) -> None:
    during_i, during_p = r["ingest"]["during"], r["probe"]["during"]
    engine_locks = r["locks"]["during"]["engine"]
    not_ok = {k: v for w in ("during", "after") for k, v in r["ingest"][w]["outcomes"].items()
              if k != "202"}
    after = r["after"]
    invalid = [i["index"] for i in after["indexes"] if not (i["valid"] and i["ready"])]
    report.headline += [
        "migrations: " + ", ".join(f"{m['name']} {m['seconds']:.2f} s" for m in r["migrations"])
        + f" (lock_timeout fired {len(r['lock_timeouts'])} times, each followed by a"
          " pause and another try)",
        f"longest stall during the migration: probe statement {during_p['max_ms']} ms "
        f"(before: {r['probe']['before']['max_ms']} ms), ingest POST {during_i['max_ms']} ms "
        f"(before: {r['ingest']['before']['max_ms']} ms); longest lock wait of an engine "
        f"session {engine_locks['max_wait_ms']} ms ({engine_locks['longest_wait_on']})",
        f"during the migration: {r['during']['events_accepted']:,} events accepted, "
        f"{r['during']['deliveries_finished']:,} deliveries finished; in the "
        f"{AFTER_S:.0f} s after: {r['after_migration']['events_accepted']:,} accepted, "
        f"{r['after_migration']['deliveries_finished']:,} finished",
        "ingest answers other than 202 during/after: " + (json.dumps(not_ok) if not_ok
                                                          else "none"),
        f"history: {after['history_finished_tenant_1']:,} of {after['history_finished']:,} "
        f"finished deliveries and {after['history_events_tenant_1']:,} of "
        f"{after['history_events']:,} events read tenant 1 ('{after['tenant_1_uid']}'); "
        f"invalid indexes: {', '.join(invalid) or 'none'}",
    ]
    report.section("Migrations", "Each file's duration, with what the running engine saw "
                   "while it ran (ingest: a POST every 10 ms; probe: a primary-key read of "
                   "each altered table every 10 ms; lock waits sampled every 10 ms).")
    report.table(
        ["migration", "seconds", "ingest max ms", "probe max ms", "engine lock wait max ms",
         "migrator lock wait max ms", "ingest outcomes"],
        [[m["name"], m["seconds"], r["per_migration"][m["name"]]["ingest"]["max_ms"],
          r["per_migration"][m["name"]]["probe"]["max_ms"],
          r["per_migration"][m["name"]]["locks"]["engine"]["max_wait_ms"],
          r["per_migration"][m["name"]]["locks"]["migrator"]["max_wait_ms"],
          json.dumps(r["per_migration"][m["name"]]["ingest"]["outcomes"])]
         for m in r["migrations"]])
    report.section("Before, during and after")
    report.table(
        ["window", "ingest p50 / p99 / max ms", "probe p50 / p99 / max ms",
         "engine lock wait max ms", "ingest outcomes"],
        [[w, f"{r['ingest'][w]['p50_ms']} / {r['ingest'][w]['p99_ms']} / "
             f"{r['ingest'][w]['max_ms']}",
          f"{r['probe'][w]['p50_ms']} / {r['probe'][w]['p99_ms']} / {r['probe'][w]['max_ms']}",
          r["locks"][w]["engine"]["max_wait_ms"], json.dumps(r["ingest"][w]["outcomes"])]
         for w in ("before", "during", "after")])
    report.section("After", "Rows by tenant after the migration, and the running engine's "
                   "error lines (its output, distinct lines with their counts).")
    report.table(["check", "value"], [[k, v] for k, v in after.items() if k != "indexes"])
    report.table(["times", "old engine error line"],
                 [[n, f"`{line}`"] for line, n in r["old_engine_error_lines"].items()])
    report.table(["table", "index", "valid", "ready"],
                 [[i["table"], i["index"], i["valid"], i["ready"]] for i in after["indexes"]])
    fig, ax = figure("Latency of the running engine's probes across the migration")
    for key, color in (("ingest", "tab:blue"), ("probe", "tab:orange")):
        points = [(t, ms) for t, ms, _ in r["timeline"][key]]
        ax.scatter([p[0] for p in points], [p[1] for p in points], s=3, color=color,
                   label=key)
    for m in r["migrations"]:
        ax.axvspan(m["start_s"], m["end_s"], alpha=0.15, label=m["name"],
                   color="tab:green" if "016" in m["name"] else "tab:red")
    ax.set_yscale("log")
    ax.set_xlabel("seconds from the migration's start")
    ax.set_ylabel("latency ms")
    ax.legend(loc="upper left")
    report.plot(fig, "tenant_migration_latency.png", "Probe latency across the migration")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench tenant-migration",
                                     description=__doc__.split("\n\n")[0])
    stack.add_server_arguments(parser)
    parser.add_argument("--rows", type=int, default=1_000_000,
                        help="events and finished deliveries written before the migration")
    parser.add_argument("--procs", type=int, default=2, help="the old engine's workers")
    parser.add_argument("--old-engine", type=Path,
                        help="a checkout of the engine before tenants (default: the parent "
                             f"of the commit that added {FIRST_TENANT_FILE}, from git)")
    parser.add_argument("--reports", type=Path, default=REPORTS)
    args = parser.parse_args(argv)
    report = Report("tenant-migration", {"rows": args.rows, "procs": args.procs,
                                         "old_engine": str(args.old_engine or "git"),
                                         "external_dsn": bool(args.dsn),
                                         "stock_pg15": args.stock_pg15}, args.reports)
    try:
        run(args, report)
    except stack.BenchError as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 1
    folder = report.save()
    print("\n".join(f"- {line}" for line in report.headline))
    print(f"report: {folder}/report.md")
    return 0
