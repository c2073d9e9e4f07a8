"""Turn loaded policy documents into one immutable CompiledPolicy.

Every CEL expression is compiled here, once, and checked against the variables of its phase;
rules are indexed by tool glob; tiers are flattened through inheritance; the policy version
is a digest of every file that went in. Any problem anywhere rejects the whole set (the caller
keeps the last good one). No I/O beyond reading the files named.
"""

from __future__ import annotations

import fnmatch
import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gateway.policy import cel
from gateway.policy.destructive import destructive_tiers
from gateway.policy.globs import globs_overlap
from gateway.policy.names import fold_glob, fold_name, name_matches
from gateway.core.call import BlockClass, Disclosure, Effect, Mode, Sensitivity
from gateway.core.errors import PolicyErrors, PolicyProblem
from gateway.policy.compose import ComposedProfile, compose_profiles
from gateway.policy.load import LoadedDocument, expand_paths, read_documents
from gateway.policy.principals import CompiledPrincipal, key_conflicts, local_user_conflicts
from gateway.policy.models import (
    DisclosureRule,
    DisclosureRuleSet,
    Policy,
    RateLimit,
    Rule,
    RuleSet,
    RuleTest,
    SanitizerSettings,
)

CALL_VARIABLES = frozenset(
    {"principal", "tool", "args", "args_shell", "args_urls", "egress", "request", "session", "findings", "now", "call"}
)
RESPONSE_VARIABLES = CALL_VARIABLES | {"response"}
ESCALATION_VARIABLES = frozenset({"principal", "tool", "args", "request", "now"})
#: What a visibility rule (`effect: hide`) sees: it decides per tool at `tools/list`, before any call.
VISIBILITY_VARIABLES = frozenset({"principal", "tool", "now"})
RESTRICTIVE = (Effect.DENY, Effect.REQUIRE_APPROVAL, Effect.REDACT)
#: `egress` of a caller whose profile sets no lists.
NO_EGRESS: dict[str, list[str]] = {"allow": [], "deny": []}


@dataclass(frozen=True, slots=True)
class CompiledRule:
    id: str
    effect: Effect
    mode: Mode
    tools: tuple[str, ...]
    when: cel.Expression | None
    message: str
    message_expr: cel.Expression | None
    block_class: BlockClass | None
    redact: tuple[str, ...]
    file: str
    line: int
    guard: str | None = None
    class_guard: str | None = None  # `"X" in call.classes && …`: the class the rule needs (class_guard)
    empty_guard: tuple[str, ...] | None = None  # `findings.exists(…) && …`: false when that list is empty


@dataclass(frozen=True, slots=True)
class CompiledDisclosureRule:
    id: str
    verdict: Disclosure
    mode: Mode
    tools: tuple[str, ...]
    topic: str
    when: cel.Expression | None
    redact: tuple[str, ...]
    redact_secrets: bool
    no_information_response: Any
    file: str
    line: int
    empty_guard: tuple[str, ...] | None = None  # `response.findings.exists(…) && …` (see empty_guard)


@dataclass(frozen=True, slots=True)
class CompiledEscalation:
    when: cel.Expression
    to: Sensitivity
    message: str


@dataclass(frozen=True, slots=True)
class CompiledSensitivity:
    tools: tuple[str, ...]
    level: Sensitivity
    escalate: tuple[CompiledEscalation, ...]


@dataclass(frozen=True, slots=True)
class CompiledGrant:
    tools: tuple[str, ...]
    annotations: tuple[tuple[str, Any], ...]

    def admits(self, annotations: dict[str, Any]) -> bool:
        """Whether `annotations` meet this grant's annotation conditions (its tool globs are
        `CompiledPolicy.grants_for`'s, worked out once per tool)."""
        return all(annotations.get(k) == v for k, v in self.annotations)


@dataclass(frozen=True, slots=True)
class CompiledTier:
    name: str
    grants: tuple[CompiledGrant, ...]
    max_sensitivity: Sensitivity


class GlobIndex:
    """Rules indexed by their tool globs: exact names in a dict, true globs in a list.

    `candidates(tool)` is memoised per tool name (the set of tool names is small and finite),
    so a call evaluates only rules that can apply and pays the glob matching once per name.
    """

    __slots__ = ("_exact", "_globs", "_cache")

    def __init__(self, items: list[tuple[tuple[str, ...], Any]]) -> None:
        self._exact: dict[str, list[tuple[int, Any]]] = {}
        self._globs: list[tuple[int, str, Any]] = []
        for order, (globs, item) in enumerate(items):
            for pattern in globs:
                if any(ch in pattern for ch in "*?["):
                    self._globs.append((order, fold_glob(pattern), item))
                else:
                    self._exact.setdefault(fold_name(pattern), []).append((order, item))
        self._cache: dict[str, tuple[Any, ...]] = {}

    def candidates(self, tool: str) -> tuple[Any, ...]:
        hit = self._cache.get(tool)
        if hit is not None:
            return hit
        folded = fold_name(tool)
        found: dict[int, Any] = {order: item for order, item in self._exact.get(folded, ())}
        for order, pattern, item in self._globs:
            if order not in found and fnmatch.fnmatchcase(folded, pattern):
                found[order] = item
        result = tuple(found[k] for k in sorted(found))
        if len(self._cache) < 65_536:
            self._cache[tool] = result
        return result


