"""Planner, cost model, tuner and the autotune database (see docs/architecture.md)."""
