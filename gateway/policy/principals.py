"""Compiled principals, the credentials two of them claim alike, and how each one is shown.

Resolution is first match in the profile's order (`stages.authenticate`), so a credential two
principals claim resolves to the earlier one and the later one never gets it. An API key claimed
twice is a load error (a key must name one caller); a local user claimed by an earlier principal
too (the same name, or `"*"`) is an error of `dharma check` while the gateway resolves it by first
match. A JWT resolves by subject = principal id, and ids are unique in a composed profile. No I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gateway.core.errors import PolicyProblem


@dataclass(frozen=True, slots=True)
class CompiledPrincipal:
    id: str
    tier: str
    roles: tuple[str, ...]
    claims: dict[str, Any]
    key_digests: tuple[bytes, ...]
    local_user: str | None
    file: str = ""
    line: int = 0

    @property
    def source(self) -> str:
        return f"{self.file}:{self.line}" if self.file else "(added for a test)"


def _at(p: CompiledPrincipal, earlier: CompiledPrincipal) -> CompiledPrincipal:
    """Where to report a conflict: at the later principal, unless the earlier one comes from another
    (nearer) profile: that is the file its author is editing."""
    return p if earlier.file == p.file else earlier


def key_conflicts(principals: tuple[CompiledPrincipal, ...]) -> list[PolicyProblem]:
    """An error for each principal holding an API key digest an earlier principal holds."""
    first: dict[bytes, CompiledPrincipal] = {}
    problems = []
    for p in principals:
        for digest in dict.fromkeys(p.key_digests):
            earlier = first.setdefault(digest, p)
            if earlier is not p:
                at = _at(p, earlier)
                problems.append(PolicyProblem(at.file, at.line, "", (
                    f"principals {earlier.id!r} ({earlier.source}) and {p.id!r} ({p.source}) have the same API key "
                    f"(sha256 {digest.hex()[:12]}…): a key must name one principal (the first would always win); give each "
                    f"its own key, or give the nearer one the other's id to replace it")))
    return problems


def shadowed_by(principals: tuple[CompiledPrincipal, ...]) -> dict[str, CompiledPrincipal]:
    """For each principal whose `local_user` an earlier principal claims too (that name or `"*"`),
    the earlier one: that principal is never resolved for a local user."""
    found: dict[str, CompiledPrincipal] = {}
    for j, p in enumerate(principals):
        if p.local_user is None:
            continue
        earlier = next((q for q in principals[:j] if q.local_user in (p.local_user, "*")), None)
        if earlier is not None:
            found[p.id] = earlier
    return found


def local_user_conflicts(principals: tuple[CompiledPrincipal, ...]) -> list[PolicyProblem]:
    """An error (reported by `dharma check`) for each principal an earlier one shadows for its local user."""
    by_id = {p.id: p for p in principals}
    problems = []
    for pid, earlier in shadowed_by(principals).items():
        p = by_id[pid]
        if earlier.local_user == p.local_user:
            what = f"principals {earlier.id!r} ({earlier.source}) and {p.id!r} ({p.source}) both claim local user {p.local_user!r}"
            fix = (f"give {earlier.id!r} the id {p.id!r} to replace the other, or drop one "
                   f"(`principals_remove: [{p.id}]` drops an inherited one)")
        else:
            what = (f"principal {p.id!r} ({p.source}, local user {p.local_user!r}) comes after {earlier.id!r} "
                    f"({earlier.source}), which claims every local user ('*')")
            fix = f"give {earlier.id!r} a specific local_user, or list {p.id!r} before it"
        alone = "" if p.key_digests else " (and, with no API key, only a JWT naming it reaches it)"
        at = _at(p, earlier)
        problems.append(PolicyProblem(at.file, at.line, "", (
            f"{what}: the first match wins, so {p.id!r} is never resolved for that user{alone}; {fix}")))
    return problems


def credentials_of(p: CompiledPrincipal) -> list[str]:
    """How `p` authenticates, never a secret: API key digests shortened, the local user, the JWT subject."""
    ways = [f"api key sha256:{d.hex()[:12]}…" for d in p.key_digests]
    if p.local_user is not None:
        ways.append("every local user" if p.local_user == "*" else f"local user {p.local_user!r}")
    ways.append(f"jwt sub={p.id!r}")
    return ways


def explain_principals(principals: tuple[CompiledPrincipal, ...]) -> list[str]:
    """One line per principal in resolution order: id, credentials, tier, roles, origin, and why
    it is never reached for its local user when an earlier principal claims that user."""
    shadowed = shadowed_by(principals)
    lines = []
    for n, p in enumerate(principals, 1):
        roles = ",".join(p.roles) or "-"
        note = ""
        if p.id in shadowed:
            note = f"  [local user shadowed by {shadowed[p.id].id!r}]"
        lines.append(f"{n:>3}. {p.id}  tier={p.tier} roles={roles}  via {', '.join(credentials_of(p))}  ({p.source}){note}")
    return lines
