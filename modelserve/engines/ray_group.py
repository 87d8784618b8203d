"""How the pods of a vLLM group meet on Ray, in the POSIX shell of the engine image (`sh -c`).

A LeaderWorkerSet group's pods start in any order: each pulls a multi-GB image on its own node, and
the leader's DNS name appears only once its pod has an address. A worker whose `ray start` fails
exits, and RecreateGroupOnPodRestart then makes the whole group again: a restart loop. So, as vLLM's
own examples/online_serving/multi-node-serving.sh does, each side waits for the other, bounded: the
worker until the head answers, the leader until the group's pods have joined; past the bound the
pod exits non-zero with a line that says what it waited for (its termination message)."""

from __future__ import annotations

# Ray's default port, where the head's GCS listens and the workers join.
RAY_PORT = 6379
# How long a pod waits for the rest of its group. vLLM's script waits 300 s, for hosts that already
# have the image; here a peer may still be pulling the engine image (vLLM's CUDA image is ~10 GB:
# minutes on a cold node), so twice that, the 10 minutes SGLang's ranks wait in torch's rendezvous
# (the NCCL process group's default timeout). Past it LeaderWorkerSet recreates the group; the layers
# already pulled stay on the nodes, so the next try starts sooner.
WAIT_SECONDS = 600
# How often a pod looks, as vLLM's script: a join takes seconds, and each look starts a Python (on
# the leader one that connects to Ray), too costly every second.
POLL_SECONDS = 5

# One look each (exit 0: done; else one line saying what is missing), as `python3 -c CODE ARG`, inside
# the script's single quotes: no single quote in them.
# The worker: the head's GCS port accepts a connection (the name resolves and the head is up).
HEAD_ANSWERS = """import socket, sys
host, _, port = sys.argv[1].rpartition(":")
try:
    socket.create_connection((host, int(port)), timeout=2).close()
except OSError as error:
    sys.exit(f"modelserve: the Ray head at {sys.argv[1]} does not answer yet: {error}")
"""
# The leader: every pod of the group is a live node of the Ray cluster (ray.nodes(), as vLLM's script
# counts them; `ray list nodes` needs ray[default]'s state API, which vLLM's image may lack).
GROUP_JOINED = """import logging, sys
import ray
ray.init(address="auto", logging_level=logging.ERROR, log_to_driver=False)
alive = sum(1 for node in ray.nodes() if node["Alive"])
ray.shutdown()
if alive < int(sys.argv[1]):
    sys.exit(f"modelserve: {alive} of {sys.argv[1]} pods of the group have joined the Ray cluster")
"""


def _wait_for(wait_seconds: int, poll_seconds: int) -> str:
    """`wait_for WHAT CHECK...`: runs CHECK every poll_seconds until it succeeds; after wait_seconds
    the script exits 1, its last line saying what it waited for."""
    return f"""wait_for() {{
  what=$1; shift; waited=0
  until "$@"; do
    if [ "$waited" -ge {wait_seconds} ]; then
      echo "modelserve: gave up after $waited s waiting for $what;" \\
        "exiting, so that LeaderWorkerSet recreates the group" >&2
      exit 1
    fi
    sleep {poll_seconds}; waited=$((waited + {poll_seconds}))
  done
}}
"""


def worker_script(port: int = RAY_PORT, wait_seconds: int = WAIT_SECONDS, poll_seconds: int = POLL_SECONDS) -> str:
    """`sh -c` on a worker: wait for the head on the leader ($LWS_LEADER_ADDRESS), then join it for good."""
    return _wait_for(wait_seconds, poll_seconds) + (
        f'head="${{LWS_LEADER_ADDRESS:?is not set: the LeaderWorkerSet pod webhook sets it}}:{port}"\n'
        'wait_for "the Ray head at $head (the leader\'s pod running, its name in cluster DNS)" '
        f"python3 -c '{HEAD_ANSWERS}' \"$head\"\n"
        'exec ray start --address="$head" --block --disable-usage-stats\n'
    )


def leader_script(port: int = RAY_PORT, wait_seconds: int = WAIT_SECONDS, poll_seconds: int = POLL_SECONDS) -> str:
    """`sh -c SCRIPT NAME ARGS...` on the leader: the Ray head, a wait for the group's $LWS_GROUP_SIZE
    pods to join it, then vLLM in the shell's place with ARGS ("$@"), a list the parser tests read."""
    return _wait_for(wait_seconds, poll_seconds) + (
        'size="${LWS_GROUP_SIZE:?is not set: the LeaderWorkerSet pod webhook sets it}"\n'
        f"ray start --head --port={port} --disable-usage-stats || exit\n"
        'wait_for "all $size pods of the group to join the Ray cluster" '
        f"python3 -c '{GROUP_JOINED}' \"$size\"\n"
        'exec vllm serve "$@"\n'
    )


LEADER_SCRIPT = leader_script()
WORKER_SCRIPT = worker_script()
