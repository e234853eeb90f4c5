"""partition-migration: the partitioned history's migrations (schema/025_history_partitions_
prepare.sql, 026_history_partitions.sql) applied to a database holding 1,000,000 finished
deliveries under a running engine, as an operator upgrading does it (README: run the new
version's `engine migrate`, then restart the hosts one at a time).

    python -m bench partition-migration [--rows 1000000] [--procs 2] [--old-engine PATH]
                                        [--old-revision REV] [--warm-up 10] [--after 20]
                                        [--dsn URL | --stock-pg15]

A database migrated up to 024 (the last migration before partitions) gets --rows events
from the last two days, each with its finished delivery and its attempt (every tenth
event keyed, so 025 has idempotency keys to copy). The engine from before partitions (main's
last commit before schema/025, unpacked with `git archive`; or --old-revision, or the
checkout --old-engine names) runs on it: ingress, --procs workers and the maintenance
leader. Every 10 ms an event is POSTed to its ingress (every tenth with an Idempotency-Key),
each delivered to three destinations of engine/testing/fakedest.mjs: a steady stream in
and out. Two samplers, every 10 ms: the migrator's session in pg_stat_activity with the
table locks it holds that block writes (SHARE and stronger), and every lock request not
granted (lock_wait_ages.sql). After --warm-up seconds this checkout's migrate() applies 025
then 026; then the old engine is stopped (SIGTERM: it drains) and this checkout's engine is
started on the same port (the restart the README asks for: the old ingress refuses events
after 026, docs/decisions/0036); it runs --after seconds more. Then the bench waits for the
queue to empty.

Reported: each file's duration and 026's tries, each statement the migrator ran (from the
sampler) and how long, how long it held each write-blocking lock (sampled: a hold shorter
than 10 ms can be missed; the 026 transaction's own duration bounds its locks); the
ingest POST's latency p50/p99/max and answers per window (before, 025, 026, restart,
after), the longest gap between two deliveries arriving at the destination per window;
the longest lock wait of an engine session; what the old engine logged as errors; and that
nothing was lost: every event answered 202 arrived at each of its destinations, duplicates
counted apart, and every history row is still there. A report folder under
bench/reports/.
"""

from __future__ import annotations

import argparse
import datetime as dt
import http.client
import json
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

import psycopg

from bench.harness import stack
from bench.harness.migration_log import MigrationLog
from bench.harness.report import REPORTS, Report, figure
from bench.harness.tenant_migration import (
    OldEngine,
    Samples,
    every,
    latency_summary,
    lock_summary,
    old_engine_checkout,
    sample_locks,
    with_application_name,
)
from engine.db.migrate import SCHEMA_DIR, load_migrations, migrate
from engine.testing.fakedest import FakeDestination

SQL = Path(__file__).with_name("sql")
FILL = (SQL / "partition_migration_fill.sql").read_text()
MIGRATOR_SAMPLE = (SQL / "migrator_sample.sql").read_text()
HISTORY_COUNTS = (SQL / "history_counts.sql").read_text()

BEFORE_PARTITIONS = 24  # the database starts at this migration
FIRST_PARTITION_FILE = "schema/025_history_partitions_prepare.sql"
DESTINATIONS = 3
FILL_CHUNK = 250_000
HISTORY_PAYLOAD = '{"order": 42, "note": "' + "x" * 100 + '"}'
PROBE_EVERY_S = 0.010
KEYED_EVERY = 10  # every tenth POST carries an Idempotency-Key
MIGRATOR_NAME = "partition-migration"
DRAIN_WAIT_S = 120.0
HISTORY_TABLES = ("events", "finished_deliveries", "delivery_attempts")


def old_engine_revision() -> str:
    """The first parent of the first commit on HEAD's first-parent line that brought
    schema/025 (on main: the merge of the partitions branch, so main's last commit
    before it)."""
    out = subprocess.run(
        ["git", "rev-list", "--first-parent", "--reverse", "HEAD", "--", FIRST_PARTITION_FILE],
        cwd=stack.ROOT, capture_output=True, text=True, check=True).stdout.split()
    if not out:
        raise stack.BenchError(f"git does not know when {FIRST_PARTITION_FILE} came:"
                               " give --old-revision or --old-engine")
    return f"{out[0]}^1"


def schema_up_to(folder: Path, version: int) -> Path:
    """A schema folder holding this checkout's migrations up to `version`."""
    for m in load_migrations()[:version]:
        (folder / f"{m.name}.sql").write_text(m.sql)
    return folder