#: Glob match of a tool name on folded spellings (`policy.names`: `get-sum`, `getSum` and `get_sum`
#: are one name to a glob).
glob_match = name_matches


@dataclass(frozen=True)
class CompiledPolicy:
    """Everything the pipeline needs to decide, built once per (re)load."""

    name: str
    version: str
    engine: str
    files: tuple[str, ...]
    rules: tuple[CompiledRule, ...]
    disclosure_rules: tuple[CompiledDisclosureRule, ...]
    rule_index: GlobIndex
    disclosure_index: GlobIndex
    visibility_rules: tuple[CompiledRule, ...] = ()
    visibility_index: GlobIndex = field(default_factory=lambda: GlobIndex([]))
    principals: tuple[CompiledPrincipal, ...] = ()
    tiers: dict[str, CompiledTier] = field(default_factory=dict)
    sensitivity: tuple[CompiledSensitivity, ...] = ()
    tool_annotations: tuple[tuple[str, dict[str, Any]], ...] = ()
    rate_limits: tuple[RateLimit, ...] = ()
    tool_costs: tuple[tuple[str, int], ...] = ()
    rate_limit_store_down: str = "deny"
    sanitizer: SanitizerSettings = SanitizerSettings()
    breaker_threshold: int = 5
    breaker_reset_seconds: float = 30.0
    approval_hold_seconds: float = 0.0
    approval_expires_seconds: float = 900.0
    approval_allow_self: bool = False
    #: `approval.allow_elicitation`: False, True (every tier) or the tiers whose callers may answer for themselves.
    approval_elicitation: bool | frozenset[str] = False
    backend_timeout_seconds: float = 30.0
    disclosure_modes: tuple[str, ...] = ("direct", "summary", "none")
    #: The `egress` variable per tier ("" for a caller without one): the profile's lists plus the tier's.
    egress: dict[str, dict[str, list[str]]] = field(default_factory=dict)
    warnings: tuple[PolicyProblem, ...] = ()
    _memo: dict[tuple[str, Any], Any] = field(default_factory=dict, compare=False, repr=False)

    def _cached(self, kind: str, tool: Any, build: Any) -> Any:
        key = (kind, tool)
        hit = self._memo.get(key)
        if hit is None:
            hit = build()
            if len(self._memo) < 65_536:
                self._memo[key] = hit
        return hit

    def egress_for(self, tier: str | None) -> dict[str, list[str]]:
        """The caller's egress lists (`egress` in CEL): its tier's, else the profile-wide ones."""
        found = self.egress.get(tier or "")
        if found is None:
            found = self.egress.get("", NO_EGRESS)
        return found

    def call_references(self, tool: str, classes: frozenset[str] | None = None) -> frozenset[str]:
        """Top-level variables the call-phase rules for `tool` read: only these are converted.

        With `classes`, rules whose class guard the call lacks are left out (they are skipped)."""
        if classes is None:
            return self._cached("call-refs", tool, lambda: _references(self.rules_for(tool), ("when", "message_expr")))
        key = tool + "\0" + ",".join(sorted(classes))
        return self._cached("call-refs-classes", key, lambda: _references(
            tuple(r for r in self.rules_for(tool) if r.class_guard is None or r.class_guard in classes),
            ("when", "message_expr")))

    def visibility_references(self, tool: str) -> frozenset[str]:
        return self._cached("visibility-refs", tool, lambda: _references(self.visibility_rules_for(tool), ("when",)))

    def visibility_rules_for(self, tool: str) -> tuple[CompiledRule, ...]:
        """The `effect: hide` rules that can apply to `tool`."""
        return self.visibility_index.candidates(tool)  # type: ignore[no-any-return]

    def memoised(self, kind: str, key: Any, build: Any) -> Any:
        """`build()` once per (kind, key) for this policy (bounded); `build` must not return None."""
        return self._cached(kind, key, build)

    def disclosure_references(self, tool: str) -> frozenset[str]:
        return self._cached("disclosure-refs", tool, lambda: _references(self.disclosure_rules_for(tool), ("when",)))

    def sensitivity_for(self, tool: str) -> tuple[CompiledSensitivity, ...]:
        """The sensitivity classes whose globs match `tool`."""
        return self._cached(
            "sensitivity", tool, lambda: tuple(c for c in self.sensitivity if any(glob_match(tool, g) for g in c.tools))
        )

    def rules_for(self, tool: str) -> tuple[CompiledRule, ...]:
        return self.rule_index.candidates(tool)  # type: ignore[no-any-return]

    def disclosure_rules_for(self, tool: str) -> tuple[CompiledDisclosureRule, ...]:
        return self.disclosure_index.candidates(tool)  # type: ignore[no-any-return]

    def all_rules(self) -> tuple[CompiledRule | CompiledDisclosureRule, ...]:
        """Call-phase, then response-phase, then visibility rules."""
        return (*self.rules, *self.disclosure_rules, *self.visibility_rules)

    def rule(self, rule_id: str) -> CompiledRule | CompiledDisclosureRule | None:
        return next((rule for rule in self.all_rules() if rule.id == rule_id), None)

    def cost_of(self, tool: str) -> int:
        if not self.tool_costs:
            return 1

        def build() -> int:
            return next((cost for pattern, cost in self.tool_costs if glob_match(tool, pattern)), 1)

        return self._cached("cost", tool, build)  # type: ignore[no-any-return]

    def annotations_for(self, tool: str, backend_annotations: dict[str, Any]) -> dict[str, Any]:
        """The policy's own classification wins over what the (untrusted) backend claims."""
        merged = dict(backend_annotations)
        if not self.tool_annotations:
            return merged
        for values in self._cached("annotations", tool, lambda: tuple(
                values for pattern, values in self.tool_annotations if glob_match(tool, pattern))):
            merged.update(values)
        return merged

    def elicitation_allowed(self, tier: str | None) -> bool:
        """Whether a caller of `tier` may release its own held call by answering the gateway's MCP
        elicitation (`approval.allow_elicitation`; off by default: the client may be the agent)."""
        allowed = self.approval_elicitation
        return allowed if isinstance(allowed, bool) else tier in allowed

    def grants_for(self, tier: CompiledTier, tool: str) -> tuple[CompiledGrant, ...]:
        """The grants of `tier` whose tool globs admit `tool` (their annotation conditions are left
        to check per call)."""
        return self._cached("grants", (tier.name, tool), lambda: tuple(  # type: ignore[no-any-return]
            g for g in tier.grants if not g.tools or any(glob_match(tool, p) for p in g.tools)))

    def rate_limits_for(self, tool: str) -> tuple[RateLimit, ...]:
        """The rate limits whose tool globs match `tool`, in the profile's order."""
        return self._cached("rate-limits", tool, lambda: tuple(  # type: ignore[no-any-return]
            limit for limit in self.rate_limits if any(glob_match(tool, g) for g in limit.tools)))

    def normalise_disclosure_mode(self, mode: str | None) -> str:
        """Known modes pass; anything unknown (or absent) is the most restrictive mode."""
        if mode in self.disclosure_modes:
            return mode  # type: ignore[return-value]
        return self.disclosure_modes[-1]


