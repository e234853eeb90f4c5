"""Ingress: the HTTP API. Events are answered only after they and all their deliveries are
committed (group commit, see committer.py)."""
