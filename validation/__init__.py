"""Deciding whether a candidate is good: compatibility suite, latency harness, SLO gates, reports."""
