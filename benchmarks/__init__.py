"""Benchmarks: control quality, service load, agent overhead (results in BENCHMARKS.md)."""
