"""Shared fixtures: a temporary state root, the demo sandbox in tmp, small policy profiles, and a
real Gateway opened from Settings (real keys, real SQLite ledger and approvals store)."""

from __future__ import annotations

import copy
import hashlib
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
#: The official MCP conformance runner and fixture server (outside the repository: ../shared/conformance
#: beside the clone, or wherever DHARMA_CONFORMANCE_DIR says, for a clone made elsewhere).
CONFORMANCE = Path(os.environ.get("DHARMA_CONFORMANCE_DIR") or REPO.parent / "shared" / "conformance").resolve()


def key_digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


# API keys of the test profile's principals (the profile stores only their SHA-256).
KEYS = {
    "reader": "reader-key",
    "operator": "operator-key",
    "clinician": "clinician-key",
    "admin": "admin-key",
}

TEST_RULES: dict[str, Any] = {
    "apiVersion": "dharma/v1",
    "kind": "RuleSet",
    "metadata": {"name": "test-rules"},
    "rules": [
        {
            "id": "fs-no-traversal",
            "description": "Paths may not climb out of the sandbox.",
            "tools": ["read_*", "write_*", "delete_*", "list_*"],
            "when": 'has(args.path) && args.path.contains("..")',
            "effect": "deny",
            "message_expr": '"path leaves the sandbox: " + args.path',
        },
        {
            "id": "confirm-delete",
            "description": "Deleting needs a human.",
            "tools": ["delete_*"],
            "effect": "require_approval",
            "message": "deleting a file",
        },
    ],
}

TEST_PROFILE: dict[str, Any] = {
    "apiVersion": "dharma/v1",
    "kind": "Policy",
    "metadata": {"name": "test-profile"},
    "principals": [
        {"id": "reader", "api_key_sha256": key_digest(KEYS["reader"]), "tier": "reader"},
        {"id": "operator", "api_key_sha256": key_digest(KEYS["operator"]), "tier": "operator"},
        {"id": "clinician", "api_key_sha256": key_digest(KEYS["clinician"]), "tier": "clinician", "roles": ["clinician"]},
        {"id": "admin", "api_key_sha256": key_digest(KEYS["admin"]), "tier": "admin", "roles": ["admin"]},
    ],
    "tiers": [
        {"name": "reader", "grants": [{"tools": ["read_*", "list_*", "search*"]}]},
        {"name": "operator", "inherits": "reader", "grants": [{"tools": ["write_*", "delete_*", "probe_*"]}]},
        {"name": "clinician", "inherits": "reader", "grants": [{"tools": ["health_*"]}]},
        {"name": "admin", "grants": [{"tools": ["*"]}]},
    ],
    "sensitivity": [{"tools": ["health_*"], "level": "RESTRICTED"}],
    "circuit_breaker": {"failure_threshold": 2, "reset_seconds": 0.3},
    "backend_timeout_seconds": 0.3,
    "rule_sets": ["rules.yaml"],
}


def write_policy(directory: Path, profile: dict[str, Any] | None = None, rules: dict[str, Any] | None = None, **overrides: Any) -> Path:
    """Write a profile (TEST_PROFILE with `overrides` on top) and its rule set; return the profile path."""
    directory.mkdir(parents=True, exist_ok=True)
    doc = copy.deepcopy(profile or TEST_PROFILE)
    doc.update(copy.deepcopy(overrides))
    (directory / "rules.yaml").write_text(yaml.safe_dump(rules or TEST_RULES, sort_keys=False), encoding="utf-8")
    path = directory / "profile.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return path


DEMO_UPSTREAM = {"id": "demo", "type": "python", "target": "examples.demo_backend:backend"}


@pytest.fixture
def state_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh DHARMA_STATE_ROOT (keys, ledger, approvals) for this test."""
    root = tmp_path / "state"
    root.mkdir()
    monkeypatch.setenv("DHARMA_STATE_ROOT", str(root))
    return root


@pytest.fixture
def sandbox(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The demo backend's sandbox, in tmp (env for subprocesses, patched module for this one)."""
    import examples.demo_backend as demo

    path = tmp_path / "sandbox"
    path.mkdir()
    monkeypatch.setenv("DHARMA_DEMO_SANDBOX", str(path))
    monkeypatch.setattr(demo, "SANDBOX", path)
    return path


@pytest.fixture
def policy_path(tmp_path: Path) -> Path:
    """The small test profile and rule set, written to tmp."""
    return write_policy(tmp_path / "policy")


OpenGateway = Callable[..., Awaitable[Any]]


@pytest.fixture
async def open_test_gateway(state_root: Path, sandbox: Path) -> AsyncIterator[OpenGateway]:
    """Open Gateways with `open_gateway(load_settings(...))` on the tmp state root; all closed at teardown."""
    from gateway.config import load_settings
    from gateway.runtime import open_gateway

    opened: list[Any] = []

    async def _open(policy: Path, *, upstreams: list[dict[str, Any]] | None = None, **settings: Any) -> Any:
        overrides = {
            "policy": str(policy),
            "state_root": str(state_root),
            "python_path": [str(REPO)],
            "upstreams": [DEMO_UPSTREAM] if upstreams is None else upstreams,
            **settings,
        }
        gw = await open_gateway(load_settings(None, env={}, overrides=overrides))
        opened.append(gw)
        return gw

    yield _open
    for gw in reversed(opened):
        await gw.aclose()


@pytest.fixture
async def demo_gateway(open_test_gateway: OpenGateway, policy_path: Path) -> Any:
    """A real Gateway over the demo backend under the small test profile."""
    return await open_test_gateway(policy_path)


@pytest.fixture(scope="session")
def postgres() -> Any:
    """Start PostgreSQL from the installed binaries (as the `postgres` user when we are root); one
    per session, `new_database()` per test (tests/pg.py)."""
    from tests.pg import postgres_or_skip

    with postgres_or_skip() as server:
        yield server


@pytest.fixture
def postgres_url(postgres: Any, request: pytest.FixtureRequest) -> str:
    """A fresh, empty PostgreSQL database for this test (dropped after): `ledger.url`."""
    url = str(postgres.new_database())
    request.addfinalizer(lambda: postgres.drop_database(url))
    return url


@pytest.fixture(scope="session")
def shared_redis() -> Any:
    """One real redis-server for the session (tests/redis_server.py); use `redis_url` in tests."""
    from tests.redis_server import redis_or_skip

    with redis_or_skip() as server:
        yield server


@pytest.fixture
def redis_url(shared_redis: Any) -> str:
    """The shared Redis, emptied before the test: `redis.url` for a gateway's settings."""
    shared_redis.flush()
    return str(shared_redis.url)


@pytest.fixture
def own_redis() -> Any:
    """A Redis of the test's own, for tests that stop, hang or restart it (outages)."""
    from tests.redis_server import redis_or_skip

    with redis_or_skip() as server:
        yield server
