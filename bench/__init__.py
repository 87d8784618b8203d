"""Benchmarks, each run from the repository root as a module: `.venv/bin/python -m bench.<name>`."""
