"""The marker protocol between a :class:`~sandlot.runtimes.BashSession` and its bash.

The session writes bash code to the shell's standard input and reads its merged
stdout/stderr. Every command gets a fresh random nonce; the shell reports on the output stream
with *markers*, ``\\x1f<nonce>:<kind>:<n>[:<n>]\\x1f``, that no command can forge because it
never sees the nonce:

* ``R:<pid>`` -- bootstrap done, the shell's pid (as the sandbox sees pids);
* ``S:<pid>:<status>`` -- the command's syntax was checked by a child ``bash -n`` whose pid is
  ``<pid>``: a *fence*, since every process the command starts is allocated a pid after it
  (pids are handed out cyclically: "after" counts across the wrap-around at ``pid_max``);
  ``<status>`` is ``bash -n``'s (non-zero: the command did not run). Sent once the traps
  below are armed: from then on SIGINT stops the command. Before it, the shell is still
  reading and checking the command text with SIGINT ignored (seconds, for megabytes of
  text), so a stop must wait for this marker;
* ``E:<status>`` -- the command finished with exit status ``<status>``;
* ``X:<status>`` -- the shell itself is exiting with ``<status>`` (top-level ``exit``, or
  ``set -e`` tripping where the session cannot catch it).

Per command the session sends (see :func:`command_script`)::

    IFS= builtin read -r -d '' __sandlot_cmd <<'SANDLOT_<nonce>'
    <command>
    SANDLOT_<nonce>
    __sandlot_pre <nonce> && . /dev/fd/3 3<<<"<opts>$__sandlot_cmd" </dev/null;
        { __sandlot_post <nonce> "$?"; } 2>/dev/null      (one line)

so the command text reaches bash verbatim through a quoted here-document (any bytes but NUL;
no quoting, no length limit), is checked with ``bash -n`` first (as SWE-ReX does), and runs at
the shell's top level with ``.`` (``cd``, ``export``, ``declare`` and functions persist; a
function wrapper would make ``declare`` local). Its standard input is ``/dev/null``, so nothing
can read the protocol stream.

Traps, armed only while a command runs (the session owns INT, ERR and EXIT; a command that
sets them changes them until it ends):

* ``INT`` returns 130 from the running command (bash defers it until the foreground child
  exits); between commands SIGINT is ignored. Background jobs ignore SIGINT as bash gives
  them (no job control), so interrupting a command spares earlier background jobs. After an
  interrupt the shell forgets its jobs (``disown -a``): bash 5.2 keeps a stale entry for the
  interrupted foreground process, and a later process given the same pid would seem to end
  at once with the old status. Background jobs run on and ``$!`` stays, but ``jobs``, ``%n``
  and a bare ``wait`` no longer list them.
* ``ERR`` (with ``set -E`` so it reaches functions): when ``set -e`` is on, or an interrupt is
  unwinding, it returns from the current function or sourced file instead of letting bash
  exit, and at the command's top level it also clears ``-e``. ``set -e`` thus stops the
  command at its first failure with that failure's status, and the session lives on; the
  option is restored for the next command, like in a terminal. Subshells keep bash's own
  ``errexit`` behaviour.
* ``EXIT`` reports ``X`` so a top-level ``exit`` is seen even when a background job keeps the
  output stream open.

``set -x`` and ``set -e`` are switched off between commands (the ``{ ...; } 2>/dev/null``
groups hide the wrapper from ``xtrace``) and switched back on in front of the next command.
"""

from __future__ import annotations

import re
import secrets
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

MARK = b"\x1f"

SESSION_ENV: dict[str, str] = {
    "PAGER": "cat",
    "GIT_PAGER": "cat",
    "MANPAGER": "cat",
    "SYSTEMD_PAGER": "",
    "TERM": "dumb",
    "PYTHONUNBUFFERED": "1",
    "PIP_PROGRESS_BAR": "off",
    "PIP_NO_INPUT": "1",
    "GIT_TERMINAL_PROMPT": "0",
    "DEBIAN_FRONTEND": "noninteractive",
}
"""Exported by every session before ``SessionConfig.env``: no pager or prompt can wait for a
keyboard, and Python flushes output as it prints, so a timeout still shows what was printed."""

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_MAX_MARKER_BODY = 64

_ERR_TRAP = (
    "{ if [[ ${BASH_SUBSHELL-0} == 0 && ( $- == *e* || -n ${__sandlot_intr-} ) ]]; then "
    "if [[ -z ${FUNCNAME[0]-} && -z ${BASH_SOURCE[1]-} && $- == *e* ]]; then "
    "builtin set +e; __sandlot_errexit=1; fi; builtin return; fi; } 2>/dev/null"
)

_FUNCTIONS = r"""
__sandlot_pre() {
  { builtin exec -a bash "$BASH" -n -O extglob; } <<<"$__sandlot_cmd" &
  local __sandlot_p=$! __sandlot_st=0
  wait "$__sandlot_p" || __sandlot_st=$?
  if [[ $__sandlot_st == 0 ]]; then
    __sandlot_intr=
    builtin trap "__sandlot_exit $1" EXIT
    builtin trap '{ __sandlot_intr=1; builtin return 130; } 2>/dev/null' INT
    builtin trap "$__sandlot_err_trap" ERR
  fi
  builtin printf '\037%s:S:%d:%d\037' "$1" "$__sandlot_p" "$__sandlot_st" >&"$__sandlot_out"
  return "$__sandlot_st"
}
__sandlot_exit() {
  builtin printf '\037%s:X:%d\037' "$1" "$?" >&"$__sandlot_out"
}
__sandlot_post() {
  __sandlot_opts=${-//[^ex]/}${__sandlot_errexit:+e}
  builtin set +ex
  __sandlot_errexit=
  builtin trap '' INT
  builtin trap - ERR EXIT
  [[ -z $__sandlot_intr ]] || builtin disown -a
  builtin printf '\037%s:E:%d\037' "$1" "$2" >&"$__sandlot_out"
}
"""


