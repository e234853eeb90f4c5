"""bench/drain.py's destination mixes, and reading what the fake destination saw of every
drained destination: many-destinations (1,000 destinations, about half capped at 10-50)
and capped-slow (100 destinations capped at 5, answering after 100 ms), each checked for a
cap ever exceeded."""

from __future__ import annotations

import random
from typing import Any, NamedTuple

from engine.testing.fakedest import FakeDestination

# Destination mixes (see mix_targets): name -> (deliveries, destinations).
MIXES = {
    # 1,000 destinations answering at once, about half of them capped at 10-50: with the
    # caps far from binding, the rate should stay near drain-fast's.
    "many-destinations": (20_000, 1_000),
    # 100 destinations capped at 5, each answering after 100 ms: the caps bind, and the
    # ceiling is 100 x 5 / 0.1 s = 5,000 deliveries/s.
    "capped-slow": (10_000, 100),
}
CAPPED_SLOW_CAP = 5
CAPPED_SLOW_CEILING = 5_000  # deliveries/s: 100 destinations x 5 slots / 100 ms
MIX_SEED = 12  # the same caps on every run


class Target(NamedTuple):
    """One destination of a run: its fake destination path (whose last part, under
    "drain", names it at the fake destination), its max_in_flight, its deliveries."""

    path: str
    cap: int | None
    count: int


def mix_targets(name: str, count: int | None) -> list[Target]:
    total, destinations = MIXES[name]
    total = count or total
    rng = random.Random(MIX_SEED)
    found = []
    for k in range(destinations):
        share = total // destinations + (1 if k < total % destinations else 0)
        if name == "capped-slow":
            found.append(Target(f"slow/100/drain/{k}", CAPPED_SLOW_CAP, share))
        else:
            cap = rng.randint(10, 50) if rng.random() < 0.5 else None
            found.append(Target(f"fast/drain/{k}", cap, share))
    return [t for t in found if t.count > 0]


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


def cap_report(watched_names: dict[str, dict[str, Any]], run: list[Target]) -> dict[str, Any]:
    """Whether any capped destination ever had more requests open at once than its cap,
    as the fake destination counted them, and how many had as many as their cap: a cap
    that was reached was binding, so a run with it measures the cap's ceiling as well
    as its cost (drain-slow with --cap 2000 reaches it on 2 x 1,024 slots)."""
    capped = [t for t in run if t.cap is not None]
    over = {}
    reached = 0
    for target in capped:
        name = target.path[target.path.index("drain"):]
        seen = int(watched_names.get(name, {}).get("max_concurrent", 0))
        if seen > target.cap:
            over[name] = {"cap": target.cap, "max_concurrent": seen}
        if seen >= target.cap:
            reached += 1
    return {
        "capped_destinations": len(capped),
        "caps": sorted({t.cap for t in capped}),
        "caps_reached": reached,
        "cap_ever_exceeded": bool(over),
        "caps_exceeded": over,
    }
