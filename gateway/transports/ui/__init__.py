"""The approvals and audit page served by `dharma serve` at `/ui` (see `app`)."""

from gateway.transports.ui.app import ui_routes

__all__ = ["ui_routes"]