def _references(rules: tuple[Any, ...], fields: tuple[str, ...]) -> frozenset[str]:
    names: set[str] = set()
    for rule in rules:
        for name in fields:
            expr = getattr(rule, name, None)
            if expr is not None:
                names |= expr.references
    return frozenset(names)


# ---- compilation --------------------------------------------------------------------


_LEADING_GUARD = re.compile(r"\s*has\(\s*args\.([A-Za-z_][A-Za-z0-9_]*)\s*\)\s*&&")


def leading_guard(source: str | None) -> str | None:
    """The argument a condition of the form `has(args.x) && …` needs, if that is its whole shape.

    Such a condition is false whenever `x` is absent, so the rule can be skipped without calling
    the engine. Only conditions with no `||` and no `?` anywhere qualify (so the `&&` is surely
    the top-level operator).
    """
    if not source or "||" in source or "?" in source:
        return None
    match = _LEADING_GUARD.match(source)
    return match.group(1) if match else None


_CLASS_GUARD = re.compile(r"""\s*(?:"([a-z_]+)"|'([a-z_]+)')\s+in\s+call\.classes\s*&&""")
_CEL_STRING = re.compile(r"""[rR]?(?:"(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*')""")


def _code_only(source: str) -> str | None:
    """`source` with its string literals emptied, for the guard scans below to count brackets and
    find top-level operators in; None when that cannot be done exactly, and the condition is then
    evaluated as written: a backslash (a raw string's does not escape its quote) or a triple quote
    anywhere, or a `//` comment (it can hide a bracket or an operator) outside the strings.
    Without backslashes a literal ends at the next quote of its kind, so emptying them left to
    right reads them as the CEL lexer does; a quote inside a comment comes after its `//`."""
    if "\\" in source or '"""' in source or "'''" in source:
        return None
    code = _CEL_STRING.sub('""', source)
    return None if "//" in code else code


def class_guard(source: str | None) -> str | None:
    """The class a condition of the form `"X" in call.classes && …` needs, if that is its shape.

    Such a condition is false for a call without class X, so the rule is skipped without building
    the variables it reads (the session history is the costly one). Qualifies only when no `||`
    or `?` stands outside parentheses after the guard (so the `&&` is surely the top-level one),
    and the scan can read it (`_code_only`).
    """
    match = _CLASS_GUARD.match(source) if source else None
    rest = _code_only(source[match.end():]) if match else None  # the guard itself is plain code
    if match is None or rest is None:
        return None
    depth = 0
    for i, ch in enumerate(rest):
        depth += ch in "([{"
        depth -= ch in ")]}"
        if depth == 0 and (ch == "?" or rest.startswith("||", i)):
            return None
    return match.group(1) or match.group(2)


