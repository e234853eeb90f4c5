"""Locust load for the ingress API (driven by the throughput and ingress scenarios;
runnable by hand too).

Environment:
  BENCH_MODE      single (POST /v1/events) or batch (POST /v1/events/batch)
  BENCH_BATCH     events per batch request (batch mode), default 1000
  BENCH_USER_RPS  requests per second per user (0: as fast as possible), default 0
  BENCH_TOKEN     bearer token, if the server wants one
  BENCH_PAYLOAD   payload size in bytes, default 1024

  locust -f bench/harness/locustfile.py --headless -u 50 -r 50 -t 30s -H http://127.0.0.1:8080
"""

from __future__ import annotations

import json
import os
import random

import gevent
from locust import constant, constant_throughput, task
from locust.contrib.fasthttp import FastHttpUser

MODE = os.environ.get("BENCH_MODE", "single")
BATCH = int(os.environ.get("BENCH_BATCH", "1000"))
USER_RPS = float(os.environ.get("BENCH_USER_RPS", "0"))
TOKEN = os.environ.get("BENCH_TOKEN")
PAYLOAD_BYTES = int(os.environ.get("BENCH_PAYLOAD", "1024"))

_PAYLOAD = {"order": 42, "note": "x" * max(0, PAYLOAD_BYTES - 30)}
_EVENT = {"type": "order.created", "payload": _PAYLOAD}
SINGLE_BODY = json.dumps(_EVENT).encode()
BATCH_BODY = json.dumps({"events": [_EVENT] * BATCH}).encode()
HEADERS = {"content-type": "application/json"}
if TOKEN:
    HEADERS["authorization"] = f"Bearer {TOKEN}"


class IngressUser(FastHttpUser):
    wait_time = constant_throughput(USER_RPS) if USER_RPS > 0 else constant(0)
    # One connection per user, kept alive, as a real producer would.
    concurrency = 1

    def on_start(self) -> None:
        # Producers are not synchronised: each user starts at a random point of its
        # period. Users spawned together otherwise fire in bursts, and each request's
        # time then includes locust handling the rest of its burst (locust's own floor
        # against noop_server.mjs with and without the offset:
        # bench/results/2026-11-30-drain-ingress-sql-rounds.md).
        if USER_RPS > 0:
            gevent.sleep(random.random() / USER_RPS)

    @task
    def post(self) -> None:
        if MODE == "batch":
            path, body, name = "/v1/events/batch", BATCH_BODY, "batch"
        else:
            path, body, name = "/v1/events", SINGLE_BODY, "single"
        with self.client.post(path, data=body, headers=HEADERS, name=name,
                              catch_response=True) as response:
            if response.status_code != 202:
                response.failure(f"status {response.status_code}: {response.text[:200]}")
