"""What `engine demo` shows: a live rich view on a terminal, plain progress lines
otherwise, and the closing summary. It reads everything from the database."""

from __future__ import annotations

import datetime as dt
import time
from collections import deque
from dataclasses import dataclass, field

import psycopg
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from engine.db import queries
from engine.db.sql_params import DemoAttemptsParams, DestinationIdsParams

RECENT_ATTEMPTS = 8
RECENT_CHANGES = 6


@dataclass
class DestinationRow:
    name: str
    id: int
    breaker: str
    disabled: bool
    paused_until: dt.datetime | None
    failures: int
    waiting: int
    retrying: int
    in_flight: int
    delivered: int
    dead: int

    @property
    def accepted(self) -> int:
        """Deliveries made for it: one per event it was subscribed to."""
        return self.waiting + self.retrying + self.in_flight + self.delivered + self.dead

    @property
    def state(self) -> str:
        return "disabled" if self.disabled else self.breaker


@dataclass
class Snapshot:
    elapsed_s: float
    accepted: int
    rows: list[DestinationRow]
    attempts: list[tuple]
    delivered_per_s: float

    @property
    def delivered(self) -> int:
        return sum(r.delivered for r in self.rows)


@dataclass
class Watcher:
    """Reads the demo's destinations and attempts, and notices state changes."""

    conn: psycopg.Connection
    names: dict[int, str]  # destination id -> behaviour name
    started: float = field(default_factory=time.monotonic)
    changes: deque[str] = field(default_factory=lambda: deque(maxlen=RECENT_CHANGES))
    unprinted: list[str] = field(default_factory=list)  # for the plain progress lines
    _states: dict[int, str] = field(default_factory=dict)
    _rates: deque[tuple[float, int]] = field(default_factory=lambda: deque(maxlen=10))

    def snapshot(self, accepted: int) -> Snapshot:
        ids = list(self.names)
        rows = [DestinationRow(self.names[r[0]], *r) for r in queries.DEMO_DESTINATIONS.run_sync(
            self.conn, DestinationIdsParams(destination_ids=ids)).fetchall()]
        attempts = queries.DEMO_ATTEMPTS.run_sync(
            self.conn, DemoAttemptsParams(destination_ids=ids, limit=RECENT_ATTEMPTS)).fetchall()
        now = time.monotonic()
        for row in rows:
            before = self._states.get(row.id)
            if before is not None and before != row.state:
                change = f"{now - self.started:5.1f}s  {row.name}: {before} -> {row.state}"
                self.changes.append(change)
                self.unprinted.append(change)
            self._states[row.id] = row.state
        delivered = sum(r.delivered for r in rows)
        self._rates.append((now, delivered))
        first_t, first_n = self._rates[0]
        rate = (delivered - first_n) / (now - first_t) if now > first_t else 0.0
        return Snapshot(now - self.started, accepted, rows, attempts, rate)


def _outcome(status_code: int | None, error: str | None) -> Text:
    if status_code is not None and 200 <= status_code < 300:
        return Text(str(status_code), style="green")
    if status_code is not None:
        return Text(str(status_code), style="red" if status_code != 410 else "magenta")
    return Text((error or "error")[:48], style="red")


_STATE_STYLE = {"closed": "green", "open": "red", "half_open": "yellow", "disabled": "magenta"}


def destination_table(snapshot: Snapshot, title: str | None = None) -> Table:
    table = Table(title=title, title_justify="left", expand=False)
    for name in ("destination", "breaker", "accepted", "waiting", "retrying", "in flight",
                 "delivered", "dead"):
        table.add_column(name, justify="left" if name in ("destination", "breaker")
                         else "right")
    for row in snapshot.rows:
        table.add_row(row.name, Text(row.state, style=_STATE_STYLE.get(row.state, "")),
                      str(row.accepted), str(row.waiting), str(row.retrying), str(row.in_flight),
                      str(row.delivered), str(row.dead))
    return table


def live_view(snapshot: Snapshot, watcher: Watcher, duration_s: float, api: str) -> Group:
    head = Text.assemble(
        ("engine demo", "bold"), f"  {snapshot.elapsed_s:4.0f} / {duration_s:.0f} s   ",
        f"accepted {snapshot.accepted} events   delivered {snapshot.delivered}   ",
        f"{snapshot.delivered_per_s:.1f} deliveries/s   API {api}   Ctrl-C stops",
    )
    attempts = Table(title="last attempts", title_justify="left", expand=False)
    for name in ("time", "destination", "delivery", "attempt", "answer", "ms"):
        attempts.add_column(name)
    for started_at, destination_id, delivery_id, attempt, code, ms, error in snapshot.attempts:
        attempts.add_row(started_at.astimezone(dt.UTC).strftime("%H:%M:%S"),
                         watcher.names.get(destination_id, str(destination_id)),
                         str(delivery_id), str(attempt), _outcome(code, error),
                         "-" if ms is None else str(ms))
    parts: list = [head, destination_table(snapshot), attempts]
    if watcher.changes:
        parts.append(Text("breaker and state changes\n" + "\n".join(watcher.changes)))
    return Group(*parts)


def progress_line(snapshot: Snapshot) -> str:
    parts = [f"{r.name} {r.state} {r.delivered}/{r.retrying}/{r.dead}" for r in snapshot.rows]
    return (f"{snapshot.elapsed_s:5.1f}s accepted={snapshot.accepted} "
            f"delivered={snapshot.delivered} ({snapshot.delivered_per_s:.1f}/s) | "
            "delivered/retrying/dead: " + ", ".join(parts))


def print_summary(console: Console, snapshot: Snapshot, where: str) -> None:
    dead = sum(r.dead for r in snapshot.rows)
    retrying = sum(r.retrying for r in snapshot.rows)
    console.print(destination_table(snapshot, title="engine demo: summary"))
    console.print(
        f"{snapshot.accepted} events accepted, {snapshot.delivered} deliveries delivered, "
        f"{retrying} retrying, {dead} dead, in {snapshot.elapsed_s:.0f} s."
    )
    console.print(
        f"Where to look next (the demo's data stays in the {where}):\n"
        "  engine status                        queue depth, breakers, table health\n"
        "  engine destinations list             the demo's destinations\n"
        "  engine deliveries --status pending   what is waiting to be retried\n"
        "  engine deliveries show ID            one delivery and its attempts\n"
        "  engine --allow-private-targets       the engine with its API on :8080,\n"
        "                                       /console in a browser\n"
        "  bench/run.sh throughput              how fast it goes on this machine"
    )
