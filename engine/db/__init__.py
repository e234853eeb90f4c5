"""The database: connections, the embedded server, migrations, and the statements the
engine runs (engine/sql/) with their parameter types."""
