"""Named tool groups (virtual servers), shared by `/mcp/{group}` and `/v1/groups/{group}/...`.

A group is a view of the one catalog: the tools whose served names match one of its globs (the
policy's own tool-glob matcher, `glob_match`), for the principals it admits. It only narrows what
a caller sees: visibility stays the compiled policy's, and a tool outside the group is answered
exactly like an unknown tool. Data and pure functions only; the transports do the I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gateway.core.call import Principal
from gateway.policy.compile import glob_match


@dataclass(frozen=True, slots=True, eq=False)
class Group:
    """One configured group (`gateway.config.GroupConfig`), ready to answer per call."""

    name: str
    globs: tuple[str, ...]
    description: str = ""
    principals: frozenset[str] = frozenset()
    roles: frozenset[str] = frozenset()

    def has(self, tool: str) -> bool:
        """Whether the served tool name `tool` is in the group (`glob_match` remembers its answers)."""
        return any(glob_match(tool, g) for g in self.globs)

    def admits(self, principal: Principal) -> bool:
        """Whether `principal` may use the group: listed by id, or holding a listed role (no list: anyone)."""
        if not self.principals and not self.roles:
            return True
        return principal.id in self.principals or bool(self.roles.intersection(principal.roles))

    def only(self, names: Iterable[str]) -> set[str]:
        """The names among `names` that are in the group."""
        return {n for n in names if self.has(n)}


def groups_from(settings: Any) -> Mapping[str, Group]:
    """The groups of `settings.groups` by name (none when the settings have no groups)."""
    return {
        g.name: Group(g.name, tuple(g.tools), g.description, frozenset(g.principals), frozenset(g.roles))
        for g in getattr(settings, "groups", ()) or ()
    }


def group_for(groups: Mapping[str, Group], name: str, principal: Principal) -> Group | None:
    """The group `name` if it exists and admits `principal`; None otherwise (both answer as unknown:
    a caller learns nothing about groups it may not use)."""
    group = groups.get(name)
    return group if group is not None and group.admits(principal) else None
