"""A delivery worker process: one uvloop event loop around its CurlPools (http/pools.py).

The pipeline: claim a batch (one statement, one short transaction), hand the connection
back, send every claim concurrently, and record outcomes in batches (one statement per
flush, at most FLUSH_INTERVAL_S or FLUSH_SIZE results). No database connection is held
while HTTP is in progress, and nothing costs a query per delivery.

One module per role:
- loop.py: `DeliveryWorker`, the process's loop: it claims, starts each POST the
  dispatcher sends, turns each answer into a result, writes the recorder's batches and
  hands every claim that comes back (from a claim, or refilled by a write) to the
  dispatcher; also the sweep of claims that waited too long, and the drain;
- dispatcher.py: `SlotDispatcher`, the one owner of the claims a worker holds (paced,
  prefetched, waiting for a slot, spares, being sent) and their counts; it decides what
  is sent when and where a freed capped slot goes (a spare, or back to the database);
- slots.py: one destination's slots (requests running, claims waiting, spares), kept by
  the dispatcher;
- claim_policy.py: how many deliveries to claim and when (threshold, prefetch, rechecks),
  and which silent destinations to leave out;
- outcome.py: an HTTP result into a `Result` with its retry time (pure);
- recorder.py: result batching and flush timing; each write, retried through outages,
  returns the claims it brought back (refilled slots, spares);
- connection.py: the worker's database connections, reconnecting until the drain
  deadline.
"""

from engine.worker.connection import DatabaseGone
from engine.worker.loop import DeliveryWorker, message_id, run_worker_process

__all__ = ["DatabaseGone", "DeliveryWorker", "message_id", "run_worker_process"]