_EMPTY_GUARD = re.compile(r"\s*(findings|args_urls|response\s*\.\s*findings)\s*\.\s*exists\s*\(")


def empty_guard(source: str | None) -> tuple[str, ...] | None:
    """The list variable (`findings` or `response.findings`, as a path) that a condition of the
    form `… && findings.exists(…) && …` needs to be non-empty.

    `exists` over an empty list is false in both engines, and a false conjunct makes the whole
    `&&` chain false in both, whatever the others give (an error or a non-boolean included: CEL's
    `&&` is commutative), so the rule is skipped while that list is empty (most calls have no
    findings). Qualifies only when the condition is a chain of `&&` at the top level (no `||` or
    `?` outside parentheses) with one link exactly such an `exists(…)`, and the scan can read it
    (`_code_only`).
    """
    text = _code_only(source) if source else None
    if text is None:
        return None
    links: list[str] = []
    depth, start = 0, 0
    for i, ch in enumerate(text):
        depth += ch in "([{"
        depth -= ch in ")]}"
        if depth == 0:
            if ch == "?" or text.startswith("||", i):
                return None
            if text.startswith("&&", i):
                links.append(text[start:i])
                start = i + 2
    links.append(text[start:])
    for link in links:
        match = _EMPTY_GUARD.match(link)
        if match is None:
            continue
        depth = 1
        for end in range(match.end(), len(link)):
            depth += link[end] in "([{"
            depth -= link[end] in ")]}"
            if depth == 0:
                break
        else:
            continue
        if not link[end + 1:].strip():
            return tuple(part.strip() for part in match.group(1).split("."))
    return None


class _Compiler:
    def __init__(self, engine: str) -> None:
        self.engine = engine
        self.problems: list[PolicyProblem] = []
        self.warnings: list[PolicyProblem] = []

    def expr(
        self, source: str | None, declared: frozenset[str], doc: LoadedDocument, loc: tuple[Any, ...], rule_id: str
    ) -> cel.Expression | None:
        if source is None:
            return None
        line = doc.line_of(loc)
        try:
            return cel.compile_expression(source, declared=declared, engine=self.engine)
        except cel.CelUndeclared as exc:
            phase_hint = ""
            if "response" in exc.names and "response" not in declared:
                phase_hint = " (`response` exists only in the response phase: use a DisclosureRuleSet)"
            elif declared == VISIBILITY_VARIABLES:
                phase_hint = " (a rule with `effect: hide` decides per tool from `principal`, `tool` and `now` only)"
            self.problems.append(
                PolicyProblem(doc.path, line, rule_id, f"unknown variable {', '.join(exc.names)}{phase_hint}")
            )
        except cel.CelError as exc:
            where = f" at column {exc.column}" if exc.column else ""
            self.problems.append(
                PolicyProblem(doc.path, line + (exc.line or 1) - 1, rule_id, f"CEL syntax error{where}: {exc.message}")
            )
        return None

    def lint_guard(self, source: str | None, doc: LoadedDocument, loc: tuple[Any, ...], rule_id: str) -> None:
        """Warn about fields read without a `has()` guard: a missing field errors, which matches.

        Covers `args.x`, nested `args.a.b`, `args["x"]`, `principal.claims.x` and
        `tool.annotations.x` (maps whose keys the caller or the backend decides).
        """
        if not source:
            return
        for path in unguarded_reads(source):
            self.warnings.append(
                PolicyProblem(
                    doc.path,
                    doc.line_of(loc),
                    rule_id,
                    f"`{path}` is read without `has({path})`: calls without it will match by error",
                    severity="warning",
                )
            )

    def lint_bool(self, source: str | None, doc: LoadedDocument, loc: tuple[Any, ...], rule_id: str) -> None:
        """A `when` that cannot be a bool (a literal) is an error; one that may not be (a bare field) a warning."""
        kind = non_bool_condition(source)
        if kind is None:
            return
        problem = PolicyProblem(
            doc.path, doc.line_of(loc), rule_id,
            f"`when` is {kind}, which may not be true or false: compare it (e.g. `{(source or '').strip()} == true`); "
            "a non-bool result is an error, and an error in a deny rule matches",
            severity="error" if kind.startswith("a literal") else "warning",
        )
        (self.problems if problem.severity == "error" else self.warnings).append(problem)


_FIELD = r"(?:\.[A-Za-z_][A-Za-z0-9_]*|\[\s*(?:\"[^\"]*\"|'[^']*')\s*\])"
_READS = re.compile(r"(?<![\w.])(args|principal\.claims|tool\.annotations)(" + _FIELD + r"+)")
_STEP = re.compile(r"\.([A-Za-z_][A-Za-z0-9_]*)|\[\s*[\"']([^\"']*)[\"']\s*\]")
_HAS = re.compile(r"\bhas\(\s*([^()]*?)\s*\)")
_LITERAL = re.compile(r"""^\s*(?:-?\d+(?:\.\d+)?u?|"[^"]*"|'[^']*'|null|\[.*\]|\{.*\})\s*$""", re.S)
KNOWN_BOOLS = frozenset({"tool.changed", "tool.accepted", "response.is_error", "args_shell.present", "args_shell.unparsed"})
"""Fields the gateway itself fills with a bool: a bare one is a fine condition."""
_BARE = re.compile(r"^\s*[A-Za-z_][A-Za-z0-9_]*(?:" + _FIELD + r")+\s*$")


