"""Composing profiles (issue 25, deliver 1): a profile that `extends` another overrides and adds by
the merge rules of docs/policy.md "Composing profiles"; principals resolve nearest first; `dharma
check` errors on credentials two principals claim, `--explain-principals` and `dharma eval
--api-key/--local-user` show who a credential resolves to. Real YAML files in tmp dirs, the real CLI."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from gateway.core.call import Credentials, Sensitivity
from gateway.core.errors import PolicyErrors
from gateway.policy.compile import load_policy
from gateway.stages.authenticate import authenticate
from tests.conftest import REPO
from tests.test_cli import dharma

HEAD = "apiVersion: dharma/v1\nkind: RuleSet\nmetadata: {name: %s}\nrules:\n"
BASE = """\
apiVersion: dharma/v1
kind: Policy
metadata:
  name: base
principals:
  - {id: local, tier: operator, local_user: "*"}
  - {id: ci, tier: reader, api_key_sha256: %(ci)s}
tiers:
  - {name: reader, grants: [{tools: ["read_*"]}]}
  - {name: operator, inherits: reader, grants: [{tools: ["write_*"]}]}
sensitivity:
  - {tools: ["health_*"], level: RESTRICTED}
  - {tools: ["search*"], level: SENSITIVE}
tool_annotations: {"delete_*": {destructiveHint: true}}
tool_costs: {report: 2, export: 3}
rate_limits:
  - {id: per-principal, key: [principal], rate: 10, burst: 20}
  - {id: per-backend, key: [backend], rate: 100, burst: 200}
sanitizer: {max_bytes: 4096, max_depth: 8}
approval: {expires_seconds: 600, hold_seconds: 5}
backend_timeout_seconds: 12
rule_sets: [a.yaml, b.yaml]
"""
CHILD = """\
apiVersion: dharma/v1
kind: Policy
metadata: {name: site}
extends: base/base.yaml
principals:
  - {id: me, tier: admin, local_user: alice}
  - {id: local, tier: reader, local_user: "*"}
tiers:
  - {name: reader, grants: [{tools: ["read_*", "list_*"]}]}
  - {name: admin, grants: [{tools: ["*"]}]}
sensitivity:
  - {tools: ["search*"], level: STANDARD}
  - {tools: ["finance_*"], level: RESTRICTED}
tool_costs: {export: 5}
rate_limits:
  - {id: per-backend, key: [backend], rate: 50, burst: 60}
  - {id: mine, key: [tool], rate: 1, burst: 5}
