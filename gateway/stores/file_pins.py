"""Tool pins in a JSON file under the state root (`mcp-pins.json`): the one-machine form of
`PinStore` (gateway/stores/base.py); several replicas share pins in Redis instead.

The file is read and written under an exclusive lock (several `dharma stdio` processes may
share a state root) and replaced atomically. Definitions already observed with the same
digest are answered from memory while the file is unchanged (one `stat`), so an acceptance made
by `dharma tools accept` in another process takes effect on the next call.
"""

from __future__ import annotations

import builtins
import contextlib
import fcntl
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gateway.stores.base import PinState, SeenTool

PINS_FILE = "mcp-pins.json"


class FilePinStore:
    """Pins of tool definitions under a state root."""

    def __init__(self, state_dir: Path) -> None:
        self.path = Path(state_dir).expanduser() / PINS_FILE
        self._known: dict[tuple[str, str], tuple[str, PinState]] = {}  # (backend, tool) -> (digest seen, state)
        self._stamp: tuple[int, int, int] | None = None  # the file's (inode, mtime_ns, size) `_known` reflects

    def _file_stamp(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        return st.st_ino, st.st_mtime_ns, st.st_size

    @contextlib.contextmanager
    def _locked(self) -> Iterator[dict[str, Any]]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_suffix(".lock"), "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if self._file_stamp() != self._stamp:  # another process wrote since `_known` was filled
                self._known.clear()
            data = self._read()
            before = json.dumps(data, sort_keys=True)
            yield data
            if json.dumps(data, sort_keys=True) != before:
                tmp = self.path.with_suffix(f".tmp{os.getpid()}")
                tmp.write_text(json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False), encoding="utf-8")
                os.replace(tmp, self.path)
            self._stamp = self._file_stamp()  # what `_known` now reflects (taken under the lock)

    def _read(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {"version": 1, "backends": {}}
        if not isinstance(data, dict) or not isinstance(data.get("backends"), dict):
            raise ValueError(f"{self.path}: not a pin file")
        return data

    async def observe(self, backend: str, seen: builtins.list[SeenTool], now: str) -> dict[str, PinState]:
        out: dict[str, PinState] = {}
        pending: builtins.list[SeenTool] = []
        stamp = self._file_stamp()
        if stamp != self._stamp:
            self._known.clear()
        for tool in seen:
            known = self._known.get((backend, tool.name))
            if known is not None and known[0] == tool.digest:
                out[tool.name] = known[1]
            else:
                pending.append(tool)
        if pending:
            with self._locked() as data:
                pins = data["backends"].setdefault(backend, {})
                for tool in pending:
                    pin = pins.get(tool.name)
                    if pin is None:
                        pin = pins[tool.name] = {"digest": tool.digest, "definition": tool.definition, "pinned_at": now}
                        changed = False
                    else:
                        changed = pin["digest"] != tool.digest
                        if changed:
                            if pin.get("seen_digest") != tool.digest:
                                pin["seen_digest"], pin["seen_definition"], pin["seen_at"] = tool.digest, tool.definition, now
                        else:
                            for k in ("seen_digest", "seen_definition", "seen_at"):
                                pin.pop(k, None)
                    state = PinState(changed, pin.get("accepted_digest") == tool.digest)
                    self._known[(backend, tool.name)] = (tool.digest, state)
                    out[tool.name] = state
        return out

    async def list(self, backend: str | None = None) -> builtins.list[dict[str, Any]]:
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
                        "accepted_digest": pin.get("accepted_digest"),
                    }
                )
        return rows

    async def accept(self, backend: str, tool: str | None, now: str) -> builtins.list[str]:
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
                if "seen_digest" in pin:
                    pin = pins[name] = {"digest": pin["seen_digest"], "definition": pin["seen_definition"], "pinned_at": now}
                elif tool is None:
                    continue
                if tool is not None:
                    pin["accepted_digest"] = pin["digest"]
                accepted.append(name)
        for name in accepted:
            self._known.pop((backend, name), None)
        return accepted
