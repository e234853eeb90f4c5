"""The console: its JSON API, its reads, and the static page (static/)."""
