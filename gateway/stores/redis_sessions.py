"""Legacy `/mcp` sessions shared by every replica through Redis (issue 8, design §7).

- Facts: one JSON value per session (`SessionFacts`, never pickle) under a key named after a hash
  of the session id, with a TTL of `idle_seconds` that every use renews (GETEX and PEXPIRE of the
  session's events in one pipelined round trip). Created with SET NX, so an id can never be taken
  over; rewritten whole with SET XX by the one replica that runs `initialize`.
- Events: one Redis stream per session holding every stream's events in order (fields `t` token,
  `n` sequence, `d` data, `g` standalone, `x` done marker). One Lua script per append (XADD, the
  byte count, trimming the oldest by count and by bytes, TTL): atomic and one round trip. A resume
  reads the stream (XRANGE) and follows a stream another replica is still writing with XREAD
  BLOCK until its done marker, giving up after `stall_seconds` without news (its writer died).
- Signals: PUBLISH on one channel every replica subscribes to; a replica skips its own.
- Limits (`SessionLimits`): open sessions are counted in sorted sets scored by when each would
  expire unused, one per principal (named after a SHA-1 of the principal, made inside Lua) and one
  of every session (members `<principal hash>:<session hash>`). `create` is one Lua script: every
  member whose score has passed is looked at again (its facts' PTTL: renewed by use, it gets its new
  expiry; gone, it leaves both sets), then both counts are checked and the session is stored and
  counted, atomically across replicas. `load` stays one pipelined round trip that touches no set:
  a renewal is noticed when its old score passes. `end` takes the session out of both sets, so a
  DELETE frees its slot at once; a TTL expiry frees it at the next `create` that looks.

Every Redis failure becomes `StoreUnavailable` naming the server (`RedisLink.unavailable`): the
transport refuses the request (fail closed) and the next request reconnects by itself.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import time
from collections.abc import AsyncIterator, Iterable
from typing import Any

import anyio
import structlog
from pydantic import ValidationError

from gateway.stores.base import PER_PRINCIPAL, TOTAL, SessionFacts, SessionLimits, SessionSignal, StreamLog, session_limit
from gateway.stores.memory_sessions import MAX_BYTES, MAX_EVENTS
from gateway.stores.redis import REDIS_ERRORS, RedisLink

log = structlog.get_logger()

#: How long a follower waits without any event of the stream it follows before it gives up.
STALL_SECONDS = 300.0
#: Pause before the signal subscriber reconnects after Redis failed.
RESUBSCRIBE_SECONDS = 0.5

_APPEND = """
local size = string.len(ARGV[3])
redis.call('XADD', KEYS[1], '*', 't', ARGV[1], 'n', ARGV[2], 'd', ARGV[3], 'g', ARGV[4], 'x', ARGV[5])
local total = redis.call('INCRBY', KEYS[2], size)
local count = redis.call('XLEN', KEYS[1])
while count > tonumber(ARGV[6]) or total > tonumber(ARGV[7]) do
  local oldest = redis.call('XRANGE', KEYS[1], '-', '+', 'COUNT', 1)
  if #oldest == 0 then break end
  local fields = oldest[1][2]
  for i = 1, #fields, 2 do
    if fields[i] == 'd' then total = redis.call('INCRBY', KEYS[2], -string.len(fields[i + 1])) end
  end
  redis.call('XDEL', KEYS[1], oldest[1][1])
  count = count - 1
