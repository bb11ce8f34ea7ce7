"""Workloads, replay, calibration, benchmarks, the demo and their plots."""
