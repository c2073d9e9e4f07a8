"""Policy files that do not load: every problem names file, line and rule id; nothing half-loads."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from gateway.core.errors import PolicyErrors
from gateway.policy.compile import compile_documents, load_policy, load_rule_documents
from gateway.policy.load import parse_documents

HEAD = "apiVersion: dharma/v1\nkind: RuleSet\nmetadata: {name: t}\nrules:\n"


def problems_of(text: str, tmp_path: Path) -> list[str]:
    path = tmp_path / "rules.yaml"
    path.write_text(textwrap.dedent(text))
    with pytest.raises(PolicyErrors) as info:
        compile_documents(load_rule_documents([path]))
    return [str(p) for p in info.value.problems]


@pytest.mark.parametrize(
    "body, line, needle",
    [
        ("  - id: a\n    effect: deny\n    when: 'args.x == \"'\n", 7, "CEL syntax error"),
        ("  - id: a\n    effect: deny\n    when: 'argz.path == \"x\"'\n", 7, "unknown variable argz"),
        ("  - id: a\n    effect: deny\n    when: 'response.text == \"x\"'\n", 7, "only in the response phase"),
        ("  - id: a\n    effect: obliterate\n", 6, "effect"),
        ("  - id: a\n    effect: deny\n    colour: red\n", 7, "unknown key 'colour'"),
        ("  - id: a\n    effect: deny\n  - id: a\n    effect: warn\n", 7, "duplicate rule id"),
        ("  - id: a\n    effect: deny\n    effect: allow\n", 7, "duplicate key 'effect'"),
        ("  - id: a\n    effect: deny\n    mode: shadow\n", 7, "mode"),
        ("  - id: a\n    effect: deny\n    when: 'args.path.startswith(\"/\")'\n", 7, "startswith"),
    ],
)
def test_rule_errors_name_file_line_and_rule(tmp_path, body, line, needle):
    found = problems_of(HEAD + body, tmp_path)
    assert any(needle in p for p in found), found
    hit = next(p for p in found if needle in p)
    assert f"rules.yaml:{line}:" in hit
    assert "[a]" in hit


def test_malformed_yaml_names_the_line(tmp_path):
    found = problems_of(HEAD + "  - id: a\n    effect: [deny\n", tmp_path)
    assert len(found) == 1 and "malformed YAML" in found[0] and "rules.yaml:" in found[0]


def test_unknown_kind_and_wrong_api_version(tmp_path):
    found = problems_of("apiVersion: dharma/v1\nkind: Rulez\nmetadata: {name: t}\n", tmp_path)
    assert "unknown kind 'Rulez'" in found[0] and ":2:" in found[0]
    found = problems_of("apiVersion: dharma/v2\nkind: RuleSet\nmetadata: {name: t}\n", tmp_path)
    assert "apiVersion" in found[0] and ":1:" in found[0]


def test_every_problem_is_reported_at_once(tmp_path):
    body = (
        "  - id: a\n    effect: deny\n    when: 'nope == 1'\n"
        "  - id: b\n    effect: deny\n    when: '(('\n"
        "  - id: a\n    effect: warn\n"
    )
    found = problems_of(HEAD + body, tmp_path)
    assert len(found) == 3
    assert [p.split(":")[1] for p in found] == ["7", "10", "11"]


def test_not_a_mapping_and_not_utf8(tmp_path):
    assert "must be a YAML mapping" in problems_of("- just\n- a list\n", tmp_path)[0]
    path = tmp_path / "bad.yaml"
    path.write_bytes(b"apiVersion: dharma/v1\nkind: RuleSet\nmetadata: {name: \xff}\n")
    with pytest.raises(PolicyErrors) as info:
        load_rule_documents([path])
    assert "not UTF-8" in str(info.value)


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(PolicyErrors) as info:
        load_rule_documents([tmp_path / "absent.yaml"])
    assert "cannot read" in str(info.value)


def test_profile_errors(tmp_path):
    (tmp_path / "p.yaml").write_text(
        textwrap.dedent(
            """\
            apiVersion: dharma/v1
            kind: Policy
            metadata: {name: p}
            principals:
              - {id: x, tier: ghost}
            tiers:
              - {name: a, inherits: b}
              - {name: b, inherits: a}
            sensitivity:
              - tools: ["s*"]
                level: SENSITIVE
                escalate:
                  - {when: 'response.x', to: RESTRICTED}
            rule_sets: [missing.yaml]
            """
        )
    )
    with pytest.raises(PolicyErrors) as info:
        load_policy(tmp_path / "p.yaml")
    assert "rule set not found: missing.yaml" in str(info.value)
    (tmp_path / "p.yaml").write_text((tmp_path / "p.yaml").read_text().replace("rule_sets: [missing.yaml]\n", ""))
    with pytest.raises(PolicyErrors) as info:
        load_policy(tmp_path / "p.yaml")
    text = str(info.value)
    assert "unknown tier 'ghost'" in text and "inheritance cycle" in text and "unknown variable response" in text


def test_api_key_digest_shape_is_checked(tmp_path):
    docs = "apiVersion: dharma/v1\nkind: Policy\nmetadata: {name: p}\nprincipals:\n  - {id: x, tier: t, api_key_sha256: plaintext-key}\n"
    with pytest.raises(PolicyErrors) as info:
        parse_documents(docs, "p.yaml")
    assert "p.yaml:5:" in str(info.value) and "64 lower-case hex" in str(info.value)


def test_unguarded_optional_field_is_a_warning_not_an_error(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text(HEAD + "  - id: a\n    effect: deny\n    when: 'args.path.contains(\"..\")'\n  - id: b\n    effect: deny\n    when: 'has(args.path) && args.path == \"x\"'\n")
    policy = compile_documents(load_rule_documents([path]))
    assert [w.rule_id for w in policy.warnings] == ["a"]
    assert "has(args.path)" in policy.warnings[0].message


def test_policy_version_changes_with_content(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text(HEAD + "  - id: a\n    effect: deny\n")
    first = compile_documents(load_rule_documents([path])).version
    assert compile_documents(load_rule_documents([path])).version == first
    path.write_text(HEAD + "  - id: a\n    effect: warn\n")
    assert compile_documents(load_rule_documents([path])).version != first


def test_rules_are_indexed_by_tool_glob(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text(
        HEAD
        + "  - {id: exact, effect: deny, tools: [read_file]}\n"
        + "  - {id: glob, effect: deny, tools: ['read_*']}\n"
        + "  - {id: other, effect: deny, tools: ['write_*', 'shell']}\n"
        + "  - {id: everything, effect: warn}\n"
    )
    policy = compile_documents(load_rule_documents([path]))
    assert [r.id for r in policy.rules_for("read_file")] == ["exact", "glob", "everything"]
    assert [r.id for r in policy.rules_for("shell")] == ["other", "everything"]
    # Tool names match on folded spellings (gateway.policy.names): case and separators are one style.
    for spelling in ("READ_FILE", "readFile", "read-file", "read.file"):
        assert [r.id for r in policy.rules_for(spelling)] == ["exact", "glob", "everything"], spelling
    assert [r.id for r in policy.rules_for("reader_file")] == ["everything"]


def test_guard_skip_never_changes_a_decision(tmp_path):
    """Skipping `has(args.x) && …` rules when x is absent gives the same matches as evaluating them."""
    import itertools

    from gateway.policy import cel
    from gateway.policy.evaluate import evaluate_rules

    path = tmp_path / "r.yaml"
    path.write_text(
        HEAD
        + "  - {id: g1, effect: deny, when: 'has(args.path) && args.path.contains(\"..\")'}\n"
        + "  - {id: g2, effect: warn, when: 'has(args.cmd) && size(args.cmd) > 3'}\n"
        + "  - {id: g3, effect: deny, when: 'has(args.n) && args.n > 2 || has(args.path)'}\n"
        + "  - {id: g4, effect: deny, when: 'has(args.n) && args.missing == 1'}\n"
    )
    policy = compile_documents(load_rule_documents([path]))
    assert [r.guard for r in policy.rules] == ["path", "cmd", None, "n"]
    values = {"path": ["../x", "ok"], "cmd": ["rm -rf", "ls"], "n": [1, 5]}
    for present in itertools.product([False, True], repeat=3):
        for picks in itertools.product(*values.values()):
            args = {k: v for (k, v), keep in zip(zip(values, picks), present) if keep}
            activation = cel.make_activation({"args": args}, policy.engine)
            full = [m.rule_id for m in evaluate_rules(policy, "t", activation)]
            skipped = [m.rule_id for m in evaluate_rules(policy, "t", activation, arguments=args)]
            assert skipped == full, args


def test_leading_guard_only_for_plain_conjunctions():
    from gateway.policy.compile import leading_guard

    assert leading_guard('has(args.path) && args.path.contains("..")') == "path"
    assert leading_guard("has(args.a) && x || y") is None
    assert leading_guard("has(args.a) ? x : y") is None
    assert leading_guard("args.a && has(args.b)") is None


# ---- `extends`: a profile that adds principals (credentials) to another --------------------

BASE_PROFILE = """\
apiVersion: dharma/v1
kind: Policy
metadata: {name: base}
principals:
  - {id: local, tier: reader, local_user: "*"}
