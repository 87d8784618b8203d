"""The test suite; `tests.helpers` holds what several test files (and bench/) share."""
