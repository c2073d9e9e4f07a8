"""Start-up: build a Gateway from Settings (policy, keys, ledger, approvals, backends).

This is where files and modules named in the configuration are opened; every failure becomes
a ConfigError or PolicyErrors with a message naming what and where.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from audit.errors import LedgerError
from audit.sqlite import SqliteLedger
from gateway.core.backends import Backend, ToolSpec
from gateway.transports.upstreams.http_api import HttpBackend
from gateway.transports.upstreams.python import CallableBackend
from gateway.config import Settings, UpstreamConfig, load_settings
from gateway.core.errors import ConfigError
from gateway.core.gateway import Gateway
from gateway.logging import ensure_logging
from gateway.policy.compile import load_policy
from gateway.crypto.receipts import KeyStore
from gateway.stores.sqlite_approvals import SqliteApprovalStore


def build_backend(upstream: UpstreamConfig, python_path: list[Path] | None = None) -> Backend:
    if upstream.type == "http":
        if not upstream.url:
            raise ConfigError(f"upstream {upstream.id}: type http needs `url`")
        tools = [ToolSpec(t.name, t.description, t.input_schema, t.output_schema, dict(t.annotations)) for t in upstream.tools]
        if not tools:
            raise ConfigError(f"upstream {upstream.id}: list the tools the HTTP API serves under `tools`")
        return HttpBackend(upstream.id, upstream.url, tools, headers=upstream.headers)
    if not upstream.target or ":" not in upstream.target:
        raise ConfigError(f"upstream {upstream.id}: type python needs `target: module:attribute`")
    module_name, _, attr = upstream.target.partition(":")
    for entry in python_path or []:
        if str(entry) not in sys.path:
            sys.path.insert(0, str(entry))
    try:
        module = importlib.import_module(module_name)
        factory: Any = getattr(module, attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"upstream {upstream.id}: cannot load {upstream.target}: {exc}") from None
    backend = factory(upstream.id) if callable(factory) and not isinstance(factory, CallableBackend) else factory
    if isinstance(backend, dict):
        backend = CallableBackend.from_functions(upstream.id, backend)
    if not hasattr(backend, "send") or not hasattr(backend, "tools"):
        raise ConfigError(f"upstream {upstream.id}: {upstream.target} did not give a backend")
    return backend  # type: ignore[no-any-return]


async def open_gateway(
    settings: Settings | None = None,
    *,
    config: str | Path | None = None,
    policy: str | Path | None = None,
    backends: Sequence[Backend] = (),
    state_root: str | Path | None = None,
) -> Gateway:
    """Open a Gateway: from `settings`, or from a dharma.yaml and/or a policy path plus backends.

    Keys, the karma ledger and approvals live under the state root (default
    `$DHARMA_STATE_ROOT` or ~/.dharma). Raises ConfigError/PolicyErrors on bad input.
    """
    ensure_logging()
    if settings is None:
        overrides: dict[str, Any] = {}
        if policy is not None:
            overrides["policy"] = str(Path(policy).resolve())
        if state_root is not None:
            overrides["state_root"] = str(state_root)
        settings = load_settings(Path(config) if config else None, os.environ, overrides)
    compiled = load_policy(settings.policy, extra=list(settings.rules), engine=settings.cel_engine)
    keys = KeyStore.open(settings.state_dir)
    # MCP upstreams are not catalog backends: their tools are listed live, per session, at /mcp
    # (gateway.transports.mcp_http.app); `build_app` finds them through `gateway.settings`.
    backends = [*backends, *(build_backend(u, list(settings.python_path)) for u in settings.upstreams if not u.is_mcp)]
    approvals = SqliteApprovalStore(settings.approvals_path)
    try:
        ledger = await SqliteLedger.open(settings.ledger_path, synchronous=settings.ledger.synchronous)
    except LedgerError as exc:
        raise ConfigError(str(exc)) from None
    try:
        gateway = Gateway(
            compiled, backends, ledger=ledger, keys=keys, approval_store=approvals, policy_path=settings.policy
        )
        gateway.settings = settings  # type: ignore[attr-defined]  # read by server.build_app (MCP upstreams)
        return gateway
    except ValueError as exc:
        await ledger.aclose()
        raise ConfigError(str(exc)) from None
