-- OpenTelemetry (SPEC, "Deployment and tracing"; docs/decisions/0035-tracing.md): the
-- W3C `traceparent` an event was posted with (NULL: none, or a malformed one ignored),
-- the parent of every attempt's span; and whether a destination's POSTs carry a
-- `traceparent` of their own. Both columns are nullable or have a constant default: no
-- table rewrite.
ALTER TABLE events ADD COLUMN traceparent text;
ALTER TABLE destinations ADD COLUMN propagate_trace boolean NOT NULL DEFAULT false;
