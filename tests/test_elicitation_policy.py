"""`approval.allow_elicitation`: off in the compiled default and, explicitly, in every shipped
profile (the MCP client that would answer the gateway's form may be the agent itself); a profile
opts in with `true` or a list of tiers; `dharma check` warns where it is on for a tier that can run
destructive tools (own or inherited grants, by tool-name globs or annotation conditions)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.policy.compile import load_policy
from gateway.policy.destructive import glob_may_name_destructive
from gateway.policy.models import ApprovalSettings
from tests.conftest import REPO
from tests.test_cli import dharma

SHIPPED = sorted((REPO / "policies").glob("*.yaml"))
TIERS: list[dict[str, Any]] = [
    {"name": "reader", "grants": [{"tools": ["read_*", "list_*", "get_*", "search*"]}]},
    {"name": "operator", "inherits": "reader", "grants": [{"tools": ["delete_*"]}]},
    {"name": "heir", "inherits": "operator"},  # no grant of its own: runs delete_* by inheritance
    {"name": "annotated", "grants": [{"annotations": {"readOnlyHint": True}}]},
    {"name": "flagged", "grants": [{"annotations": {"destructiveHint": True}}]},
    {"name": "everything", "grants": [{"tools": ["*"]}]},
]


def _profile(tmp_path: Path, allow: Any) -> Path:
    doc = {"apiVersion": "dharma/v1", "kind": "Policy", "metadata": {"name": "elicit"},
           "principals": [{"id": "local", "local_user": "*", "tier": "reader"}], "tiers": TIERS,
           "approval": {"hold_seconds": 0, "allow_elicitation": allow}}
    path = tmp_path / f"profile-{len(list(tmp_path.glob('profile-*')))}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return path


def test_elicitation_is_off_in_the_compiled_default_and_explicitly_in_every_shipped_profile(tmp_path: Path) -> None:
    assert ApprovalSettings().allow_elicitation is False
    doc = yaml.safe_load(_profile(tmp_path, False).read_text())
    del doc["approval"]
    bare = tmp_path / "bare.yaml"
    bare.write_text(yaml.safe_dump(doc), encoding="utf-8")
    assert not load_policy(bare).elicitation_allowed("reader")
    assert [p.name for p in SHIPPED] == ["permissive.yaml", "standard.yaml", "strict.yaml"]
    for path in SHIPPED:
        assert yaml.safe_load(path.read_text())["approval"]["allow_elicitation"] is False, path
        policy = load_policy(path)
        assert not any(policy.elicitation_allowed(tier) for tier in [*policy.tiers, None]), path


def test_true_allows_every_tier_and_a_list_only_its_own(tmp_path: Path) -> None:
    everyone = load_policy(_profile(tmp_path, True))
    assert all(everyone.elicitation_allowed(t) for t in ["reader", "operator", None])
    listed = load_policy(_profile(tmp_path, ["reader"]))
    assert listed.elicitation_allowed("reader")
    assert not listed.elicitation_allowed("operator") and not listed.elicitation_allowed(None)


@pytest.mark.parametrize(("pattern", "destructive"), [
    ("*", True), ("delete_*", True), ("*_delete", True), ("write_file", True), ("run_command", True), ("move_*", True),
    ("patient_*", True), ("shell*", True),
    ("read_*", False), ("get_*", False), ("search*", False), ("fs_read_*", False), ("read_file", False), ("echo", False),
])
def test_which_globs_may_name_a_destructive_tool(pattern: str, destructive: bool) -> None:
    assert glob_may_name_destructive(pattern) is destructive


def test_check_warns_where_elicitation_is_on_for_a_tier_that_can_run_destructive_tools(tmp_path: Path, state_root: Path) -> None:
    cases = {
        "true": True,
        "read-only": ["reader", "annotated"],
        "inherited": ["reader", "heir"],
        "flagged": ["flagged"],
        "unknown": ["reader", "nosuch"],
        "off": False,
    }
    paths = {name: _profile(tmp_path, allow) for name, allow in cases.items()}
    runs = {name: dharma("check", path, state_root=state_root) for name, path in paths.items()}
    every = runs["true"]
    assert every.rc == 0 and "0 error(s), 1 warning(s)" in every.out, every.out + every.err
    [warning] = [line for line in every.out.splitlines() if "warning:" in line]
    setting = next(n for n, text in enumerate(paths["true"].read_text().splitlines(), 1) if "allow_elicitation" in text)
    assert warning.startswith(f"{paths['true']}:{setting}: warning: approval.allow_elicitation lets callers of tiers ")
    assert "'operator' (grant 'delete_*')" in warning and "'everything' (grant '*')" in warning
    assert "'heir' (grant 'delete_*')" in warning and "'flagged' (grant annotations destructiveHint: true)" in warning
    assert "'reader'" not in warning and "'annotated'" not in warning
    assert runs["read-only"].rc == 0 and "0 error(s), 0 warning(s)" in runs["read-only"].out
    inherited = runs["inherited"].out
    assert runs["inherited"].rc == 0 and "tier 'heir' (grant 'delete_*')" in inherited and "that tier can run destructive tools" in inherited
    assert runs["flagged"].rc == 0 and "tier 'flagged'" in runs["flagged"].out
    assert runs["unknown"].rc == 1 and "approval.allow_elicitation names unknown tier 'nosuch'" in runs["unknown"].out
    assert runs["off"].rc == 0 and "0 error(s), 0 warning(s)" in runs["off"].out