def fill_history(dsn: str, rows: int, destinations: list[int]) -> tuple[int, int]:
    """`rows` events, finished deliveries and attempts; returns the last event and
    finished delivery ids."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for start in range(0, rows, FILL_CHUNK):
            stack.run_sql(conn, FILL, (min(FILL_CHUNK, rows - start), destinations,
                                       HISTORY_PAYLOAD, start, rows))
        for table in HISTORY_TABLES:
            conn.execute(f"VACUUM ANALYZE {table}")
        row = conn.execute("SELECT (SELECT max(id) FROM events),"
                           " (SELECT max(id) FROM finished_deliveries)").fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


@dataclass
class Posts:
    """Each POST: (monotonic time issued, latency s, outcome, event id, deliveries)."""

    rows: list[tuple[float, float, str, int | None, int]] = field(default_factory=list)

    def between(self, start: float, end: float) -> list[tuple[float, float, str]]:
        return [(t, lat, o) for t, lat, o, _, _ in self.rows if start <= t < end]

    def accepted(self) -> list[tuple[int, int]]:
        return [(i, n) for _, _, o, i, n in self.rows if o == "202" and i is not None]


def post_events(base_url: str, posts: Posts, stop: threading.Event) -> None:
    """POST one event every PROBE_EVERY_S on a kept-alive connection (reopened after an
    error: the engine's restart refuses connections for a while)."""
    host, port = base_url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    for n, began in enumerate(every(stop, PROBE_EVERY_S)):
        body = json.dumps({"type": "order.created", "payload": {"order": n}}).encode()
        headers = {"content-type": "application/json"}
        if n % KEYED_EVERY == 0:
            headers["idempotency-key"] = f"probe-{n}"
        event_id, deliveries = None, 0
        try:
            conn.request("POST", "/v1/events", body, headers)
            response = conn.getresponse()
            answer = response.read()
            outcome = str(response.status)
            if response.status == 202:
                accepted = json.loads(answer)
                event_id, deliveries = int(accepted["id"]), int(accepted["deliveries"])
        except (OSError, http.client.HTTPException) as exc:
            outcome = type(exc).__name__
            conn.close()
            conn = http.client.HTTPConnection(host, int(port), timeout=30)
        posts.rows.append((began, time.monotonic() - began, outcome, event_id, deliveries))
    conn.close()


@dataclass
class MigratorSample:
    clock: dt.datetime  # the server's
    pid: int
    query_start: dt.datetime | None
    state: str | None
    query: str
    locks: tuple[str, ...]  # 'relation:mode' of each write-blocking lock held


def sample_migrator(dsn: str, found: list[MigratorSample], stop: threading.Event) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for _ in every(stop, PROBE_EVERY_S):
            for clock, pid, started, state, query, locks in stack.run_sql(
                    conn, MIGRATOR_SAMPLE, (MIGRATOR_NAME,)):
                found.append(MigratorSample(clock, pid, started, state, query or "",
                                            tuple(locks)))


def statements(samples: Sequence[MigratorSample]) -> list[dict[str, Any]]:
    """Each statement the migrator was seen running: its first line, when it began and
    for how long it was seen active (the server's clock: from query_start to the last
    sample that saw it active, so within one sampling period)."""
    steps: dict[tuple[int, dt.datetime], dict[str, Any]] = {}
    for s in samples:
        if s.state != "active" or s.query_start is None or "migrator_sample" in s.query:
            continue
        step = steps.setdefault((s.pid, s.query_start), {
            "began": s.query_start, "last_seen": s.clock, "statement": _first_line(s.query)})
        step["last_seen"] = max(step["last_seen"], s.clock)
    return [{"began": v["began"], "statement": v["statement"],
             "seconds": round((v["last_seen"] - v["began"]).total_seconds(), 3)}
            for v in sorted(steps.values(), key=lambda v: v["began"])]


def _first_line(query: str) -> str:
    """A statement's first line that is not a comment (files open with comments)."""
    for line in query.splitlines():
        if line.strip() and not line.lstrip().startswith("--"):
            return line.strip()[:100]
    return " ".join(query.split())[:100]


def lock_holds(samples: Sequence[MigratorSample], period_s: float = PROBE_EVERY_S
               ) -> list[dict[str, Any]]:
    """Each stretch of consecutive samples in which the migrator held a given lock:
    'relation:mode', first and last seen (server clock), seen for how long. A stretch
    seen once lasted under two sampling periods; one never seen lasted under one."""
    clocks = sorted({s.clock for s in samples})
    index = {c: i for i, c in enumerate(clocks)}
    holds: list[dict[str, Any]] = []
    open_: dict[str, dict[str, Any]] = {}
    for s in sorted(samples, key=lambda s: s.clock):
        i = index[s.clock]
        for lock in s.locks:
            hold = open_.get(lock)
            if hold is not None and hold["last_index"] == i - 1:
                hold["last_index"], hold["last_seen"] = i, s.clock
            else:
                hold = {"lock": lock, "first_seen": s.clock, "last_seen": s.clock,
                        "last_index": i, "statement": _first_line(s.query)}
                open_[lock] = hold
                holds.append(hold)
    for hold in holds:
        seen = (hold["last_seen"] - hold["first_seen"]).total_seconds()
        hold["seen_s"] = round(seen, 3)
        hold["at_most_s"] = round(seen + 2 * period_s, 3)
        del hold["last_index"]
    return holds


def arrival_gaps(arrivals_ms: Sequence[float], windows: dict[str, tuple[float, float]]
                 ) -> dict[str, dict[str, Any]]:
    """Per window (unix seconds, [start, end)): deliveries arrived, per second, and the
    longest time without one (from the window's start to its first arrival, between two,
    and from the last to its end)."""
    times = sorted(a / 1000 for a in arrivals_ms)
    found = {}
    for name, (start, end) in windows.items():
        inside = [t for t in times if start <= t < end]
        edges = [start, *inside, end]
        gap = max((b - a for a, b in pairwise(edges)), default=end - start)
        found[name] = {"seconds": round(end - start, 3), "arrived": len(inside),
                       "per_s": round(len(inside) / (end - start), 1) if end > start else None,
                       "longest_gap_ms": round(gap * 1000, 1)}
    return found


def account(accepted: Sequence[tuple[int, int]], arrivals: dict[str, dict[str, Any]]
            ) -> dict[str, Any]:
    """Every accepted event (id, deliveries it was answered with) against the destination:
    the events that arrived fewer times than they have deliveries (lost), and more
    (impossible here: every event goes to every destination once, so a name seeing an id
    twice is a duplicate, counted by the fake destination)."""
    short, over = [], []
    for event_id, deliveries in accepted:
        seen = sum(f"evt_{event_id}" in by_id for by_id in arrivals.values())
        if seen < deliveries:
            short.append(event_id)
        elif seen > deliveries:
            over.append(event_id)
    return {"accepted": len(accepted),
            "deliveries_expected": sum(n for _, n in accepted),
            "events_short": len(short), "events_short_sample": short[:20],
            "events_more_than_expected": len(over)}


class Clock:
    """Named instants on the bench's monotonic clock and the wall clock together (the
    fake destination stamps arrivals in unix ms)."""

    def __init__(self) -> None:
        self.marks: dict[str, tuple[float, float]] = {}

    def mark(self, name: str) -> float:
        now = time.monotonic()
        self.marks[name] = (now, time.time())
        return now

    def mono(self, name: str) -> float:
        return self.marks[name][0]

    def wall(self, name: str) -> float:
        return self.marks[name][1]


def run(args: argparse.Namespace, report: Report) -> None:
    started = time.monotonic()
    revision = None if args.old_engine else (args.old_revision or old_engine_revision())
    report.data["old_engine_revision"] = revision and subprocess.run(
        ["git", "rev-parse", revision], cwd=stack.ROOT, capture_output=True, text=True,
        check=True).stdout.strip()
    with (stack.server(args.dsn, stock_pg15_cluster=args.stock_pg15) as admin_dsn,
          stack.fresh_database(admin_dsn, "engine_bench_partition_migration",
                               migrated=False) as dsn,
          old_engine_checkout(args.old_engine, revision) as checkout,
          tempfile.TemporaryDirectory(prefix="engine-schema-024-") as early):
        migrate(dsn, schema_up_to(Path(early), BEFORE_PARTITIONS))
        report.data["postgres"] = stack.pg_settings(dsn)
        with FakeDestination(extra_args=["--keep", "0"]) as dest:
            names = [f"d{i}" for i in range(DESTINATIONS)]
            with psycopg.connect(dsn, autocommit=True) as conn:
                for name in names:
                    stack.add_destination(conn, dest.url(f"fast/{name}"))
                destinations = [int(r[0]) for r in conn.execute(
                    "SELECT id FROM destinations ORDER BY id").fetchall()]
            began = time.monotonic()
            last_event, last_delivery = fill_history(dsn, args.rows, destinations)
            report.data["fill_s"] = round(time.monotonic() - began, 1)
            print(f"history: {args.rows:,} events, finished deliveries and attempts in "
                  f"{report.data['fill_s']} s", file=sys.stderr)
            old = OldEngine(checkout, dsn, args.procs, Path(early) / "engine.log")
            result = under_load(args, old, dsn, dest, names)
            result["old_engine_error_lines"] = old.error_lines()
        with psycopg.connect(dsn, autocommit=True) as conn:
            events, finished, attempts, new_events, queued = stack.run_sql(
                conn, HISTORY_COUNTS, (last_event, last_delivery))[0]
            partitions = conn.execute(
                "SELECT parent, partition FROM history_partitions() ORDER BY 1, 2").fetchall()
        result["history_after"] = {
            "rows_written": args.rows, "events": events, "finished_deliveries": finished,
            "delivery_attempts": attempts, "events_after_fill": new_events,
            "left_in_queue": queued,
            "partitions": [f"{p}: {c}" for p, c in partitions]}
    report.data.update(result)
    report.data["elapsed_s"] = round(time.monotonic() - started, 1)
    write(report, result)


def under_load(args: argparse.Namespace, old: OldEngine, dsn: str, dest: FakeDestination,
               names: list[str]) -> dict[str, Any]:
    posts, waits = Posts(), Samples("locks")
    migrator: list[MigratorSample] = []
    stop = threading.Event()
    clock = Clock()
    new: stack.Engine | None = None
    old.start()
    try:
        old.wait_ready()
        threads = [
            threading.Thread(target=post_events, args=(old.base_url, posts, stop)),
            threading.Thread(target=sample_migrator, args=(dsn, migrator, stop)),
            threading.Thread(target=sample_locks, args=(dsn, waits, stop)),
        ]
        clock.mark("start")
        for t in threads:
            t.start()
        time.sleep(args.warm_up)
        log = MigrationLog(clock.mark("migration_start"), clock.mark)
        migrations, lock_timeouts = log.migrations, log.lock_timeouts
        migrate(with_application_name(dsn, MIGRATOR_NAME), SCHEMA_DIR, log.progress,
                log.gave_up)
        # 025 and 026 first; later files (027 on) may follow them.
        if [m["name"][:3] for m in migrations][:2] != ["025", "026"]:
            raise stack.BenchError(f"expected 025 and 026 to apply, got {migrations}")
        # The restart: the old host drains, this checkout's engine takes its port.
        old.signal_stop()
        old.wait_stopped()
        clock.mark("old_stopped")
        new = stack.Engine(dsn, args.procs)
        new.port = old.port
        new.argv[new.argv.index("--bind") + 1] = f"127.0.0.1:{old.port}"
        new.start()
        new.wait_ready()
        clock.mark("new_ready")
        time.sleep(args.after)
        clock.mark("end")
        stop.set()
        for t in threads:
            t.join(30)
        drained = wait_for_empty_queue(dsn)
        clock.mark("drained")
    finally:
        stop.set()
        old.signal_stop()
        old.wait_stopped()
        if new is not None:
            new.signal_stop()
            new.wait_stopped()
    windows = {
        "before": ("start", "migration_start"),
        "025": ("migration_start", migrations[0]["name"]),
        "026": (migrations[0]["name"], migrations[1]["name"]),
        "old engine after 026": (migrations[1]["name"], "old_stopped"),
        "restart": ("old_stopped", "new_ready"),
        "after": ("new_ready", "end"),
    }
    arrivals = {name: dest.arrivals(name) for name in names}
    name_stats = dest.stats()["names"]
    all_arrivals = [ms for by_id in arrivals.values() for ms in by_id.values()]
    return {
        "migrations": migrations, "lock_timeouts": lock_timeouts,
        "marks_s": {k: round(v[0] - clock.mono("migration_start"), 3)
                    for k, v in clock.marks.items()},
        "statements": [{**s, "began": s["began"].isoformat()} for s in statements(migrator)],
        "lock_holds": [{**h, "first_seen": h["first_seen"].isoformat(),
                        "last_seen": h["last_seen"].isoformat()} for h in lock_holds(migrator)],
        "ingest": {w: latency_summary(posts.between(clock.mono(a), clock.mono(b)))
                   for w, (a, b) in windows.items()},
        "engine_lock_waits": {w: lock_summary(waits.between(clock.mono(a), clock.mono(b)))
                              for w, (a, b) in windows.items()},
        "arrivals": arrival_gaps(all_arrivals, {w: (clock.wall(a), clock.wall(b))
                                                for w, (a, b) in windows.items()}),
        "loss": {**account(posts.accepted(), arrivals), "queue_drained": drained,
                 "duplicates": {n: name_stats.get(n, {}).get("duplicates", 0) for n in names}},
        "timeline": {"ingest": [(round(t - clock.mono("migration_start"), 3),
                                 round(lat * 1000, 2), o) for t, lat, o, _, _ in posts.rows],
                     "arrivals_s": sorted(round(ms / 1000 - clock.wall("migration_start"), 3)
                                          for ms in all_arrivals)},
    }


def wait_for_empty_queue(dsn: str) -> bool:
    """Until the queue holds no delivery (all delivered), at most DRAIN_WAIT_S."""
    deadline = time.monotonic() + DRAIN_WAIT_S
    with psycopg.connect(dsn, autocommit=True) as conn:
        while time.monotonic() < deadline:
            row = conn.execute("SELECT count(*) FROM deliveries").fetchone()
            if row is not None and row[0] == 0:
                return True
            time.sleep(0.5)
    return False


def blocking_holds(holds: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The holds of a lock on a table the engine uses (not one the migration is creating,
    which shows as an OID or a name no engine statement reads)."""
    engine_tables = {*HISTORY_TABLES, "deliveries", "destinations", "idempotency_keys"}
    return [h for h in holds if h["lock"].split(":")[0] in engine_tables]


def write(report: Report, r: dict[str, Any]) -> None:
    files = {m["name"][:3]: m for m in r["migrations"]}
    held = blocking_holds(r["lock_holds"])
    longest = max(held, key=lambda h: h["seen_s"], default=None)
    loss = r["loss"]
    ingest, arrivals = r["ingest"], r["arrivals"]
    not_202 = {w: {k: v for k, v in ingest[w]["outcomes"].items() if k != "202"}
               for w in ingest}
    report.headline += [
        f"025 took {files['025']['seconds']:.2f} s, 026 {files['026']['seconds']:.3f} s "
        f"(lock_timeout fired {len(r['lock_timeouts'])} times)",
        "write-blocking locks on the engine's tables seen held by the migrator: "
        + (f"longest {longest['lock']} seen for {longest['seen_s'] * 1000:.0f} ms "
           f"(under {longest['at_most_s'] * 1000:.0f} ms), {len(held)} holds in all"
           if longest else "none in any 10 ms sample")
        + f"; the 026 transaction lasted {files['026']['seconds'] * 1000:.0f} ms in all",
        "ingest POST p50 / p99 / max ms: " + "; ".join(
            f"{w} {ingest[w]['p50_ms']} / {ingest[w]['p99_ms']} / {ingest[w]['max_ms']}"
            for w in ("before", "025", "026", "after")),
        "longest gap between deliveries: " + "; ".join(
            f"{w} {arrivals[w]['longest_gap_ms']:.0f} ms" for w in arrivals)
        + f" (the old engine took {arrivals['old engine after 026']['seconds']:.1f} s to drain"
          f" and stop, the new one {arrivals['restart']['seconds']:.1f} s to answer)",
        "answers other than 202: " + ("; ".join(f"{w} {json.dumps(v)}" for w, v in
                                                  not_202.items() if v) or "none"),
        f"loss: {loss['accepted']:,} events accepted, {loss['events_short']} arrived at fewer "
        f"destinations than answered; duplicates {json.dumps(loss['duplicates'])}; queue "
        f"{'drained' if loss['queue_drained'] else 'NOT drained'}",
        f"history kept: {r['history_after']['events']:,} events, "
        f"{r['history_after']['finished_deliveries']:,} finished deliveries, "
        f"{r['history_after']['delivery_attempts']:,} attempts of "
        f"{r['history_after']['rows_written']:,} written",
    ]
    report.section("Migrations", "Each file as migrate() timed it, and each statement the "
                   "migrator's session was seen running (sampled every 10 ms: 'seconds' is "
                   "from its start to the last sample that saw it active).")
    report.table(["file", "seconds", "start s", "end s"],
                 [[m["name"], m["seconds"], m["start_s"], m["end_s"]] for m in r["migrations"]])
    report.table(["began", "seconds", "statement"],
                 [[s["began"][11:23], s["seconds"], f"`{s['statement']}`"]
                  for s in r["statements"]])
    report.section("Write-blocking locks the migrator held",
                   "SHARE or stronger on a table the engine reads or writes, each stretch of "
                   "10 ms samples that saw it (at_most: plus two sampling periods).")
    report.table(["lock", "seen ms", "at most ms", "during"],
                 [[h["lock"], round(h["seen_s"] * 1000), round(h["at_most_s"] * 1000),
                   f"`{h['statement']}`"] for h in held])
    report.section("What the engine saw", "Windows: before the migration, while 025 ran, "
                   "while 026 ran, from 026's end until the old engine had drained and "
                   "stopped (SIGTERM sent at once), until this checkout's engine answered on "
                   "its port, and after.")
    report.table(
        ["window", "s", "POST p50 / p99 / max ms", "answers", "deliveries/s",
         "longest delivery gap ms", "engine lock wait max ms"],
        [[w, arrivals[w]["seconds"],
          f"{ingest[w]['p50_ms']} / {ingest[w]['p99_ms']} / {ingest[w]['max_ms']}",
          json.dumps(ingest[w]["outcomes"]), arrivals[w]["per_s"],
          arrivals[w]["longest_gap_ms"], r["engine_lock_waits"][w]["engine"]["max_wait_ms"]]
         for w in ingest])
    report.section("Nothing lost")
    report.table(["check", "value"], [[k, json.dumps(v) if isinstance(v, dict | list) else v]
                                      for k, v in {**loss, **r["history_after"]}.items()])
    report.table(["times", "old engine error line"],
                 [[n, f"`{line}`"] for line, n in r["old_engine_error_lines"].items()])
    fig, ax = figure("Ingest latency and deliveries across the migration")
    points = [(t, ms) for t, ms, _ in r["timeline"]["ingest"]]
    ax.scatter([p[0] for p in points], [max(p[1], 0.1) for p in points], s=3,
               color="tab:blue", label="POST latency ms")
    ax.set_yscale("log")
    ax.set_xlabel("seconds from the migration's start")
    ax.set_ylabel("POST latency ms")
    twin = ax.twinx()
    arrived = r["timeline"]["arrivals_s"]
    if arrived:
        lo, hi = int(min(arrived) * 10), int(max(arrived) * 10) + 1
        counts = [0] * (hi - lo)
        for t in arrived:
            counts[int(t * 10) - lo] += 1
        twin.plot([(lo + i) / 10 for i in range(len(counts))], counts, color="tab:gray",
                  linewidth=0.6, label="deliveries per 100 ms")
        twin.set_ylabel("deliveries per 100 ms")
    for m in r["migrations"]:
        ax.axvspan(m["start_s"], m["end_s"], alpha=0.15, label=m["name"],
                   color="tab:green" if m["name"].startswith("025") else "tab:red")
    ax.legend(loc="upper left")
    report.plot(fig, "partition_migration.png", "POST latency and deliveries")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench partition-migration",
                                     description=__doc__.split("\n\n")[0])
    stack.add_server_arguments(parser)
    parser.add_argument("--rows", type=int, default=1_000_000,
                        help="finished deliveries (each with its event and attempt) written "
                             "before the migration")
    parser.add_argument("--procs", type=int, default=2, help="engine workers")
    old = parser.add_mutually_exclusive_group()
    old.add_argument("--old-engine", type=Path,
                     help="a checkout of the engine before partitions")
    old.add_argument("--old-revision",
                     help="the git revision of the engine before partitions (default: the "
                          f"first parent of the commit that brought {FIRST_PARTITION_FILE})")
    parser.add_argument("--warm-up", type=float, default=10.0,
                        help="seconds of load before the migration")
    parser.add_argument("--after", type=float, default=20.0,
                        help="seconds of load after the new engine answers")
    parser.add_argument("--reports", type=Path, default=REPORTS)
    args = parser.parse_args(argv)
    report = Report("partition-migration", {
        "rows": args.rows, "procs": args.procs, "warm_up_s": args.warm_up,
        "after_s": args.after, "old_engine": str(args.old_engine or args.old_revision or "git"),
        "external_dsn": bool(args.dsn), "stock_pg15": args.stock_pg15}, args.reports)
    try:
        run(args, report)
    except stack.BenchError as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 1
    folder = report.save()
    print("\n".join(f"- {line}" for line in report.headline))
    print(f"report: {folder}/report.md")
    return 0
