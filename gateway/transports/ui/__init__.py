"""The approvals and audit page served by `dharma serve` at `/ui` (see `app`)."""

from gateway.transports.ui.app import ui_routes
from gateway.transports.ui.sessions import UiSessions

__all__ = ["UiSessions", "ui_routes"]
