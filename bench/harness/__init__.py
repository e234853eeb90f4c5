"""The scenarios and what they share: cli.py (the registry and the timed scenarios' runner),
stack.py (the database server, fresh databases, the engine, load and CPU accounting),
report.py (the report folders and JSON reports), live.py (the progress bar), one module per
scenario, and sql/ (the statements the scenarios read the database with)."""
