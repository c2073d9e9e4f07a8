"""Redis as the replicas' shared state (design §7): the one place a Redis client is made.

Every Redis-backed store takes a `RedisLink`: the asyncio client with bounded connect and
operation timeouts, the key prefix, and `unavailable()`, which turns any Redis error into
`StoreUnavailable` naming the server (never its password) so each stage decides, as with every
other store, whether that fails open or closed. redis-py reconnects by itself on the next
command, so a Redis that comes back is used again without a restart.
"""

from __future__ import annotations

import builtins
import hashlib
import json
import secrets
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError

from gateway.config import RedisSettings, display_url
from gateway.crypto.strict_json import loads as strict_loads
from gateway.stores.base import OidcFlowRecord, PinState, SeenTool, StoreUnavailable, UiSessionRecord
from gateway.stores.memory import BreakerState, check

T = TypeVar("T")
_Expiring = TypeVar("_Expiring", UiSessionRecord, OidcFlowRecord)

#: What a failed Redis command may raise besides RedisError (timeouts and refused connections
#: surface as OSError subclasses from the socket layer on some paths).
REDIS_ERRORS: tuple[type[BaseException], ...] = (RedisError, OSError)


@dataclass(slots=True)
class RedisLink:
    """A shared Redis client plus what every store needs to use it safely."""

    client: aioredis.Redis
    prefix: str
    where: str
    name: ClassVar[str] = "redis"  # as /healthz names this dependency

    def key(self, *parts: str) -> str:
        """A key under the gateway's prefix; parts are joined with `:`."""
        return self.prefix + ":".join(parts)

    def unavailable(self, exc: BaseException) -> StoreUnavailable:
        """The error a store raises when Redis fails: says which Redis and what went wrong."""
        return StoreUnavailable(f"Redis at {self.where} is unavailable: {type(exc).__name__}: {exc}")

    async def ping(self) -> str | None:
        """None if Redis answers, else why not (for /healthz)."""
        try:
            await self.client.ping()
        except REDIS_ERRORS as exc:
            return str(self.unavailable(exc))
        return None

    async def aclose(self) -> None:
        await self.client.aclose()


def connect(settings: RedisSettings) -> RedisLink:
    """A client for `settings.url` (lazy: nothing is sent until the first command)."""
    if settings.url is None:
        raise ValueError("redis.url is not set")
    # A pooled connection that Redis dropped (it restarted) fails its next command once: retry that
    # command once on a fresh connection, at once. Timeouts are not retried, so a hung Redis costs a
    # call one operation timeout, not several.
    client: Any = aioredis.Redis.from_url(
        settings.url,
        socket_connect_timeout=settings.connect_timeout_seconds,
        socket_timeout=settings.operation_timeout_seconds,
        retry=Retry(NoBackoff(), retries=1, supported_errors=(RedisConnectionError,)),
        retry_on_error=[RedisConnectionError],
        health_check_interval=30,
    )
    return RedisLink(client=client, prefix=settings.key_prefix, where=display_url(settings.url))


async def _run(link: RedisLink, op: Awaitable[T]) -> T:
    """Await one Redis operation; any Redis or socket failure becomes `StoreUnavailable`."""
    try:
        return await op
    except REDIS_ERRORS as exc:
        raise link.unavailable(exc) from None


# ---- rate limits -------------------------------------------------------------------------