end
redis.call('PEXPIRE', KEYS[1], ARGV[8])
redis.call('PEXPIRE', KEYS[2], ARGV[8])
return 1
"""


_CREATE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[2])
local phash = redis.sha1hex(ARGV[6])
local mine = ARGV[8] .. phash
for _, member in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now)) do
  local sep = string.find(member, ':', 1, true)
  local owner, session = ARGV[8] .. string.sub(member, 1, sep - 1), string.sub(member, sep + 1)
  local left = redis.call('PTTL', ARGV[7] .. session)
  if left > 0 then
    redis.call('ZADD', KEYS[2], now + left, member)
    redis.call('ZADD', owner, now + left, session)
    redis.call('PEXPIRE', owner, ttl)
  else
    redis.call('ZREM', KEYS[2], member)
    redis.call('ZREM', owner, session)
  end
end
local owned = redis.call('ZCARD', mine)
if owned >= tonumber(ARGV[3]) then
  return {1, owned, tonumber(redis.call('ZRANGE', mine, 0, 0, 'WITHSCORES')[2]) - now}
end
local total = redis.call('ZCARD', KEYS[2])
if total >= tonumber(ARGV[4]) then
  return {2, total, tonumber(redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')[2]) - now}
end
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ttl) then return {3, 0, 0} end
redis.call('ZADD', KEYS[2], now + ttl, phash .. ':' .. ARGV[5])
redis.call('ZADD', mine, now + ttl, ARGV[5])
redis.call('PEXPIRE', mine, ttl)
return {0, 0, 0}
"""

_END = """
local raw = redis.call('GET', KEYS[1])
if raw then
  local ok, facts = pcall(cjson.decode, raw)
  if ok and type(facts) == 'table' and type(facts['principal']) == 'string' then
    local phash = redis.sha1hex(facts['principal'])
    redis.call('ZREM', KEYS[4], phash .. ':' .. ARGV[1])
    redis.call('ZREM', ARGV[2] .. phash, ARGV[1])
  end
end
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
redis.call('PUBLISH', ARGV[3], ARGV[4])
return 1
"""


def _hashed(session_id: str) -> str:
    """Keys are named after a hash of the id: a listing of Redis keys shows no usable session id."""
    return hashlib.sha256(session_id.encode()).hexdigest()[:32]


def _fields(raw: dict[bytes, bytes]) -> tuple[str, int, bytes, bool, bool] | None:
    try:
        return (raw[b"t"].decode(), int(raw[b"n"]), raw[b"d"], raw[b"g"] == b"1", raw[b"x"] == b"1")
    except (KeyError, ValueError, UnicodeDecodeError):
        return None


