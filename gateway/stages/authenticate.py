"""Authenticate: resolve who is calling (API key, verified JWT, local user); refuse callers nobody knows."""

from __future__ import annotations

import hashlib
import hmac

from gateway.core.call import BlockClass, CallContext, Credentials, Decision, Principal, VerifiedJwt
from gateway.core.errors import ErrorCode
from gateway.policy.compile import CompiledPolicy


def api_key_digest(api_key: str) -> bytes:
    """The SHA-256 an API key is known by (the policy's `api_key_sha256`, a /ui session's reference)."""
    return hashlib.sha256(api_key.encode("utf-8", "surrogatepass")).digest()


def authenticate(policy: CompiledPolicy, credentials: Credentials) -> Principal | None:
    """Resolve the caller: an API key or its digest (compared by SHA-256 digest, constant time), a verified
    JWT (see `principal_for_jwt`) or the local user."""
    if credentials.jwt is not None:
        return principal_for_jwt(policy, credentials.jwt)
    presented = credentials.api_key_sha256
    if presented is None and credentials.api_key:
        presented = api_key_digest(credentials.api_key)
    if presented is not None:
        found: Principal | None = None
        for p in policy.principals:
            for stored in p.key_digests:
                if hmac.compare_digest(presented, stored) and found is None:
                    found = Principal(p.id, p.tier, p.roles, p.claims)
        return found
    if credentials.local_user is not None:
        for p in policy.principals:
            if p.local_user in (credentials.local_user, "*"):
                return Principal(p.id, p.tier, p.roles, p.claims)
    return None


def principal_for_jwt(policy: CompiledPolicy, token: VerifiedJwt) -> Principal | None:
    """A policy principal whose id is the token's subject, else the tier the token names.

    The token's claims are visible to rules as `principal.claims`; a principal's own `claims`
    in the policy win over the token's (the policy is the administrator's word). A token
    naming no known principal and no known tier resolves to nobody (fail closed).
    """
    for p in policy.principals:
        if p.id == token.subject:
            return Principal(p.id, p.tier, p.roles, {**token.claims, **p.claims})
    if token.tier is not None and token.tier in policy.tiers:
        return Principal(token.subject, token.tier, (), dict(token.claims))
    return None


class Authenticate:
    """Refuse callers the gateway could not resolve to a principal (see `authenticate`)."""

    name = "authenticate"

    async def __call__(self, ctx: CallContext, policy: CompiledPolicy) -> Decision | None:
        if ctx.principal is None:
            return Decision.block(
                ErrorCode.UNAUTHENTICATED,
                "no valid credentials: present an API key the gateway knows",
                BlockClass.SAFETY_TIER_GATE,
                stage=self.name,
            )
        return None
