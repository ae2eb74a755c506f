"""airlock: self-hosted microVM sandboxes for AI agents, from Python.

Standard library only. Talks to the local ``airlockd`` over its unix socket
(as the ``airlock`` CLI finds it) or to ``$AIRLOCK_URL``::

    from airlock import Sandbox
    with Sandbox.create(image="minimal", metadata={"task": "t-17"}) as sb:
        r = sb.exec("sh", "-c", "echo $((6*7))")
        print(r.exit_code, r.stdout)
"""

from .aio import AsyncProcess, AsyncSandbox, AsyncStream
from .errors import (AirlockError, Conflict, DaemonUnavailable, GuestError, InternalError,
                     InvalidArgument, MethodNotAllowed, NotFound, PayloadTooLarge, RouteNotFound,
                     QuotaExceeded, RateLimited, SandboxFailed, SandboxNotFound, Timeout,
                     Unauthenticated, Unavailable, Unsupported)
from .sandbox import Client, ExecStream, Process, Sandbox, default_client
from .types import ExecEvent, ExecResult, FileEntry, WatchEvent
from ._transport import default_socket

__version__ = "0.1.0"

__all__ = [
    "AirlockError", "AsyncProcess", "AsyncSandbox", "AsyncStream", "Client", "Conflict",
    "DaemonUnavailable",
    "ExecEvent", "ExecResult", "ExecStream", "FileEntry", "GuestError", "InternalError",
    "InvalidArgument", "MethodNotAllowed", "NotFound", "PayloadTooLarge", "Process",
    "QuotaExceeded", "RateLimited", "RouteNotFound", "Sandbox", "SandboxFailed",
    "SandboxNotFound", "Timeout", "Unauthenticated", "Unavailable",
    "Unsupported", "WatchEvent", "default_client", "default_socket",
]