class RedisEventStore:
    """The events of one session's streams in a Redis stream (`gateway.stores.base.EventStore`)."""

    def __init__(self, link: RedisLink, hashed: str, *, ttl_ms: int, block_seconds: float, script: Any = None,
                 max_events: int = MAX_EVENTS, max_bytes: int = MAX_BYTES, stall_seconds: float = STALL_SECONDS) -> None:
        self.link = link
        self.key = link.key("mcp", "e", hashed)
        self.bytes_key = link.key("mcp", "b", hashed)
        self.ttl_ms = ttl_ms
        self.block_ms = max(1, int(block_seconds * 1000))
        self.max_events, self.max_bytes, self.stall_seconds = max_events, max_bytes, stall_seconds
        self._append = script if script is not None else link.client.register_script(_APPEND)

    def open(self, *, standalone: bool = False) -> StreamLog:
        return StreamLog(standalone=standalone)

    async def append(self, stream: StreamLog, data: bytes) -> str:
        stream.seq += 1
        await self._add(stream, stream.seq, data, done=False)
        return f"{stream.token}.{stream.seq}"

    async def finish(self, stream: StreamLog) -> None:
        await self._add(stream, 0, b"", done=True)

    async def _add(self, stream: StreamLog, seq: int, data: bytes, *, done: bool) -> None:
        args = [stream.token, seq, data, "1" if stream.standalone else "0", "1" if done else "0",
                self.max_events, self.max_bytes, self.ttl_ms]
        try:
            await self._append(keys=[self.key, self.bytes_key], args=args)
        except REDIS_ERRORS as exc:
            raise self.link.unavailable(exc) from None

    async def find(self, event_id: str) -> tuple[StreamLog, int] | None:
        token, _, number = event_id.rpartition(".")
        if not token or not number.isdigit():
            return None
        found: tuple[StreamLog, int] | None = None
        for _entry, fields in await self._range():
            if fields is None or fields[0] != token or fields[4]:
                continue
            if found is None and fields[1] == int(number):
                found = (StreamLog(standalone=fields[3], token=token, seq=fields[1]), fields[1])
            if found is not None:
                found[0].seq = max(found[0].seq, fields[1])
        return found

    async def follow(self, stream: StreamLog, after: int, *, wait: bool = True) -> AsyncIterator[tuple[str, bytes]]:
        last = "0-0"
        entries = await self._range()
        quiet_since = time.monotonic()
        while True:
            for entry, fields in entries:
                last = entry
                if fields is None or fields[0] != stream.token:
                    continue
                quiet_since = time.monotonic()
                if fields[4]:
                    return
                if fields[1] > after:
                    after = fields[1]
                    if fields[2]:
                        yield f"{stream.token}.{fields[1]}", fields[2]
            if not wait:
                return
            if time.monotonic() - quiet_since > self.stall_seconds:
                log.warning("mcp_http.follow_stalled", stream=stream.token[:6], seconds=self.stall_seconds)
                return
            entries = await self._read_after(last)

    async def _range(self) -> list[tuple[str, tuple[str, int, bytes, bool, bool] | None]]:
        try:
            raw = await self.link.client.xrange(self.key, "-", "+")
        except REDIS_ERRORS as exc:
            raise self.link.unavailable(exc) from None
        return [(entry.decode(), _fields(fields)) for entry, fields in raw]

    async def _read_after(self, last: str) -> list[tuple[str, tuple[str, int, bytes, bool, bool] | None]]:
        try:
            raw = await self.link.client.xread({self.key: last}, block=self.block_ms)
        except REDIS_ERRORS as exc:
            raise self.link.unavailable(exc) from None
        return [(entry.decode(), _fields(fields)) for _key, items in raw or [] for entry, fields in items]


