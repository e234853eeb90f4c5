"""The maintenance process: one leader per cluster runs the housekeeping jobs.

Every host may run one; the holder of the leader lock (leader.py) does the work and the
others poll to take over (loop.py). One module per job, each the same shape: a settings
dataclass, `run_once(conn, settings, ...)` returning a report of what it did, run by the
loop every `settings.interval_s`, each in bounded batches of short transactions:
- reaper.py: claims whose lease ran out (a lost host) go back to pending;
- partitions.py: the history tables' daily partitions are created ahead and dropped once
  older than `retention_days` (an events partition only once no delivery refers to it);
- payload_retention.py: payloads and response bodies older than `payload_retention_days`
  are cleared, keeping the rest of the history;
- retention.py: the console's per-minute rollup rows past their time are deleted;
- breaker_defer.py: due deliveries of destinations whose breaker is open move to the end
  of the pause, out of the claim's way (engine/sql/maintenance/breaker_defer.sql);
- auto_disable.py: destinations whose attempts have all failed for `disable_after` are
  disabled, with an operational event (engine/sql/maintenance/auto_disable.sql);
- fold_minutes.py: the console's rollup rows, written per worker session, are folded into
  one per minute and destination once the minute is two minutes old (docs/decisions/0012);
- stalled_claims.py: the sessions of workers frozen inside a pipelined claim are ended so
  that what they claimed is free again (docs/decisions/0014).
The list of jobs and their order is `_jobs` in loop.py.
Each job run that did something logs one JSON line to stderr; so do leadership changes.
"""

from engine.maintenance.loop import run_maintenance

__all__ = ["run_maintenance"]
