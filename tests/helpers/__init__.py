"""Helpers shared by test files and benchmarks: harnesses, cluster views, test data, the trace simulator."""
