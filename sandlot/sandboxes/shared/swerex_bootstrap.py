"""The command an instance starts with: prepare the workdir, then become a SWE-ReX server.

For the backends whose data plane is a SWE-ReX server
(:mod:`sandlot.sandboxes.shared.swerex_plane`). It must ``exec`` the server so that the server is
PID 1 and receives the platform's SIGTERM (veFaaS's ``KillSandbox``): a server started under
``curl ... | bash`` or any wrapper that stays alive keeps the sandbox in ``Terminating`` until the
platform's grace period ends (uni-agent PR #94).

How the server gets there, first match wins:

1. ``swerex_python`` (``SwerexPlaneOptions``): a pre-staged interpreter with swe-rex (``{python} -m
   swerex.server``); nothing is installed;
2. the image's ``swerex-remote``, or ``python3`` that imports ``swerex.server``;
3. ``pip install swe-rex==1.4.0`` into ``python3``: from ``swerex_find_links`` (a wheelhouse
   directory or URL, ``--no-index``: no PyPI egress needed) when set, else from PyPI.

Sandlot cannot upload the wheels itself: the data plane *is* the SWE-ReX server, which does not
run yet, and the control plane carries no files (see ``docs/cloud-backends.md``).
The port is ``$SANDLOT_SWEREX_PORT`` when the platform sets it, else ``SwerexPlaneOptions.port``.
The token goes as ``--auth-token=TOKEN``: a random token may begin with ``-``, which argparse
would take for an option after a separate ``--auth-token``.
"""

from __future__ import annotations

import shlex

SWEREX_REQUIREMENT = "swe-rex==1.4.0"

DEFAULT_BOOTSTRAP = (
    "mkdir -p {workdir} && cd {workdir} || exit 1; "
    'P="${{SANDLOT_SWEREX_PORT:-{port}}}"; '
    'if [ -n {python} ]; then exec {python} -m swerex.server --host 0.0.0.0 --port "$P" '
    "--auth-token={token}; fi; "
    "if ! command -v swerex-remote >/dev/null 2>&1 && "
    "! python3 -c 'import swerex.server' >/dev/null 2>&1; then "
    "if [ -n {find_links} ]; then "
    "python3 -m pip install -q --no-index --find-links {find_links} {requirement} || exit 1; "
    "else python3 -m pip install -q {requirement} || exit 1; fi; fi; "
    "if command -v swerex-remote >/dev/null 2>&1; then "
    'exec swerex-remote --host 0.0.0.0 --port "$P" --auth-token={token}; '
    'else exec python3 -m swerex.server --host 0.0.0.0 --port "$P" --auth-token={token}; fi'
)


def bootstrap_command(
    template: str | None,
    *,
    workdir: str,
    port: int,
    token: str,
    python: str | None = None,
    find_links: str | None = None,
) -> str:
    """``template`` (default :data:`DEFAULT_BOOTSTRAP`) with its placeholders filled, quoted.

    Args:
        template: a start command with ``{workdir}``, ``{port}``, ``{token}`` and optionally
            ``{python}``, ``{find_links}``, ``{requirement}``; ``None`` for the default.
        workdir: the sandbox's working directory.
        port: the server's port when the platform sets no ``SANDLOT_SWEREX_PORT``.
        token: the server's API key.
        python: ``SwerexPlaneOptions.swerex_python`` (``""`` when unset).
        find_links: ``SwerexPlaneOptions.swerex_find_links`` (``""`` when unset).
    """
    return (template or DEFAULT_BOOTSTRAP).format(
        workdir=shlex.quote(workdir),
        port=port,
        token=shlex.quote(token),
        python=shlex.quote(python or ""),
        find_links=shlex.quote(find_links or ""),
        requirement=shlex.quote(SWEREX_REQUIREMENT),
    )