def new_nonce() -> str:
    """A random marker nonce (16 hex digits)."""
    return secrets.token_hex(8)


def _sourced(text: str, nonce: str) -> str:
    """``text`` run at top level by ``.`` from a quoted here-document, stdin ``/dev/null``."""
    return f". /dev/fd/3 </dev/null 3<<'SANDLOT_{nonce}'\n{text}\nSANDLOT_{nonce}\n"


def bootstrap_script(
    nonce: str,
    *,
    prelude: str = "",
    env: Mapping[str, str] | None = None,
    startup: Sequence[str] = (),
) -> bytes:
    """The code that turns a plain ``bash`` reading stdin into a session shell.

    Args:
        nonce: nonce of the ``R`` marker that ends the bootstrap.
        prelude: backend code run first (limits, cgroup); it may ``exit`` to refuse to start.
        env: variables exported after :data:`SESSION_ENV` (which they override).
        startup: commands run once, in order, at top level with stdin ``/dev/null`` (e.g.
            ``source /opt/venv/bin/activate``); their output is discarded by the session.

    Raises:
        ValueError: an ``env`` name is not a shell identifier.
    """
    exports = {**SESSION_ENV, **(env or {})}
    bad = [k for k in exports if not _NAME.match(k)]
    if bad:
        raise ValueError(f"invalid environment variable name(s): {', '.join(map(repr, bad))}")
    lines = [
        "exec 2>&1",
        prelude,
        "exec {__sandlot_out}>&1",
        "set +o history; unset HISTFILE; set -E",
        "__sandlot_opts= __sandlot_intr= __sandlot_errexit=",
        f"__sandlot_err_trap={shlex.quote(_ERR_TRAP)}",
        "builtin trap '' INT",
        _FUNCTIONS,
        "export " + " ".join(f"{k}={shlex.quote(v)}" for k, v in exports.items()),
    ]
    lines += [_sourced(cmd, nonce) for cmd in startup]
    lines.append(f'builtin printf \'\\037%s:R:%d\\037\' {nonce} "$$" >&"$__sandlot_out"\n')
    return "\n".join(lines).encode()


def command_script(command: str, nonce: str) -> bytes:
    """The bytes that run ``command`` under the protocol (see the module docstring).

    Raises:
        ValueError: ``command`` contains a NUL character, which bash cannot read.
    """
    if "\0" in command:
        raise ValueError("the command contains a NUL character, which bash cannot run")
    delimiter = f"SANDLOT_{nonce}"
    return (
        f"IFS= builtin read -r -d '' __sandlot_cmd <<'{delimiter}'\n"
        f"{command}\n{delimiter}\n"
        f"__sandlot_pre {nonce} && . /dev/fd/3 "
        f'3<<<"${{__sandlot_opts:+builtin set -$__sandlot_opts; }}$__sandlot_cmd" </dev/null; '
        f'{{ __sandlot_post {nonce} "$?"; }} 2>/dev/null\n'
    ).encode("utf-8", "surrogateescape")


@dataclass(frozen=True)
class Marker:
    """A report of the shell: ``kind`` (``R``, ``S``, ``E`` or ``X``) and its numbers."""

    kind: str
    values: tuple[int, ...]


class MarkerScanner:
    """Splits the shell's output stream into output bytes and the markers of one nonce.

    Markers may arrive split across chunks; the bytes that might start one are held back until
    the next :meth:`feed`. Text that looks like a marker but is not well formed is output.
    """

    def __init__(self, nonce: str) -> None:
        self._prefix = MARK + nonce.encode() + b":"
        self._pending = b""

    def feed(self, data: bytes) -> list[bytes | Marker]:
        """Scan the next chunk; return output bytes and markers in stream order."""
        buf = self._pending + data
        items: list[bytes | Marker] = []
        start = 0
        while True:
            at = buf.find(self._prefix, start)
            if at < 0:
                keep = self._partial_prefix_len(buf, start)
                self._emit(items, buf[start : len(buf) - keep])
                self._pending = buf[len(buf) - keep :]
                return items
            body_start = at + len(self._prefix)
            end = buf.find(MARK, body_start, body_start + _MAX_MARKER_BODY + 1)
            if end < 0 and len(buf) - body_start <= _MAX_MARKER_BODY:
                self._emit(items, buf[start:at])
                self._pending = buf[at:]
                return items
            marker = _parse(buf[body_start:end]) if end >= 0 else None
            if marker is None:  # not ours after all: keep it as output
                self._emit(items, buf[start:body_start])
                start = body_start
                continue
            self._emit(items, buf[start:at])
            items.append(marker)
            start = end + 1

    def flush(self) -> bytes:
        """Whatever is held back, as output (call at end of stream)."""
        rest, self._pending = self._pending, b""
        return rest

    def _partial_prefix_len(self, buf: bytes, start: int) -> int:
        for n in range(min(len(self._prefix) - 1, len(buf) - start), 0, -1):
            if buf.endswith(self._prefix[:n]):
                return n
        return 0

    @staticmethod
    def _emit(items: list[bytes | Marker], data: bytes) -> None:
        if data:
            items.append(data)


def _parse(body: bytes) -> Marker | None:
    kind, _, rest = body.partition(b":")
    fields = rest.split(b":")
    if kind not in (b"R", b"S", b"E", b"X") or not all(f.isdigit() for f in fields):
        return None
    return Marker(kind.decode(), tuple(int(f) for f in fields))