tiers:
  - {name: reader, grants: [{tools: ["read_*"]}]}
rule_sets: [rules.yaml]
"""


def write_pair(tmp_path: Path, extending: str) -> Path:
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "base.yaml").write_text(BASE_PROFILE)
    (tmp_path / "base" / "rules.yaml").write_text(HEAD + "  - {id: no-x, effect: deny, tools: [read_x]}\n")
    path = tmp_path / "mine.yaml"
    path.write_text("apiVersion: dharma/v1\nkind: Policy\nmetadata: {name: mine}\nextends: base/base.yaml\n" + extending)
    return path


def test_an_extending_profile_adds_principals_and_keeps_everything_else(tmp_path):
    digest = "ab" * 32
    mine = load_policy(write_pair(tmp_path, f"principals:\n  - {{id: bot, tier: reader, api_key_sha256: {digest}}}\n"))
    base = load_policy(tmp_path / "base" / "base.yaml")
    assert mine.name == "mine"
    assert [(p.id, p.key_digests) for p in mine.principals] == [("bot", (bytes.fromhex(digest),)), ("local", ())]  # nearest first
    assert [r.id for r in mine.rules] == [r.id for r in base.rules] == ["no-x"]  # rule sets resolve next to the base
    assert mine.tiers == base.tiers
    assert mine.version != base.version and str(tmp_path / "base" / "base.yaml") in mine.files
    (tmp_path / "base" / "base.yaml").write_text(BASE_PROFILE.replace('"read_*"', '"read_*", "list_*"'))
    assert load_policy(tmp_path / "mine.yaml").version != mine.version  # a change to the base is a new version


@pytest.mark.parametrize(
    "extending, line, needle",
    [
        ("tiers: [{name: a}, {name: a}]\n", 5, "tier 'a' is defined twice in this profile (first at line 5)"),
        ("principals:\n  - {id: x, tier: reader}\n  - {id: x, tier: reader}\n", 7, "principal 'x' is defined twice in this profile (first at line 6)"),
        ("principals:\n  - {id: bot, tier: writer}\n", 6, "principal 'bot' has unknown tier 'writer'"),
        ("rule_sets_remove: [rules.yaml]\n", 5, "rule_sets_remove: rules.yaml"),
    ],
)
def test_extending_profile_errors_name_file_and_line(tmp_path, extending, line, needle):
    path = write_pair(tmp_path, extending)
    with pytest.raises(PolicyErrors) as info:
        load_policy(path)
    assert any(p.file == str(path) and p.line == line and needle in p.message for p in info.value.problems), info.value.problems


def test_extends_to_a_missing_profile_or_a_cycle_is_an_error(tmp_path):
    path = tmp_path / "a.yaml"
    path.write_text("apiVersion: dharma/v1\nkind: Policy\nmetadata: {name: a}\nextends: b.yaml\n")
    with pytest.raises(PolicyErrors, match="extended profile not found: b.yaml") as info:
        load_policy(path)
    assert info.value.problems[0].line == 4
    (tmp_path / "b.yaml").write_text("apiVersion: dharma/v1\nkind: Policy\nmetadata: {name: b}\nextends: a.yaml\n")
    with pytest.raises(PolicyErrors, match="`extends` cycle: a.yaml is already in the chain"):
        load_policy(path)


COSTLY_PROFILE = """\
apiVersion: dharma/v1
kind: Policy
metadata: {name: p}
rate_limits:
  - {id: searches, key: [principal], tools: ["search*"], rate: 1, per_seconds: 1, burst: 3}
  - {id: everything, key: [principal], rate: 10, burst: 20}
