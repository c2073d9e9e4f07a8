"""Tool pinning (rug-pull defence): the first definition seen of each tool, per backend.

A tool seen for the first time is pinned; a tool whose definition (title, description, schemas,
annotations) differs from its pin is *changed*: rules see `tool.changed == true` (the shipped
standard and strict profiles hold such calls for approval) until an operator reviews the change
and accepts it with `dharma tools accept`. Accepting one named tool also records that exactly
this definition is accepted as it is: rules see `tool.accepted == true` (the shipped rules then
no longer hide it for its definition's findings, rules/tool_definitions.yaml).

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
from gateway.stores.base import PinState, PinStore, SeenTool, StoreUnavailable

__all__ = ["PinState", "PinStore", "diff_definitions", "now_stamp", "observe_or_distrust"]

#: What a tool counts as when the pins cannot be read or written: changed, and accepted by nobody.
DISTRUSTED = PinState(changed=True, accepted=False)

log = structlog.get_logger()


_last_stamp: tuple[int, str] = (-1, "")


def now_stamp() -> str:
    """The time a pin or a sighting is stamped with (UTC, seconds). Formatted once per second:
    every `tools/call` observes its tool's pin, and `strftime` cost more than the rest of a hit."""
    global _last_stamp
    second = int(time.time())
    if _last_stamp[0] != second:
        _last_stamp = (second, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(second)))
    return _last_stamp[1]


def diff_definitions(old: Any, new: Any) -> list[str]:
    """Short human lines naming what changed between two tool definitions."""
    lines = []
    for key in ("title", "description", "inputSchema", "outputSchema", "annotations"):
        a = old.get(key) if isinstance(old, dict) else None
        b = new.get(key) if isinstance(new, dict) else None
        if a != b:
            lines.append(f"{key}: {json.dumps(a, ensure_ascii=False)[:200]} -> {json.dumps(b, ensure_ascii=False)[:200]}")
    return lines


async def observe_or_distrust(
    pins: PinStore, backend: str, tools: list[dict[str, Any]], digests: list[str] | None = None
) -> dict[str, PinState]:
    """Pin what is new and say which definitions changed; if the pins cannot be read or written,
    every tool counts as changed (fail closed). Changes are logged with how to review them.

    `digests`, when given, are the definitions' `definition_digest`s in order (taken once when
    the catalog recorded them), so a call does not canonicalise its tool's definition again."""
    if digests is None or len(digests) != len(tools):
        digests = [definition_digest(t) if isinstance(t.get("name"), str) else "" for t in tools]
    seen = [SeenTool(t["name"], d, t) for t, d in zip(tools, digests) if isinstance(t.get("name"), str)]
    if not seen:
        return {}
    try:
        changed = await pins.observe(backend, seen, now_stamp())
    except (OSError, ValueError, StoreUnavailable) as exc:
        log.error("pins.unavailable", error=str(exc))
        return {t.name: DISTRUSTED for t in seen}
    for name, state in changed.items():
        if state.changed:
            log.warning("tool.definition_changed", backend=backend, tool=name,
                        hint=f"review with `dharma tools pins`, accept with `dharma tools accept {backend} {name}`")
    return changed
