#!/usr/bin/env bash
# The whole suite as two pytest processes at once: the tests that run pods on the real node (marker
# `realnode`, set in tests/conftest.py: one real node per host, so they stay in one process, in
# order) beside all the others (their own KWOK control plane, the engine and sidecar tests). The two
# share only the machine's cores; one after the other they took 70-82 min of CI's 90.
# The others' output streams; the real-node half's goes to a log printed whole after it, so lines
# never interleave. Last comes each half's short summary (its failures), where a tail shows them.
# Arguments go to both: `bash hack/run-tests.sh -x`.
set -uo pipefail
cd "$(dirname "$0")/.."

logs=$(mktemp -d /tmp/modelserve-tests.XXXXXX)
.venv/bin/pytest -m realnode "$@" >"$logs/realnode.log" 2>&1 &
realnode_pid=$!
trap 'kill -INT "$realnode_pid" 2>/dev/null' EXIT  # stopped with us (Ctrl-C, a CI timeout)
trap 'exit 130' INT TERM
.venv/bin/pytest -m "not realnode" "$@" 2>&1 | tee "$logs/rest.log"
rest=${PIPESTATUS[0]}
wait "$realnode_pid"
realnode=$?
trap - EXIT

echo "===== pytest -m realnode (beside the above; its log kept in $logs if either half fails)"
cat "$logs/realnode.log"
summary() { # half's log -> its short test summary and final line (the final line alone if it has none)
  sed -n '/short test summary info/,$p' "$1" | grep . || tail -n 1 "$1"
}
echo "===== both halves"
echo "--- pytest -m \"not realnode\": exit $rest"
summary "$logs/rest.log"
echo "--- pytest -m realnode: exit $realnode"
summary "$logs/realnode.log"
# pytest's 5 is "no test collected": arguments that select tests of one half only.
ok() { [[ $1 == 0 || $1 == 5 ]]; }
if ok "$rest" && ok "$realnode"; then rm -rf "$logs"; else exit 1; fi