tool_costs:
  search_fast: 3
  search_deep: 5
  report: 9
  "*_export": 25
"""


def test_tool_cost_above_a_covering_burst_is_rejected_with_file_line(tmp_path):
    # GCRA never admits a call whose cost exceeds the burst: such a cost must not load.
    (tmp_path / "p.yaml").write_text(COSTLY_PROFILE)
    with pytest.raises(PolicyErrors) as info:
        load_policy(tmp_path / "p.yaml")
    found = [str(p) for p in info.value.problems]
    assert len(found) == 3, found
    deep, report, export = found
    assert deep.startswith(f"{tmp_path / 'p.yaml'}:9: [searches] error:") and "'search_deep'" in deep
    assert "burst 3" in deep and "(line 5)" in deep and "never be admitted" in deep
    # search_fast (3) fits the burst; report (9) is outside `searches` and within `everything`'s.
    # `*_export` (25) is above both bursts, and `search*` covers e.g. search_export.
    assert report.startswith(f"{tmp_path / 'p.yaml'}:11: [everything] error:") and "'*_export'" in report
    assert export.startswith(f"{tmp_path / 'p.yaml'}:11: [searches] error:") and "'*_export'" in export
    fixed = COSTLY_PROFILE.replace("search_deep: 5", "search_deep: 3").replace('"*_export": 25', '"*_export": 2')
    (tmp_path / "p.yaml").write_text(fixed)
    policy = load_policy(tmp_path / "p.yaml")
    assert policy.cost_of("search_deep") == 3 and policy.cost_of("report") == 9


def test_negative_tool_cost_is_rejected(tmp_path):
    docs = COSTLY_PROFILE.replace("report: 9", "report: -1")
    with pytest.raises(PolicyErrors) as info:
        parse_documents(docs, "p.yaml")
    assert "p.yaml:10:" in str(info.value) and "greater than or equal to 0" in str(info.value)


@pytest.mark.parametrize(
    "a, b, overlap",
    [
        ("*", "anything", True),
        ("search*", "search_deep", True),
        ("search*", "*_export", True),  # e.g. search_export
        ("search_*", "report", False),
        ("read_?", "read_ab", False),
        ("read_[a-c]", "read_[!abc]", False),
        ("read_[a-c]", "read_[!ab]", True),
        ("read_[!x]", "read_[!y]", True),
        ("a*b", "*c", False),
        ("a*b*c", "*b*", True),
        ("x[", "x[", True),  # an unclosed bracket is a literal
        ("", "*", True),
        ("", "?", False),
    ],
)
def test_globs_overlap(a, b, overlap):
    import fnmatch

    from gateway.policy.globs import globs_overlap

    assert globs_overlap(a, b) is overlap and globs_overlap(b, a) is overlap
    if not any(ch in a for ch in "*?["):  # a plain name: the answer is fnmatch's
        assert overlap is fnmatch.fnmatchcase(a, b)
