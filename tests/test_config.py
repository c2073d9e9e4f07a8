"""Settings: file < DHARMA_* environment < flags, paths relative to dharma.yaml, typos are errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.config import load_settings
from gateway.core.errors import ConfigError


def write(tmp: Path, text: str) -> Path:
    path = tmp / "dharma.yaml"
    path.write_text(text)
    return path


def test_paths_are_relative_to_the_config_file(tmp_path):
    (tmp_path / "sub").mkdir()
    config = write(
        tmp_path / "sub",
        "policy: ../p.yaml\nledger: {path: data/ledger.db}\nupstreams:\n"
        "  - {id: s, type: mcp_stdio, command: ../venv/bin/python, args: [-m, x], env: {PYTHONPATH: .., MODE: fast}}\n"
        "  - {id: t, type: mcp_stdio, command: npx, prefix: t_}\n",
    )
    settings = load_settings(config, {})
    assert settings.policy == tmp_path / "p.yaml"
    assert settings.ledger_path == tmp_path / "sub" / "data" / "ledger.db"
    stdio, bare = settings.upstreams
    assert stdio.command == str(tmp_path / "venv" / "bin" / "python")
    assert stdio.env == {"PYTHONPATH": str(tmp_path), "MODE": "fast"}
    assert bare.command == "npx"  # a program name is looked up on PATH, not resolved


def test_groups_are_read_from_the_file_and_the_environment(tmp_path):
    config = write(tmp_path, "groups:\n  - {name: research, tools: [web_*, ev_get-*], roles: [analyst]}\n")
    [group] = load_settings(config, {}).groups
    assert (group.name, group.tools, group.roles, group.principals) == ("research", ["web_*", "ev_get-*"], ["analyst"], [])
    env = {"DHARMA_GROUPS": "[{name: ops, tools: ['*'], principals: [oncall]}]"}
    assert [g.name for g in load_settings(config, env).groups] == ["ops"]


def test_environment_overrides_the_file_and_flags_override_both(tmp_path):
    config = write(tmp_path, "server: {port: 9000}\nledger: {synchronous: FULL}\n")
    env = {"DHARMA_SERVER__PORT": "9100", "DHARMA_LEDGER__SYNCHRONOUS": "NORMAL"}
    settings = load_settings(config, env, {"server": {"port": 9200}})
    assert settings.server.port == 9200 and settings.ledger.synchronous == "NORMAL"
    assert load_settings(config, env).server.port == 9100


@pytest.mark.parametrize(
    "text, env, needle",
    [
        ("servr: {port: 1}\n", {}, "servr: unknown key"),
        ("server: {port: 99999}\n", {}, "server.port"),
        ("", {"DHARMA_STATEROOT": "/x"}, "DHARMA_STATEROOT"),
        ("policy: [\n", {}, "malformed YAML"),
        ("ledger: {inline_max_ms: -1}\n", {}, "ledger.inline_max_ms"),
        ("server: {header_timeout_seconds: 0}\n", {}, "server.header_timeout_seconds"),
        ("", {"DHARMA_SERVER__MAX_CONNECTIONS": "0"}, "server.max_connections"),
        ("", {"DHARMA_SERVER__MAX_CONNECTIONS_PER_ADDRESS": "-1"}, "server.max_connections_per_address"),
        ("groups: [{name: Research, tools: [a]}]\n", {}, "groups.0.name"),
        ("groups: [{name: a/b, tools: [a]}]\n", {}, "groups.0.name"),
        ("groups: [{name: ops, tools: []}]\n", {}, "groups.0.tools"),
        ("groups: [{name: ops, tools: [' a']}]\n", {}, "tool glob ' a'"),
        ("groups: [{name: ops, tools: [a]}, {name: ops, tools: [b]}]\n", {}, "group name 'ops' is used more than once"),
        ("groups: [{name: ops, tool: [a]}]\n", {}, "tool: unknown key"),
    ],
)
def test_bad_settings_name_what_and_where(tmp_path, text, env, needle):
    with pytest.raises(ConfigError) as info:
        load_settings(write(tmp_path, text), env)
    assert needle in str(info.value)


def test_connection_limits_have_safe_defaults_and_come_from_the_environment(tmp_path):
    server = load_settings(None, {}).server
    assert (server.max_connections, server.max_connections_per_address, server.header_timeout_seconds,
            server.body_idle_seconds, server.body_timeout_seconds, server.keep_alive_seconds,
            server.max_requests_per_connection) == (1024, 64, 10.0, 30.0, 120.0, 5.0, 1000)
    env = {"DHARMA_SERVER__MAX_CONNECTIONS": "4096", "DHARMA_SERVER__HEADER_TIMEOUT_SECONDS": "2.5"}
    server = load_settings(write(tmp_path, "server: {max_connections_per_address: 0}\n"), env).server
    assert (server.max_connections, server.header_timeout_seconds, server.max_connections_per_address) == (4096, 2.5, 0)


def test_missing_config_file(tmp_path):
    with pytest.raises(ConfigError, match="cannot read config"):
        load_settings(tmp_path / "absent.yaml", {})


def test_a_postgres_ledger_is_named_by_url(tmp_path):
    settings = load_settings(write(tmp_path, "ledger: {url: 'postgresql://gw@db:5432/karma'}\n"), {})
    assert settings.ledger.url == "postgresql://gw@db:5432/karma"
    assert load_settings(write(tmp_path, ""), {}).ledger.url is None  # SQLite stays the default


@pytest.mark.parametrize(
    "text, needle",
    [
        ("ledger: {url: 'sqlite:///x.db'}\n", "must be a postgresql:// URL, not 'sqlite'"),
        ("ledger: {url: 'postgresql://db/k', path: x.db}\n", "either path (SQLite) or url (PostgreSQL), not both"),
    ],
)
def test_a_bad_ledger_url_is_refused(tmp_path, text, needle):
    with pytest.raises(ConfigError) as info:
        load_settings(write(tmp_path, text), {})
    assert needle in str(info.value) and "ledger" in str(info.value)


def test_every_dharma_variable_the_code_reads_is_a_setting_or_declared_not_one() -> None:
    """A DHARMA_* variable read elsewhere (the CLI's API key, a test's directory) but unknown to the
    settings loader makes `dharma serve` refuse to start in any shell that sets it."""
    import re

    from gateway.config import ENV_PREFIX, NOT_SETTINGS, Settings

    root = Path(__file__).resolve().parent.parent
    read = set()
    for folder in ("gateway", "tests", "bench", "examples"):
        for path in (root / folder).rglob("*.py"):
            read |= set(re.findall(r"environ(?:\.get)?[\[(]\"(DHARMA_[A-Z0-9_]+)\"", path.read_text(encoding="utf-8")))
    assert {"DHARMA_API_KEY", "DHARMA_TEST_CACHE"} <= read  # the scan finds what it is meant to
    settings = {f"{ENV_PREFIX}{name.upper()}" for name in Settings.model_fields}
    stray = sorted(v for v in read - NOT_SETTINGS if not any(v == s or v.startswith(s + "__") for s in settings))
    assert not stray, f"read from the environment but neither a setting nor in NOT_SETTINGS: {stray}"
    for name in NOT_SETTINGS - {"DHARMA_CONFIG"}:  # (DHARMA_CONFIG names a file to read)
        load_settings(env={name: "x"})
