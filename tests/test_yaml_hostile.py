"""Hostile YAML for the policy and config loaders (issue 12): each case crashed or hung a loader
before (found by tests/fuzz), and is now an error naming file:line."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from gateway.config import env_layer, load_settings
from gateway.core.errors import ConfigError, PolicyErrors
from gateway.policy.compile import load_policy

CASES = [
    # (text, line, words)
    ("apiVersion: dharma/v1\nkind: Policy\nx: &a [*a]\n", 3, "alias refers to a node that contains it"),
    ("apiVersion: dharma/v1\nmetadata: &m {name: *m}\n", 2, "alias refers to a node that contains it"),
    ("a: 1\nb: " + "[" * 6000 + "\n", 2, "nest deeper than 64 levels"),  # RecursionError, and seconds of scanning
    ("a: 1\nb: " + "{c: " * 3000 + "\n", 2, "nest deeper than 64 levels"),
    ("- " * 3000 + "x\n", 1, "nested too deeply to read"),
    ("a: 1\nb: 2\nc: \x1f\n", 3, "character U+001F is not allowed"),  # reader errors had no line
    ('a: 1\nb: "\\ud800"\n', 2, "lone surrogate"),
]


@pytest.mark.parametrize("text, line, words", CASES)
def test_policy_loader_names_file_and_line(tmp_path: Path, text: str, line: int, words: str) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(text, encoding="utf-8")
    started = time.monotonic()
    with pytest.raises(PolicyErrors) as caught:
        load_policy(path)
    assert time.monotonic() - started < 5
    assert f"{path}:{line}:" in str(caught.value) and words in str(caught.value), str(caught.value)


@pytest.mark.parametrize("text, line, words", CASES[2:])
def test_config_loader_names_file_and_line(tmp_path: Path, text: str, line: int, words: str) -> None:
    path = tmp_path / "dharma.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        load_settings(path, env={})
    assert str(caught.value).startswith(f"{path}:{line}: ") and words in str(caught.value), str(caught.value)


@pytest.mark.parametrize("text, where", [
    ('server:\n  host: x\n  port: 99999\n', ":3: invalid configuration: server.port"),
    ("policy: x\nservr: {port: 1}\n", ":2: invalid configuration: servr: unknown key (line 2)"),
    ('# a comment\n- a list\n', ":2: config must be a YAML mapping"),
    ('server: {host: x}\npolicy: "a\\0b"\n', ":2: a path holds a NUL character"),  # os.path raised ValueError
    ("a: 1\n---\nb: 2\n", ":3: malformed YAML: a config file holds one YAML document"),
])
def test_config_problems_name_the_line(tmp_path: Path, text: str, where: str) -> None:
    path = tmp_path / "dharma.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        load_settings(path, env={})
    assert str(caught.value).startswith(f"{path}{where}"), str(caught.value)


def test_environment_values_that_are_not_one_yaml_value_stay_text() -> None:
    layer = env_layer({"DHARMA_POLICY": "[" * 5000, "DHARMA_RULES": "[a, b]", "DHARMA_STATE_ROOT": '"\\ud800"'})
    assert layer == {"policy": "[" * 5000, "rules": ["a", "b"], "state_root": '"\\ud800"'}
