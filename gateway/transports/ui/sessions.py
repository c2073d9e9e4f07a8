"""The approvals page's login sessions: a random id in an HttpOnly cookie, everything else in a store.

A session keeps who logged in by a reference, never the credential: an API key's SHA-256, or the
verified token's subject, claims and tier. Every request resolves the principal again under the
policy loaded now, so a key removed from the policy, or a role taken away, ends what the session
may do at once. Each session has its own synchronizer CSRF token and an expiry (capped by a JWT's
`exp`). The store is this process's memory, or Redis when `redis.url` is set, so that behind
several replicas any of them serves a logged-in browser and a logout on one ends it on all.
"""

from __future__ import annotations

import hmac
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

from gateway.core.call import Credentials, VerifiedJwt
from gateway.stages.authenticate import api_key_digest
from gateway.stores.base import UiSessionRecord, UiSessionStore
from gateway.stores.memory import MemoryUiSessionStore

COOKIE = "dharma_ui"
"""The session cookie's name (`__Host-dharma_ui` over https, which also pins it to this host)."""
SESSION_SECONDS = 8 * 3600.0


@dataclass(slots=True)
class UiSession:
    """One logged-in browser: its id (the cookie) and what the store keeps of it."""

    id: str
    record: UiSessionRecord

    @property
    def csrf(self) -> str:
        return self.record.csrf

    @property
    def expires_at(self) -> float:
        return self.record.expires_at

    @property
    def credentials(self) -> Credentials:
        """What the principal is resolved from on each request (a digest or a verified token, never a key)."""
        r = self.record
        if r.jwt_subject is not None:
            return Credentials(jwt=VerifiedJwt(r.jwt_subject, dict(r.jwt_claims), r.jwt_tier))
        return Credentials(api_key_sha256=bytes.fromhex(r.api_key_sha256) if r.api_key_sha256 else None)

    def csrf_ok(self, presented: str | None) -> bool:
        return bool(presented) and hmac.compare_digest(self.csrf.encode(), str(presented).encode())


def record_for(credentials: Credentials, csrf: str, expires_at: float) -> UiSessionRecord:
    """What a store keeps of a login with `credentials`: the API key's digest, or the verified token's facts."""
    if credentials.jwt is not None:
        jwt = credentials.jwt
        return UiSessionRecord(csrf=csrf, expires_at=expires_at, jwt_subject=jwt.subject, jwt_claims=dict(jwt.claims),
                               jwt_tier=jwt.tier)
    digest = credentials.api_key_sha256
    if digest is None and credentials.api_key:
        digest = api_key_digest(credentials.api_key)
    if digest is None:
        raise ValueError("a /ui session needs an API key or a verified token")
    return UiSessionRecord(csrf=csrf, expires_at=expires_at, api_key_sha256=digest.hex())


class UiSessions:
    """The sessions, by id, in `store` (this process's memory unless given one)."""

    def __init__(self, store: UiSessionStore | None = None, *, seconds: float = SESSION_SECONDS,
                 clock: Callable[[], float] = time.time) -> None:
        self.store: UiSessionStore = store if store is not None else MemoryUiSessionStore(clock=clock)
        self.seconds = seconds
        self.clock = clock

    async def create(self, credentials: Credentials) -> UiSession:
        """A new session for `credentials`; it ends after `seconds`, or when the JWT it holds expires."""
        expires = self.clock() + self.seconds
        exp = credentials.jwt.claims.get("exp") if credentials.jwt is not None else None
        if isinstance(exp, (int, float)) and not isinstance(exp, bool):
            expires = min(expires, float(exp))
        session = UiSession(secrets.token_urlsafe(32), record_for(credentials, secrets.token_urlsafe(32), expires))
        await self.store.put(session.id, session.record)
        return session

    async def get(self, session_id: str | None) -> UiSession | None:
        if not session_id:
            return None
        record = await self.store.get(session_id, self.clock())
        return UiSession(session_id, record) if record is not None else None

    async def end(self, session_id: str) -> None:
        await self.store.end(session_id)

    async def set_flash(self, session: UiSession, text: str | None) -> None:
        """Keep a one-time notice for the session's next page (wherever that page is served)."""
        session.record = session.record.model_copy(update={"flash": text})
        await self.store.put(session.id, session.record)

    async def take_flash(self, session: UiSession) -> str | None:
        """The session's notice, forgotten once read."""
        flash = session.record.flash
        if flash is not None:
            await self.set_flash(session, None)
        return flash
