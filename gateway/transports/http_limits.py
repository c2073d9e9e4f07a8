"""Bounded connections for `dharma serve`: caps on open connections, deadlines for a request's
head and body, keep-alive limits (docs/operations.md#limits-and-abuse).

uvicorn's httptools protocol times a connection only between two requests (its keep-alive timer,
cancelled by any byte received): a client that sends its headers a byte at a time (slowloris), a
body that never ends, or a kept-alive connection fed blank lines holds its socket for ever, and
nothing caps how many sockets are open. Here, at the connection level, so `/mcp`, `/v1` and `/ui`
alike:

- Admission. A new connection over `max_connections` (all addresses) or over
  `max_connections_per_address` (one IPv4 address, or one IPv6 /64) is answered at once, 503 or
  429 with `Retry-After` and a JSON body naming the limit, half-closed and dropped when the client
  closes or after `LINGER_SECONDS` (`LingeringConnection`). It never reaches uvicorn or the app.
- Deadlines. Each admitted connection notes what it waits for (`HEAD`, `BODY`, `WAIT`, `IDLE`)
  and since when, read from the guard's clock; one timer per server (`ConnectionGuard`, every
  `tick` seconds) walks the open connections and closes those past their deadline, answering 408
  when nothing of a response is on its way, and lingering like a refused connection: the client
  that is still sending reads the answer instead of a reset. A request arms and cancels no timer
  of its own.
- Records. Every refusal and timeout is counted (`gateway.metrics.ConnectionStats`, at
  `/metrics`) and logged at most once per reason per `LOG_INTERVAL` with the count, never once
  per connection: an attack must not turn into a log flood.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import math
import socket
from typing import Any

import structlog
from uvicorn.protocols.http.httptools_impl import STATUS_LINE

from gateway.config import ServerSettings
from gateway.metrics import ConnectionStats
from gateway.transports.http_protocol import OneWriteHttpToolsProtocol

log = structlog.get_logger()

LOG_INTERVAL = 10.0
"""Seconds between two log lines of one kind of refusal or timeout (each says how many it covers)."""
LINGER_SECONDS = 2.0
"""How long a refused or timed-out connection is kept half-closed for its client to read the answer."""
LINGER_SHARE = 8
"""At most `max_connections / LINGER_SHARE` refused or timed-out connections linger at once: with the cap at half
the descriptor limit, admitted and lingering connections leave the gateway over 40 % of its
descriptors (its ledger, upstreams and stores) whatever a flood does."""
RETRY_AFTER = 1
"""Seconds a refused client is told to wait (a slot frees as soon as any connection closes)."""
#: What an admitted connection waits for: the head of a request (its first byte starts the clock,
#: or the connection's opening for its first request), the rest of a body, the app's answer (no
#: deadline: a held call waits for a human), or the next request (idle since the sweep saw the answer).
HEAD, BODY, WAIT, IDLE = 0, 1, 2, 3


@dataclasses.dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """The limits in force (`ServerSettings`' fields, `max_connections` fitted to the descriptors)."""

    max_connections: int
    max_connections_per_address: int
    header_timeout: float
    body_idle: float
    body_timeout: float
    keep_alive: float
    max_requests: int

    @classmethod
    def of(cls, server: ServerSettings) -> ConnectionLimits:
        return cls(server.max_connections, server.max_connections_per_address, server.header_timeout_seconds,
                   server.body_idle_seconds, server.body_timeout_seconds, server.keep_alive_seconds,
                   server.max_requests_per_connection)

    @property
    def tick(self) -> float:
        """Seconds between two sweeps: a tenth of the shortest deadline, within 50 ms … 1 s."""
        return min(1.0, max(0.05, min(self.header_timeout, self.body_idle, self.keep_alive) / 10))


def fit_to_descriptors(limits: ConnectionLimits) -> ConnectionLimits:
    """`limits` with `max_connections` at most half the process's file-descriptor limit (the other
    half is for upstream connections, stdio servers' pipes, the stores and refused connections
    lingering), the soft limit first raised to the hard one. Logs the limits chosen."""
    try:
        import resource
    except ImportError:  # no such limit here (Windows)
        log.info("http.connection_limits", **_fields(limits))
        return limits
    before, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    soft = before
    target = hard if hard != resource.RLIM_INFINITY else 1_048_576
    if before != resource.RLIM_INFINITY and target > before:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):  # refused (a kernel ceiling below the hard limit): keep what is
            pass
    fit = max(1, soft // 2) if soft != resource.RLIM_INFINITY else limits.max_connections
    chosen = dataclasses.replace(limits, max_connections=min(limits.max_connections, fit))
    descriptors = {"nofile_soft": _rlimit(soft), "nofile_soft_at_start": _rlimit(before), "nofile_hard": _rlimit(hard)}
    if chosen.max_connections < limits.max_connections:
        log.warning("http.connection_limits", **_fields(chosen), **descriptors, max_connections_configured=limits.max_connections,
                    note="server.max_connections lowered to half the file-descriptor limit; raise `ulimit -n` to serve more")
    else:
        log.info("http.connection_limits", **_fields(chosen), **descriptors)
    return chosen


def _rlimit(value: int) -> int | str:
    import resource

    return "unlimited" if value == resource.RLIM_INFINITY else value


def _fields(limits: ConnectionLimits) -> dict[str, Any]:
    return {"max_connections": limits.max_connections, "max_connections_per_address": limits.max_connections_per_address,
            "header_timeout_seconds": limits.header_timeout, "body_idle_seconds": limits.body_idle,
            "body_timeout_seconds": limits.body_timeout, "keep_alive_seconds": limits.keep_alive,
            "max_requests_per_connection": limits.max_requests}


def address_key(peer: Any) -> str:
    """The client address connections are counted under: an IPv4 address (also when mapped into
    IPv6), or the /64 of an IPv6 one (one host is commonly handed a whole /64); peers of a Unix
    socket share one key."""
    if not isinstance(peer, (tuple, list)) or not peer:
        return "local"
    host = str(peer[0])
    if ":" not in host:
        return host
    if host.startswith("::ffff:") and "." in host:
        return host[7:]
    try:
        packed = socket.inet_pton(socket.AF_INET6, host.partition("%")[0])
    except OSError:
        return host
    return socket.inet_ntop(socket.AF_INET6, packed[:8] + bytes(8)) + "/64"


def answer(status: int, body: dict[str, Any], retry_after: int | None = None) -> bytes:
    """A whole HTTP/1.1 response closing its connection: `status`, the JSON `body`, `Retry-After`."""
    raw = json.dumps(body, separators=(",", ":")).encode()
    head = [STATUS_LINE[status], b"content-type: application/json\r\n", b"cache-control: no-store\r\n"]
    if retry_after is not None:
        head.append(b"retry-after: %d\r\n" % retry_after)
    head.append(b"connection: close\r\ncontent-length: %d\r\n\r\n" % len(raw))
    return b"".join(head) + raw


def _refusals(limits: ConnectionLimits) -> dict[str, tuple[str, float, bytes | None]]:
    """Per reason: the setting it enforces, its value, and the answer sent (built once; None: the
    connection is closed without one)."""
    total, per = limits.max_connections, limits.max_connections_per_address
    table: dict[str, tuple[int, str, str, float, str]] = {
        "max_connections": (503, "rate_limited", "max_connections", total,
                            f"the gateway holds its limit of {total} open connections (server.max_connections); retry shortly"),
        "max_connections_per_address": (429, "rate_limited", "max_connections_per_address", per,
                                        f"this client address holds its limit of {per} open connections "
                                        "(server.max_connections_per_address): reuse or close one of them"),
        "header_timeout": (408, "timeout", "header_timeout_seconds", limits.header_timeout,
                           f"the request's line and headers did not arrive within {limits.header_timeout:g} s "
                           "(server.header_timeout_seconds)"),
        "body_idle": (408, "timeout", "body_idle_seconds", limits.body_idle,
                      f"the request body sent nothing for {limits.body_idle:g} s (server.body_idle_seconds)"),
        "body_timeout": (408, "timeout", "body_timeout_seconds", limits.body_timeout,
                         f"the request body did not arrive whole within {limits.body_timeout:g} s (server.body_timeout_seconds)"),
    }
    out: dict[str, tuple[str, float, bytes | None]] = {"keep_alive_idle": ("server.keep_alive_seconds", limits.keep_alive, None),
                                                       "malformed_request": ("HTTP/1.1 syntax", 0, None)}
    for reason, (status, code, setting, value, message) in table.items():
        body: dict[str, Any] = {"error_code": code, "message": message, "retryable": True, "limit": f"server.{setting}", "value": value}
        retry = RETRY_AFTER if status != 408 else None
        if retry is not None:
            body["retry_after"] = retry
        out[reason] = (f"server.{setting}", value, answer(status, body, retry))
    return out


#: The connections `dharma serve` refuses at once (`ConnectionStats.refused`); every other reason
#: closes an admitted connection (`ConnectionStats.closed`).
_REFUSED = frozenset({"max_connections", "max_connections_per_address"})
_LOGGED = {"max_connections": "http.connections_refused", "max_connections_per_address": "http.connections_refused",
           "header_timeout": "http.connections_timed_out", "body_idle": "http.connections_timed_out",
           "body_timeout": "http.connections_timed_out", "malformed_request": "http.requests_malformed"}


class _DropMalformedWarning(logging.Filter):
    """uvicorn's "Invalid HTTP request received." warning, once per malformed request: the guard
    counts those and logs them once per `LOG_INTERVAL` instead (a client could fill the log)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.msg != "Invalid HTTP request received."


#: The logger guarded connections give uvicorn's protocol: a child of `uvicorn.error` (same handlers
#: and level as `dharma serve` sets it: warning, which also keeps the protocol's per-connection
#: trace lines skipped) whose one filter drops the per-request malformed-request warning.
_UVICORN_LOG = logging.getLogger("uvicorn.error.guarded")
_UVICORN_LOG.setLevel(logging.WARNING)
_UVICORN_LOG.addFilter(_DropMalformedWarning())


class ConnectionGuard:
    """One server's connection accounting: admission (O(1): a set and a dict per address), the
    clock every connection reads, the sweep that enforces the deadlines, the rate-limited log."""

    def __init__(self, limits: ConnectionLimits) -> None:
        self.limits = limits
        self.stats = ConnectionStats(limits.max_connections, limits.max_connections_per_address)
        self.reasons = _refusals(limits)
        self.open: set[GuardedHttpToolsProtocol] = set()
        self.per_address: dict[str, int] = {}
        self.lingering = 0
        self.max_lingering = max(8, limits.max_connections // LINGER_SHARE)
        self.now = 0.0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._pending: dict[str, int] = {}
        self._example: dict[str, str] = {}
        self._logged_at: dict[str, float] = {}

    def admit(self, protocol: GuardedHttpToolsProtocol, loop: asyncio.AbstractEventLoop) -> bytes | None:
        """Count `protocol` in and return None, or return the answer refusing it (counted, logged)."""
        if self._loop is None:
            self._start(loop)
        key = protocol.address
        if len(self.open) >= self.limits.max_connections:
            return self._refuse("max_connections", key)
        held = self.per_address.get(key, 0)
        if held >= self.limits.max_connections_per_address > 0:
            return self._refuse("max_connections_per_address", key)
        self.per_address[key] = held + 1
        self.open.add(protocol)
        self.stats.open = len(self.open)
        return None

    def release(self, protocol: GuardedHttpToolsProtocol) -> None:
        """`protocol`'s connection is gone: its slot and its address's are free again."""
        if protocol not in self.open:
            return
        self.open.discard(protocol)
        self.stats.open = len(self.open)
        key = protocol.address
        left = self.per_address.get(key, 1) - 1
        if left > 0:
            self.per_address[key] = left
        else:
            self.per_address.pop(key, None)

    def _refuse(self, reason: str, key: str) -> bytes:
        self.event(reason, key)
        refusal = self.reasons[reason][2]
        assert refusal is not None
        return refusal

    def event(self, reason: str, key: str) -> None:
        """Count a refusal or a close; log the first of a burst at once, the rest as one line per interval."""
        counter = self.stats.refused if reason in _REFUSED else self.stats.closed
        counter[reason] = counter.get(reason, 0) + 1
        if reason not in _LOGGED:
            return
        pending = self._pending.get(reason, 0)
        if not pending:
            self._example[reason] = key
        self._pending[reason] = pending + 1
        if self.now - self._logged_at.get(reason, -math.inf) >= LOG_INTERVAL:
            self._log(reason)

    def _log(self, reason: str) -> None:
        count = self._pending.pop(reason, 0)
        self._logged_at[reason] = self.now
        if count:
            setting, value, _ = self.reasons[reason]
            log.warning(_LOGGED[reason], reason=reason, count=count, interval_seconds=LOG_INTERVAL,
                        first_address=self._example.pop(reason, None), limit=setting, value=value)

    def _start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.now = loop.time()
        self._timer = loop.call_later(self.limits.tick, self._sweep)

    def _sweep(self) -> None:
        """Close every connection past its deadline; flush the log lines that are due; run again."""
        loop = self._loop
        assert loop is not None
        self.now = now = loop.time()
        try:
            limits = self.limits
            overdue = [(protocol, why) for protocol in self.open if (why := protocol.overdue(now, limits)) is not None]
            for protocol, why in overdue:
                protocol.close_overdue(why)
            for reason in [r for r in self._pending if now - self._logged_at.get(r, -math.inf) >= LOG_INTERVAL]:
                self._log(reason)
        except Exception:  # a bug here must not stop the deadlines for good: say it, sweep again next tick
            log.exception("http.connection_sweep_failed")
        finally:
            self._timer = loop.call_later(self.limits.tick, self._sweep)

    def close(self) -> None:
        """Stop the sweep (the server is done) and write what the log still owes."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for reason in list(self._pending):
            self._log(reason)


class LingeringConnection(asyncio.Protocol):
    """A connection the guard is done with (over a cap, or past a deadline): its answer, if any,
    written and the connection half-closed, whatever the client still sends read and dropped until
    it closes or `LINGER_SECONDS` pass. Closing with unread bytes would send a reset, which can
    destroy the answer before the client reads it. In a flood (past
    `ConnectionGuard.max_lingering` lingering at once) one is closed straight after its answer."""

    def __init__(self, guard: ConnectionGuard, transport: asyncio.Transport, answer: bytes | None, loop: asyncio.AbstractEventLoop) -> None:
        self.guard = guard
        self.timer: asyncio.TimerHandle | None = None
        if answer is not None:
            transport.write(answer)
        if guard.lingering >= guard.max_lingering or not transport.can_write_eof():
            transport.close()
            return
        guard.lingering += 1
        transport.write_eof()
        self.timer = loop.call_later(LINGER_SECONDS, transport.close)

    def data_received(self, data: bytes) -> None:
        pass

    def eof_received(self) -> None:
        return None  # the client closed its side: close the connection

    def connection_lost(self, exc: Exception | None) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
            self.guard.lingering -= 1


_BEGIN = OneWriteHttpToolsProtocol.on_message_begin
_HEADERS = OneWriteHttpToolsProtocol.on_headers_complete
_BODY = OneWriteHttpToolsProtocol.on_body
_COMPLETE = OneWriteHttpToolsProtocol.on_message_complete


class GuardedHttpToolsProtocol(OneWriteHttpToolsProtocol):
    """`OneWriteHttpToolsProtocol` under a `ConnectionGuard`: admitted or refused as it connects,
    its request phases noted for the guard's sweep, at most `max_requests` answers per connection.

    A request costs a few attribute writes in parser callbacks it already has (the parent's
    methods called directly, no `super()` object); when a connection went idle is the sweep's to note."""

    #: Set on the subclass `guarded_protocol` makes per server, with `requests_left`; the rest are
    #: defaults each connection overwrites (no `__init__` of its own: a connection is built per accept).
    guard: ConnectionGuard
    requests_left = -1  # counts down to 0 (then `connection: close`); from -1 never reaches it
    address = ""
    socket_transport: asyncio.Transport
    phase = HEAD
    since = 0.0
    body_at = 0.0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        guard = self.guard
        self.address = address_key(transport.get_extra_info("peername"))
        refusal = guard.admit(self, self.loop)
        if refusal is not None:
            transport.set_protocol(LingeringConnection(guard, transport, refusal, self.loop))
            return
        self.since = guard.now
        self.logger = _UVICORN_LOG
        self.socket_transport = transport
        super().connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self.guard.release(self)
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        _BEGIN(self)
        if self.phase != HEAD:  # a connection's first request counts from its opening
            self.phase = HEAD
            self.since = self.guard.now

    def on_headers_complete(self) -> None:
        _HEADERS(self)
        self.phase = BODY
        self.since = self.body_at = self.guard.now
        self.requests_left -= 1
        if not self.requests_left and self.cycle is not None:
            self.cycle.keep_alive = False  # its answer says `connection: close` and closes

    def on_body(self, body: bytes) -> None:
        _BODY(self, body)
        self.body_at = self.guard.now

    def on_message_complete(self) -> None:
        _COMPLETE(self)
        self.phase = WAIT

    def timeout_keep_alive_handler(self) -> None:
        if not self.transport.is_closing():
            self.guard.event("keep_alive_idle", self.address)
            self.linger(None, "keep_alive_idle")

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to a request it cannot parse (it closes the connection): counted and
        logged by the guard, a line per `LOG_INTERVAL` whatever a client sends."""
        self.guard.event("malformed_request", self.address)
        super().send_400_response(msg)

    def _unsupported_upgrade_warning(self) -> None:
        """An `Upgrade` the gateway does not serve (it serves no WebSocket) is answered as a plain
        request, without uvicorn's warning per request (a client could fill the log with them)."""

    def overdue(self, now: float, limits: ConnectionLimits) -> str | None:
        """The deadline this connection has passed at `now` (a reason of `_refusals`), or None."""
        if self.transport is None or self.transport.is_closing():
            return None
        if self.flow.read_paused:  # the server holds the reading (a queued request, a full buffer), not the client
            self.since = self.body_at = now
            return None
        phase = self.phase
        if phase == HEAD:
            return "header_timeout" if now - self.since >= limits.header_timeout else None
        if phase == BODY:
            if now - self.body_at >= limits.body_idle:
                return "body_idle"
            return "body_timeout" if now - self.since >= limits.body_timeout else None
        cycle = self.cycle
        if (cycle is not None and not cycle.response_complete) or self.pipeline:
            return None  # the app is answering
        if phase == WAIT:  # answered: idle from now on (uvicorn's keep-alive timer is the precise one)
            self.phase, self.since = IDLE, now
            return None
        return "keep_alive_idle" if now - self.since >= limits.keep_alive else None

    def close_overdue(self, reason: str) -> None:
        """Close for `reason`, with a 408 first when no answer is under way on this connection."""
        self.guard.event(reason, self.address)
        cycle = self.cycle
        refusal = self.guard.reasons[reason][2]
        if self.pipeline:
            self.transport.close()
        elif refusal is None:  # idle between requests: nothing to answer
            self.linger(None, reason)
        elif self.phase == HEAD and (cycle is None or cycle.response_complete):
            self.linger(refusal, reason)
        elif self.phase == BODY and cycle is not None and not cycle.response_started:
            self.linger(refusal, reason)  # the app's `receive` answers `http.disconnect`, its `send` is dropped
        else:
            self.transport.close()  # an answer is under way: it ends the connection as it stands

    def linger(self, answer: bytes | None, reason: str) -> None:
        """Hand the connection to a `LingeringConnection` (with `answer`, if any): uvicorn's state for
        it is cleaned up as if the client had gone, without closing the socket, and its slot freed."""
        self.transport.flush()  # a response head held for its body, if any
        self._unset_keepalive_if_required()
        self.connection_lost(ConnectionAbortedError(reason))
        self.socket_transport.set_protocol(LingeringConnection(self.guard, self.socket_transport, answer, self.loop))


def guarded_protocol(guard: ConnectionGuard) -> type[GuardedHttpToolsProtocol]:
    """What uvicorn's `Config(http=...)` takes to build each connection's protocol under `guard`:
    a subclass bound to it (a class attribute costs a connection nothing; a factory's keyword would)."""
    return type("GuardedHttpToolsProtocol", (GuardedHttpToolsProtocol,),
                {"guard": guard, "requests_left": guard.limits.max_requests or -1, "__module__": __name__})
