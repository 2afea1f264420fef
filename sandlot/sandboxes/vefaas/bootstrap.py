"""The command a veFaaS instance starts with: prepare the workdir, then become a SWE-ReX server.

It must ``exec`` the server so that the server is PID 1 and receives the SIGTERM of
``KillSandbox``: a server started under ``curl ... | bash`` or any wrapper that stays alive keeps
the sandbox in ``Terminating`` until the platform's grace period ends (uni-agent PR #94).

The default uses the image's ``swerex-remote`` or ``python3 -m swerex.server`` and installs
``swe-rex==1.4.0`` with pip when the image has neither (which needs egress from the function).
The port is ``$SANDLOT_SWEREX_PORT`` when the platform sets it, else ``VefaasOptions.port``.
The token goes as ``--auth-token=TOKEN``: a random token may begin with ``-``, which argparse
would take for an option after a separate ``--auth-token``.
"""

from __future__ import annotations

import shlex

DEFAULT_BOOTSTRAP = (
    "mkdir -p {workdir} && cd {workdir} || exit 1; "
    'P="${{SANDLOT_SWEREX_PORT:-{port}}}"; '
    "if ! command -v swerex-remote >/dev/null 2>&1 && "
    "! python3 -c 'import swerex.server' >/dev/null 2>&1; then "
    "python3 -m pip install -q 'swe-rex==1.4.0' || exit 1; fi; "
    "if command -v swerex-remote >/dev/null 2>&1; then "
    'exec swerex-remote --host 0.0.0.0 --port "$P" --auth-token={token}; '
    'else exec python3 -m swerex.server --host 0.0.0.0 --port "$P" --auth-token={token}; fi'
)


def bootstrap_command(template: str | None, *, workdir: str, port: int, token: str) -> str:
    """``template`` (default :data:`DEFAULT_BOOTSTRAP`) with its placeholders filled, quoted."""
    return (template or DEFAULT_BOOTSTRAP).format(
        workdir=shlex.quote(workdir), port=port, token=shlex.quote(token)
    )
