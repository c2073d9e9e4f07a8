"""Which tiers can run destructive tools, as far as the policy's text tells (for `dharma check`).

`approval.allow_elicitation` lets a caller release its own held calls; on a tier that can run a
tool that changes or destroys state that makes the hold no hold, and the compiler warns. The test
is conservative: a grant can cover a destructive tool unless its annotation conditions admit only
tools that call themselves harmless (`readOnlyHint: true` or `destructiveHint: false`), or every
name its globs match spells no state-changing word where it is literal and starts with a
read-only verb before its first wildcard (`read_*` cannot, `*`, `patient_*` and `delete_*` can).
Tool names are read with the sequence classifier's words (`stages.classify`). Inherited grants
count: a compiled tier holds them. No I/O.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gateway.policy.compile import CompiledGrant, CompiledTier

#: Verbs that start the name of a tool that only reads (`read_file`, `list_directory`, `search`).
READ_ONLY_VERBS = frozenset(
    {"read", "get", "list", "search", "find", "view", "show", "describe", "lookup", "query", "stat", "count", "ls",
     "cat", "head", "tail", "inspect"}
)  # fmt: skip
_WILDCARD = re.compile(r"\[[^\]]*\]|[*?\[]")


def destructive_tiers(tiers: Mapping[str, CompiledTier], names: Iterable[str]) -> dict[str, str]:
    """Of the tiers `names`, those that can run a destructive tool, each with the grant that can (quoted)."""
    found: dict[str, str] = {}
    for name in names:
        tier = tiers.get(name)
        why = next((w for g in tier.grants if (w := destructive_grant(g)) is not None), None) if tier else None
        if why is not None:
            found[name] = why
    return found


def destructive_grant(grant: CompiledGrant) -> str | None:
    """What in `grant` could cover a destructive tool (a glob, or its annotation conditions), or None."""
    conditions = dict(grant.annotations)
    if conditions.get("readOnlyHint") is True or conditions.get("destructiveHint") is False:
        return None
    if conditions.get("destructiveHint") is True or not grant.tools:
        return "annotations " + (", ".join(f"{k}: {json.dumps(v)}" for k, v in grant.annotations))
    return next((repr(g) for g in grant.tools if glob_may_name_destructive(g)), None)


def glob_may_name_destructive(pattern: str) -> bool:
    """Whether tool-name glob `pattern` may match a name that says it changes or destroys state."""
    from gateway.stages.classify import STATE_CHANGING_WORDS, tool_words  # stages import the policy: not at load

    if tool_words(_WILDCARD.sub(" ", pattern)) & STATE_CHANGING_WORDS:
        return True
    wild = _WILDCARD.search(pattern)
    return wild is not None and not tool_words(pattern[: wild.start()]) & READ_ONLY_VERBS
