"""Operational events: the engine reporting on itself through its own pipeline.

The events are enqueued by SQL in the same statement as the state change that causes them
(engine/sql/results/record_results.sql, return_claims.sql, auto_disable.sql), to the destinations
that list their type in `event_types` (a destination subscribed to every type, with
event_types null, does not get them: they are about the engine, not the application).
Never to the destination they are about, and never about the deliveries of operational
events, so a failing subscriber cannot feed itself. Clients may not create events of these
types (the API answers 422 for any type with the prefix).
"""

from __future__ import annotations

RESERVED_EVENT_PREFIX = "engine."
DESTINATION_DISABLED = "engine.destination.disabled"
BREAKER_OPENED = "engine.destination.breaker_opened"
DESTINATION_RECOVERED = "engine.destination.recovered"
DELIVERY_DEAD = "engine.delivery.dead"
EVENT_TYPES = (DESTINATION_DISABLED, BREAKER_OPENED, DESTINATION_RECOVERED, DELIVERY_DEAD)
