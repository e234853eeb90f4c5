"""The history retention of whichever engine PYTHONPATH names, driven on a compressed clock
(the bloat scenario's --history variants).

    PYTHONPATH=<engine tree> python bench/harness/retention_driver.py DSN \
        --start-days K --day-seconds S [--every 5]

Every --every seconds, until SIGTERM, this runs the engine's own retention job once with
retention_days = K - (seconds since start) / S: one day of history passes retention every S
seconds. The job is the engine tree's own: from schema/026 on, the partition job
(engine/maintenance/partitions.py: drops the day partitions wholly past the cutoff, and
creates ahead), before it the batch deletes of engine/maintenance/retention.py (finished
deliveries with their attempts, then events, 1,000 rows a transaction). Both run as the
maintenance leader runs them (their settings' batch and budget) on one connection. Prints
one JSON line per run: seconds since start, the retention applied, how long the run took,
and the job's report.

Run as a file, not a module: it imports `engine` from PYTHONPATH only, so one bench process
can drive an engine of another checkout (the one from before partitions).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from dataclasses import asdict

import psycopg


def job(conn: psycopg.Connection, retention_days: float) -> tuple[str, dict[str, object]]:
    """Run the tree's history retention once: (its name, its report)."""
    try:
        from engine.maintenance import partitions
    except ImportError:  # an engine from before partitioned history
        from engine.maintenance import retention

        settings = retention.RetentionSettings(retention_days)
        return "deletes", asdict(retention.run_retention(
            conn, retention_days, settings.batch, settings.budget_s))
    return "partitions", asdict(partitions.run_partitions(
        conn, partitions.PartitionSettings(retention_days)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dsn")
    parser.add_argument("--start-days", type=float, required=True)
    parser.add_argument("--day-seconds", type=float, required=True)
    parser.add_argument("--every", type=float, default=5.0)
    parser.add_argument("--floor-days", type=float, default=1.5,
                        help="never retain less than this (the soak's own rows stay)")
    args = parser.parse_args()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    started = time.monotonic()
    with psycopg.connect(args.dsn, autocommit=True,
                         application_name="engine bench retention") as conn:
        while not stop.is_set():
            at = time.monotonic() - started
            days = max(args.floor_days, args.start_days - at / args.day_seconds)
            began = time.monotonic()
            kind, report = job(conn, days)
            print(json.dumps({"t": round(at, 2), "retention_days": round(days, 4),
                              "ms": round((time.monotonic() - began) * 1000, 1),
                              "job": kind, **report}), flush=True)
            stop.wait(max(0.0, args.every - (time.monotonic() - began)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
