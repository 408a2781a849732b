"""Calibration micro-benchmarks that measure what this machine really delivers."""