def _dotted(root: str, steps: str) -> str:
    return ".".join([root, *(a or b for a, b in _STEP.findall(steps))])


def unguarded_reads(source: str) -> list[str]:
    """Map fields (`args…`, `principal.claims…`, `tool.annotations…`) read with no `has()` of them (or of a deeper field)."""
    guarded = set()
    for inner in _HAS.findall(source):
        found = _READS.fullmatch(inner.strip())
        if found:
            guarded.add(_dotted(found.group(1), found.group(2)))
    unguarded = []
    for match in _READS.finditer(source):
        steps = _STEP.findall(match.group(2))
        if source[match.end():].lstrip().startswith("("):
            steps = steps[:-1]  # a method call on the field: the receiver is what is read
        root = match.group(1)
        for depth in range(1, len(steps) + 1):  # each level of a nested read must be there
            path = ".".join([root, *(a or b for a, b in steps[:depth])])
            if not any(g == path or g.startswith(path + ".") for g in guarded):
                unguarded.append(path)
                break
    return list(dict.fromkeys(unguarded))


def non_bool_condition(source: str | None) -> str | None:
    """What a condition statically is when it cannot or may not be a bool, else None."""
    if not source:
        return None
    text = source.strip()
    if text in ("true", "false") or text in KNOWN_BOOLS:
        return None
    if _LITERAL.match(text):
        return "a literal (" + text[:40] + ")"
    if _BARE.match(text):
        return f"a bare field ({text[:60]})"
    return None


def compile_documents(
    docs: list[LoadedDocument],
    *,
    engine: str | None = None,
    profile: ComposedProfile | None = None,
) -> CompiledPolicy:
    """Compile a (composed) profile, if any, and rule documents into a CompiledPolicy. Raises PolicyErrors."""
    chosen = engine or cel.default_engine()
    c = _Compiler(chosen)
    rules: list[CompiledRule] = []
    visibility: list[CompiledRule] = []
    disclosure: list[CompiledDisclosureRule] = []
    seen_ids: dict[str, str] = {}

    def claim_id(rule_id: str, doc: LoadedDocument, loc: tuple[Any, ...]) -> None:
        where = f"{doc.path}:{doc.line_of(loc)}"
        if rule_id in seen_ids:
            c.problems.append(
                PolicyProblem(doc.path, doc.line_of(loc), rule_id, f"duplicate rule id (first defined at {seen_ids[rule_id]})")
            )
        else:
            seen_ids[rule_id] = where

    for doc in docs:
        model = doc.model
        if isinstance(model, RuleSet):
            for i, r in enumerate(model.rules):
                loc = ("rules", i)
                claim_id(r.id, doc, loc)
                (visibility if r.effect is Effect.HIDE else rules).append(_compile_rule(c, r, doc, loc))
        elif isinstance(model, DisclosureRuleSet):
            for i, d in enumerate(model.rules):
                loc = ("rules", i)
                claim_id(d.id, doc, loc)
                disclosure.append(_compile_disclosure(c, d, model, doc, loc))
    compiled: dict[str, Any] = {}
    if profile is not None:
        compiled = _compile_profile(profile, c)
    if c.problems:
        raise PolicyErrors(c.problems)
    all_docs = [*reversed(profile.layers)] + docs if profile else docs
    version = hashlib.sha256(
        "\n".join(f"{d.path.rsplit('/', 1)[-1]}:{d.text_digest}" for d in all_docs).encode()
    ).hexdigest()
    return CompiledPolicy(
        name=profile.model.metadata.name if profile else "rules",
        version=f"sha256:{version[:32]}",
        engine=chosen,
        files=tuple(dict.fromkeys(d.path for d in all_docs)),
        rules=tuple(rules),
        disclosure_rules=tuple(disclosure),
        rule_index=GlobIndex([(r.tools, r) for r in rules]),
        disclosure_index=GlobIndex([(d.tools, d) for d in disclosure]),
        visibility_rules=tuple(visibility),
        visibility_index=GlobIndex([(r.tools, r) for r in visibility]),
        warnings=tuple(sorted(c.warnings)),
        **compiled,
    )


def _compile_rule(c: _Compiler, r: Rule, doc: LoadedDocument, loc: tuple[Any, ...]) -> CompiledRule:
    """One dharma (or visibility) rule: its CEL compiled against the variables its effect sees, linted."""
    declared = VISIBILITY_VARIABLES if r.effect is Effect.HIDE else CALL_VARIABLES
    when = c.expr(r.when, declared, doc, (*loc, "when"), r.id)
    msg = c.expr(r.message_expr, declared, doc, (*loc, "message_expr"), r.id)
    if r.effect in RESTRICTIVE:
        c.lint_guard(r.when, doc, (*loc, "when"), r.id)
    c.lint_bool(r.when, doc, (*loc, "when"), r.id)
    return CompiledRule(
        id=r.id,
        effect=r.effect,
        mode=r.mode,
        tools=tuple(r.tools),
        when=when,
        message=r.message,
        message_expr=msg,
        block_class=r.block_class,
        redact=tuple(r.redact),
        file=doc.path,
        line=doc.line_of(loc),
        guard=leading_guard(r.when),
        class_guard=class_guard(r.when),
        empty_guard=empty_guard(r.when),
    )


