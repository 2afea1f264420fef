"""Benchmark: sandlot's chat client (``sandlot.rollout.llm``, httpx + tenacity) against the
official ``openai`` SDK, for what the rollout loop needs of a client.

The server is the scripted OpenAI-compatible server of ``tests/rollout/scripted_server.py``,
run in a child process (so the client's CPU time is the client's); it answers with what vLLM
adds to a chat completion when asked: ``choices[i].logprobs`` (OpenAI's shape) for
``logprobs: true``, and ``choices[i].token_ids`` + ``prompt_token_ids`` for vLLM's
``return_token_ids: true``. Measured, in one run:

1. **Per-request cost** of ``n`` sequential requests of the ``quitter`` model (a short text
   reply): median and p95 latency, and the client process's CPU milliseconds per request; then
   ``--concurrency`` requests at once, as episodes share one client (requests per second).
   The baseline is a bare ``httpx.AsyncClient.post`` + ``json.loads``, measured in the same run;
   each client is reported as a ratio to it.
2. **vLLM's extras**: whether the token ids and logprobs of the reply reach the caller.
3. **Retry-After**: the wait each client takes on a 429 with ``Retry-After: 3`` and ``150``.
4. **An outage**: a model server that refuses connections. How long each client keeps trying
   with its defaults (the SDK's ``max_retries=2``; sandlot's ``retry_budget_s=300``, on a
   virtual clock so the benchmark does not wait 5 minutes), against the 90 s restart of
   ``tests/rollout/test_outage.py``.
5. **Import time** of each client's modules, in a fresh interpreter.

Usage: python benchmarks/llm_client.py [--n 400] [--concurrency 32]
       (needs ``sandlot[rollout]``; the SDK rows need ``pip install openai``)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
from rich.console import Console
from rich.table import Table

# `python benchmarks/llm_client.py` puts benchmarks/ first on sys.path, not the checkout.
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from rollout.scripted_server import ScriptedServer  # noqa: E402  (tests/ helper, stdlib only)
from rollout.virtual_time import VirtualClock  # noqa: E402

from sandlot.rollout.llm import OpenAIChatPolicy  # noqa: E402
from sandlot.rollout.policy import PolicyError  # noqa: E402

MESSAGES = [
    {"role": "system", "content": "You fix bugs."},
    {"role": "user", "content": "<task id=minicalc__minicalc-1>\nDivision truncates.\n</task>"},
]
OUTAGE_S = 90.0
_WARMUP = 20

Call = Callable[[], Awaitable[Any]]


def serve() -> None:
    """Child process: serve until stdin closes; print the URL first."""
    with ScriptedServer(retry_after="3", flaky_failures=1) as server:
        print(server.url, flush=True)
        sys.stdin.read()


def _sdk() -> Any:
    try:
        import openai
    except ImportError:
        return None
    return openai


async def _measure(call: Call, n: int) -> tuple[list[float], float]:
    """Latencies of ``n`` sequential calls (after a warm-up) and CPU seconds per call."""
    for _ in range(_WARMUP):
        await call()
    latencies = []
    cpu = time.process_time()
    for _ in range(n):
        started = time.perf_counter()
        await call()
        latencies.append(time.perf_counter() - started)
    return latencies, (time.process_time() - cpu) / n


async def _throughput(call: Call, total: int, concurrency: int) -> float:
    """Requests per second with ``concurrency`` callers sharing the client."""
    left = [total]

    async def worker() -> None:
        while left[0] > 0:
            left[0] -= 1
            await call()

    started = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for _ in range(concurrency):
            tg.start_soon(worker)
    return total / (time.perf_counter() - started)


async def cost(url: str, n: int, concurrency: int, console: Console) -> None:
    import httpx

    openai = _sdk()
    async with httpx.AsyncClient(timeout=60) as raw, OpenAIChatPolicy(url, "quitter") as ours:
        body = json.dumps({"model": "quitter", "messages": MESSAGES}).encode()

        async def bare() -> Any:
            response = await raw.post(f"{url}/chat/completions", content=body)
            return json.loads(response.content)

        contenders: dict[str, Call] = {
            "httpx post + json.loads (baseline)": bare,
            "sandlot OpenAIChatPolicy": lambda: ours.generate(MESSAGES, []),
        }
        sdk = None
        if openai is not None:
            sdk = openai.AsyncOpenAI(base_url=url, api_key="unused", max_retries=0)
            contenders[f"openai {openai.__version__} AsyncOpenAI"] = lambda: (
                sdk.chat.completions.create(model="quitter", messages=MESSAGES)
            )
        rows = []
        for name, call in contenders.items():
            latencies, cpu = await _measure(call, n)
            rate = await _throughput(call, n, concurrency)
            rows.append((name, latencies, cpu, rate))
        if sdk is not None:
            await sdk.close()
    base_ms = statistics.median(rows[0][1]) * 1000
    base_cpu = rows[0][2] * 1000
    table = Table(title=f"1. one chat completion, n={n} sequential; {concurrency} concurrent")
    for column in ("client", "median ms", "p95 ms", "CPU ms/req", "CPU / baseline", "req/s"):
        table.add_column(column, justify="left" if column == "client" else "right")
    for name, latencies, cpu, rate in rows:
        ms = sorted(x * 1000 for x in latencies)
        table.add_row(
            name,
            f"{statistics.median(ms):.2f}",
            f"{ms[int(0.95 * (len(ms) - 1))]:.2f}",
            f"{cpu * 1000:.2f}",
            f"{cpu * 1000 / base_cpu:.2f}x",
            f"{rate:.0f}",
        )
    console.print(table)
    console.print(f"(baseline median {base_ms:.2f} ms)")
    if openai is None:
        console.print("openai: not installed (pip install openai), its row is missing")


async def extras(url: str, console: Console) -> None:
    openai = _sdk()
    table = Table(title="2. vLLM's token ids and logprobs (logprobs=true, return_token_ids=true)")
    for column in ("client", "reply token ids", "prompt token ids", "logprobs"):
        table.add_column(column)
    sampling = {"logprobs": True, "return_token_ids": True}
    async with OpenAIChatPolicy(url, "quitter", sampling=sampling) as ours:
        turn = await ours.generate(MESSAGES, [])
    known = set(vars(turn)) | set(turn.extra)
    table.add_row(
        "sandlot OpenAIChatPolicy",
        *("yes" if k in known else "dropped" for k in ("token_ids", "prompt_token_ids")),
        "yes" if "logprobs" in known else "dropped",
    )
    if openai is not None:
        async with openai.AsyncOpenAI(base_url=url, api_key="unused", max_retries=0) as sdk:
            reply = await sdk.chat.completions.create(
                model="quitter",
                messages=MESSAGES,
                logprobs=True,
                extra_body={"return_token_ids": True},
            )
        choice = reply.choices[0]
        token_ids = (choice.model_extra or {}).get("token_ids")
        prompt_ids = (reply.model_extra or {}).get("prompt_token_ids")
        logprobs = choice.logprobs.content if choice.logprobs else None
        table.add_row(
            f"openai {openai.__version__}",
            f"choice.model_extra: {token_ids}" if token_ids else "dropped",
            f"model_extra: {prompt_ids}" if prompt_ids else "dropped",
            f"typed: {[round(t.logprob, 2) for t in logprobs]}" if logprobs else "dropped",
        )
    console.print(table)


async def retry_after(console: Console) -> None:
    openai = _sdk()
    table = Table(title="3. wait taken on a 429 with Retry-After")
    for column in ("client", "Retry-After: 3", "Retry-After: 150"):
        table.add_column(column)
    waits: dict[str, list[str]] = {"sandlot OpenAIChatPolicy": [], "openai SDK": []}
    for header in ("3", "150"):
        # One server per client: `flaky` fails the first request of each conversation once.
        with ScriptedServer(flaky_failures=1, retry_after=header) as server:
            clock = VirtualClock()
            async with OpenAIChatPolicy(
                server.url, "flaky", clock=clock, sleep=clock.sleep, retry_budget_s=300
            ) as ours:
                await ours.generate(MESSAGES, [])
            waits["sandlot OpenAIChatPolicy"].append(f"{clock.sleeps} (virtual clock), answered")
        if openai is None:
            waits["openai SDK"].append("not installed")
            continue
        with ScriptedServer(flaky_failures=1, retry_after=header) as server:
            async with openai.AsyncOpenAI(base_url=server.url, api_key="unused") as sdk:
                started = time.perf_counter()
                try:
                    await sdk.chat.completions.create(model="flaky", messages=MESSAGES)
                    outcome = "answered"
                except openai.RateLimitError:
                    outcome = "raised RateLimitError"
                waits["openai SDK"].append(f"{time.perf_counter() - started:.2f} s, {outcome}")
    for name, cells in waits.items():
        table.add_row(name, *cells)
    console.print(table)


async def outage(console: Console) -> None:
    openai = _sdk()
    with socket.socket() as s:  # a port nothing listens on: connections are refused
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}/v1"
    table = Table(title=f"4. a server that refuses connections (a restart takes ~{OUTAGE_S:g} s)")
    for column in ("client (defaults)", "attempts", "gave up after", f"outlasts {OUTAGE_S:g} s"):
        table.add_column(column)
    clock = VirtualClock()
    async with OpenAIChatPolicy(url, "solver", clock=clock, sleep=clock.sleep) as ours:
        with contextlib.suppress(PolicyError):
            await ours.generate(MESSAGES, [])
    attempts = len(clock.sleeps) + 1
    table.add_row(
        "sandlot retry_budget_s=300",
        str(attempts),
        f"{clock.now:.0f} s (virtual clock)",
        "yes" if clock.now >= OUTAGE_S else "no",
    )
    if openai is not None:
        async with openai.AsyncOpenAI(base_url=url, api_key="unused") as sdk:
            started = time.perf_counter()
            with contextlib.suppress(openai.APIConnectionError):
                await sdk.chat.completions.create(model="solver", messages=MESSAGES)
            spent = time.perf_counter() - started
        table.add_row(
            f"openai max_retries={sdk.max_retries}",
            str(sdk.max_retries + 1),
            f"{spent:.2f} s",
            "yes" if spent >= OUTAGE_S else "no",
        )
        # Its schedule: min(0.5 * 2**k, 8) s less up to 25 % jitter, a count of retries.
        needed, waited = 0, 0.0
        while waited < OUTAGE_S:
            waited += min(0.5 * 2**needed, 8.0) * 0.75
            needed += 1
        table.add_row(
            "openai, retries to outlast it", str(needed + 1), "(worst-case jitter)", "a count"
        )
    console.print(table)


def import_times(console: Console) -> None:
    table = Table(title="5. import time in a fresh interpreter (median of 5)")
    table.add_column("modules")
    table.add_column("ms", justify="right")
    for name, stmt in (
        ("httpx + tenacity (sandlot's client)", "import httpx, tenacity"),
        ("openai", "import openai"),
    ):
        runs = []
        for _ in range(5):
            started = time.perf_counter()
            done = subprocess.run([sys.executable, "-c", stmt], capture_output=True)
            runs.append(time.perf_counter() - started)
            if done.returncode:
                break
        cell = f"{statistics.median(runs) * 1000:.0f}" if not done.returncode else "not installed"
        table.add_row(name, cell)
    empty = [0.0]
    for _ in range(5):
        started = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        empty.append(time.perf_counter() - started)
    table.add_row("(an empty interpreter)", f"{statistics.median(empty[1:]) * 1000:.0f}")
    console.print(table)


async def main_async(args: argparse.Namespace) -> None:
    console = Console(width=110)
    logging.getLogger("sandlot.rollout.llm").setLevel(logging.ERROR)  # its retry warnings
    child = subprocess.Popen(  # noqa: ASYNC220 (started once, before anything is measured)
        [sys.executable, __file__, "--serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert child.stdout is not None
        url = child.stdout.readline().decode().strip()
        await cost(url, args.n, args.concurrency, console)
        await extras(url, console)
    finally:
        if child.stdin:
            child.stdin.close()
        child.wait(timeout=30)
    await retry_after(console)
    await outage(console)
    import_times(console)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=400, help="sequential requests per client")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve()
        return
    anyio.run(main_async, args)


if __name__ == "__main__":
    main()