sanitizer: {max_bytes: 2048}
approval: {allow_self_approval: true}
rule_sets: [base/b.yaml, c.yaml]
rule_sets_remove: [base/a.yaml]
"""
CI_KEY = "ci-secret-key"


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def write_chain(tmp_path: Path, child: str = CHILD) -> Path:
    """base/base.yaml (rule sets a, b) and site.yaml extending it (rule set c) in `tmp_path`."""
    base = tmp_path / "base"
    base.mkdir(exist_ok=True)
    (base / "base.yaml").write_text(BASE % {"ci": digest(CI_KEY)})
    for name in ("a", "b"):
        (base / f"{name}.yaml").write_text(HEAD % name + f"  - {{id: rule-{name}, effect: deny, tools: [{name}_tool]}}\n")
    (tmp_path / "c.yaml").write_text(HEAD % "c" + "  - {id: rule-c, effect: deny, tools: [c_tool]}\n")
    path = tmp_path / "site.yaml"
    path.write_text(child)
    return path


def test_a_child_overrides_by_name_and_appends_new_names(tmp_path: Path) -> None:
    site = load_policy(write_chain(tmp_path))
    assert site.name == "site"
    # tiers: reader replaced in place (operator, which inherits it, sees the new grants), admin appended
    assert list(site.tiers) == ["reader", "operator", "admin"]
    assert [g.tools for g in site.tiers["reader"].grants] == [("read_*", "list_*")]
    assert [g.tools for g in site.tiers["operator"].grants] == [("write_*",), ("read_*", "list_*")]
    # rate limits by id: per-backend replaced where it stood, mine appended
    assert [(r.id, r.rate) for r in site.rate_limits] == [("per-principal", 10), ("per-backend", 50), ("mine", 1)]
    # sensitivity by the set of globs: search* lowered in place, finance_* appended
    assert [(c.tools, c.level) for c in site.sensitivity] == [
        (("health_*",), Sensitivity.RESTRICTED), (("search*",), Sensitivity.STANDARD), (("finance_*",), Sensitivity.RESTRICTED)]
    # mappings key by key, the child's value winning; scalars the child does not write are the base's
    assert dict(site.tool_costs) == {"report": 2, "export": 5}
    assert dict(site.tool_annotations) == {"delete_*": {"destructiveHint": True}}
    assert (site.sanitizer.max_bytes, site.sanitizer.max_depth) == (2048, 8)
    assert (site.approval_allow_self, site.approval_expires_seconds, site.approval_hold_seconds) == (True, 600, 5)
    assert site.backend_timeout_seconds == 12
    # rule sets: the base's (minus a), then the child's; b named twice loads once
    assert [r.id for r in site.rules] == ["rule-b", "rule-c"]
    # principals: the child's first; its `local` replaced the base's (and took the child's place)
    assert [(p.id, p.tier) for p in site.principals] == [("me", "admin"), ("local", "reader"), ("ci", "reader")]
    assert site.principals[0].file == str(tmp_path / "site.yaml") and site.principals[0].line == 6
    assert (site.principals[2].file, site.principals[2].line) == (str(tmp_path / "base" / "base.yaml"), 7)


def test_first_match_prefers_the_nearest_profile(tmp_path: Path) -> None:
    site = load_policy(write_chain(tmp_path))
    assert authenticate(site, Credentials(local_user="alice")).id == "me"  # type: ignore[union-attr]
    assert authenticate(site, Credentials(local_user="bob")).id == "local"  # type: ignore[union-attr]
    assert authenticate(site, Credentials(api_key=CI_KEY)).id == "ci"  # type: ignore[union-attr]


def test_three_levels_compose_in_order(tmp_path: Path) -> None:
    write_chain(tmp_path)
    (tmp_path / "team.yaml").write_text(
        "apiVersion: dharma/v1\nkind: Policy\nmetadata: {name: team}\nextends: site.yaml\n"
        "principals:\n  - {id: me, tier: reader, local_user: alice}\n"
        "tiers:\n  - {name: admin, grants: [{tools: [\"admin_*\"]}]}\n"
        "rate_limits:\n  - {id: per-principal, key: [principal], rate: 3, burst: 6}\n"
        "sanitizer: {max_depth: 4}\nrule_sets_remove: [base/b.yaml]\n")
    team = load_policy(tmp_path / "team.yaml")
    assert [(p.id, p.tier) for p in team.principals] == [("me", "reader"), ("local", "reader"), ("ci", "reader")]
    assert [g.tools for g in team.tiers["admin"].grants] == [("admin_*",)]
    assert [(r.id, r.rate) for r in team.rate_limits] == [("per-principal", 3), ("per-backend", 50), ("mine", 1)]
    assert (team.sanitizer.max_bytes, team.sanitizer.max_depth) == (2048, 4)
    assert [r.id for r in team.rules] == ["rule-c"]
    assert {str(tmp_path / n) for n in ("team.yaml", "site.yaml", "base/base.yaml")} <= set(team.files)


def problems_of(path: Path) -> list[str]:
    with pytest.raises(PolicyErrors) as info:
        load_policy(path)
    return [str(p) for p in info.value.problems]


def test_errors_in_the_child_name_the_child_file_and_line(tmp_path: Path) -> None:
    child = CHILD.replace('  - {name: admin, grants: [{tools: ["*"]}]}\n',
                          '  - {name: admin, grants: [{tools: ["*"]}]}\n  - {name: ops, inherits: nobody}\n')
    child = child.replace('  - {tools: ["finance_*"], level: RESTRICTED}\n',
                          '  - {tools: ["finance_*"], level: RESTRICTED, escalate: [{when: "args.x ==", to: RESTRICTED}]}\n')
    child = child.replace("rule_sets_remove: [base/a.yaml]", "rule_sets_remove: [base/a.yaml, base/z.yaml]")
    found = problems_of(write_chain(tmp_path, child))
    site = str(tmp_path / "site.yaml")
    assert any(p.startswith(f"{site}:22: error: rule_sets_remove: base/z.yaml") and "not a rule set this profile inherits" in p
               for p in found), found
    (tmp_path / "site.yaml").write_text(child.replace(", base/z.yaml", ""))
    found = problems_of(tmp_path / "site.yaml")
    assert any(p.startswith(f"{site}:11: error: tier 'ops' inherits unknown tier 'nobody'") for p in found), found
    assert any(p.startswith(f"{site}:14: error: CEL syntax error") for p in found), found


def test_the_same_api_key_on_two_principals_does_not_load(tmp_path: Path) -> None:
    child = CHILD.replace("  - {id: me, tier: admin, local_user: alice}\n",
                          f"  - {{id: me, tier: admin, local_user: alice, api_key_sha256: {digest(CI_KEY)}}}\n")
    found = problems_of(write_chain(tmp_path, child))
    assert len(found) == 1, found
    assert found[0].startswith(f"{tmp_path / 'site.yaml'}:6: error: principals 'me' ({tmp_path / 'site.yaml'}:6) and 'ci' "
                               f"({tmp_path / 'base' / 'base.yaml'}:7) have the same API key (sha256 {digest(CI_KEY)[:12]}")
    assert CI_KEY not in found[0]


def test_check_errors_on_a_shadowed_local_user_and_explains_the_principals(tmp_path: Path) -> None:
    # The profile: `me` claims every local user, as the base's `local` does.
    child = CHILD.replace("local_user: alice", 'local_user: "*"').replace('  - {id: local, tier: reader, local_user: "*"}\n', "")
    child = child.replace("principals:\n", "principals:\n  - {id: bob, tier: reader, local_user: bob, api_key_sha256: %s}\n"
                          % digest("bob-key"), 1)
    path = write_chain(tmp_path, child)
    site, base = tmp_path / "site.yaml", tmp_path / "base" / "base.yaml"
    run = dharma("check", "--explain-principals", path, state_root=tmp_path / "state")
    assert run.rc == 1, run.out
    errors = [line for line in run.out.splitlines() if ": error: " in line]
    assert len(errors) == 1, run.out
    # 'me' ('*') shadows the base's local ('*'): reported at the child's line, naming both places
    assert errors[0].startswith(f"{site}:7: error: principals 'me' ({site}:7) and 'local' ({base}:6) both claim local user '*'")
    assert "give 'me' the id 'local' to replace the other" in errors[0]
    # bob comes before me, so it is not shadowed; nothing else is wrong
    assert "1 file(s) checked: 1 error(s), 0 warning(s)" in run.out
    explained = run.out[run.out.index("principals of profile 'site'"):].splitlines()[1:5]
    assert explained == [
        f"  1. bob  tier=reader roles=-  via api key sha256:{digest('bob-key')[:12]}…, local user 'bob', jwt sub='bob'  ({site}:6)",
        f"  2. me  tier=admin roles=-  via every local user, jwt sub='me'  ({site}:7)",
        f"  3. local  tier=operator roles=-  via every local user, jwt sub='local'  ({base}:6)  [local user shadowed by 'me']",
        f"  4. ci  tier=reader roles=-  via api key sha256:{digest(CI_KEY)[:12]}…, jwt sub='ci'  ({base}:7)",
    ], run.out
    assert "bob-key" not in run.out and CI_KEY not in run.out


def test_check_errors_on_a_specific_user_after_every_user(tmp_path: Path) -> None:
    (tmp_path / "p.yaml").write_text(
        "apiVersion: dharma/v1\nkind: Policy\nmetadata: {name: p}\n"
        "principals:\n  - {id: anyone, tier: t, local_user: \"*\"}\n  - {id: alice, tier: t, local_user: alice}\n"
        "tiers: [{name: t, grants: [{tools: [x]}]}]\n")
    run = dharma("check", tmp_path / "p.yaml", state_root=tmp_path / "state")
    assert run.rc == 1
    assert (f"{tmp_path / 'p.yaml'}:6: error: principal 'alice' ({tmp_path / 'p.yaml'}:6, local user 'alice') comes after "
            f"'anyone' ({tmp_path / 'p.yaml'}:5), which claims every local user ('*')") in run.out
    load_policy(tmp_path / "p.yaml")  # the gateway still loads it: resolution is first match, stated


def test_check_is_clean_when_the_child_replaces_the_inherited_principal_by_id(tmp_path: Path) -> None:
    child = CHILD.replace("local_user: alice", 'local_user: "*"').replace('  - {id: local, tier: reader, local_user: "*"}\n', "")
    path = write_chain(tmp_path, child.replace("id: me,", "id: local,"))
    run = dharma("check", path, state_root=tmp_path / "state")
    assert run.rc == 0, run.out
    assert "0 error(s)" in run.out


def test_eval_shows_whom_a_credential_resolves_to(tmp_path: Path) -> None:
    path = write_chain(tmp_path)
    state = tmp_path / "state"
    site, base = tmp_path / "site.yaml", tmp_path / "base" / "base.yaml"
    run = dharma("eval", "--policy", path, "--local-user", "alice", state_root=state)
    assert run.rc == 0, run.err
    assert run.out.strip() == f"local user 'alice' resolves to principal 'me': tier admin, roles -, via local user 'alice', jwt sub='me' ({site}:6)"
    run = dharma("eval", "--policy", path, "--local-user", "bob", "--tool", "read_x", "--json", state_root=state)
    report = json.loads(run.out)
    assert report["principal"]["id"] == "local" and report["granted"] is True
    keyed = dharma("eval", "--policy", path, "--api-key", CI_KEY, "--tool", "write_x", state_root=state)
    assert keyed.rc == 0, keyed.err
    assert keyed.out.splitlines()[0].startswith("the API key resolves to principal 'ci': tier reader, roles -, via api key sha256:")
    assert f"({base}:7)" in keyed.out and "granted to ci (tier reader): no" in keyed.out and CI_KEY not in keyed.out
    unknown = dharma("eval", "--policy", path, "--api-key", "nobody-key", state_root=state)
    assert unknown.rc == 2 and "the API key resolves to no principal" in unknown.err and "nobody-key" not in unknown.err
    both = dharma("eval", "--policy", path, "--principal", "me", "--local-user", "x", state_root=state)
    assert both.rc == 2 and "give one of --principal, --api-key and --local-user" in both.err
    bare = dharma("eval", "--policy", path, state_root=state)
    assert bare.rc == 2 and "name the call's --tool" in bare.err


def worked_example() -> str:
    """The profile of docs/policy.md's "Worked example", its base paths pointed at this checkout."""
    text = (REPO / "docs" / "policy.md").read_text()
    block = text[text.index("### Worked example"):].split("```yaml\n", 1)[1].split("```", 1)[0]
    return block.replace("/opt/dharma/", f"{REPO}/")