#: GCRA in one script (atomic: no read-modify-write race between replicas), on Redis's own clock
#: so replicas with skewed clocks share one limit. Times are microseconds (exact in a double).
#: KEYS[1] holds the theoretical arrival time; it expires once it lies in the past (idle key).
_GCRA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local interval, burst, cost = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local tat = tonumber(redis.call('GET', KEYS[1]) or '0')
if tat < now then tat = now end
local new_tat = tat + interval * cost
local allow_at = new_tat - interval * burst
if allow_at > now then return string.format('%.0f', allow_at - now) end
local ttl = math.max(1, math.ceil((new_tat - now) / 1000))
redis.call('SET', KEYS[1], string.format('%.0f', new_tat), 'PX', ttl)
return '0'
"""


class RedisLimiterStore:
    """GCRA limits shared by every replica: one EVALSHA per check, keyed `<prefix>rl:<limit key>`."""

    def __init__(self, link: RedisLink) -> None:
        self.link = link
        self._gcra = link.client.register_script(_GCRA)

    async def acquire(self, key: str, *, interval: float, burst: int, cost: int, now: float) -> float:
        wait = await _run(self.link, self._gcra(keys=[self.link.key("rl", key)], args=[interval * 1e6, burst, cost]))
        return int(wait) / 1e6


# ---- circuit breaker ---------------------------------------------------------------------

#: Half-open claims the one probe across all replicas. A probe whose replica died without
#: recording it is given up after `reset_seconds`, so a crashed replica cannot hold it forever.
_ADMIT = """
local now, reset = tonumber(ARGV[1]), tonumber(ARGV[2])
local h = redis.call('HMGET', KEYS[1], 'state', 'opened_at', 'probing', 'probe_at')
local state = h[1] or 'closed'
if state == 'open' then
  local waited = now - tonumber(h[2])
  if waited < reset then return tostring(reset - waited) end
  state = 'half_open'
elseif state == 'half_open' and h[3] == '1' and now - tonumber(h[4]) < reset then
  return tostring(math.max(reset / 10, 0.1))
end
if state == 'half_open' then
  redis.call('HSET', KEYS[1], 'state', 'half_open', 'probing', '1', 'probe_at', ARGV[1])
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
end
return '0'
"""

#: Success deletes the state (absent = closed, no failures); a failure counts and may open.
_RECORD = """
if ARGV[1] == '1' then redis.call('DEL', KEYS[1]) return 0 end
local failures = redis.call('HINCRBY', KEYS[1], 'failures', 1)
local state = redis.call('HGET', KEYS[1], 'state')
if state == 'half_open' or failures >= tonumber(ARGV[3]) then
  redis.call('HSET', KEYS[1], 'state', 'open', 'opened_at', ARGV[2], 'probing', '0')
