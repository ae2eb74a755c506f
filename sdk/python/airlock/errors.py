"""Exceptions raised by the SDK.

Every error the daemon reports arrives as ``{"error": {"code", "message",
"field"}}``; the SDK raises the subclass of :class:`AirlockError` that matches
``code`` and keeps all three, so callers can branch on the type and still show
the server's own message.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Type


class AirlockError(Exception):
    """Base class of every SDK error.

    Attributes:
        code: the daemon's machine-readable code (``invalid_argument``,
            ``not_found``, ``conflict``, ...), or ``connection`` when the
            daemon could not be reached at all.
        message: the human message, naming what was wrong.
        field: the request field the error is about, or ``None``.
        status: the HTTP status, or ``None`` for client-side errors.
    """

    def __init__(self, code: str, message: str, field: Optional[str] = None,
                 status: Optional[int] = None) -> None:
        super().__init__(f"{code}: {message}" + (f" (field: {field})" if field else ""))
        self.code = code
        self.message = message
        self.field = field
        self.status = status


class InvalidArgument(AirlockError):
    """The request was malformed or out of range (HTTP 400); ``field`` names the culprit."""


class NotFound(AirlockError):
    """Something named in the request does not exist (HTTP 404)."""


class SandboxNotFound(NotFound):
    """No sandbox with that id exists (HTTP 404, field ``id``)."""


class RouteNotFound(NotFound):
    """The daemon does not serve this route: it predates the feature that needs it."""


class MethodNotAllowed(AirlockError):
    """The route exists but not with this HTTP method (HTTP 405)."""


class Conflict(AirlockError):
    """The action does not fit the sandbox's current state (HTTP 409)."""


class SandboxFailed(Conflict):
    """The sandbox has failed, so the action cannot run.

    Attributes:
        sandbox_id: the failed sandbox.
        failure: the typed cause: ``guest_panic``, ``vmm_died``, ``agent_lost``,
            ``oom``, ``net_helper_died`` or ``boot_failed``.
        reason: the daemon's detailed reason.
    """

    def __init__(self, code: str, message: str, field: Optional[str] = None,
                 status: Optional[int] = None, *, sandbox_id: str = "", failure: str = "",
                 reason: str = "") -> None:
        super().__init__(code, message, field, status)
        self.sandbox_id = sandbox_id
        self.failure = failure
        self.reason = reason


class PayloadTooLarge(AirlockError):
    """The request body is over the daemon's limit (HTTP 413)."""


class Timeout(AirlockError):
    """A deadline passed: the daemon's (HTTP 504) or the client's own wait."""


class Unavailable(AirlockError):
    """A resource is missing or exhausted, e.g. an image that is not built (HTTP 503)."""


class GuestError(AirlockError):
    """The guest agent failed or broke the protocol (HTTP 502)."""


class InternalError(AirlockError):
    """airlock's own bug or a host failure (HTTP 500)."""


class DaemonUnavailable(AirlockError):
    """The daemon could not be reached (no socket, connection refused or reset)."""


class Unsupported(AirlockError):
    """The daemon does not support a feature this call needs (it is older than the SDK)."""


class Unauthenticated(AirlockError):
    """No valid token on a TCP listener (HTTP 401; never says which part failed)."""


class QuotaExceeded(AirlockError):
    """The tenant's quota is reached (HTTP 429); ``field`` names the limit."""


class RateLimited(AirlockError):
    """Too many requests of a kind (HTTP 429): auth failures, creates per minute."""


_BY_CODE: Dict[str, Type[AirlockError]] = {
    "unauthenticated": Unauthenticated,
    "quota_exceeded": QuotaExceeded,
    "rate_limited": RateLimited,
    "invalid_argument": InvalidArgument,
    "not_found": NotFound,
    "method_not_allowed": MethodNotAllowed,
    "conflict": Conflict,
    "payload_too_large": PayloadTooLarge,
    "timeout": Timeout,
    "unavailable": Unavailable,
    "guest_error": GuestError,
    "protocol_error": GuestError,
    "internal": InternalError,
}


def error_from_body(status: Optional[int], body: Any) -> AirlockError:
    """Builds the matching exception from a daemon error body (or anything else)."""
    err = body.get("error") if isinstance(body, dict) else None
    if not isinstance(err, dict):
        text = body.decode(errors="replace") if isinstance(body, bytes) else str(body)
        return InternalError("internal", f"HTTP {status}: {text[:500]}", None, status)
    code = str(err.get("code") or "internal")
    message = str(err.get("message") or "")
    field = err.get("field") or None
    cls = _BY_CODE.get(code, AirlockError)
    if cls is NotFound:
        if message.startswith("no route for"):
            cls = RouteNotFound
        elif field == "id" or message.startswith("no sandbox"):
            cls = SandboxNotFound
    return cls(code, message, field, status)
