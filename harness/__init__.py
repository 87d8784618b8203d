"""What the tests and the benchmarks (bench/) both use, so that neither imports the other: sidecar and
engine processes and the replay engine (sidecar.py), the request pipeline's lifecycle check
(lifecycle.py), the autoscaler's load traces (load_traces.py), ModelServer test data (testdata.py).

A development package, never in the wheel (pyproject.toml installs `modelserve` only); importable from
the repository root, where pytest (`pythonpath = ["."]`) and `python -m bench.<name>` run."""
