"""A small OpenAI-compatible chat-completions server whose "models" are scripted policies.

Tests start it on 127.0.0.1 (a free port) in a thread; it stops at the end of the ``with``
block (``ScriptedServer`` is a context manager) and every wait inside it is bounded. The
request's ``model`` picks the policy:

``solver``
    Solves ``examples/swe-mini`` instances through the real tools: views the first file the
    gold patch touches, replays each hunk of the gold ``patch`` as a ``str_replace`` edit, runs
    the repository's own tests with ``bash``, then calls ``submit``. The instance is the one whose
    ``instance_id`` appears in the conversation's first user message.
``garbage``
    Malformed tool calls every turn (invalid JSON, a closing tag without its opening, an
    unknown tool, arguments that are not JSON): format errors, never a patch.
``sleeper``
    Waits ``sleep_s`` (past the client's timeout) before answering as ``solver``.
``flaky``
    Answers 429 (with ``Retry-After: retry_after``) to the first ``flaky_failures`` requests of
    each conversation, then behaves as ``solver``.
``stall``
    Runs ``sleep 600`` with ``bash`` every turn (for the timeout budget).
``leaker``
    Writes the bearer token it received into its text and into a ``bash`` command, then submits
    (for redaction tests).
``quitter``
    Answers with text and no tool call.
``overflow``
    400 with vLLM's "maximum context length" message.
``malformed``
    200 with a body that is not a chat completion.
``status-<code>``
    Always answers HTTP ``<code>`` with an OpenAI error body (``status-401`` echoes the
    ``Authorization`` header it received, as a careless server might).
any name of ``scripts``
    Makes, one per turn, the calls its function gives for the instance (its record), as
    ``solver`` does with :func:`solver_script`.

Any completion carries vLLM's extras when the request asks for them: ``logprobs`` for
``logprobs: true``, ``token_ids`` and ``prompt_token_ids`` for ``return_token_ids: true``.

Tool calls are written in the ``hermes`` text format, or as native ``tool_calls`` when the
request carries ``tools`` and its ``tool_choice`` is not ``"none"`` (as vLLM does). The
policies are stateless per conversation (the turn is the number of assistant messages so far),
so concurrent episodes work; ``requests`` counts requests per model.

:meth:`ScriptedServer.go_down` plays a model-server restart: the listening socket and every open
connection close (new connections are refused, as while vLLM restarts) until
:meth:`ScriptedServer.come_up` listens on the same port again.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

ROOT = "/testbed"
EDITOR = "str_replace_editor"

Call = tuple[str, dict[str, Any]]
"""A scripted tool call: name and arguments."""

_HUNK = re.compile(r"^@@ -\d+(?:,(\d+))? \+\d+(?:,(\d+))? @@")


def patch_edits(patch: str) -> list[tuple[str, str, str]]:
    """The hunks of a unified diff as ``(path, old_text, new_text)`` (context included).

    Only modifications of existing files (what the swe-mini gold patches hold).
    """
    edits: list[tuple[str, str, str]] = []
    lines = patch.splitlines(keepends=True)
    path = ""
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if line.startswith("+++ "):
            path = line[4:].strip().removeprefix("b/")
            continue
        match = _HUNK.match(line)
        if not match:
            continue
        old_left = int(match.group(1) or 1)
        new_left = int(match.group(2) or 1)
        old: list[str] = []
        new: list[str] = []
        while (old_left or new_left) and i < len(lines):
            body = lines[i]
            i += 1
            tag, text = body[:1], body[1:]
            if body.startswith("\\"):  # "\ No newline at end of file"
                continue
            if tag in (" ", "\n", ""):
                text = text if tag == " " else "\n"
                old.append(text)
                new.append(text)
                old_left -= 1
                new_left -= 1
            elif tag == "-":
                old.append(text)
                old_left -= 1
            elif tag == "+":
                new.append(text)
                new_left -= 1
        edits.append((path, "".join(old), "".join(new)))
    return edits


def solver_script(instance: Mapping[str, Any]) -> list[Call]:
    """The calls that solve ``instance`` from its gold patch (see the module docstring)."""
    workdir = instance.get("workdir") or ROOT
    edits = patch_edits(instance["patch"])
    calls: list[Call] = [(EDITOR, {"command": "view", "path": f"{workdir}/{edits[0][0]}"})]
    for path, old, new in edits:
        calls.append(
            (
                EDITOR,
                {
                    "command": "str_replace",
                    "path": f"{workdir}/{path}",
                    "old_str": old,
                    "new_str": new,
                },
            )
        )
    pytest = "python -m pytest -q -p no:cacheprovider tests"
    calls.append(("bash", {"command": f"cd {workdir} && {pytest} 2>&1 | tail -3"}))
    calls.append(("submit", {}))
    return calls


GARBAGE_TEXT = [
    '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"\n</tool_call>',
    '{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>',
    '<tool_call>\n{"name": "rm_rf_everything", "arguments": {}}\n</tool_call>',
    '<tool_call>\n{"name": "bash", "arguments": "not json at all"}\n</tool_call>',
]
GARBAGE_NATIVE = [
    ("bash", '{"command": "ls"'),
    ("bash", "[1, 2, 3]"),
    ("rm_rf_everything", "{}"),
    ("bash", "not json at all"),
]


class ScriptedServer:
    """The server (see the module docstring).

    Args:
        instances: swe-mini instance records (``instance_id``, ``patch``, ``test_cmd``, ...).
        sleep_s: how long ``sleeper`` waits before answering.
        flaky_failures: 429 answers ``flaky`` gives per conversation before it answers.
        retry_after: the ``Retry-After`` header of those answers (``None``: no header).
        scripts: further models: name -> the calls it makes on an instance record.
    """

    def __init__(
        self,
        instances: Iterable[Mapping[str, Any]] = (),
        *,
        sleep_s: float = 30.0,
        flaky_failures: int = 2,
        retry_after: str | None = "0",
        scripts: Mapping[str, Callable[[dict[str, Any]], list[Call]]] | None = None,
    ) -> None:
        self.instances = {i["instance_id"]: dict(i) for i in instances}
        self.scripts = dict(scripts or {})
        self.sleep_s = sleep_s
        self.flaky_failures = flaky_failures
        self.retry_after = retry_after
        self.requests: Counter[str] = Counter()
        self.bodies: list[dict[str, Any]] = []
        self.authorizations: list[str | None] = []
        self._flaky_seen: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._port = 0
        self._connections: set[socket.socket] = set()
        self.down = False

    @property
    def url(self) -> str:
        """The API root, ``http://127.0.0.1:<port>/v1``."""
        assert self._port, "the server was never started"
        return f"http://127.0.0.1:{self._port}/v1"

    def start(self) -> ScriptedServer:
        httpd = ThreadingHTTPServer(("127.0.0.1", self._port), _Handler)
        httpd.daemon_threads = True
        httpd.scripted = self  # type: ignore[attr-defined]
        self._httpd = httpd
        self._port = httpd.server_address[1]
        self._thread = threading.Thread(
            target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving; a ``sleeper`` still waiting answers at once."""
        self._stopping.set()
        self._close()

    def go_down(self) -> None:
        """Stop listening and drop every open connection, as a server process that exits."""
        self.down = True
        self._close()
        with self._lock:
            open_now = list(self._connections)
        for conn in open_now:
            with contextlib.suppress(OSError):  # already closed by its handler
                conn.shutdown(socket.SHUT_RDWR)

    def come_up(self) -> None:
        """Listen again on the same port (the restarted server)."""
        self.down = False
        self.start()

    def track(self, conn: socket.socket, *, opened: bool) -> None:
        """Record (or forget) a connection a handler serves, for :meth:`go_down` to drop."""
        with self._lock:
            if opened:
                self._connections.add(conn)
            else:
                self._connections.discard(conn)

    def _close(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def __enter__(self) -> ScriptedServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # ----------------------------------------------------------------- policies

    def answer(self, body: dict[str, Any], authorization: str | None) -> tuple[int, dict, dict]:
        """``(status, headers, json body)`` for one request, with vLLM's extras when asked."""
        status, headers, payload = self._answer(body, authorization)
        if status == 200 and payload.get("choices"):
            _add_vllm_extras(body, payload)
        return status, headers, payload

    def _answer(self, body: dict[str, Any], authorization: str | None) -> tuple[int, dict, dict]:
        model = str(body.get("model", ""))
        messages: list[dict[str, Any]] = body.get("messages") or []
        native = bool(body.get("tools")) and body.get("tool_choice") != "none"
        with self._lock:
            self.requests[model] += 1
            self.bodies.append(body)
            self.authorizations.append(authorization)
        turn = sum(1 for m in messages if m.get("role") == "assistant")
        if model.startswith("status-"):
            code = int(model.removeprefix("status-"))
            message = f"scripted failure {code}"
            if code == 401:
                message = f"invalid credentials: {authorization}"
            return code, {}, {"error": {"message": message, "type": "scripted", "code": code}}
        if model == "overflow":
            return (
                400,
                {},
                _vllm_error(
                    "This model's maximum context length is 32768 tokens. However, you requested "
                    "40000 tokens in the messages. Please reduce the length of the messages."
                ),
            )
        if model == "malformed":
            return 200, {}, {"id": "x", "object": "chat.completion", "choices": []}
        if model == "flaky":
            key = _conversation_key(messages)
            with self._lock:
                self._flaky_seen[key] += 1
                failing = self._flaky_seen[key] <= self.flaky_failures
            if failing:
                headers = {"Retry-After": self.retry_after} if self.retry_after else {}
                return 429, headers, {"error": {"message": "rate limited", "type": "scripted"}}
        if model == "sleeper":
            self._stopping.wait(self.sleep_s)
        if model == "garbage":
            return 200, {}, self._garbage(turn, native, messages)
        if model == "quitter":
            return 200, {}, _completion("I am done here.", None, messages)
        if model == "stall":
            return 200, {}, self._calls([("bash", {"command": "sleep 600"})], native, messages)
        if model == "leaker":
            token = (authorization or "").removeprefix("Bearer ")
            script: list[Call] = [("bash", {"command": f"echo {token}"}), ("submit", {})]
            call = script[min(turn, len(script) - 1)]
            return 200, {}, self._calls([call], native, messages, thought=f"my key: {token}")
        if model in ("solver", "flaky", "sleeper") or model in self.scripts:
            instance = self._instance(messages)
            if instance is None:
                return 200, {}, _completion("I do not know this task.", None, messages)
            script = self.scripts.get(model, solver_script)(instance)
            call = script[min(turn, len(script) - 1)]
            return 200, {}, self._calls([call], native, messages, thought=f"Step {turn + 1}.")
        return 404, {}, {"error": {"message": f"The model `{model}` does not exist."}}

    def _instance(self, messages: list[dict[str, Any]]) -> dict[str, Any] | None:
        first_user = next((m for m in messages if m.get("role") == "user"), None)
        text = str(first_user.get("content", "")) if first_user else ""
        for instance_id, instance in self.instances.items():
            if instance_id in text:
                return instance
        return None

    @staticmethod
    def _calls(
        calls: list[Call], native: bool, messages: list[dict[str, Any]], thought: str = ""
    ) -> dict[str, Any]:
        if native:
            wire = [
                {
                    "id": f"call_{i}",
                    "type": "function",
                    "function": {"name": name, "arguments": json.dumps(args)},
                }
                for i, (name, args) in enumerate(calls)
            ]
            return _completion(thought, wire, messages)
        text = "\n".join(
            [thought]
            + [
                "<tool_call>\n" + json.dumps({"name": name, "arguments": args}) + "\n</tool_call>"
                for name, args in calls
            ]
        )
        return _completion(text, None, messages)

    @staticmethod
    def _garbage(turn: int, native: bool, messages: list[dict[str, Any]]) -> dict[str, Any]:
        if native:
            name, arguments = GARBAGE_NATIVE[turn % len(GARBAGE_NATIVE)]
            function = {"name": name, "arguments": arguments}
            wire = [{"id": "call_0", "type": "function", "function": function}]
            return _completion("", wire, messages)
        return _completion(GARBAGE_TEXT[turn % len(GARBAGE_TEXT)], None, messages)


def _conversation_key(messages: list[dict[str, Any]]) -> str:
    first = [m for m in messages if m.get("role") in ("system", "user")][:2]
    turn = sum(1 for m in messages if m.get("role") == "assistant")
    return hashlib.sha256(json.dumps([first, turn], sort_keys=True).encode()).hexdigest()


def _completion(
    content: str, tool_calls: list[dict[str, Any]] | None, messages: list[dict[str, Any]]
) -> dict[str, Any]:
    prompt_chars = sum(len(str(m.get("content") or "")) for m in messages)
    message: dict[str, Any] = {"role": "assistant", "content": content or None}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return {
        "id": f"chatcmpl-{time.monotonic_ns()}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": "scripted",
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if tool_calls else "stop",
            }
        ],
        "usage": {
            "prompt_tokens": prompt_chars // 4 + 1,
            "completion_tokens": len(content) // 4 + 1,
            "total_tokens": prompt_chars // 4 + len(content) // 4 + 2,
        },
    }


