"""Checks run before anything reaches a cluster: cross-layer lint rules and pinned-schema validation."""
