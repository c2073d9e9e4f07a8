"""Tool pins in a JSON file under the state root (`mcp-pins.json`): the one-machine form of
`PinStore` (gateway/stores/base.py); several replicas share pins in Redis instead.

The file is read and written under an exclusive lock (several `dharma stdio` processes may
share a state root) and replaced atomically. Definitions already observed with the same
digest are answered from memory while the file is unchanged, so an acceptance made by `dharma
tools accept` in another process takes effect on the next call.

"Unchanged" is asked of the file itself, kept open since it was last read (`_Watch`): an
`fstat` of it (~2.6 µs a call in `dharma serve`, where a `stat` of the path took ~10.6 µs) sees
it replaced (no link left: every writer replaces it) or edited in place (ctime, mtime, size).
Only a rename of the file away (another link kept) within the filesystem clock's tick of its last
change could leave its ctime as it was, so the path is also asked until a look made a settling
time after that change found the same file there.
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

from gateway.crypto import strict_json
from gateway.crypto.strict_json import StrictJSONError
from gateway.stores.base import PinState, SeenTool

PINS_FILE = "mcp-pins.json"
#: How long after a file's last change its ctime is trusted to show the next one (far above any
#: filesystem timestamp granularity and the coarse clock the kernel stamps changes with).
SETTLE_NS = 2_000_000_000


class _Watch:
    """The pin file as it was when last read: an open descriptor and its stamp, closed when dropped."""

    __slots__ = ("fd", "stamp", "settled")

    def __init__(self, fd: int) -> None:
        self.fd = fd
        st = os.fstat(fd)
        self.stamp = (st.st_ctime_ns, st.st_mtime_ns, st.st_size)
        self.settled = False  # whether a look at the path made SETTLE_NS after the last change found this file

    def __del__(self) -> None:
        os.close(self.fd)


class FilePinStore:
    """Pins of tool definitions under a state root."""

    def __init__(self, state_dir: Path) -> None:
        self.path = Path(state_dir).expanduser() / PINS_FILE
        self._name = str(self.path)
        self._known: dict[tuple[str, str], tuple[str, PinState]] = {}  # (backend, tool) -> (digest seen, state)
        self._watch: _Watch | None = None  # the file `_known` reflects (None: there was none)

    def _unchanged(self) -> bool:
        """Whether the file at the path is still the one `_known` reflects, as it was then."""
        watch = self._watch
        if watch is None:
            try:
                os.stat(self._name)
            except FileNotFoundError:
                return True  # still no file
            return False
        st = os.fstat(watch.fd)
        if st.st_nlink == 0 or (st.st_ctime_ns, st.st_mtime_ns, st.st_size) != watch.stamp:
            return False
        if watch.settled:
            return True
        now = time.time_ns()  # taken before the path is asked: that look is then later than `now`
        try:
            at_path = os.stat(self._name)
        except FileNotFoundError:
            return False
        if (at_path.st_dev, at_path.st_ino) != (st.st_dev, st.st_ino):
            return False
        watch.settled = now - st.st_ctime_ns > SETTLE_NS
        return True

    def _rewatch(self) -> None:
        """Watch the file as it is now (called under the lock, after any write)."""
        self._watch = None
        try:
            fd = os.open(self._name, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return
        self._watch = _Watch(fd)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[dict[str, Any]]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_suffix(".lock"), "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not self._unchanged():  # another process wrote since `_known` was filled
                self._known.clear()
            data = self._read()
            before = json.dumps(data, sort_keys=True)
            yield data
            if json.dumps(data, sort_keys=True) != before:
                tmp = self.path.with_suffix(f".tmp{os.getpid()}")
                tmp.write_text(json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False), encoding="utf-8")
                os.replace(tmp, self.path)
            self._rewatch()  # what `_known` now reflects (taken under the lock)

    def _read(self) -> dict[str, Any]:
        try:
            data = strict_json.loads(self.path.read_bytes())
        except FileNotFoundError:
            return {"version": 1, "backends": {}}
        except StrictJSONError as exc:  # one reading only: a duplicated pin must not mean two definitions
            raise ValueError(f"{self.path}: not a pin file ({exc})") from None
        if not isinstance(data, dict) or not isinstance(data.get("backends"), dict):
            raise ValueError(f"{self.path}: not a pin file")
        return data

    async def observe(self, backend: str, seen: builtins.list[SeenTool], now: str) -> dict[str, PinState]:
        out: dict[str, PinState] = {}
        pending: builtins.list[SeenTool] = []
        if not self._unchanged():
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
