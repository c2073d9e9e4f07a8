"""Builders shared by the pipeline tests: a policy from YAML text, a gateway over real parts."""

from __future__ import annotations

import contextlib
import inspect
import logging
import subprocess
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import anyio
import pytest
import structlog
from structlog.testing import capture_logs

from audit.sqlite import SqliteLedger
from gateway.core.backends import ToolSpec
from gateway.transports.upstreams.python import CallableBackend
from gateway.core.gateway import Gateway
from gateway.policy.compile import CompiledPolicy, load_policy
from gateway.crypto.receipts import KeyStore

PROFILE_HEAD = """\
apiVersion: dharma/v1
kind: Policy
metadata: {name: test}
principals:
  - {id: alice, tier: reader, api_key_sha256: 72ee9d4355ccb9d3a4c9dbf37382e38e75c1b1a225b5bd1f729ee91bbda30c20}   # "alice-key"
  - {id: bob, tier: writer, roles: [admin], api_key_sha256: 9b94dc1a51a38769f135edf04033ad7f2f487b6c25929be7a861cfc1ab10cf98}     # "bob-key"
"""


def write_policy(tmp: Path, profile: str, rules: dict[str, str] | None = None) -> Path:
    """Write a profile (PROFILE_HEAD + `profile`) and rule files into tmp; return the profile path."""
    (tmp / "rules").mkdir(exist_ok=True)
    names = []
    for name, text in (rules or {}).items():
        (tmp / "rules" / name).write_text(textwrap.dedent(text))
        names.append(f"rules/{name}")
    body = PROFILE_HEAD + textwrap.dedent(profile)
    if names:
        body += "rule_sets: [" + ", ".join(names) + "]\n"
    path = tmp / "policy.yaml"
    path.write_text(body)
    return path


class Recorder:
    """A callable backend that records what reached it."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def backend(self, tools: dict[str, Any], annotations: dict[str, dict[str, Any]] | None = None, schemas: dict[str, Any] | None = None) -> CallableBackend:
        def wrap(name: str, fn: Any) -> Any:
            def tool(**kwargs: Any) -> Any:
                self.calls.append((name, kwargs))
                return fn(**kwargs)

            return tool

        return CallableBackend(
            "test",
            {
                name: (
                    wrap(name, fn),
                    ToolSpec(name, f"{name} tool", (schemas or {}).get(name), annotations=(annotations or {}).get(name, {})),
                )
                for name, fn in tools.items()
            },
        )


async def open_gateway(tmp: Path, policy: CompiledPolicy | Path, backends: list[Any], **kwargs: Any) -> Gateway:
    compiled = load_policy(policy) if isinstance(policy, Path) else policy
    ledger = await SqliteLedger.open(tmp / "ledger.db")
    keys = KeyStore.open(tmp / "state")
    return Gateway(compiled, backends, ledger=ledger, keys=keys, policy_path=policy if isinstance(policy, Path) else None, **kwargs)


def text_result(value: str) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": value}]}


@contextlib.contextmanager
def all_logs(monkeypatch: pytest.MonkeyPatch, *modules: ModuleType) -> Iterator[list[dict[str, Any]]]:
    """Every structlog event at every level, whatever logging an earlier test configured: a level
    filter, or a module's logger cached on first use (gateway.logging), would hide events from
    capture_logs, so each of `modules` gets a fresh `log`."""
    saved = structlog.get_config()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG), cache_logger_on_first_use=False)
    try:
        with capture_logs() as logs:
            for module in modules:
                monkeypatch.setattr(module, "log", structlog.get_logger())
            yield logs
    finally:
        structlog.configure(**saved)


class AgentAnswers:
    """An MCP client's callbacks that answer the gateway's forms on their own, as an agent can:
    every form asked is accepted and kept (`asked`), every progress note kept (`notes`)."""

    def __init__(self) -> None:
        self.asked: list[Any] = []
        self.notes: list[str | None] = []

    async def accept(self, ctx: Any, params: Any) -> Any:
        import mcp_types as types

        self.asked.append(params)
        return types.ElicitResult(action="accept", content={"approve": True})

    async def progress(self, done: float, total: float | None, message: str | None) -> None:
        self.notes.append(message)

async def wait_for(condition: Callable[[], Any], what: str, server: subprocess.Popen[Any] | None = None, *,
                   seconds: float = 60.0) -> Any:
    """Poll `condition` (its value may be awaitable) every 50 ms until it returns something truthy,
    and return that; fail naming `what` after `seconds` (generous: CI is a busy 2-core machine),
    or as soon as `server`, when given, has exited."""
    deadline = time.monotonic() + seconds
    while True:
        got = condition()
        if inspect.isawaitable(got):
            got = await got
        if got:
            return got
        if server is not None:
            assert server.poll() is None, f"the server exited while waiting for {what}"
        assert time.monotonic() < deadline, f"timed out after {seconds:g} s waiting for {what}"
        await anyio.sleep(0.05)
