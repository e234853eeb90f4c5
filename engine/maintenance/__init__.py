"""The maintenance process: one leader per cluster runs the housekeeping jobs.

Every host may run one; the holder of the leader lock (leader.py) does the work and the
others poll to take over (loop.py). One module per job, each the same shape: a settings
dataclass, `run_once(conn, settings, ...)` returning a report of what it did, run by the
loop every `settings.interval_s`, each in bounded batches of short transactions:
- reaper.py: claims whose lease ran out (a lost host) go back to pending;
- retention.py: finished deliveries, their attempts and then unreferenced events older
  than `retention_days` are deleted;
- breaker_defer.py: due deliveries of destinations whose breaker is open move to the end
  of the pause, out of the claim's way (engine/sql/breaker_defer.sql);
- auto_disable.py: destinations whose attempts have all failed for `disable_after` are
  disabled, with an operational event (engine/sql/auto_disable.sql).
Each job run that did something logs one JSON line to stderr; so do leadership changes.
"""

from engine.maintenance.loop import run_maintenance

__all__ = ["run_maintenance"]
