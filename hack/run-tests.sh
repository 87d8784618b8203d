#!/usr/bin/env bash
# The whole suite as two pytest processes at once: the tests that run pods on the real node (marker
# `realnode`, set in tests/conftest.py: one real node per host, so they stay in one process, in
# order) beside all the others (their own KWOK control plane, the engine and sidecar tests). The two
# share only the machine's cores; one after the other they took 70-82 min of CI's 90.
# The others' output streams; the real-node half's goes to a log printed whole after it, so lines
# never interleave. Last comes each half's short summary (its failures), where a tail shows them.
# Where the time went comes last of all: each half's 25 slowest tests (pytest's --durations), each
# half's wall time and hack/setup.sh's steps (build/setup-times.txt), so a run's cost is read from
# its own tail (docs/development.md keeps the table).
# Arguments go to both: `bash hack/run-tests.sh -x`.
set -uo pipefail
cd "$(dirname "$0")/.."

logs=$(mktemp -d /tmp/modelserve-tests.XXXXXX)
started=$SECONDS
(
  .venv/bin/pytest -m realnode --durations=25 "$@" >"$logs/realnode.log" 2>&1
  status=$?
  echo $((SECONDS - started)) >"$logs/realnode.seconds"
  exit $status
) &
realnode_pid=$!
trap 'kill -INT "$realnode_pid" 2>/dev/null' EXIT  # stopped with us (Ctrl-C, a CI timeout)
trap 'exit 130' INT TERM
.venv/bin/pytest -m "not realnode" --durations=25 "$@" 2>&1 | tee "$logs/rest.log"
rest=${PIPESTATUS[0]}
rest_seconds=$((SECONDS - started))
wait "$realnode_pid"
realnode=$?
trap - EXIT

echo "===== pytest -m realnode (beside the above; its log kept in $logs if either half fails)"
cat "$logs/realnode.log"
summary() { # half's log -> its short test summary and final line (the final line alone if it has none)
  sed -n '/short test summary info/,$p' "$1" | grep . || tail -n 1 "$1"
}
slowest() { # half's log -> pytest's slowest-durations table, without its header lines
  sed -n '/slowest 25 durations/,/short test summary info\|^=\+ .* in [0-9.]\+s/p' "$1" | grep -E '^[0-9.]+s '
}
minutes() { awk -v s="$1" 'BEGIN { printf "%d s (%.1f min)", s, s / 60 }'; }
echo "===== where the time went"
for half in rest realnode; do
  echo "--- the 25 slowest of pytest -m \"$([[ $half == rest ]] && echo 'not realnode' || echo realnode)\""
  slowest "$logs/$half.log" || echo "(none recorded)"
done
echo "--- set-up (hack/setup.sh, this run)"
cat build/setup-times.txt 2>/dev/null || echo "(no build/setup-times.txt: hack/setup.sh did not run first)"
echo "--- wall time: pytest -m \"not realnode\" $(minutes "$rest_seconds"), pytest -m realnode $(minutes "$(cat "$logs/realnode.seconds" 2>/dev/null || echo 0)"), both halves $(minutes $((SECONDS - started)))"
echo "===== both halves"
echo "--- pytest -m \"not realnode\": exit $rest"
summary "$logs/rest.log"
echo "--- pytest -m realnode: exit $realnode"
summary "$logs/realnode.log"
# pytest's 5 is "no test collected": arguments that select tests of one half only.
ok() { [[ $1 == 0 || $1 == 5 ]]; }
if ok "$rest" && ok "$realnode"; then rm -rf "$logs"; else exit 1; fi
