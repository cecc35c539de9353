"""inboxd-client: a dependency-free client for the inboxd wire protocol.

``Client`` speaks the protocol over TCP; ``codec`` holds the frame and body
layouts with no IO; ``errors`` has one exception per protocol error code.
"""

from . import codec
from .client import Client, SyncRun, read_token_file
from .codec import PROTOCOL_VERSION, DeviceState, EventKind, MessageKind, Op, SnapshotState
from .errors import *  # noqa: F401,F403  (one exception class per error code)
from .errors import ConnectionClosed, InboxdError, ProtocolError, error_for

__all__ = [
    "Client",
    "SyncRun",
    "read_token_file",
    "codec",
    "PROTOCOL_VERSION",
    "DeviceState",
    "EventKind",
    "MessageKind",
    "Op",
    "SnapshotState",
    "ConnectionClosed",
    "InboxdError",
    "ProtocolError",
    "error_for",
]