def test_the_worked_example_of_the_docs_composes_as_it_says(tmp_path: Path) -> None:
    (tmp_path / "my-rules.yaml").write_text(HEAD % "mine" + "  - {id: my-rule, effect: deny, tools: [nuke]}\n")
    path = tmp_path / "me.yaml"
    path.write_text(worked_example().replace("<hex>", digest("k")))
    me, standard = load_policy(path), load_policy(REPO / "policies" / "standard.yaml")
    assert [(p.id, p.tier, p.line) for p in me.principals] == [("local", "admin", 7), ("ci", "reader", 8)]
    assert list(me.tiers) == list(standard.tiers)
    assert "get-*" in me.tiers["operator"].grants[-1].tools  # operator inherits the replaced reader
    assert [(r.id, r.rate) for r in me.rate_limits] == [("per-principal-tool", 5), ("per-backend", 500), ("writes", 1)]
    assert me.approval_allow_self and me.approval_expires_seconds == standard.approval_expires_seconds
    ids = [r.id for r in me.rules]
    assert ids[-1] == "my-rule" and not any(i.startswith("seq-") for i in ids) and any(r.id.startswith("seq-") for r in standard.rules)
    run = dharma("check", "--explain-principals", path, state_root=tmp_path / "state")
    assert run.rc == 0 and f"  1. local  tier=admin roles=-  via every local user, jwt sub='local'  ({path}:7)" in run.out, run.out
    path.write_text(worked_example().replace("<hex>", digest("k")).replace("{id: local,", "{id: me,"))
    run = dharma("check", path, state_root=tmp_path / "state")
    assert run.rc == 1 and f"{path}:7: error: principals 'me' ({path}:7) and 'local' ({REPO}/policies/standard.yaml:11) both claim" in run.out


