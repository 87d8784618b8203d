#!/usr/bin/env bash
# The whole suite as two pytest processes at once: the tests that run pods on the real node (marker
# `realnode`, set in tests/conftest.py: one real node per host, so they stay in one process, in
# order) beside all the others (their own KWOK control plane, the engine and sidecar tests). The two
# share only the machine's cores; one after the other they took 70-82 min of CI's 90.
# Each process writes its own log, printed whole once both are done (a failing one last, where CI's
# tail shows it), so their lines never interleave. Arguments go to both: `bash hack/run-tests.sh -x`.
set -uo pipefail
cd "$(dirname "$0")/.."

logs=$(mktemp -d /tmp/modelserve-tests.XXXXXX)
.venv/bin/pytest -m realnode "$@" >"$logs/realnode.log" 2>&1 &
realnode_pid=$!
trap 'kill -INT "$realnode_pid" 2>/dev/null' EXIT  # stopped with us (Ctrl-C, a CI timeout)
trap 'exit 130' INT TERM
.venv/bin/pytest -m "not realnode" "$@" >"$logs/rest.log" 2>&1
rest=$?
wait "$realnode_pid"
realnode=$?
trap - EXIT

# pytest's 5 is "no test collected": arguments that select tests of one half only.
ok() { [[ $1 == 0 || $1 == 5 ]]; }
order=(rest realnode)
ok "$rest" || order=(realnode rest)
for half in "${order[@]}"; do
  echo "===== pytest -m $([[ $half == realnode ]] && echo 'realnode' || echo '"not realnode"') ($logs/$half.log)"
  cat "$logs/$half.log"
done
ok "$rest" && ok "$realnode"
