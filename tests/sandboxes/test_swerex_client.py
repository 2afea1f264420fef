"""``SwerexClient`` against a real ``swerex.server`` on loopback, and against httpx mocks."""

from __future__ import annotations

import ssl
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from fakes.fake_vefaas import free_port
from requirements import SWEREX, TEST, need_module

httpx = need_module("httpx", TEST)
need_module("swerex.server", SWEREX)

from sandlot.runtimes.swerex import (  # noqa: E402 (needs httpx)
    SwerexClient,
    SwerexHTTPError,
    SwerexRemoteError,
    SwerexUnavailableError,
)

pytestmark = pytest.mark.anyio
TOKEN = "test-token"


@pytest.fixture(scope="module")
def server_url() -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "swerex.server",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--auth-token",
            TOKEN,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{url}/is_alive", headers={"X-API-Key": TOKEN}).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "swerex.server did not start"
            time.sleep(0.1)
        yield url
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture
async def client(server_url: str) -> AsyncIterator[SwerexClient]:
    c = SwerexClient(server_url, api_key=TOKEN, retries=1, backoff_s=0.01)
    yield c
    await c.aclose()


@pytest.mark.e2e
async def test_execute_and_text_files(client: SwerexClient, tmp_path: Path) -> None:
    assert await client.is_alive()
    out = await client.execute(["sh", "-c", "echo out; echo err >&2; exit 3"], timeout=10)
    assert (out.stdout, out.stderr, out.exit_code) == ("out\n", "err\n", 3)
    path = str(tmp_path / "deep" / "t.txt")
    await client.write_file(path, "héllo")
    assert await client.read_file(path) == "héllo"


async def test_bytes_round_trip(client: SwerexClient, tmp_path: Path) -> None:
    data = bytes(range(256)) * 300 + b"\x00\r\n"
    path = str(tmp_path / "new" / "bin")
    await client.write_bytes(path, data)
    assert (tmp_path / "new" / "bin").read_bytes() == data
    assert await client.read_bytes(path) == data
    with pytest.raises(FileNotFoundError, match="missing"):
        await client.read_bytes(str(tmp_path / "missing"))


@pytest.mark.e2e
async def test_sessions_keep_state(client: SwerexClient, tmp_path: Path) -> None:
    await client.create_session("s1")
    await client.run_in_session(f"cd {tmp_path} && export X=42", session="s1", timeout=10)
    r = await client.run_in_session("echo $X $PWD; false", session="s1", timeout=10)
    assert (r.output.strip(), r.exit_code) == (f"42 {tmp_path}", 1)
    with pytest.raises(SwerexRemoteError) as info:
        await client.run_in_session("sleep 5", session="s1", timeout=0.5)
    assert info.value.is_timeout
    await client.interrupt_session(session="s1")
    assert (
        await client.run_in_session("echo back", session="s1", timeout=10)
    ).output.strip() == "back"
    await client.close_session("s1")


async def test_server_exceptions_are_raised_with_their_class(client: SwerexClient) -> None:
    with pytest.raises(SwerexRemoteError) as info:
        await client.execute(["sleep", "5"], timeout=0.3)
    assert info.value.is_timeout and "CommandTimeoutError" in str(info.value)
    assert not info.value.retryable
    with pytest.raises(SwerexRemoteError, match="FileNotFoundError"):
        await client.read_file("/no/such/file")


async def test_wrong_api_key_is_an_http_error(server_url: str) -> None:
    c = SwerexClient(server_url, api_key="wrong", retries=0)
    with pytest.raises(SwerexHTTPError) as info:
        await c.execute(["true"], timeout=5)
    assert info.value.status == 401
    await c.aclose()


@pytest.mark.e2e
async def test_long_command_is_not_cut_by_a_fixed_client_timeout(server_url: str) -> None:
    # Shrunk scale of the 300 s bug: requests without a command timeout are cut at 0.5 s, yet a
    # 1.5 s command with timeout=10 finishes, because its request waits 10 s + margin.
    c = SwerexClient(server_url, api_key=TOKEN, request_timeout_s=0.5, margin_s=2, retries=0)
    out = await c.execute(["sh", "-c", "sleep 1.5; echo done"], timeout=10)
    assert out.stdout == "done\n"
    await c.aclose()


def _mock(handler: object) -> httpx.MockTransport:
    return httpx.MockTransport(handler)  # type: ignore[arg-type]


