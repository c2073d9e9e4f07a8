"""Compose a profile with the profiles it `extends` into one effective profile, remembering where
every part came from.

The merge rules (docs/policy.md, "Composing profiles"), applied from the root base to the
nearest profile, one layer at a time:

- tiers, rate limits, sensitivity classes: override by name (a tier's `name`, a limit's `id`, a
  class's set of tool globs). A child's entry with a parent's name replaces it where it stands;
  a new name is appended after the parent's.
- principals: the child's come first, then the parent's; a child principal with a parent's id
  replaces it (so first-match resolution prefers the more specific profile); `principals_remove`
  drops inherited ones by id (naming one that is not inherited is an error).
- `tool_annotations`, `tool_costs`: key by key (glob), the child's value wins.
- `sanitizer`, `circuit_breaker`, `approval`: field by field, the fields the child writes win.
- `rate_limit_store_down`, `backend_timeout_seconds`, `disclosure_modes`: the child's if written.
- `rule_sets`: the parent's, then the child's (each relative to the file naming it); one file
  named twice loads once; `rule_sets_remove` drops inherited files (naming one that is not
  inherited is an error, so a typo cannot leave a rule set in force unnoticed).
- `egress` lists are added to the parent's (compiled in `compile._egress`).

No I/O beyond resolving the paths of rule sets.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.core.errors import PolicyProblem
from gateway.policy.load import LoadedDocument, Loc
from gateway.policy.models import Policy

#: List sections merged by name: section -> the name an entry is known by.
BY_NAME: dict[str, Callable[[Any], Any]] = {
    "tiers": lambda t: t.name,
    "rate_limits": lambda r: r.id,
    "sensitivity": lambda s: tuple(sorted(set(s.tools))),
}
KEYED = ("tool_annotations", "tool_costs")
FIELDWISE = ("sanitizer", "circuit_breaker", "approval")
SCALARS = ("rate_limit_store_down", "backend_timeout_seconds", "disclosure_modes")
_WHAT = {"tiers": "tier", "rate_limits": "rate limit", "sensitivity": "sensitivity class for tools"}


@dataclass(frozen=True, slots=True)
class RuleSetRef:
    """One entry of the effective `rule_sets`: the file naming it, its index there, the path."""

    referrer: LoadedDocument
    index: int
    ref: str
    target: Path


@dataclass(frozen=True)
class ComposedProfile:
    """The effective profile of a chain, and the origin (file and place) of each of its parts."""

    model: Policy
    layers: tuple[LoadedDocument, ...]  # root base first, the profile named last
    origins: dict[Loc, tuple[LoadedDocument, Loc]]
    rule_sets: tuple[RuleSetRef, ...]

    @property
    def nearest(self) -> LoadedDocument:
        return self.layers[-1]

    def at(self, loc: Loc) -> tuple[LoadedDocument, Loc]:
        """The document and the place in it that `loc` of the effective profile came from."""
        for end in range(len(loc), 0, -1):
            hit = self.origins.get(loc[:end])
            if hit is not None:
                return hit[0], (*hit[1], *loc[end:])
        return self.nearest, loc

    def where(self, loc: Loc) -> str:
        doc, inner = self.at(loc)
        return f"{doc.path}:{doc.line_of(inner)}"

    def problem(self, loc: Loc, message: str, *, rule_id: str = "", severity: str = "error") -> PolicyProblem:
        doc, inner = self.at(loc)
        return PolicyProblem(doc.path, doc.line_of(inner), rule_id, message, severity=severity)


def compose_profiles(layers: Sequence[LoadedDocument], problems: list[PolicyProblem]) -> ComposedProfile:
    """Merge `layers` (root base first) by the rules in this module's docstring; problems are appended."""
    origins: dict[Loc, tuple[LoadedDocument, Loc]] = {}
    update: dict[str, Any] = {}
    for section in BY_NAME:
        update[section] = _by_name(layers, section, origins, problems)
    update["principals"] = _principals(layers, origins, problems)
    for section in KEYED:
        merged: dict[str, Any] = {}
        for doc in layers:
            for key, value in getattr(_policy(doc), section).items():
                merged[key] = value
                origins[(section, key)] = (doc, (section, key))
        update[section] = merged
    for section in FIELDWISE:
        value = getattr(_policy(layers[0]), section)
        for doc in layers:
            mine = getattr(_policy(doc), section)
            written = {name: getattr(mine, name) for name in mine.model_fields_set}
            value = value.model_copy(update=written)
            origins.update({(section, name): (doc, (section, name)) for name in written})
        update[section] = value
    for section in SCALARS:
        for doc in layers:
            if section in _policy(doc).model_fields_set:
                update[section] = getattr(_policy(doc), section)
                origins[(section,)] = (doc, (section,))
    nearest = _policy(layers[-1])
    model = nearest.model_copy(update=update)
    return ComposedProfile(model, tuple(layers), origins, tuple(_rule_sets(layers, problems)))


