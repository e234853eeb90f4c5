"""`python -m bench claim-cost`: the cost of one claim (queue_async.claim_batch, the
worker's own call on a worker's connection) in three queues, without HTTP or workers:

- one-tenant: one tenant, 200,000 due deliveries over 10 destinations;
- two-tenants: that backlog, and a second tenant with 200 fresh deliveries (newest);
- 10k-tenants: 10,000 tenants x 3 destinations, two due deliveries each (60,000).

Each claim takes --limit rows (default 50 and 500 in turn) and is committed; its
deliveries stay in flight. At most half the queue is claimed, so the last claim measured
still finds it full. Reported
per claim and per delivery claimed: wall time at the client (round trips included), and
the CPU the claim's server backend used (utime + stime from /proc, same machine), the
median and p90 over --claims claims after --warmup. Also: how many claims it took until
the second tenant's 200 deliveries were all claimed (two-tenants), and how many distinct
tenants a claim served (10k-tenants).

A/B: `--engine-tree PATH` imports the engine from PATH (a checkout or worktree, e.g. the
main branch before a change) instead of this one, so the same script measures both sides
on the same server settings. Run each side as its own command, alternating.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psycopg

SCENARIOS = ("one-tenant", "two-tenants", "10k-tenants")
BACKLOG = 200_000
BACKLOG_DESTINATIONS = 10
SMALL_TENANT_ROWS = 200
MANY_TENANTS = 10_000
DESTINATIONS_PER_TENANT = 3
DUE_PER_DESTINATION = 2
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Measured:
    scenario: str
    limit: int
    claims: int
    claimed: int
    wall_ms_median: float
    wall_ms_p90: float
    backend_cpu_ms_per_claim: float
    wall_us_per_delivery: float
    backend_cpu_us_per_delivery: float
    claims_until_small_tenant_done: int | None
    tenants_per_claim_median: float
    # The fill's INSERT of the deliveries, per row: what each index on deliveries costs
    # a write (one statement; a rough gauge, not the enqueue path).
    insert_us_per_delivery: float


def fill_sql(scenario: str) -> list[str]:
    """The statements that fill a fresh migrated database for `scenario`."""
    secret = "'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw'"
    backlog = [
        "INSERT INTO destinations (url, secret, tenant_id)"
        f" SELECT 'http://127.0.0.1:9/' || g, {secret}, 1"
        f" FROM generate_series(1, {BACKLOG_DESTINATIONS}) g",
        "INSERT INTO events (type, payload, delivery_count, tenant_id)"
        f" SELECT 'order.created', '{{}}', 1, 1 FROM generate_series(1, {BACKLOG})",
        "INSERT INTO deliveries (event_id, created_at, destination_id, tenant_id,"
        " next_attempt_at)"
        f" SELECT e.id, e.created_at, 1 + e.id % {BACKLOG_DESTINATIONS}, 1,"
        "        now() - interval '1 hour' + e.id * interval '1 ms' FROM events e",
    ]
    if scenario == "one-tenant":
        return backlog
    if scenario == "two-tenants":
        return [*backlog,
                "INSERT INTO tenants (uid) VALUES ('small')",
                f"INSERT INTO destinations (url, secret, tenant_id) VALUES ('http://127.0.0.1:9/b',"
                f" {secret}, 2)",
                "INSERT INTO events (type, payload, delivery_count, tenant_id)"
                " SELECT 'order.created', '{}', 1, 2"
                f" FROM generate_series(1, {SMALL_TENANT_ROWS})",
                "INSERT INTO deliveries (event_id, created_at, destination_id, tenant_id,"
                " next_attempt_at)"
                f" SELECT e.id, e.created_at, {BACKLOG_DESTINATIONS + 1}, 2,"
                " now() - interval '1 second'"
                " FROM events e WHERE e.tenant_id = 2"]
    return [
        f"INSERT INTO tenants (uid) SELECT 't' || g FROM generate_series(1, {MANY_TENANTS}) g",
        "INSERT INTO destinations (url, secret, tenant_id)"
        f" SELECT 'http://127.0.0.1:9/' || t.id || '/' || k, {secret}, t.id"
        f" FROM tenants t, generate_series(1, {DESTINATIONS_PER_TENANT}) k"
        " WHERE t.id > 1 ORDER BY t.id, k",
        "INSERT INTO events (type, payload, delivery_count, tenant_id)"
        f" SELECT 'order.created', '{{}}', 1, tenant_id FROM destinations,"
        f" generate_series(1, {DUE_PER_DESTINATION}) ORDER BY id",
        # Due over the last 30 s in random order across tenants, as traffic spread over
        # them leaves it.
        "INSERT INTO deliveries (event_id, created_at, destination_id, tenant_id,"
        " next_attempt_at)"
        " SELECT e.id, e.created_at, 1 + (e.id - 1) / 2, e.tenant_id,"
        " now() - random() * interval '30 s'"
        " FROM events e",
    ]


def fill(dsn: str, scenario: str) -> float:
    """Fill the queue for `scenario`; returns the INSERTs of deliveries' time per row."""
    inserting_s = 0.0
    with psycopg.connect(dsn, autocommit=True) as conn:
        for statement in fill_sql(scenario):
            started = time.perf_counter()
            conn.execute(statement)  # type: ignore[arg-type]
            if statement.startswith("INSERT INTO deliveries"):
                inserting_s += time.perf_counter() - started
        conn.execute("VACUUM (ANALYZE)")
        rows = conn.execute("SELECT count(*) FROM deliveries").fetchone()
    assert rows is not None
    return round(inserting_s / rows[0] * 1e6, 2)


