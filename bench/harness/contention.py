"""contention: N claiming processes x claim size against one shared backlog, the claim
path alone (the worker's queue_async.claim_batch, then record_results marking every
claimed row delivered; no HTTP), so what is measured is what SKIP LOCKED and the claim
index do under concurrency.

Per cell: claims/s, deliveries/s, rows returned per claim against rows asked (a claimer
that skips rows locked by another comes back short), lock waits sampled every 100 ms from
pg_stat_activity and pg_locks, and claim latency p50/p99 as the claimers timed it."""

from __future__ import annotations

import asyncio
import datetime as dt
import multiprocessing as mp
import time
from pathlib import Path
from typing import Any

import psycopg
import uvloop

from bench.harness import stack
from bench.harness.live import Live
from bench.harness.report import Report, figure
from engine.db import queue, queue_async
from engine.db.database import session_options

PROCS = (1, 2, 4, 8)
SIZES = (1, 10, 50, 200, 500)
DESTINATIONS = 50
LEASE_MS = 60_000
BACKLOG_PER_S = 30_000
WARM_UP_S = 1.0  # one unrecorded cell first: caches, plans and connections warm
PAYLOAD = '{"order": 42, "note": "' + "x" * 200 + '"}'
SQL = Path(__file__).with_name("sql")
FILL_BACKLOG = (SQL / "fill_backlog.sql").read_text()
LOCK_WAITS = (SQL / "lock_waits.sql").read_text()


def claimer(dsn: str, size: int, start_at: float, stop_at: float, out: mp.Queue) -> None:
    """One claiming process: claim, mark delivered, repeat until `stop_at` (monotonic)."""
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        out.put(runner.run(claim_until(dsn, size, start_at, stop_at)))


async def claim_until(dsn: str, size: int, start_at: float, stop_at: float) -> dict[str, Any]:
    """The worker's claim and result write (queue_async.claim_batch, .record_results) on a
    session opened with the worker's options (generic plans, the timeouts)."""
    worker = queue.worker_id("contention")
    latencies: list[float] = []
    claims = rows = 0
    async with await psycopg.AsyncConnection.connect(
            dsn, autocommit=True, options=session_options(dsn)) as conn:
        await conn.execute("SELECT 1")
        while time.monotonic() < start_at:
            await asyncio.sleep(0.001)
        while time.monotonic() < stop_at:
            began = time.perf_counter()
            got = await queue_async.claim_batch(conn, worker, size, LEASE_MS)
            latencies.append(time.perf_counter() - began)
            claims += 1
            rows += len(got)
            if got:
                now = dt.datetime.now(dt.UTC)
                await queue_async.record_results(conn, worker, [
                    queue.Result(c.id, c.attempt, "delivered", now, duration_ms=1,
                                 status_code=200, claim_token=c.claim_token) for c in got])
    return {"claims": claims, "rows": rows, "latencies": latencies}


def run_cell(dsn: str, destinations: list[int], procs: int, size: int, seconds: float
             ) -> dict[str, Any]:
    # More than the fastest cell can take in its seconds, so a cell never runs dry.
    backlog = int(BACKLOG_PER_S * seconds)
    with psycopg.connect(dsn, autocommit=True) as conn:
        stack.run_sql(conn, FILL_BACKLOG, (backlog, destinations, PAYLOAD))
        conn.execute("VACUUM ANALYZE deliveries")
        out: mp.Queue = mp.get_context("fork").Queue()
        start_at = time.monotonic() + 0.5  # every claimer connected before the clock starts
        stop_at = start_at + seconds
        workers = [mp.get_context("fork").Process(
            target=claimer, args=(dsn, size, start_at, stop_at, out)) for _ in range(procs)]
        for w in workers:
            w.start()
        waits: list[tuple[int, int]] = []
        while time.monotonic() < stop_at:
            row = stack.run_sql(conn, LOCK_WAITS)[0]
            if row is not None and time.monotonic() >= start_at:
                waits.append((int(row[0]), int(row[1])))
            time.sleep(0.1)
        results = [out.get(timeout=60) for _ in workers]
        for w in workers:
            w.join(30)
    latencies = sorted(x for r in results for x in r["latencies"])
    claims = sum(r["claims"] for r in results)
    rows = sum(r["rows"] for r in results)

    def quantile_ms(q: float) -> float | None:
        if not latencies:
            return None
        return round(latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1000, 2)

    return {
        "procs": procs, "claim_size": size, "seconds": seconds, "claims": claims,
        "claims_per_s": round(claims / seconds, 1), "deliveries_per_s": round(rows / seconds),
        "rows_per_claim": round(rows / claims, 2) if claims else 0,
        "fill_ratio": round(rows / (claims * size), 3) if claims else 0,
        "claim_p50_ms": quantile_ms(0.5), "claim_p99_ms": quantile_ms(0.99),
        "lock_waiting_mean": round(sum(w for w, _ in waits) / len(waits), 2) if waits else 0,
        "lock_waiting_max": max((w for w, _ in waits), default=0),
        "locks_not_granted_max": max((n for _, n in waits), default=0),
        "lock_samples": len(waits),
    }