def _compile_disclosure(c: _Compiler, d: DisclosureRule, rule_set: DisclosureRuleSet, doc: LoadedDocument,
                        loc: tuple[Any, ...]) -> CompiledDisclosureRule:
    """One disclosure rule: its CEL compiled against the response variables."""
    return CompiledDisclosureRule(
        id=d.id,
        verdict=d.verdict,
        mode=d.mode,
        tools=tuple(d.tools),
        topic=d.topic,
        when=c.expr(d.when, RESPONSE_VARIABLES, doc, (*loc, "when"), d.id),
        redact=tuple(d.redact),
        redact_secrets=d.redact_secrets,
        no_information_response=rule_set.no_information_response,
        file=doc.path,
        line=doc.line_of(loc),
        empty_guard=empty_guard(d.when),
    )


def _compile_profile(profile: ComposedProfile, c: _Compiler) -> dict[str, Any]:
    """Everything the effective profile gives the CompiledPolicy (problems name the file each part came from)."""
    model = profile.model
    tier_specs = {t.name: (i, t) for i, t in enumerate(model.tiers)}
    tiers = _compile_tiers(profile, tier_specs, c)
    principals = _compile_principals(profile, tiers, c)
    ids = [r.id for r in model.rate_limits]
    for dup in {x for x in ids if ids.count(x) > 1}:
        c.problems.append(profile.problem(("rate_limits", ids.index(dup)), f"duplicate rate limit id {dup!r}"))
    c.problems.extend(_unadmittable_costs(profile))
    return {
        "principals": principals,
        "tiers": tiers,
        "sensitivity": _compile_sensitivity(profile, c),
        "tool_annotations": tuple(model.tool_annotations.items()),
        "rate_limits": tuple(model.rate_limits),
        "tool_costs": tuple(model.tool_costs.items()),
        "rate_limit_store_down": model.rate_limit_store_down,
        "sanitizer": model.sanitizer,
        "breaker_threshold": model.circuit_breaker.failure_threshold,
        "breaker_reset_seconds": model.circuit_breaker.reset_seconds,
        "approval_hold_seconds": model.approval.hold_seconds,
        "approval_expires_seconds": model.approval.expires_seconds,
        "approval_allow_self": model.approval.allow_self_approval,
        "approval_elicitation": _elicitation(profile, tiers, c),
        "backend_timeout_seconds": model.backend_timeout_seconds,
        "disclosure_modes": tuple(model.disclosure_modes),
        "egress": _egress(profile.layers, tier_specs, c),
    }


def _compile_tiers(profile: ComposedProfile, tier_specs: dict[str, tuple[int, Any]], c: _Compiler) -> dict[str, CompiledTier]:
    """Each tier with the grants of the tiers it inherits (by name, in the effective profile)."""
    tiers: dict[str, CompiledTier] = {}
    for name, (i, spec) in tier_specs.items():
        grants: list[CompiledGrant] = []
        chain: list[str] = []
        current: str | None = name
        while current is not None:
            if current in chain:
                c.problems.append(profile.problem(("tiers", i), f"tier {name!r}: inheritance cycle {' -> '.join([*chain, current])}"))
                break
            chain.append(current)
            found = tier_specs.get(current)
            if found is None:
                c.problems.append(profile.problem(("tiers", i, "inherits"), f"tier {name!r} inherits unknown tier {current!r}"))
                break
            grants.extend(
                CompiledGrant(tuple(g.tools), tuple(sorted(g.annotations.items()))) for g in found[1].grants
            )
            current = found[1].inherits
        tiers[name] = CompiledTier(name, tuple(grants), spec.max_sensitivity)
    return tiers


def _compile_principals(profile: ComposedProfile, tiers: dict[str, CompiledTier], c: _Compiler) -> tuple[CompiledPrincipal, ...]:
    """The principals in resolution order; an API key two of them hold is an error, a local user an
    earlier one claims too an error of `dharma check` (kept in the warnings, with severity error)."""
    principals: list[CompiledPrincipal] = []
    for i, p in enumerate(profile.model.principals):
        if p.tier not in tiers:
            c.problems.append(profile.problem(("principals", i, "tier"), f"principal {p.id!r} has unknown tier {p.tier!r}"))
        doc, loc = profile.at(("principals", i))
        principals.append(CompiledPrincipal(
            id=p.id, tier=p.tier, roles=tuple(p.roles), claims=dict(p.claims),
            key_digests=tuple(bytes.fromhex(d) for d in p.api_key_sha256), local_user=p.local_user,
            file=doc.path, line=doc.line_of(loc),
        ))
    found = tuple(principals)
    c.problems.extend(key_conflicts(found))
    c.warnings.extend(local_user_conflicts(found))
    return found


