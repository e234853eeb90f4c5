"""Client load for the database-fault tests: what a well-behaved API client does during an
outage (retry each event with its Idempotency-Key until it is accepted), and what a load
balancer sees (/healthz polled), every answer timed, so the tests can tell what was
accepted, how fast refusals came and when service came back."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import psycopg

from engine.testing.ingress_server import IngressProcess


@dataclass
class Sample:
    sent: float  # monotonic
    seconds: float
    status: int  # 0: no HTTP answer (connection refused or reset)


@dataclass
class FaultLoad:
    client: IngressProcess
    destination_id: int
    pace_s: float = 0.02
    # /healthz is polled this often, so that the first 200 after an outage is seen within
    # this much of when it became possible (tests assert a bound of a fraction of a second).
    health_poll_s: float = 0.025
    reads_poll_s: float = 0.05
    accepted: dict[str, int] = field(default_factory=dict)  # idempotency key -> event id
    posts: list[Sample] = field(default_factory=list)
    reads: list[Sample] = field(default_factory=list)
    health: list[Sample] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._post_loop, daemon=True),
            threading.Thread(target=self._poll_loop,
                             args=(self.health, "/healthz", self.health_poll_s), daemon=True),
            threading.Thread(target=self._poll_loop,
                             args=(self.reads, "/v1/deliveries?limit=1", self.reads_poll_s),
                             daemon=True),
        ]

    def start(self) -> FaultLoad:
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        """Stops sending new events; the one being retried is retried until accepted."""
        self._stop.set()
        for thread in self._threads:
            thread.join(120)
            assert not thread.is_alive(), "the load did not finish"

    def _timed(self, method: str, path: str, body: object = None,
               headers: dict[str, str] | None = None) -> tuple[Sample, object]:
        sent = time.monotonic()
        try:
            answer = self.client.request(method, path, body, headers=headers, timeout=30)
        except OSError:
            return Sample(sent, time.monotonic() - sent, 0), None
        return Sample(sent, time.monotonic() - sent, answer.status), answer

    def _post_loop(self) -> None:
        number = 0
        while not self._stop.is_set():
            number += 1
            key = f"fault-{number}"
            event = {"type": "t", "payload": {"n": number},
                     "destination_ids": [self.destination_id]}
            while True:  # until accepted, even after stop(): a client does not give up
                sample, answer = self._timed("POST", "/v1/events", event,
                                             {"Idempotency-Key": key})
                self.posts.append(sample)
                if sample.status == 202:
                    self.accepted[key] = answer.json()["id"]  # type: ignore[union-attr]
                    break
                time.sleep(self.pace_s)
            time.sleep(self.pace_s)

    def _poll_loop(self, samples: list[Sample], path: str, every_s: float) -> None:
        while not self._stop.is_set():
            sample, _ = self._timed("GET", path)
            samples.append(sample)
            time.sleep(every_s)

    def wait_accepted(self, count: int, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        start = len(self.accepted)
        while len(self.accepted) < start + count:
            assert time.monotonic() < deadline, f"fewer than {count} events accepted"
            time.sleep(0.05)


def first_ok_after(samples: list[Sample], ok: int, moment: float) -> float | None:
    """Seconds from `moment` to the first answer `ok` sent at or after it."""
    for sample in samples:
        if sample.sent >= moment and sample.status == ok:
            return sample.sent + sample.seconds - moment
    return None


class DatabaseWatch:
    """When the database accepts connections again: a thread connects every `every_s`
    from start() on and keeps the time of the first success after a failure (the moment
    a restarted or refusing server came back), then stops; `stop()` ends it otherwise."""

    def __init__(self, dsn: str, every_s: float = 0.02) -> None:
        self.dsn = dsn
        self.every_s = every_s
        self.failed_at: float | None = None  # monotonic, the first failed connect
        self.back_at: float | None = None  # monotonic, the first success after it
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def start(self) -> DatabaseWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        assert not self._thread.is_alive(), "the database watch did not finish"

    def _watch(self) -> None:
        while not self._stop.is_set():
            tried = time.monotonic()
            try:
                psycopg.connect(self.dsn, connect_timeout=2).close()
            except psycopg.OperationalError:
                if self.failed_at is None:
                    self.failed_at = tried
            else:
                if self.failed_at is not None:
                    self.back_at = time.monotonic()
                    return
            self._stop.wait(self.every_s)
