"""Watching a drain from the fake destination's side and reporting it (the drain scenarios
and peers): when the first delivery arrived and the last, the rate between them,
duplicates, concurrency, the arrivals' shape, and the CPU each part (engine, PostgreSQL,
destination, a peer) spent per delivery from the first delivery on."""

from __future__ import annotations

import itertools
import statistics
import subprocess
import time
from typing import Any, NamedTuple

from bench.harness.stack import tree_cpu
from engine.testing.fakedest import FakeDestination

TIMEOUT_S = 300.0


def drain_names(stats: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The fake destination's counters of every drained name ("drain", "drain/<k>")."""
    return {name: counters for name, counters in stats["names"].items()
            if name == "drain" or name.startswith("drain/")}


def drain_stats(dest: FakeDestination) -> dict[str, Any]:
    """The counters of every drained destination, summed; per name under "names"."""
    names = drain_names(dest.stats())
    if not names:
        return {}
    summed: dict[str, Any] = {key: sum(int(n.get(key, 0)) for n in names.values())
                              for key in ("requests", "delivered_ids", "duplicates")}
    summed["first_request_ms"] = min(int(n["first_request_ms"]) for n in names.values())
    summed["last_request_ms"] = max(int(n["last_request_ms"]) for n in names.values())
    summed["max_concurrent"] = max(int(n.get("max_concurrent", 0)) for n in names.values())
    summed["names"] = names
    return summed


def cpu_delta(before: dict[int, float], after: dict[int, float]) -> float:
    return sum(value - before.get(pid, 0.0) for pid, value in after.items())


class Watched(NamedTuple):
    stats: dict[str, Any]  # the fake destination's counters for the drained name
    cpu_s: dict[str, float]  # CPU seconds per part, from the first delivery on
    delivered_before: int  # delivered when CPU counting began
    arrivals_ms: list[int]


def watch_drain(
    dest: FakeDestination, count: int, parts: dict[str, list[int]],
    senders: list[subprocess.Popen[bytes]],
) -> Watched:
    """Wait until the destination has `count` deliveries for "drain"; CPU of each part's
    process trees counted from the first delivery on: start-up (imports, migrations,
    forks) is not per-delivery work. RuntimeError if a sender exits first."""
    deadline = time.monotonic() + TIMEOUT_S

    def check_senders() -> None:
        if any(sender.poll() is not None for sender in senders):
            codes = [sender.poll() for sender in senders]
            raise RuntimeError(f"a sending process exited before the drain was done: {codes}")

    while time.monotonic() < deadline and not drain_stats(dest).get("requests"):
        check_senders()
        time.sleep(0.005)
    before = parts_cpu(parts)
    delivered_before = int(drain_stats(dest).get("delivered_ids", 0))
    stats: dict[str, Any] = {}
    while time.monotonic() < deadline:
        stats = drain_stats(dest)
        if int(stats.get("delivered_ids", 0)) >= count:
            break
        check_senders()
        # Many names make each poll a large document for the destination to write.
        time.sleep(0.1 if len(stats.get("names", ())) <= 1 else 0.5)
    after = parts_cpu(parts)
    cpu_s = {part: cpu_delta(before[part], after[part]) for part in parts}
    # Arrival times are fetched per name: for the single-destination scenarios only.
    names = list(stats.get("names", ()))
    arrivals = sorted(dest.arrivals(names[0]).values()) if len(names) == 1 else []
    return Watched(stats, cpu_s, delivered_before, arrivals)


def parts_cpu(parts: dict[str, list[int]]) -> dict[str, dict[int, float]]:
    return {part: tree_cpu(pids) for part, pids in parts.items()}


def drain_report(watched: Watched) -> dict[str, object]:
    """What the destination saw: rate from its first to its last request, duplicates,
    concurrency, the arrivals' shape (a ramp, a stall or bursts show here, not in the
    rate) and CPU per delivery of each part."""
    stats = watched.stats
    delivered = int(stats.get("delivered_ids", 0))
    span_s = (int(stats["last_request_ms"]) - int(stats["first_request_ms"])) / 1000
    per_delivery = 1e6 / max(delivered - watched.delivered_before, 1)
    return {
        "delivered_at_destination": delivered,
        "duplicates": stats.get("duplicates"),
        "span_s": round(span_s, 3),
        "deliveries_per_s": round(delivered / span_s) if span_s > 0 else None,
        "max_in_flight_at_destination": stats.get("max_concurrent"),
        **arrival_timeline(watched.arrivals_ms),
        "cpu_s": {part: round(seconds, 2) for part, seconds in watched.cpu_s.items()},
        "cpu_us_per_delivery": {
            part: round(seconds * per_delivery, 1) for part, seconds in watched.cpu_s.items()
        },
    }


def arrival_timeline(arrivals_ms: list[int]) -> dict[str, object]:
    """First arrivals per 50 ms from the first one on, and the longest gap between two."""
    if not arrivals_ms:
        return {"arrivals_per_50ms": [], "longest_arrival_gap_ms": None}
    buckets = [0] * ((arrivals_ms[-1] - arrivals_ms[0]) // 50 + 1)
    for at in arrivals_ms:
        buckets[(at - arrivals_ms[0]) // 50] += 1
    gaps = [b - a for a, b in itertools.pairwise(arrivals_ms)]
    return {"arrivals_per_50ms": buckets, "longest_arrival_gap_ms": max(gaps, default=0)}


def summary(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """Each run's deliveries/s and the medians of a repeated scenario."""
    rates = [int(r["deliveries_per_s"]) for r in reports]
    cpu = {
        part: round(statistics.median(r["cpu_us_per_delivery"][part] for r in reports), 1)
        for part in ("engine", "postgres", "destination")
    }
    return {
        "deliveries_per_s": rates, "median_deliveries_per_s": statistics.median(rates),
        "median_cpu_us_per_delivery": cpu,
        "duplicates": sum(int(r["duplicates"] or 0) for r in reports),
        "left_in_queue": sum(int(r["left_in_queue"] or 0) for r in reports),
    }