def _compile_sensitivity(profile: ComposedProfile, c: _Compiler) -> tuple[CompiledSensitivity, ...]:
    sensitivity: list[CompiledSensitivity] = []
    for i, s in enumerate(profile.model.sensitivity):
        escalations = []
        for j, e in enumerate(s.escalate):
            expr = c.expr(e.when, ESCALATION_VARIABLES, *profile.at(("sensitivity", i, "escalate", j, "when")), "")
            if expr is not None:
                escalations.append(CompiledEscalation(expr, e.to, e.message))
        sensitivity.append(CompiledSensitivity(tuple(s.tools), s.level, tuple(escalations)))
    return tuple(sensitivity)


def _egress(layers: Sequence[LoadedDocument], tier_specs: dict[str, tuple[int, Any]], c: _Compiler) -> dict[str, dict[str, list[str]]]:
    """The `egress` variable of each tier: the profile-wide lists of every profile of the chain,
    plus the lists they give the tier and each tier it inherits (a tier naming none of the
    profile's tiers is an error)."""
    wide: dict[str, list[str]] = {"allow": [], "deny": []}
    per_tier: dict[str, dict[str, list[str]]] = {}
    for layer in layers:
        assert isinstance(layer.model, Policy)
        settings = layer.model.egress
        for which in ("allow", "deny"):
            wide[which].extend(e for e in getattr(settings, which) if e not in wide[which])
        for name, lists in settings.tiers.items():
            if name not in tier_specs:
                c.problems.append(PolicyProblem(layer.path, layer.line_of(("egress", "tiers", name)), "",
                                                f"egress.tiers names unknown tier {name!r}"))
                continue
            mine = per_tier.setdefault(name, {"allow": [], "deny": []})
            for which in ("allow", "deny"):
                mine[which].extend(e for e in getattr(lists, which) if e not in mine[which])
    out = {"": wide}
    for name in tier_specs:
        lists = {"allow": list(wide["allow"]), "deny": list(wide["deny"])}
        current: str | None = name
        seen: set[str] = set()
        while current is not None and current not in seen and current in tier_specs:
            seen.add(current)
            for which in ("allow", "deny"):
                lists[which].extend(e for e in per_tier.get(current, {}).get(which, ()) if e not in lists[which])
            current = tier_specs[current][1].inherits
        out[name] = lists
    return out


def _elicitation(profile: ComposedProfile, tiers: dict[str, CompiledTier], c: _Compiler) -> bool | frozenset[str]:
    """`approval.allow_elicitation` compiled; an unknown tier is an error, and a tier it lets release
    its own held calls that can run destructive tools is a warning (the agent can answer forms)."""
    setting = profile.model.approval.allow_elicitation
    loc = ("approval", "allow_elicitation")
    if isinstance(setting, list):
        for name in (n for n in setting if n not in tiers):
            c.problems.append(profile.problem(loc, f"approval.allow_elicitation names unknown tier {name!r}"))
    named = sorted(tiers) if setting is True else setting if isinstance(setting, list) else []
    risky = destructive_tiers(tiers, named)
    if risky:
        which = ", ".join(f"{name!r} (grant {why})" for name, why in risky.items())
        tiers_word, these = ("tiers", "these tiers") if len(risky) > 1 else ("tier", "that tier")
        c.warnings.append(profile.problem(loc, (
            f"approval.allow_elicitation lets callers of {tiers_word} {which} release their own held calls by answering "
            f"the gateway's elicitation, and {these} can run destructive tools; an agent can answer forms on its own, so "
            "such a hold is no hold. Set it false (an approver or admin decides on /ui, the CLI or the HTTP API) or list "
            "only tiers without destructive tools"), severity="warning"))
    return frozenset(setting) if isinstance(setting, list) else setting


def _unadmittable_costs(profile: ComposedProfile) -> list[PolicyProblem]:
    """Tool costs above the burst of a rate limit that covers some tool of that cost.

    GCRA admits a call of cost c only when c <= burst, so such a call would be refused forever,
    each time with a `retry_after` that lies. Reported at the cost's line.
    """
    problems = []
    model = profile.model
    for i, limit in enumerate(model.rate_limits):
        for pattern, cost in model.tool_costs.items():
            if cost > limit.burst and any(globs_overlap(fold_glob(pattern), fold_glob(g)) for g in limit.tools):
                doc, loc = profile.at(("rate_limits", i))
                at = f"line {doc.line_of(loc)}" if doc is profile.at(("tool_costs", pattern))[0] else profile.where(("rate_limits", i))
                problems.append(profile.problem(
                    ("tool_costs", pattern),
                    f"tool cost {cost} for {pattern!r} is above the burst {limit.burst} of rate limit {limit.id!r} "
                    f"({at}), which covers it: such a call would never be admitted; "
                    f"raise that burst to at least {cost} or lower the cost", rule_id=limit.id))
    return problems