end
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return 0
"""

_RELEASE = """
if redis.call('EXISTS', KEYS[1]) == 1 then redis.call('HSET', KEYS[1], 'probing', '0') end
return 0
"""

#: How long a backend's breaker state outlives its last change (it is dropped once idle that long).
BREAKER_IDLE_MS = 86_400_000


class RedisBreakerStore:
    """Circuit state per backend in one Redis hash, `<prefix>cb:<backend>`: open on one replica is
    open on all. `check` is one HMGET; admit and record are one script each (atomic).

    Times are the callers' clocks (seconds; a skew of milliseconds is nothing against a reset
    time of seconds), so the state machine matches the memory form's call for call.
    """

    def __init__(self, link: RedisLink) -> None:
        self.link = link
        self._admit = link.client.register_script(_ADMIT)
        self._record = link.client.register_script(_RECORD)
        self._release = link.client.register_script(_RELEASE)

    async def check(self, backend: str, *, now: float, reset_seconds: float) -> float:
        state, opened_at, probing, probe_at = await _run(
            self.link, self.link.client.hmget(self.link.key("cb", backend), ["state", "opened_at", "probing", "probe_at"])
        )
        fresh_probe = probing == b"1" and now - float(probe_at) < reset_seconds
        s = BreakerState(state=(state or b"closed").decode(), opened_at=float(opened_at or 0), probing=fresh_probe)
        return check(s, now=now, reset_seconds=reset_seconds)

    async def admit(self, backend: str, *, now: float, reset_seconds: float) -> float:
        args = [repr(now), repr(reset_seconds), BREAKER_IDLE_MS]
        return float(await _run(self.link, self._admit(keys=[self.link.key("cb", backend)], args=args)))

    async def record(self, backend: str, *, ok: bool, now: float, threshold: int) -> None:
        args = ["1" if ok else "0", repr(now), threshold, BREAKER_IDLE_MS]
        await _run(self.link, self._record(keys=[self.link.key("cb", backend)], args=args))

    async def release(self, backend: str) -> None:
        await _run(self.link, self._release(keys=[self.link.key("cb", backend)]))


# ---- idempotency -------------------------------------------------------------------------


class RedisIdempotencyStore:
    """Answers stored for replay, as JSON under `<prefix>idem:<key>`, for `ttl_seconds`."""

    def __init__(self, link: RedisLink, ttl_seconds: float) -> None:
        self.link = link
        self._ttl_ms = max(1, int(ttl_seconds * 1000))

    async def get(self, key: str) -> Any | None:
        raw = await _run(self.link, self.link.client.get(self.link.key("idem", key)))
        if raw is None:
            return None
        try:
            return strict_loads(raw)
        except ValueError as exc:  # someone else's bytes under our key: never replay them
            raise StoreUnavailable(f"Redis at {self.link.where} holds a damaged idempotency entry: {exc}") from None

    async def put(self, key: str, value: Any) -> None:
        data = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        await _run(self.link, self.link.client.set(self.link.key("idem", key), data, px=self._ttl_ms))


# ---- /ui login sessions --------------------------------------------------------------------


class RedisUiSessionStore:
    """`/ui` sessions shared by every replica: JSON under `<prefix>ui:<SHA-256 of the session id>`
    (the id is the cookie's bearer secret, so Redis never holds it), expiring with the session.
    SSO logins under way likewise under `<prefix>ui-oidc:<SHA-256 of the flow id>`, expiring with
    the flow and taken with GETDEL, so a callback completes on whichever replica it reaches, once."""

    def __init__(self, link: RedisLink) -> None:
        self.link = link

    def _key(self, session_id: str, kind: str = "ui") -> str:
        return self.link.key(kind, hashlib.sha256(session_id.encode("utf-8", "surrogatepass")).hexdigest())

    async def put(self, session_id: str, record: UiSessionRecord) -> None:
        at_ms = max(1, int(record.expires_at * 1000))
        await _run(self.link, self.link.client.set(self._key(session_id), record.model_dump_json(), pxat=at_ms))

    async def get(self, session_id: str, now: float) -> UiSessionRecord | None:
        raw = await _run(self.link, self.link.client.get(self._key(session_id)))
        return self._live(raw, UiSessionRecord, "a damaged /ui session", now)

    async def end(self, session_id: str) -> None:
        await _run(self.link, self.link.client.delete(self._key(session_id)))

    async def put_flow(self, flow_id: str, record: OidcFlowRecord) -> None:
        at_ms = max(1, int(record.expires_at * 1000))
        await _run(self.link, self.link.client.set(self._key(flow_id, "ui-oidc"), record.model_dump_json(), pxat=at_ms))

    async def take_flow(self, flow_id: str, now: float) -> OidcFlowRecord | None:
        raw = await _run(self.link, self.link.client.getdel(self._key(flow_id, "ui-oidc")))
        return self._live(raw, OidcFlowRecord, "a damaged SSO login under way", now)

    def _live(self, raw: bytes | None, model: type[_Expiring], what: str, now: float) -> _Expiring | None:
        """The record stored as `raw` if it has not expired; someone else's bytes under our key are
        never a login (StoreUnavailable naming `what`)."""
        if raw is None:
            return None
        try:
            record = model.model_validate_json(raw)
        except ValueError as exc:
            raise StoreUnavailable(f"Redis at {self.link.where} holds {what}: {exc}") from None
        return record if record.expires_at > now else None


# ---- session history and karma -----------------------------------------------------------


class RedisHistory:
    """Recent calls per session (a list, newest first: LPUSH + LTRIM) and per principal the calls
    and denials in the window (two sorted sets scored by time). One round trip to read (a
    pipeline), one to write (a MULTI transaction)."""

    def __init__(self, link: RedisLink, depth: int = 50, window: float = 3600.0, session_ttl: float = 86_400.0,
                 max_events: int = 10_000) -> None:
        self.link = link
        self._depth, self._window, self._max, self._max_age = depth, window, max_events, session_ttl
        self._session_ttl_ms, self._window_ms = int(session_ttl * 1000), int(window * 1000)

    def _keys(self, session_id: str | None, principal: str) -> tuple[str | None, str, str]:
        session = self.link.key("hist", "s", session_id) if session_id else None
        return session, self.link.key("hist", "calls", principal), self.link.key("hist", "denials", principal)

    async def read(self, session_id: str | None, principal: str, now: float) -> tuple[list[dict[str, Any]], dict[str, int]]:
        session, calls, denials = self._keys(session_id, principal)
        pipe = self.link.client.pipeline(transaction=False)
        if session is not None:
            pipe.lrange(session, 0, self._depth - 1)
        since = now - self._window
        pipe.zcount(calls, since, "+inf")
        pipe.zcount(denials, since, "+inf")
        replies = await _run(self.link, pipe.execute())
        recent = [strict_loads(raw) for raw in reversed(replies[0])] if session is not None else []
        since = now - self._max_age  # the list lives `session_ttl` past its last call; each call no longer
        recent = [c for c in recent if not isinstance(c, dict) or c.get("at", since) >= since]
        return recent, {"calls": int(replies[-2]), "denials": int(replies[-1])}

    async def record(self, *, session_id: str | None, principal: str, tool: str, decision: str, denied: bool,
                     now: float, time: str, detail: Mapping[str, Any] | None = None) -> None:
        session, calls, denials = self._keys(session_id, principal)
        pipe = self.link.client.pipeline(transaction=True)
        if session is not None:
            entry = {"tool": tool, "decision": decision, "time": time, **(detail or {})}
            pipe.lpush(session, json.dumps(entry, ensure_ascii=False, separators=(",", ":"), allow_nan=False))
            pipe.ltrim(session, 0, self._depth - 1)
            pipe.pexpire(session, self._session_ttl_ms)
        member = f"{now!r}:{secrets.token_hex(6)}"
        for key, add in ((calls, True), (denials, denied)):
            if add:
                pipe.zadd(key, {member: now})
            pipe.zremrangebyscore(key, "-inf", f"({now - self._window!r}")
            pipe.zremrangebyrank(key, 0, -self._max - 1)
            pipe.pexpire(key, self._window_ms)
        await _run(self.link, pipe.execute())


# ---- tool pins ---------------------------------------------------------------------------

#: One hash per backend, `<prefix>pins:<backend>`, fields by tool: `d:` pinned digest, `p:` pinned
#: definition (JSON), `t:` pinned at, and while a different definition is seen: `s:` its digest,
#: `S:` it (JSON), `u:` seen at, and `a:` the digest an operator accepted as it is (findings and
#: all). The first pin is an HSETNX, so two replicas seeing a tool at once agree on one pin. ARGV:
#: now, then (name, digest, definition) per tool. Returns per tool 1 if changed, plus 2 if accepted.
_OBSERVE = """
local out = {}
for i = 2, #ARGV, 3 do
  local name, digest, definition = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  if redis.call('HSETNX', KEYS[1], 'd:' .. name, digest) == 1 then
    redis.call('HSET', KEYS[1], 'p:' .. name, definition, 't:' .. name, ARGV[1])
    out[#out + 1] = 0
  elseif redis.call('HGET', KEYS[1], 'd:' .. name) == digest then
    redis.call('HDEL', KEYS[1], 's:' .. name, 'S:' .. name, 'u:' .. name)
    if redis.call('HGET', KEYS[1], 'a:' .. name) == digest then
      out[#out + 1] = 2
    else
      out[#out + 1] = 0
    end
  else
    if redis.call('HGET', KEYS[1], 's:' .. name) ~= digest then
      redis.call('HSET', KEYS[1], 's:' .. name, digest, 'S:' .. name, definition, 'u:' .. name, ARGV[1])
    end
    out[#out + 1] = 1
  end
end
return out
"""

#: ARGV: now, "1" to accept the named definitions as they are (`a:`) or "0", then the tool names
#: to accept (with "0", those with no seen definition are skipped).
_ACCEPT = """
local out = {}
for i = 3, #ARGV do
  local name = ARGV[i]
  local seen = redis.call('HGET', KEYS[1], 's:' .. name)
  if seen then
    redis.call('HSET', KEYS[1], 'd:' .. name, seen, 'p:' .. name, redis.call('HGET', KEYS[1], 'S:' .. name),
               't:' .. name, ARGV[1])
    redis.call('HDEL', KEYS[1], 's:' .. name, 'S:' .. name, 'u:' .. name)
  end
  if ARGV[2] == '1' then
    redis.call('HSET', KEYS[1], 'a:' .. name, redis.call('HGET', KEYS[1], 'd:' .. name))
  end
  if seen or ARGV[2] == '1' then
    out[#out + 1] = name
  end
end
return out
"""


class RedisPinStore:
    """Tool pins shared by every replica (a rug-pull seen by one holds calls on all): one script
    per observation, so the first pin and every change are atomic."""

    def __init__(self, link: RedisLink) -> None:
        self.link = link
        self._observe = link.client.register_script(_OBSERVE)
        self._accept = link.client.register_script(_ACCEPT)

    async def observe(self, backend: str, seen: list[SeenTool], now: str) -> dict[str, PinState]:
        args: list[str] = [now]
        for tool in seen:
            args += [tool.name, tool.digest, json.dumps(tool.definition, ensure_ascii=False, sort_keys=True)]
        flags = await _run(self.link, self._observe(keys=[self.link.key("pins", backend)], args=args))
        return {tool.name: PinState(bool(flag & 1), bool(flag & 2)) for tool, flag in zip(seen, flags, strict=True)}

    async def list(self, backend: str | None = None) -> list[dict[str, Any]]:
        if backend is not None:
            keys = [self.link.key("pins", backend)]
        else:
            keys = [k.decode() async for k in self.link.client.scan_iter(match=self.link.key("pins", "*"), count=500)]
        rows: list[dict[str, Any]] = []
        for key in sorted(keys):
            fields = {k.decode(): v.decode() for k, v in (await _run(self.link, self.link.client.hgetall(key))).items()}
            name_of = key[len(self.link.key("pins", "")):]
            for tool in sorted(f[2:] for f in fields if f.startswith("d:")):
                rows.append(pin_row(name_of, tool, {k[:1]: v for k, v in fields.items() if k[2:] == tool}))
        return rows

    async def accept(self, backend: str, tool: str | None, now: str) -> builtins.list[str]:
        key = self.link.key("pins", backend)
        names = await _run(self.link, self.link.client.hkeys(key))
        pinned = {n.decode()[2:] for n in names if n.startswith(b"d:")}
        if not pinned:
            raise KeyError(backend)
        if tool is not None and tool not in pinned:
            raise KeyError(f"{backend}/{tool}")
        wanted = [tool] if tool is not None else sorted({n.decode()[2:] for n in names if n.startswith(b"s:")})
        accepted = await _run(self.link, self._accept(keys=[key], args=[now, "1" if tool is not None else "0", *wanted]))
        return [a.decode() for a in accepted]


def pin_row(backend: str, tool: str, f: dict[str, str]) -> dict[str, Any]:
    """One pin as `dharma tools pins` shows it, from the hash fields of one tool (by kind letter)."""
    return {
        "backend": backend,
        "tool": tool,
        "digest": f["d"],
        "pinned_at": f.get("t"),
        "changed": "s" in f,
        "seen_digest": f.get("s"),
        "seen_at": f.get("u"),
        "definition": strict_loads(f["p"]) if "p" in f else None,
        "seen_definition": strict_loads(f["S"]) if "S" in f else None,
        "accepted_digest": f.get("a"),
    }