def _add_vllm_extras(body: dict[str, Any], payload: dict[str, Any]) -> None:
    """What vLLM adds to a completion when asked: ``choices[0].logprobs`` in OpenAI's shape for
    ``logprobs: true``; ``choices[0].token_ids`` and ``prompt_token_ids`` for vLLM's
    ``return_token_ids: true``. A "token" here is a word of the reply; id = 100 + its index."""
    choice = payload["choices"][0]
    tokens = (choice["message"].get("content") or "").split() or [""]
    if body.get("logprobs"):
        choice["logprobs"] = {
            "content": [
                {"token": t, "logprob": -0.25, "bytes": list(t.encode()), "top_logprobs": []}
                for t in tokens
            ]
        }
    if body.get("return_token_ids"):
        choice["token_ids"] = [100 + i for i in range(len(tokens))]
        payload["prompt_token_ids"] = list(range(len(body.get("messages") or [])))


def _vllm_error(message: str) -> dict[str, Any]:
    return {"object": "error", "message": message, "type": "BadRequestError", "code": 400}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 30  # an idle keep-alive connection ends its thread after this

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def setup(self) -> None:
        super().setup()
        self.server.scripted.track(self.connection, opened=True)  # type: ignore[attr-defined]

    def finish(self) -> None:
        self.server.scripted.track(self.connection, opened=False)  # type: ignore[attr-defined]
        with contextlib.suppress(OSError):  # dropped by go_down
            super().finish()

    def do_GET(self) -> None:
        if self.path.rstrip("/").endswith("/models"):
            self._send(200, {}, {"object": "list", "data": [{"id": "solver"}]})
        else:
            self._send(404, {}, {"error": {"message": "not found"}})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        if not self.path.rstrip("/").endswith("/chat/completions"):
            self._send(404, {}, {"error": {"message": f"no route {self.path}"}})
            return
        try:
            body = json.loads(raw)
        except json.JSONDecodeError as exc:
            self._send(400, {}, {"error": {"message": f"invalid JSON body: {exc}"}})
            return
        scripted: ScriptedServer = self.server.scripted  # type: ignore[attr-defined]
        if scripted.down:  # went down while this request was read: no answer
            self.close_connection = True
            return
        status, headers, payload = scripted.answer(body, self.headers.get("Authorization"))
        self._send(status, headers, payload)

    def _send(self, status: int, headers: dict[str, str], payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for name, value in headers.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (a sleeper past its timeout)
