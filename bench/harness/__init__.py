"""The scenario harness behind bench/run.sh: each scenario starts what it needs (a durable
PostgreSQL, the engine, fake destinations, locust), watches it with a live progress bar
and leaves a report folder under bench/reports/<UTC time>-<scenario>/."""
