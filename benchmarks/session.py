"""Benchmark: round trip of ``echo hi`` in a shell session, ours against SWE-ReX's.

Measures, in one run on one machine, interleaved so that load affects all alike:

* ``local``: ``BashSession.run("echo hi")`` in a ``local`` sandbox session (bubblewrap jail,
  or ``--isolation none``);
* ``docker``: the same on the ``docker`` backend, when it is installed, an engine answers and
  ``--docker-image`` exists (skipped otherwise);
* ``swerex``: ``RemoteRuntime.run_in_session(BashAction("echo hi"))`` against
  ``python -m swerex.server`` started on 127.0.0.1 (swe-rex 1.4.0 and aiohttp, from the
  ``bench`` extra).

Prints medians, 95th percentiles and each backend's speed-up over SWE-ReX. Target: the local
session at least 10x faster than SWE-ReX (median).

Usage: python benchmarks/session.py [--n 300] [--isolation bwrap] [--docker-image IMAGE]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from pathlib import Path

import anyio
from rich.console import Console
from rich.table import Table

# `python benchmarks/session.py` puts benchmarks/ first on sys.path, not the checkout.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import sandlot

TARGET_RATIO = 10.0
_WARMUP = 10
_SERVER_START_S = 60.0

RoundTrip = Callable[[], Awaitable[None]]


def _ms(samples: Sequence[float]) -> tuple[float, float]:
    """Median and 95th percentile of ``samples`` (seconds), in milliseconds."""
    return statistics.median(samples) * 1e3, statistics.quantiles(samples, n=20)[18] * 1e3


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextlib.contextmanager
def _swerex_server() -> Iterator[tuple[int, str]]:
    port, token = _free_port(), secrets.token_hex(16)
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "swerex.server",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--auth-token",
            token,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + _SERVER_START_S
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
                break
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("swerex.server did not start")
            time.sleep(0.05)
        yield port, token
    finally:
        server.terminate()
        server.wait(10)


@contextlib.asynccontextmanager
async def _swerex(port: int, token: str) -> AsyncIterator[RoundTrip]:
    from swerex.runtime.abstract import BashAction, CreateBashSessionRequest
    from swerex.runtime.remote import RemoteRuntime

    runtime = RemoteRuntime(host="http://127.0.0.1", port=port, auth_token=token)
    await runtime.create_session(CreateBashSessionRequest(session="bench"))

    async def once() -> None:
        obs = await runtime.run_in_session(BashAction(command="echo hi", session="bench"))
        assert obs.output.strip() == "hi", obs

    try:
        yield once
    finally:
        await runtime.close()


@contextlib.asynccontextmanager
async def _ours(backend: str, **fields: str) -> AsyncIterator[RoundTrip]:
    async with sandlot.open(backend, **fields) as sb:
        session = await sb.shell("bench")

        async def once() -> None:
            obs = await session.run("echo hi")
            assert obs.output == "hi\n", obs

        yield once


def _docker_unavailable(image: str) -> str | None:
    try:
        import docker

        docker.from_env(timeout=10).images.get(image)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


async def _measure(n: int, contenders: dict[str, RoundTrip]) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {name: [] for name in contenders}
    for i in range(n + _WARMUP):
        for name, once in contenders.items():
            started = time.perf_counter()
            await once()
            if i >= _WARMUP:
                samples[name].append(time.perf_counter() - started)
    return samples


async def _main(args: argparse.Namespace) -> int:
    console = Console()
    skipped: dict[str, str] = {}
    async with contextlib.AsyncExitStack() as stack:
        contenders: dict[str, RoundTrip] = {
            "local": await stack.enter_async_context(_ours("local", isolation=args.isolation))
        }
        reason = _docker_unavailable(args.docker_image)
        if reason is None:
            contenders["docker"] = await stack.enter_async_context(
                _ours("docker", image=args.docker_image)
            )
        else:
            skipped["docker"] = reason
        port, token = stack.enter_context(_swerex_server())
        contenders["swerex"] = await stack.enter_async_context(_swerex(port, token))
        samples = await _measure(args.n, contenders)

    base, _ = _ms(samples["swerex"])
    table = Table(title=f"`echo hi` round trip in a shell session, n={args.n} (ms)")
    for column in ("session", "median", "p95", "SWE-ReX median / median"):
        table.add_column(column, justify="right" if column != "session" else "left")
    for name, values in samples.items():
        median, p95 = _ms(values)
        table.add_row(name, f"{median:.2f}", f"{p95:.2f}", f"{base / median:.1f}x")
    console.print(table)
    for name, why in skipped.items():
        console.print(f"{name}: skipped ({why})")
    ratio = base / _ms(samples["local"])[0]
    ok = ratio >= TARGET_RATIO
    console.print(
        f"local is {ratio:.1f}x faster than SWE-ReX (target >= {TARGET_RATIO:g}x): "
        + ("[green]met[/green]" if ok else "[red]missed[/red]")
    )
    return 0 if ok else 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=300, help="round trips per contender")
    parser.add_argument("--isolation", choices=["bwrap", "none"], default="bwrap")
    parser.add_argument(
        "--docker-image",
        default=os.environ.get("SANDLOT_TEST_IMAGE", "python:3.12-slim"),
        help="image for the docker contender (skipped when absent)",
    )
    sys.exit(anyio.run(_main, parser.parse_args()))


if __name__ == "__main__":
    main()
