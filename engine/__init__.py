"""engine: a webhook delivery engine on PostgreSQL."""

__version__ = "0.1.0"
