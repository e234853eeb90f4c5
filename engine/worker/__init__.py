"""A delivery worker process: one uvloop event loop around its CurlPools (http_pools.py).

The pipeline: claim a batch (one statement, one short transaction), hand the connection
back, send every claim concurrently, and record outcomes in batches (one statement per
flush, at most FLUSH_INTERVAL_S or FLUSH_SIZE results). No database connection is held
while HTTP is in progress, and nothing costs a query per delivery.

One module per role:
- loop.py: `DeliveryWorker`, its lifecycle (run, drain) and the wiring of the others:
  the claim loop, sending, and the sweep of claims that waited too long;
- claim_policy.py: how many deliveries to claim and when (threshold, prefetch, the
  unrecorded-results bound, rechecks), and which silent destinations to leave out;
- slots.py: per-destination concurrency (max_in_flight) and the claims waiting for it;
- outcome.py: an HTTP result into a `Result` with its retry time (pure);
- recorder.py: result batching, flush timers and recording through outages;
- connection.py: the worker's database connections and reconnecting.
"""

from engine.worker.connection import DatabaseGone
from engine.worker.loop import DeliveryWorker, message_id, run_worker_process

__all__ = ["DatabaseGone", "DeliveryWorker", "message_id", "run_worker_process"]
