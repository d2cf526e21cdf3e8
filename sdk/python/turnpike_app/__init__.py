"""Turnpike apps in Python: `on_reactive_event` handlers served over the remote app protocol.

See `docs/remote-apps.md` in the Turnpike repository for the protocol.
"""

from .app import (
    App,
    Context,
    Event,
    ModelReply,
    Parked,
    Refused,
    ToolResult,
    PROTOCOL_VERSION,
)

__all__ = [
    "App",
    "Context",
    "Event",
    "ModelReply",
    "Parked",
    "Refused",
    "ToolResult",
    "PROTOCOL_VERSION",
]
