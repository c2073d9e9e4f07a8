"""Tool names fold to one spelling for globs (gateway.policy.names, docs/policy.md "Tool names"):
every style a real server uses meets the policy's snake_case globs, near misses stay apart, and a
catalog whose names fold to one is found."""

from __future__ import annotations

import pytest

from gateway.policy import cel
from gateway.policy.names import collisions, fold_glob, fold_name, name_matches


@pytest.mark.parametrize("name", ["get-tiny-image", "getTinyImage", "get.tiny.image", "GET_TINY_IMAGE", "get__tiny-image",
                                  "GetTinyImage"])
def test_every_style_folds_to_one_name(name: str) -> None:
    assert fold_name(name) == "get_tiny_image"


@pytest.mark.parametrize(("name", "folded"), [("HTTPRequest", "http_request"), ("listS3Buckets", "list_s3_buckets"),
                                              ("cloud.compute.listInstances", "cloud_compute_list_instances"),
                                              ("_private", "_private")])
def test_acronyms_digits_and_dots(name: str, folded: str) -> None:
    assert fold_name(name) == folded


@pytest.mark.parametrize(("pattern", "folded"), [("read-*", "read_*"), ("*Image", "*image"), ("[A-Z]*", "[a-z]*"),
                                                 ("[!a-c]x", "[!a-c]x"), ("a[", "a["), ("get?sum", "get?sum")])
def test_globs_fold_their_literals_and_keep_their_sets(pattern: str, folded: str) -> None:
    assert fold_glob(pattern) == folded


@pytest.mark.parametrize(("name", "pattern", "hit"), [
    ("get-sum", "get_*", True), ("getSum", "get_*", True), ("searchIssues", "search*", True),
    ("deleteRepo", "delete_*", True), ("getaway_booking", "get_*", False), ("getawayBooking", "get_*", False),
    ("reader-stats", "read_*", False), ("run-command", "run_command", True), ("runCommands", "run_command", False),
])
def test_name_matches(name: str, pattern: str, hit: bool) -> None:
    assert name_matches(name, pattern) is hit


def test_collisions_pair_each_clashing_name_with_another() -> None:
    found = collisions(["get_sum", "get-sum", "getSum", "echo", "Echo_2", "echo-2", "echo2"])
    assert set(found) == {"get_sum", "get-sum", "getSum", "Echo_2", "echo-2"}
    assert all(fold_name(a) == fold_name(b) and a != b for a, b in found.items())
    assert collisions(["get-sum", "get-tiny-image", "echo"]) == {}


@pytest.mark.parametrize("engine", cel.available_engines())
def test_cel_tool_glob_on_every_engine(engine: str) -> None:
    expr = cel.compile_expression('tool_glob(tool.name, "get_*") && !tool_glob(tool.name, "getaway*")', declared=["tool"],
                                  engine=engine)
    for name, want in [("get-sum", True), ("getTinyImage", True), ("getawayBooking", False), ("list-x", False)]:
        activation = cel.make_activation({"tool": {"name": name}}, engine)
        assert expr.evaluate(activation) is want and expr.evaluate_engine(activation) is want, (engine, name)