def _policy(doc: LoadedDocument) -> Policy:
    assert isinstance(doc.model, Policy)
    return doc.model


def _by_name(layers: Sequence[LoadedDocument], section: str, origins: dict[Loc, tuple[LoadedDocument, Loc]],
             problems: list[PolicyProblem]) -> list[Any]:
    """A list section merged by name: a later layer's entry replaces an earlier one's in place."""
    key_of = BY_NAME[section]
    entries: list[tuple[Any, LoadedDocument, int]] = []
    for doc in layers:
        positions = {key_of(item): n for n, (item, _, _) in enumerate(entries)}
        mine: dict[Any, int] = {}
        for i, item in enumerate(getattr(_policy(doc), section)):
            key = key_of(item)
            if key in mine:
                problems.append(PolicyProblem(doc.path, doc.line_of((section, i)), "", (
                    f"{_WHAT[section]} {_shown(key)} is defined twice in this profile (first at line "
                    f"{doc.line_of((section, mine[key]))})")))
                continue
            mine[key] = i
            if key in positions:
                entries[positions[key]] = (item, doc, i)
            else:
                entries.append((item, doc, i))
    for n, (_, doc, i) in enumerate(entries):
        origins[(section, n)] = (doc, (section, i))
    return [item for item, _, _ in entries]


def _shown(key: Any) -> str:
    return "[" + ", ".join(map(repr, key)) + "]" if isinstance(key, tuple) else repr(key)


def _principals(layers: Sequence[LoadedDocument], origins: dict[Loc, tuple[LoadedDocument, Loc]],
                problems: list[PolicyProblem]) -> list[Any]:
    """The principals, the nearest profile's first; one with the id of a more distant one replaces it,
    and `principals_remove` drops a more distant one."""
    entries: list[tuple[Any, LoadedDocument, int]] = []
    removed: set[str] = set()
    for n, doc in enumerate(reversed(layers)):
        taken = {p.id for p, _, _ in entries} | removed
        mine: dict[str, int] = {}
        for i, spec in enumerate(_policy(doc).principals):
            if spec.id in mine:
                problems.append(PolicyProblem(doc.path, doc.line_of(("principals", i)), "", (
                    f"principal {spec.id!r} is defined twice in this profile (first at line "
                    f"{doc.line_of(('principals', mine[spec.id]))})")))
                continue
            mine[spec.id] = i
            if spec.id not in taken:
                entries.append((spec, doc, i))
        farther = {p.id for layer in layers[:len(layers) - n - 1] for p in _policy(layer).principals}
        for i, pid in enumerate(_policy(doc).principals_remove):
            if pid not in farther:
                problems.append(PolicyProblem(doc.path, doc.line_of(("principals_remove", i)), "", (
                    f"principals_remove: {pid!r} is not a principal this profile inherits "
                    f"(inherited: {', '.join(sorted(farther)) or 'none'})")))
            removed.add(pid)
    for n, (_, doc, i) in enumerate(entries):
        origins[("principals", n)] = (doc, ("principals", i))
    return [spec for spec, _, _ in entries]


def _rule_sets(layers: Sequence[LoadedDocument], problems: list[PolicyProblem]) -> list[RuleSetRef]:
    """The effective rule sets: each layer's appended to the inherited ones, minus its `rule_sets_remove`."""
    refs: list[RuleSetRef] = []
    for doc in layers:
        here = Path(doc.path).parent
        model = _policy(doc)
        for i, ref in enumerate(model.rule_sets_remove):
            target = (here / ref).resolve()
            if not any(r.target == target for r in refs):
                inherited = ", ".join(str(r.target) for r in refs) or "none"
                problems.append(PolicyProblem(doc.path, doc.line_of(("rule_sets_remove", i)), "", (
                    f"rule_sets_remove: {ref} ({target}) is not a rule set this profile inherits "
                    f"(inherited: {inherited})")))
            refs = [r for r in refs if r.target != target]
        for i, ref in enumerate(model.rule_sets):
            target = (here / ref).resolve()
            if not any(r.target == target for r in refs):
                refs.append(RuleSetRef(doc, i, ref, target))
    return refs