def test_the_readme_quickstart_profile_is_the_example_and_works(tmp_path: Path) -> None:
    readme = (REPO / "README.md").read_text()
    site, rules = REPO / "examples" / "site" / "site.yaml", REPO / "examples" / "site" / "no-prod.yaml"
    assert f"```yaml\n{site.read_text()}```" in readme and f"```yaml\n{rules.read_text()}```" in readme
    state = tmp_path / "state"
    run = dharma("check", "--explain-principals", REPO / "examples" / "site", state_root=state)
    assert run.rc == 0 and "0 error(s), 0 warning(s)" in run.out, run.out
    assert [line.split()[1] for line in run.out.splitlines() if line[:4].strip().rstrip(".").isdigit()] == ["ci-bot", "alice", "local"]
    run = dharma("eval", "--policy", site, "--api-key", "example-alice-key", state_root=state)
    assert run.out.startswith("the API key resolves to principal 'alice': tier admin, roles admin,approver"), run.out
    run = dharma("eval", "--policy", site, "--principal", "ci-bot", "--tool", "write_file", "--args", '{"path": "prod/app.conf"}', "--json",
                 state_root=state)
    report = json.loads(run.out)
    assert report["pipeline"]["error_code"] == "policy_blocked" and report["matched"] == ["site-no-prod-writes"]
    assert [r.id for r in load_policy(site).rate_limits][-1] == "ci-bot-writes"