def run(admin_dsn: str, args: Any, report: Report, live: Live) -> None:
    seconds = 1.5 if args.quick else 4.0
    grid = [(p, s) for p in PROCS for s in SIZES]
    report.data["settings"] = {"procs": PROCS, "claim_sizes": SIZES, "cell_seconds": seconds,
                               "destinations": DESTINATIONS, "lease_ms": LEASE_MS}
    cells: list[dict[str, Any]] = []
    with stack.fresh_database(admin_dsn, "engine_bench_contention") as dsn:
        report.data["postgres"] = stack.pg_settings(dsn)
        with psycopg.connect(dsn, autocommit=True) as conn:
            destinations = [stack.add_destination(conn, f"http://127.0.0.1:9/c{i}")
                            for i in range(DESTINATIONS)]
        live.phase("warm-up")
        run_cell(dsn, destinations, 2, 50, WARM_UP_S)
        for index, (procs, size) in enumerate(grid, 1):
            live.phase(f"cell {index}/{len(grid)}: {procs} procs x {size}")
            cell = run_cell(dsn, destinations, procs, size, seconds)
            cells.append(cell)
            live.figures(f"{procs}x{size}: {cell['deliveries_per_s']:,}/s, claim p99 "
                         f"{cell['claim_p99_ms']} ms, fill {cell['fill_ratio']:.0%}")
    report.data["cells"] = cells
    write(report, cells)


def write(report: Report, cells: list[dict[str, Any]]) -> None:
    best = max(cells, key=lambda c: c["deliveries_per_s"])
    worst = min(cells, key=lambda c: c["deliveries_per_s"])
    report.data["best"], report.data["worst"] = best, worst
    report.headline += [
        f"best cell: {best['procs']} procs x claim {best['claim_size']}: "
        f"{best['deliveries_per_s']:,} deliveries/s, claim p99 {best['claim_p99_ms']} ms",
        f"worst cell: {worst['procs']} procs x claim {worst['claim_size']}: "
        f"{worst['deliveries_per_s']:,} deliveries/s, claim p99 {worst['claim_p99_ms']} ms",
        f"lowest fill (rows returned / asked): "
        f"{min(c['fill_ratio'] for c in cells):.0%}; most sessions waiting on a lock at "
        f"once: {max(c['lock_waiting_max'] for c in cells)}",
    ]
    report.section("Grid", "Each cell: the claim path alone (claim, then mark delivered, no "
                   "HTTP) for the cell's seconds against a backlog topped up before it. "
                   "Fill = rows returned / rows asked: below 100 % means claimers came back "
                   "short (skipped rows others held, or the backlog ran low).")
    report.table(
        ["procs", "claim size", "claims/s", "deliveries/s", "rows/claim", "fill",
         "claim p50 ms", "claim p99 ms", "lock waiters mean / max", "not granted max"],
        [[c["procs"], c["claim_size"], c["claims_per_s"], c["deliveries_per_s"],
          c["rows_per_claim"], f"{c['fill_ratio']:.0%}", c["claim_p50_ms"], c["claim_p99_ms"],
          f"{c['lock_waiting_mean']} / {c['lock_waiting_max']}", c["locks_not_granted_max"]]
         for c in cells])
    heat_map(report, cells, "deliveries_per_s", "Deliveries/s by claimers x claim size",
             "deliveries/s", "contention_heatmap.png", "{:,.0f}")
    heat_map(report, cells, "claim_p99_ms", "Claim latency p99 (ms) by claimers x claim size",
             "ms", "contention_claim_p99.png", "{:.1f}")


def heat_map(report: Report, cells: list[dict[str, Any]], key: str, title: str, unit: str,
             name: str, fmt: str) -> None:
    grid = [[next(c[key] or 0 for c in cells if c["procs"] == p and c["claim_size"] == s)
             for s in SIZES] for p in PROCS]
    fig, ax = figure(title, size=(7.5, 4.2))
    ax.grid(False)
    image = ax.imshow(grid, cmap="viridis", aspect="auto", origin="lower", vmin=0)
    ax.set_xticks(range(len(SIZES)), [str(s) for s in SIZES])
    ax.set_yticks(range(len(PROCS)), [str(p) for p in PROCS])
    ax.set_xlabel("claim size (rows asked per claim)")
    ax.set_ylabel("claiming processes")
    top = max(max(row) for row in grid) or 1
    for y, row in enumerate(grid):
        for x, value in enumerate(row):
            ax.text(x, y, fmt.format(value), ha="center", va="center",
                    color="black" if value > 0.6 * top else "white", fontsize=9)
    fig.colorbar(image, ax=ax, label=unit)
    report.plot(fig, name, title)
