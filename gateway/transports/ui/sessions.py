"""The approvals page's login sessions: a random id in an HttpOnly cookie, everything else here.

A session keeps the credentials the operator logged in with (never sent back to the browser), so
every request resolves the principal again under the policy loaded now: a key removed from the
policy, or a role taken away, ends what the session may do at once. Each session has its own
synchronizer CSRF token and an expiry (capped by a JWT's `exp`). Sessions live in this process:
behind several replicas, route `/ui` to one replica or log in on each (docs/operations.md).
"""

from __future__ import annotations

import hmac
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

from gateway.core.call import Credentials

COOKIE = "dharma_ui"
"""The session cookie's name (`__Host-dharma_ui` over https, which also pins it to this host)."""
SESSION_SECONDS = 8 * 3600.0
MAX_SESSIONS = 10_000


@dataclass(slots=True)
class UiSession:
    """One logged-in browser: who (their credentials, resolved per request), its CSRF token, its end."""

    id: str
    credentials: Credentials
    csrf: str
    expires_at: float
    flash: str | None = None
    """A one-time notice for the next page (what the last decision did)."""

    def csrf_ok(self, presented: str | None) -> bool:
        return bool(presented) and hmac.compare_digest(self.csrf.encode(), str(presented).encode())


class UiSessions:
    """The sessions of this process, by id; expired ones are forgotten when met, the oldest dropped past `limit`."""

    def __init__(self, *, seconds: float = SESSION_SECONDS, limit: int = MAX_SESSIONS, clock: Callable[[], float] = time.time) -> None:
        self.seconds = seconds
        self.limit = limit
        self.clock = clock
        self._by_id: dict[str, UiSession] = {}

    def create(self, credentials: Credentials) -> UiSession:
        """A new session for `credentials`; it ends after `seconds`, or when the JWT it holds expires."""
        now = self.clock()
        expires = now + self.seconds
        exp = credentials.jwt.claims.get("exp") if credentials.jwt is not None else None
        if isinstance(exp, (int, float)) and not isinstance(exp, bool):
            expires = min(expires, float(exp))
        if len(self._by_id) >= self.limit:
            self._by_id = {k: s for k, s in self._by_id.items() if s.expires_at > now}
            while len(self._by_id) >= self.limit:
                self._by_id.pop(next(iter(self._by_id)))
        session = UiSession(secrets.token_urlsafe(32), credentials, secrets.token_urlsafe(32), expires)
        self._by_id[session.id] = session
        return session

    def get(self, session_id: str | None) -> UiSession | None:
        if not session_id:
            return None
        session = self._by_id.get(session_id)
        if session is not None and session.expires_at <= self.clock():
            self._by_id.pop(session_id, None)
            return None
        return session

    def end(self, session_id: str) -> None:
        self._by_id.pop(session_id, None)