def test_principals_remove_drops_an_inherited_principal_and_refuses_an_unknown_one(tmp_path: Path) -> None:
    child = CHILD.replace('  - {id: local, tier: reader, local_user: "*"}\n', "") + "principals_remove: [local]\n"
    site = load_policy(write_chain(tmp_path, child))
    assert [p.id for p in site.principals] == ["me", "ci"]
    assert authenticate(site, Credentials(local_user="bob")) is None  # nobody claims every local user any more
    (tmp_path / "site.yaml").write_text(child.replace("principals_remove: [local]", "principals_remove: [me, nobody]"))
    found = problems_of(tmp_path / "site.yaml")
    site_file = tmp_path / "site.yaml"
    assert [p.split(" (inherited")[0] for p in found] == [
        f"{site_file}:21: error: principals_remove: 'me' is not a principal this profile inherits",
        f"{site_file}:21: error: principals_remove: 'nobody' is not a principal this profile inherits"], found


@pytest.mark.parametrize("key", ["extends", "rule_sets", "rule_sets_remove"])
def test_a_nul_in_a_profile_path_is_an_error_at_its_line(tmp_path: Path, key: str) -> None:
    value = '"a\\0b"' if key == "extends" else '["a\\0b"]'
    path = tmp_path / "p.yaml"
    path.write_text(f"apiVersion: dharma/v1\nkind: Policy\nmetadata: {{name: p}}\n{key}: {value}\n")
    assert problems_of(path) == [f"{path}:4: error: {key}: Value error, a file path may not hold a NUL character"]