class RedisSessionStore:
    """Legacy sessions every replica shares (`gateway.stores.base.SessionStore`); see the module docstring."""

    def __init__(self, link: RedisLink, idle_seconds: float, *, block_seconds: float, limits: SessionLimits | None = None) -> None:
        self.link = link
        self.idle_seconds = idle_seconds
        self.limits = limits if limits is not None else SessionLimits()
        self.replica = secrets.token_hex(4)
        self.ttl_ms = max(1, int(idle_seconds * 1000))
        self.block_seconds = block_seconds
        self.channel = link.key("mcp", "signals")
        self.open_key = link.key("mcp", "open")  # every open session, scored by when it would expire unused
        self._append = link.client.register_script(_APPEND)  # EVALSHA, loaded once per server
        self._create = link.client.register_script(_CREATE)
        self._end = link.client.register_script(_END)

    def _key(self, session_id: str) -> str:
        return self.link.key("mcp", "s", _hashed(session_id))

    def events(self, session_id: str) -> RedisEventStore:
        return RedisEventStore(self.link, _hashed(session_id), ttl_ms=self.ttl_ms, block_seconds=self.block_seconds,
                               script=self._append)

    async def create(self, facts: SessionFacts) -> None:
        args = [facts.model_dump_json(), self.ttl_ms, self.limits.per_principal, self.limits.total, _hashed(facts.id),
                facts.principal, self.link.key("mcp", "s", ""), self.link.key("mcp", "p", "")]
        try:
            refused, open_now, free_ms = await self._create(keys=[self._key(facts.id), self.open_key], args=args)
        except REDIS_ERRORS as exc:
            raise self.link.unavailable(exc) from None
        if refused == 1:
            raise session_limit(PER_PRINCIPAL, int(open_now), facts.principal, int(free_ms) / 1000)
        if refused == 2:
            raise session_limit(TOTAL, int(open_now), None, int(free_ms) / 1000)
        if refused:
            raise ValueError("a session with this id exists already")

    async def load(self, session_id: str) -> SessionFacts | None:
        hashed = _hashed(session_id)
        try:
            async with self.link.client.pipeline(transaction=False) as pipe:
                pipe.getex(self._key(session_id), px=self.ttl_ms)
                pipe.pexpire(self.link.key("mcp", "e", hashed), self.ttl_ms)
                pipe.pexpire(self.link.key("mcp", "b", hashed), self.ttl_ms)
                raw, _events, _bytes = await pipe.execute()
        except REDIS_ERRORS as exc:
            raise self.link.unavailable(exc) from None
        if raw is None:
            return None
        try:
            facts = SessionFacts.model_validate_json(raw)
        except ValidationError as exc:
            log.error("mcp_http.session_facts_invalid", where=self.link.where, error=str(exc)[:200])
            return None
        return facts if facts.id == session_id else None

    async def save(self, facts: SessionFacts) -> None:
        try:
            await self.link.client.set(self._key(facts.id), facts.model_dump_json(), xx=True, px=self.ttl_ms)
        except REDIS_ERRORS as exc:
            raise self.link.unavailable(exc) from None

    async def end(self, session_id: str) -> None:
        hashed = _hashed(session_id)
        signal = SessionSignal(kind="end", session=session_id, origin=self.replica)
        keys = [self._key(session_id), self.link.key("mcp", "e", hashed), self.link.key("mcp", "b", hashed), self.open_key]
        try:
            await self._end(keys=keys, args=[hashed, self.link.key("mcp", "p", ""), self.channel, signal.model_dump_json()])
        except REDIS_ERRORS as exc:
            raise self.link.unavailable(exc) from None

    async def touch(self, session_ids: Iterable[str]) -> None:
        ids = list(session_ids)
        if not ids:
            return
        try:
            async with self.link.client.pipeline(transaction=False) as pipe:
                for sid in ids:
                    hashed = _hashed(sid)
                    for key in (self._key(sid), self.link.key("mcp", "e", hashed), self.link.key("mcp", "b", hashed)):
                        pipe.pexpire(key, self.ttl_ms)
                await pipe.execute()
        except REDIS_ERRORS as exc:
            raise self.link.unavailable(exc) from None

    async def reap(self) -> list[SessionFacts]:
        """Nothing to hand over: Redis expires the facts itself (TTL), and `create` notices that."""
        return []

    async def publish(self, signal: SessionSignal) -> None:
        try:
            await self.link.client.publish(self.channel, signal.model_copy(update={"origin": self.replica}).model_dump_json())
        except REDIS_ERRORS as exc:
            raise self.link.unavailable(exc) from None

    async def signals(self) -> AsyncIterator[SessionSignal]:
        """Other replicas' signals; resubscribes by itself after Redis failed (signals sent while it
        was down are lost: a waiter then times out and a hold runs out, both failing closed)."""
        while True:
            pubsub: Any = self.link.client.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(self.channel)
                log.info("mcp_http.signals_subscribed", where=self.link.where)
                while True:
                    message = await pubsub.get_message(timeout=self.block_seconds)
                    if message is None or message.get("type") != "message":
                        continue
                    signal = _signal(message.get("data"))
                    if signal is not None and signal.origin != self.replica:
                        yield signal
            except REDIS_ERRORS as exc:
                log.warning("mcp_http.signals_lost", error=str(self.link.unavailable(exc)))
            finally:
                with anyio.CancelScope(shield=True), anyio.move_on_after(1):
                    await pubsub.aclose()
            await anyio.sleep(RESUBSCRIBE_SECONDS)


def _signal(data: Any) -> SessionSignal | None:
    try:
        return SessionSignal.model_validate_json(data)
    except (ValidationError, TypeError, json.JSONDecodeError):
        log.warning("mcp_http.signal_invalid")
        return None
