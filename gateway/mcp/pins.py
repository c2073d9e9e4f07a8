"""Tool pinning (rug-pull defence): the first definition seen of each tool, per backend.

A tool seen for the first time is pinned; a tool whose definition (title, description, schemas,
annotations) differs from its pin is *changed*: rules see `tool.changed == true` (the shipped
standard and strict profiles hold such calls for approval) until an operator reviews the change
and accepts it with `dharma tools accept`.

The pins live in a `PinStore` (gateway/stores/base.py): a JSON file under the state root
(`gateway.stores.file_pins`) or, with several replicas, Redis (`gateway.stores.redis`), so a
change seen by one replica holds calls on all. This module computes digests and fails closed.
"""

from __future__ import annotations

import json
import time
from typing import Any

import structlog

from gateway.mcp.governance import definition_digest
from gateway.stores.base import PinStore, SeenTool, StoreUnavailable

__all__ = ["PinStore", "diff_definitions", "now_stamp", "observe_or_distrust"]

log = structlog.get_logger()


def now_stamp() -> str:
    """The time a pin or a sighting is stamped with (UTC, seconds)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def diff_definitions(old: Any, new: Any) -> list[str]:
    """Short human lines naming what changed between two tool definitions."""
    lines = []
    for key in ("title", "description", "inputSchema", "outputSchema", "annotations"):
        a = old.get(key) if isinstance(old, dict) else None
        b = new.get(key) if isinstance(new, dict) else None
        if a != b:
            lines.append(f"{key}: {json.dumps(a, ensure_ascii=False)[:200]} -> {json.dumps(b, ensure_ascii=False)[:200]}")
    return lines


async def observe_or_distrust(pins: PinStore, backend: str, tools: list[dict[str, Any]]) -> dict[str, bool]:
    """Pin what is new and say which definitions changed; if the pins cannot be read or written,
    every tool counts as changed (fail closed). Changes are logged with how to review them."""
    seen = [SeenTool(t["name"], definition_digest(t), t) for t in tools if isinstance(t.get("name"), str)]
    if not seen:
        return {}
    try:
        changed = await pins.observe(backend, seen, now_stamp())
    except (OSError, ValueError, StoreUnavailable) as exc:
        log.error("pins.unavailable", error=str(exc))
        return {t.name: True for t in seen}
    for name, is_changed in changed.items():
        if is_changed:
            log.warning("tool.definition_changed", backend=backend, tool=name,
                        hint=f"review with `dharma tools pins`, accept with `dharma tools accept {backend} {name}`")
    return changed
