"""What runs commands inside a sandbox: long-lived bash sessions and the SWE-ReX client.

``await sandbox.shell(name)`` returns a :class:`BashSession`; see
:mod:`sandlot.runtimes.session`, the marker protocol in :mod:`sandlot.runtimes.protocol` and
``docs/sessions-and-tools.md``.
"""

from sandlot.runtimes.channel import Channel
from sandlot.runtimes.channel_session import ChannelSession
from sandlot.runtimes.exec_session import ExecSession
from sandlot.runtimes.observation import INTERRUPTED_EXIT_CODE, SYNTAX_ERROR_EXIT_CODE, Observation
from sandlot.runtimes.session import BashSession, SessionClosedError, SessionConfig

__all__ = [
    "INTERRUPTED_EXIT_CODE",
    "SYNTAX_ERROR_EXIT_CODE",
    "BashSession",
    "Channel",
    "ChannelSession",
    "ExecSession",
    "Observation",
    "SessionClosedError",
    "SessionConfig",
]