async def test_request_timeout_is_command_timeout_plus_margin() -> None:
    seen: list[dict[str, float | None]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.extensions["timeout"])
        return httpx.Response(200, json={"stdout": "", "stderr": "", "exit_code": 0})

    c = SwerexClient("http://sandbox", api_key="k", margin_s=30, transport=_mock(handler))
    await c.execute(["make", "test"], timeout=1000)  # 16 minutes: no 300 s cut-off
    await c.execute(["sleep", "infinity"], timeout=None)
    assert seen[0]["read"] == 1030 and seen[1]["read"] is None
    await c.aclose()


async def test_5xx_and_connection_errors_are_retried_with_one_request_id() -> None:
    ids: list[str] = []
    answers = [503, 502, 200]

    def handler(request: httpx.Request) -> httpx.Response:
        ids.append(request.headers["X-Request-ID"])
        assert (
            request.headers["X-API-Key"] == "k" and request.headers["x-faas-instance-name"] == "i"
        )
        status = answers.pop(0)
        return httpx.Response(status, json={"stdout": "ok", "stderr": "", "exit_code": 0})

    c = SwerexClient(
        "http://sandbox",
        api_key="k",
        headers={"x-faas-instance-name": "i"},
        retries=3,
        backoff_s=0.001,
        transport=_mock(handler),
    )
    assert (await c.execute(["true"], timeout=5)).stdout == "ok"
    assert len(ids) == 3 and len(set(ids)) == 1
    await c.aclose()

    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    c = SwerexClient(
        "http://sandbox", api_key="k", retries=2, backoff_s=0.001, transport=_mock(refuse)
    )
    with pytest.raises(SwerexUnavailableError, match="3 attempts") as info:
        await c.execute(["true"], timeout=5)
    assert info.value.retryable
    await c.aclose()


async def test_511_is_never_retried() -> None:
    calls = 0

    def handler(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        body = {
            "swerexception": {
                "message": "boom",
                "class_path": "builtins.ValueError",
                "traceback": "",
                "extra_info": {"output": "partial"},
            }
        }
        return httpx.Response(511, json=body)

    c = SwerexClient("http://sandbox", api_key="k", retries=3, transport=_mock(handler))
    with pytest.raises(SwerexRemoteError) as info:
        await c.execute(["x"], timeout=1)
    assert calls == 1 and info.value.class_path == "builtins.ValueError"
    assert info.value.extra_info == {"output": "partial"}
    await c.aclose()


async def test_a_hung_server_is_retried_then_unavailable_never_raw_httpx() -> None:
    ids: list[str] = []

    def hang(request: httpx.Request) -> httpx.Response:
        ids.append(request.headers["X-Request-ID"])
        raise httpx.ReadTimeout("timed out", request=request)

    c = SwerexClient(
        "http://sandbox", api_key="k", retries=2, backoff_s=0.001, transport=_mock(hang)
    )
    with pytest.raises(SwerexUnavailableError, match="ReadTimeout") as info:
        await c.execute(["true"], timeout=5)
    assert info.value.retryable and len(ids) == 3 and len(set(ids)) == 1
    await c.aclose()

    answers = [httpx.Response(200, text="<html>gateway</html>")]
    c = SwerexClient(
        "http://sandbox", api_key="k", retries=0, transport=_mock(lambda r: answers[0])
    )
    with pytest.raises(SwerexHTTPError, match="not JSON"):
        await c.execute(["true"], timeout=5)
    assert not await c.is_alive()
    await c.aclose()


async def test_clients_share_one_verifying_tls_context(
    monkeypatch: pytest.MonkeyPatch, ssl_contexts_made: list[ssl.SSLContext]
) -> None:
    from sandlot.runtimes import swerex

    made = ssl_contexts_made
    swerex._tls_context.cache_clear()
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    clients = [SwerexClient(f"https://sandbox-{i}.example", TOKEN) for i in range(3)]
    assert all(c.client is not None for c in clients)
    assert len(made) == 1  # the bundle parsed once, not once per client
    assert made[0].verify_mode == ssl.CERT_REQUIRED
    monkeypatch.setenv("SSL_CERT_DIR", "/etc/ssl/certs")  # httpx's trust_env: a context of its own
    assert swerex.shared_tls_context() is not made[0]
    for c in clients:
        await c.aclose()
