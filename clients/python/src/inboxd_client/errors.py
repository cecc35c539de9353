"""Exceptions: one class per protocol error code (PROTOCOL.md section 3).

Every error reply raises a subclass of :class:`InboxdError` carrying the
code, the code-specific ``detail`` and the server's human message. A code
this client does not know raises :class:`InboxdError` itself.
"""

from __future__ import annotations


class InboxdError(Exception):
    """An ``ERROR`` reply from the server."""

    code: int = 0
    name: str = "OTHER"

    def __init__(self, code: int, detail: int, message: str, leader_addr: str | None = None) -> None:
        super().__init__(f"{_NAMES.get(code, 'OTHER')} ({code}): {message} [detail {detail}]")
        self.code = code
        self.detail = detail
        self.message = message
        self._leader_addr = leader_addr


class ConnectionClosed(Exception):
    """The server closed the connection (after an error frame, if any)."""


class ProtocolError(Exception):
    """The server sent bytes this client cannot parse."""


class BadRequestError(InboxdError):
    code, name = 1, "BAD_REQUEST"


class UnauthenticatedError(InboxdError):
    code, name = 2, "UNAUTHENTICATED"


class ForbiddenError(InboxdError):
    code, name = 3, "FORBIDDEN"


class StaleGenerationError(InboxdError):
    """``detail`` is the device's current generation."""

    code, name = 4, "STALE_GENERATION"


class ResetRequiredError(InboxdError):
    """``detail`` is the device's new generation: install a snapshot."""

    code, name = 5, "RESET_REQUIRED"


class DeviceRevokedError(InboxdError):
    code, name = 6, "DEVICE_REVOKED"


class RateLimitedError(InboxdError):
    """``detail`` is how many milliseconds to wait before retrying."""

    code, name = 7, "RATE_LIMITED"


class TooLargeError(InboxdError):
    """``detail`` is the limit in bytes."""

    code, name = 8, "TOO_LARGE"


class UnsupportedError(InboxdError):
    """Unknown opcode, or a protocol version the server does not speak
    (``detail`` is then the newest it speaks)."""

    code, name = 9, "UNSUPPORTED"


class InternalError(InboxdError):
    code, name = 10, "INTERNAL"


class DeviceResettingError(InboxdError):
    code, name = 11, "DEVICE_RESETTING"


class NotFoundError(InboxdError):
    code, name = 12, "NOT_FOUND"


class BadTokenError(InboxdError):
    code, name = 13, "BAD_TOKEN"


class AckBeyondHwmError(InboxdError):
    """``detail`` is the batch's high watermark."""

    code, name = 14, "ACK_BEYOND_HWM"


class ConflictError(InboxdError):
    code, name = 15, "CONFLICT"


class NoSpaceError(InboxdError):
    code, name = 16, "NO_SPACE"


class UnavailableError(InboxdError):
    code, name = 17, "UNAVAILABLE"


class MarkerMovedError(InboxdError):
    """A large group's marker moved past the version a clear observed;
    ``detail`` is the current version: pull again, then clear it."""

    code, name = 18, "MARKER_MOVED"


class NotLeaderError(InboxdError):
    """This node of a replicated group does not lead (or lost the
    leadership before the request committed). ``leader_addr`` is the
    leader's client address when the node knows it: retry there with the
    same idempotency key."""

    code, name = 19, "NOT_LEADER"

    @property
    def leader_addr(self) -> str | None:
        """The ``leader_addr`` field of the error (protocol version 3)."""
        return self._leader_addr


_BY_CODE: dict[int, type[InboxdError]] = {
    cls.code: cls
    for cls in (
        BadRequestError,
        UnauthenticatedError,
        ForbiddenError,
        StaleGenerationError,
        ResetRequiredError,
        DeviceRevokedError,
        RateLimitedError,
        TooLargeError,
        UnsupportedError,
        InternalError,
        DeviceResettingError,
        NotFoundError,
        BadTokenError,
        AckBeyondHwmError,
        ConflictError,
        NoSpaceError,
        UnavailableError,
        MarkerMovedError,
        NotLeaderError,
    )
}
_NAMES = {code: cls.name for code, cls in _BY_CODE.items()}


def error_for(code: int, detail: int, message: str, leader_addr: str | None = None) -> InboxdError:
    """The exception for an ``ERROR`` reply."""
    return _BY_CODE.get(code, InboxdError)(code, detail, message, leader_addr)
