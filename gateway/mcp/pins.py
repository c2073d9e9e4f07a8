"""Tool pinning (rug-pull defence): the first definition seen of each tool, per backend.

The pins live in `<state root>/mcp-pins.json`. A tool seen for the first time is pinned; a tool
whose definition (title, description, schemas, annotations) differs from its pin is *changed*:
rules see `tool.changed == true` (the shipped standard and strict profiles hold such calls for
approval) until an operator reviews the change and accepts it with `dharma tools accept`.

The file is read and written under an exclusive lock (several `dharma stdio` processes may
share a state root) and replaced atomically.
"""

from __future__ import annotations

import builtins
import contextlib
import fcntl
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import structlog

from gateway.mcp.governance import definition_digest

PINS_FILE = "mcp-pins.json"


log = structlog.get_logger()

class PinStore:
    """Pins of tool definitions under a state root."""

    def __init__(self, state_dir: Path) -> None:
        self.path = Path(state_dir).expanduser() / PINS_FILE
        self._known: dict[tuple[str, str], tuple[str, bool]] = {}  # (backend, tool) -> (digest seen, changed)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[dict[str, Any]]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_suffix(".lock"), "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            data = self._read()
            before = json.dumps(data, sort_keys=True)
            yield data
            if json.dumps(data, sort_keys=True) != before:
                tmp = self.path.with_suffix(f".tmp{os.getpid()}")
                tmp.write_text(json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False), encoding="utf-8")
                os.replace(tmp, self.path)

    def _read(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {"version": 1, "backends": {}}
        if not isinstance(data, dict) or not isinstance(data.get("backends"), dict):
            raise ValueError(f"{self.path}: not a pin file")
        return data

    def observe(self, backend: str, tools: list[dict[str, Any]]) -> dict[str, bool]:
        """Record the definitions seen; return {tool name: changed} for each of them."""
        out: dict[str, bool] = {}
        pending: list[tuple[str, str, dict[str, Any]]] = []
        for tool in tools:
            name = tool.get("name")
            if not isinstance(name, str):
                continue
            d = definition_digest(tool)
            known = self._known.get((backend, name))
            if known is not None and known[0] == d:
                out[name] = known[1]
            else:
                pending.append((name, d, tool))
        if pending:
            now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            with self._locked() as data:
                pins = data["backends"].setdefault(backend, {})
                for name, d, tool in pending:
                    pin = pins.get(name)
                    if pin is None:
                        pins[name] = {"digest": d, "definition": tool, "pinned_at": now}
                        changed = False
                    else:
                        changed = pin["digest"] != d
                        if changed:
                            if pin.get("seen_digest") != d:
                                pin["seen_digest"], pin["seen_definition"], pin["seen_at"] = d, tool, now
                        else:
                            for k in ("seen_digest", "seen_definition", "seen_at"):
                                pin.pop(k, None)
                    self._known[(backend, name)] = (d, changed)
                    out[name] = changed
        return out

    def changed(self, backend: str, tool: dict[str, Any]) -> bool:
        return self.observe(backend, [tool]).get(tool.get("name", ""), False)

    def list(self, backend: str | None = None) -> list[dict[str, Any]]:
        """Every pin (optionally of one backend), with whether a changed definition was seen."""
        data = self._read()
        rows = []
        for b, pins in sorted(data["backends"].items()):
            if backend is not None and b != backend:
                continue
            for name, pin in sorted(pins.items()):
                rows.append(
                    {
                        "backend": b,
                        "tool": name,
                        "digest": pin["digest"],
                        "pinned_at": pin.get("pinned_at"),
                        "changed": "seen_digest" in pin,
                        "seen_digest": pin.get("seen_digest"),
                        "seen_at": pin.get("seen_at"),
                        "definition": pin.get("definition"),
                        "seen_definition": pin.get("seen_definition"),
                    }
                )
        return rows

    def accept(self, backend: str, tool: str | None = None) -> builtins.list[str]:
        """Pin the last seen definition of `tool` (or of every changed tool of `backend`)."""
        accepted: builtins.list[str] = []
        with self._locked() as data:
            pins = data["backends"].get(backend)
            if pins is None:
                raise KeyError(backend)
            names = [tool] if tool is not None else [n for n, p in pins.items() if "seen_digest" in p]
            for name in names:
                pin = pins.get(name)
                if pin is None:
                    raise KeyError(f"{backend}/{name}")
                if "seen_digest" not in pin:
                    continue
                pins[name] = {
                    "digest": pin["seen_digest"],
                    "definition": pin["seen_definition"],
                    "pinned_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                }
                accepted.append(name)
        for name in accepted:
            self._known.pop((backend, name), None)
        return accepted


def diff_definitions(old: Any, new: Any) -> list[str]:
    """Short human lines naming what changed between two tool definitions."""
    lines = []
    for key in ("title", "description", "inputSchema", "outputSchema", "annotations"):
        a = old.get(key) if isinstance(old, dict) else None
        b = new.get(key) if isinstance(new, dict) else None
        if a != b:
            lines.append(f"{key}: {json.dumps(a, ensure_ascii=False)[:200]} -> {json.dumps(b, ensure_ascii=False)[:200]}")
    return lines


def observe_or_distrust(pins: PinStore, backend: str, tools: list[dict[str, Any]]) -> dict[str, bool]:
    """Pin what is new and say which definitions changed; if the pins cannot be read or written,
    every tool counts as changed (fail closed). Changes are logged with how to review them."""
    try:
        changed = pins.observe(backend, tools)
    except (OSError, ValueError) as exc:
        log.error("pins.unavailable", error=str(exc))
        return {t["name"]: True for t in tools}
    for name, is_changed in changed.items():
        if is_changed:
            log.warning("tool.definition_changed", backend=backend, tool=name,
                        hint=f"review with `dharma tools pins`, accept with `dharma tools accept {backend} {name}`")
    return changed

