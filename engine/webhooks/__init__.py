"""The rules every process shares about a webhook destination: which URLs may be
targets, how requests are signed, when a failure is retried, which options a
destination may set."""