def backend_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime


async def measure(dsn: str, scenario: str, limit: int, claims: int, warmup: int,
                  insert_us: float) -> Measured:
    from engine.db import queue_async
    from engine.observe.oplog import Outage
    from engine.worker.connection import connect

    def never_give_up() -> None:
        """connect()'s `give_up`: nothing here drains."""

    conn = await connect(dsn, "claim-cost", listen=False, outage=Outage("worker"),
                         give_up=never_give_up)
    cursor_kwargs: dict[str, Any] = {}
    if hasattr(queue_async, "TenantCursor"):  # an engine from before has no fair share
        cursor_kwargs["tenant_cursor"] = queue_async.TenantCursor()
    with psycopg.connect(dsn, autocommit=True) as reader:
        tenant_of = dict(reader.execute("SELECT id, tenant_id FROM deliveries").fetchall())
    pid = conn.info.backend_pid
    walls: list[float] = []
    cpus: list[float] = []
    claimed = 0
    small_left = SMALL_TENANT_ROWS
    small_done: int | None = None
    tenants_served: list[int] = []
    for n in range(warmup + claims):
        cpu_before = backend_cpu_s(pid)
        started = time.perf_counter()
        got = await queue_async.claim_batch(conn, "claim-cost", limit, 60_000, limit // 4,
                                            (), **cursor_kwargs)
        wall = time.perf_counter() - started
        cpu = backend_cpu_s(pid) - cpu_before
        tenants = [tenant_of[c.id] for c in got]
        if scenario == "two-tenants":
            small_left -= sum(1 for t in tenants if t == 2)
            if small_left == 0 and small_done is None:
                small_done = n + 1
        if n >= warmup:
            walls.append(wall)
            cpus.append(cpu)
            claimed += len(got)
            tenants_served.append(len(set(tenants)))
    await conn.close()
    if claimed == 0:
        # A claim that returns nothing measures nothing (the fill's deliveries must carry
        # their event's created_at, which the claim joins on: schema/026).
        raise SystemExit(f"{scenario}: {claims} claims of {limit} returned no row")
    total_wall, total_cpu = sum(walls), sum(cpus)
    return Measured(
        scenario=scenario, limit=limit, claims=claims, claimed=claimed,
        wall_ms_median=round(statistics.median(walls) * 1e3, 3),
        wall_ms_p90=round(statistics.quantiles(walls, n=10)[-1] * 1e3, 3),
        backend_cpu_ms_per_claim=round(total_cpu / claims * 1e3, 3),
        wall_us_per_delivery=round(total_wall / max(claimed, 1) * 1e6, 2),
        backend_cpu_us_per_delivery=round(total_cpu / max(claimed, 1) * 1e6, 2),
        claims_until_small_tenant_done=small_done,
        tenants_per_claim_median=statistics.median(tenants_served),
        insert_us_per_delivery=insert_us,
    )


def tree_commit(path: Path) -> str:
    return subprocess.run(["git", "-C", str(path), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True, check=False).stdout.strip()


def run(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench claim-cost",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenario", choices=SCENARIOS, action="append",
                        help="repeatable; default: all three")
    parser.add_argument("--limit", type=int, action="append",
                        help="rows per claim, repeatable; default: 50 and 500")
    parser.add_argument("--claims", type=int, default=200, help="claims measured per run")
    parser.add_argument("--warmup", type=int, default=10, help="claims before measuring")
    parser.add_argument("--json", type=Path, help="also write the results here")
    from bench.harness import stack

    stack.add_server_arguments(parser)
    args = parser.parse_args(argv)
    from engine.db import queue_async

    tree = Path(queue_async.__file__).resolve().parents[2]
    results: list[Measured] = []
    print(f"engine from {tree} at {tree_commit(tree)}")
    with stack.server(args.dsn, stock_pg15_cluster=args.stock_pg15) as admin_dsn:
        for scenario in args.scenario or SCENARIOS:
            for limit in args.limit or (50, 500):
                rows = (MANY_TENANTS * DESTINATIONS_PER_TENANT * DUE_PER_DESTINATION
                        if scenario == "10k-tenants" else BACKLOG)
                claims = min(args.claims, rows // 2 // limit - args.warmup)
                if claims < 10:
                    raise SystemExit(f"{scenario}: --limit {limit} --warmup {args.warmup}"
                                     f" leaves fewer than 10 claims in half of {rows} rows")
                with stack.fresh_database(admin_dsn, "claim_cost") as dsn:
                    insert_us = fill(dsn, scenario)
                    measured = asyncio.run(
                        measure(dsn, scenario, limit, claims, args.warmup, insert_us))
                results.append(measured)
                print(json.dumps(asdict(measured)))
    if args.json:
        args.json.write_text(json.dumps(
            {"engine_tree": str(tree), "commit": tree_commit(tree),
             "results": [asdict(m) for m in results]}, indent=2) + "\n")
    return 0


def main(argv: Sequence[str]) -> int:
    """`--engine-tree PATH` must take effect before anything imports the engine."""
    rest = list(argv)
    if "--engine-tree" in rest:
        at = rest.index("--engine-tree")
        tree = rest[at + 1]
        del rest[at:at + 2]
        if "engine" in sys.modules:
            raise SystemExit("--engine-tree: the engine is imported already; run"
                             " python -m bench.harness.claim_cost --engine-tree PATH ...")
        sys.path.insert(0, tree)
    return run(rest)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
