"""The replica deployment in examples/deploy is checked as `docker compose config` would check it
(the Compose Specification's JSON Schema), and its parts are checked against each other: every
replica reaches the same PostgreSQL and Redis, the balancer reaches every replica, the gateway
configuration loads, and no password is written in the files (containers cannot run here; the
replica test in tests/ is the proof that the setup works)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import jsonschema
import pytest
import yaml

from gateway.config import load_settings
from gateway.policy.compile import load_policy

REPO = Path(__file__).resolve().parent.parent
DEPLOY = REPO / "examples" / "deploy"
IMAGE_ROOT = Path("/opt/dharma")  # where the Dockerfile puts the repository
INTERPOLATION = re.compile(r"\$\{([A-Z_][A-Z0-9_]*)(:?[?-])([^}]*)\}")


def _compose() -> dict[str, Any]:
    return yaml.safe_load((DEPLOY / "compose.yaml").read_text())


def _interpolate(value: Any, env: dict[str, str]) -> Any:
    """Compose's `${VAR:?error}` / `${VAR:-default}` substitution, enough for this file."""
    if isinstance(value, str):
        def sub(m: re.Match[str]) -> str:
            name, op, arg = m.groups()
            if name in env and env[name]:
                return env[name]
            if op.endswith("?"):
                raise KeyError(f"{name}: {arg}")
            return arg
        return INTERPOLATION.sub(sub, value)
    if isinstance(value, dict):
        return {k: _interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [_interpolate(v, env) for v in value]
    return value


def _gateways(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {name: svc for name, svc in compose["services"].items() if name.startswith("gateway-")}


def test_compose_file_is_valid_compose() -> None:
    schema = json.loads((REPO / "tests" / "data" / "compose-spec.json").read_text())
    compose = _compose()
    validator = jsonschema.Draft7Validator(schema)
    validator.validate(compose)
    broken = dict(compose, services={**compose["services"], "redis": {**compose["services"]["redis"], "ports": {"a": 1}}})
    with pytest.raises(jsonschema.ValidationError):
        validator.validate(broken)


def test_no_password_is_written_down() -> None:
    compose = _compose()
    with pytest.raises(KeyError, match="POSTGRES_PASSWORD"):
        _interpolate(compose, {})
    text = (DEPLOY / "compose.yaml").read_text() + (DEPLOY / "dharma.yaml").read_text()
    for url in re.findall(r"(?:postgresql|redis)://[^\s\"']+", text):
        userinfo = urlsplit(url.replace("${", "").replace("}", "")).password
        assert userinfo is None or userinfo.startswith("POSTGRES_PASSWORD"), url


def test_three_replicas_share_one_postgres_and_one_redis() -> None:
    compose = _interpolate(_compose(), {"POSTGRES_PASSWORD": "pw"})
    services = compose["services"]
    gateways = _gateways(compose)
    assert len(gateways) == 3
    ledgers = {svc["environment"]["DHARMA_LEDGER__URL"] for svc in gateways.values()}
    redises = {svc["environment"]["DHARMA_REDIS__URL"] for svc in gateways.values()}
    assert len(ledgers) == 1 and len(redises) == 1
    ledger, redis_url = urlsplit(ledgers.pop()), urlsplit(redises.pop())
    assert ledger.hostname in services and redis_url.hostname in services
    pg = services[ledger.hostname]["environment"]
    assert (ledger.username, ledger.password, ledger.path.lstrip("/")) == (pg["POSTGRES_USER"], pg["POSTGRES_PASSWORD"], pg["POSTGRES_DB"])
    for name, svc in services.items():
        for dep in svc.get("depends_on", {}):
            assert dep in services, f"{name} depends on unknown service {dep}"
        for volume in svc.get("volumes", []):
            source = volume.split(":")[0]
            if not source.startswith((".", "/")):
                assert source in compose["volumes"], f"{name}: undeclared volume {source}"
            else:
                assert (DEPLOY / source).resolve().exists(), f"{name}: {source} does not exist"
    keys = {v for svc in gateways.values() for v in svc["volumes"] if v.startswith("keys:")}
    assert len(keys) == 1, "every replica must sign with the same keys"


def test_the_balancer_reaches_every_replica_and_streams() -> None:
    compose = _compose()
    conf = (DEPLOY / "nginx.conf").read_text()
    servers = re.findall(r"^\s*server\s+([\w.-]+):(\d+)", conf, re.M)
    gateways = _gateways(compose)
    assert sorted(s for s, _ in servers) == sorted(gateways)
    for name, svc in gateways.items():
        port = svc["command"][svc["command"].index("--port") + 1]
        assert {p for s, p in servers if s == name} == {port}
    assert re.search(r"proxy_buffering\s+off;", conf), "SSE streams must not be buffered"
    assert "non_idempotent" not in conf, "a tools/call POST must never be retried on another replica"
    read_timeout = int(re.search(r"proxy_read_timeout\s+(\d+)s;", conf).group(1))  # type: ignore[union-attr]
    config = yaml.safe_load((DEPLOY / "dharma.yaml").read_text())
    assert read_timeout > config["mcp"]["hold_seconds"], "a held call must outlive the balancer's read timeout"


def test_the_balancer_holds_the_per_client_limits() -> None:
    """Behind the balancer every client has the balancer's address: a replica's cap per address
    would throttle everyone at once, so the balancer caps per client and the replica only in total;
    the balancer drops an idle connection to a replica before the replica does (else a request sent
    on a connection the replica is closing fails, and nginx does not retry a POST)."""
    conf = (DEPLOY / "nginx.conf").read_text()
    settings = load_settings(DEPLOY / "dharma.yaml", env={}, overrides={"policy": str(REPO / "policies" / "standard.yaml")})
    assert settings.server.max_connections_per_address == 0
    assert re.search(r"limit_conn\s+per_client\s+\d+;", conf) and re.search(r"limit_conn_zone\s+\$binary_remote_addr", conf)
    idle = int(re.search(r"keepalive_timeout\s+(\d+)s;", conf).group(1))  # type: ignore[union-attr]
    assert idle < settings.server.keep_alive_seconds
    header = int(re.search(r"client_header_timeout\s+(\d+)s;", conf).group(1))  # type: ignore[union-attr]
    assert header <= settings.server.header_timeout_seconds


def test_the_replica_configuration_loads() -> None:
    config_file = DEPLOY / "dharma.yaml"
    raw = yaml.safe_load(config_file.read_text())
    policy = REPO / Path(raw["policy"]).relative_to(IMAGE_ROOT)
    settings = load_settings(
        config_file,
        env={"DHARMA_LEDGER__URL": "postgresql://dharma:pw@postgres:5432/dharma", "DHARMA_REDIS__URL": "redis://redis:6379/0"},
        overrides={"policy": str(policy)},
    )
    assert settings.ledger.url and settings.redis.url
    load_policy(settings.policy)
    compose = _compose()
    tools = compose["services"]["tools"]["command"]
    upstream = urlsplit(settings.upstreams[0].url or "")
    assert upstream.hostname == "tools" and str(upstream.port) == tools[tools.index("--port") + 1]
    copied = [p for line in re.findall(r"^COPY\s+(.+)$", (DEPLOY / "Dockerfile").read_text(), re.M) for p in line.split()[:-1]]
    assert "gateway" in copied and "audit" in copied
    for path in copied:
        assert (REPO / path).exists(), f"Dockerfile copies {path}, which does not exist"