def read_profile(path: Path) -> LoadedDocument:
    """The one `kind: Policy` document of a profile file."""
    profiles = [d for d in read_documents(path) if isinstance(d.model, Policy)]
    if len(profiles) != 1:
        raise PolicyErrors([PolicyProblem(str(path), 1, "", "expected exactly one `kind: Policy` document")])
    return profiles[0]


def profile_chain(path: Path) -> list[LoadedDocument]:
    """The profile at `path` and the profiles it `extends`, nearest first (a missing base or a cycle
    is an error naming file:line). `compose.compose_profiles` merges them."""
    chain = [read_profile(path)]
    seen = {path.resolve()}
    while True:
        doc = chain[-1]
        assert isinstance(doc.model, Policy)
        ref = doc.model.extends
        if ref is None:
            return chain
        target = (Path(doc.path).parent / ref).resolve()
        if target in seen:
            raise PolicyErrors([PolicyProblem(doc.path, doc.line_of(("extends",)), "", f"`extends` cycle: {ref} is already in the chain")])
        if not target.is_file():
            raise PolicyErrors([PolicyProblem(doc.path, doc.line_of(("extends",)), "", f"extended profile not found: {ref}")])
        seen.add(target)
        chain.append(read_profile(target))


def compose_file(path: Path) -> ComposedProfile:
    """The effective profile of the file at `path` and the profiles it extends. Raises PolicyErrors."""
    problems: list[PolicyProblem] = []
    composed = compose_profiles(list(reversed(profile_chain(path))), problems)
    if problems:
        raise PolicyErrors(problems)
    return composed


def load_policy(
    path: Path, *, extra: list[Path] | None = None, engine: str | None = None, extra_docs: Sequence[LoadedDocument] = ()
) -> CompiledPolicy:
    """Load a profile (composed with the profiles it extends) and its effective rule sets (each
    relative to the profile file that names it), plus `extra` rule files and `extra_docs` (a file
    the profile already names is not added twice)."""
    composed = compose_file(path)
    docs: list[LoadedDocument] = []
    problems: list[PolicyProblem] = []
    for ref in composed.rule_sets:
        try:
            docs.extend(rule_documents_named(ref.referrer, "rule_sets", ref.index, ref.ref))
        except PolicyErrors as exc:
            problems.extend(exc.problems)
    if problems:
        raise PolicyErrors(problems)
    named = {d.path for d in docs}
    docs.extend(d for d in [*load_rule_documents(extra or []), *extra_docs] if d.path not in named)
    return compile_documents(docs, engine=engine, profile=composed)


RULE_KINDS = (RuleSet, DisclosureRuleSet)


def named_rule_documents(referrer: LoadedDocument, key: str, refs: Sequence[str]) -> list[LoadedDocument]:
    """The rule documents of the files `referrer` names under `key` (paths relative to it); see
    `rule_documents_named`. Every problem of every file is collected."""
    docs: list[LoadedDocument] = []
    problems: list[PolicyProblem] = []
    for i, ref in enumerate(refs):
        try:
            docs.extend(rule_documents_named(referrer, key, i, ref))
        except PolicyErrors as exc:
            problems.extend(exc.problems)
    if problems:
        raise PolicyErrors(problems)
    return docs


def rule_documents_named(referrer: LoadedDocument, key: str, index: int, ref: str) -> list[LoadedDocument]:
    """The rule documents of `ref`, item `index` of `referrer`'s `key` (a path relative to it).

    A named file that is missing, holds another kind (a profile, a RuleTest) or holds no rules is
    an error at the naming line, never zero rules loaded in silence. A named directory contributes
    the rule documents of its files (its RuleTest files are skipped, as they live beside the rules).
    """
    line = referrer.line_of((key, index))
    target = (Path(referrer.path).parent / ref).resolve()
    if target.is_dir():
        return load_rule_documents([target])
    if not target.is_file():
        raise PolicyErrors([PolicyProblem(referrer.path, line, "", f"rule set not found: {ref} (named in `{key}`)")])
    found = read_documents(target)
    problems = []
    for d in (d for d in found if not isinstance(d.model, RULE_KINDS)):
        hint = " (to test a whole profile, name it in `policy:`)" if isinstance(d.model, Policy) else ""
        problems.append(PolicyProblem(
            referrer.path, line, "",
            f"{key}: {ref} holds a `kind: {d.model.kind}` document at line {d.line_of(())}, not rules "
            f"(RuleSet or DisclosureRuleSet){hint}"))
    if not found:
        problems.append(PolicyProblem(referrer.path, line, "", f"{key}: {ref} holds no rules"))
    if problems:
        raise PolicyErrors(problems)
    return found


def load_rule_documents(paths: list[Path]) -> list[LoadedDocument]:
    """Read rule files (dirs expand to their YAML files), skipping RuleTest files; collect all problems."""
    docs: list[LoadedDocument] = []
    problems: list[PolicyProblem] = []
    for file in expand_paths(paths):
        try:
            docs.extend(d for d in read_documents(file) if not isinstance(d.model, (RuleTest, Policy)))
        except PolicyErrors as exc:
            problems.extend(exc.problems)
    if problems:
        raise PolicyErrors(problems)
    return docs
