"""What every `dharma` command group shares: exit codes, the global options, settings, output.

Imports only the standard library at module level, so building the parser stays cheap; each
command imports what it needs when it runs.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


COMMANDS = {
    "serve": "serve the HTTP front (tool API, MCP at /mcp, approvals, JWKS); binds 127.0.0.1 by default",
    "stdio": "govern a stdio MCP server: dharma stdio [--config F] -- CMD ARGS...",
    "tools": "review pinned MCP tool definitions",
    "check": "validate policy and rule files; errors name file:line [rule]",
    "test": "run RuleTest cases (*_test.yaml) and report rules no case exercised",
    "eval": "dry-run one call against a policy and explain the decision",
    "replay": "re-decide recorded calls under a candidate policy and report what would change",
    "schema": "print the JSON Schema of the policy files, for editors",
    "audit": "verify, query and checkpoint the karma ledger",
    "approvals": "list, approve or deny held calls",
    "keys": "receipt and checkpoint signing keys",
    "receipt": "verify signed receipts offline",
}
"""Every top-level `dharma` command and its one-line help, in the order `dharma --help` lists them
(the help is listed without importing or building the commands' own parsers)."""

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def loop_factory() -> Callable[[], Any] | None:
    """uvloop's event loop (libuv, C) when it is installed, else asyncio's default: every byte
    `dharma serve` and `dharma stdio` move goes through the loop, and uvloop's transports and
    cross-thread wake-ups (the ledger writer's) cost a fraction of asyncio's CPU."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop  # type: ignore[no-any-return]


class UsageError(Exception):
    """Bad input on the command line: exit 2 with the message, never a traceback."""


def add_global_options(parser: argparse.ArgumentParser, default: Any) -> None:
    """`--config` and `--state-root`, accepted before the subcommand and after it.

    The top-level parser uses `default=None`; every subcommand gets them through GLOBAL_OPTIONS
    with `default=SUPPRESS`, so a value given after the subcommand wins and an absent one leaves
    the top-level value alone.
    """
    parser.add_argument("--config", type=Path, default=default, help="dharma.yaml to load (default: $DHARMA_CONFIG)")
    parser.add_argument(
        "--state-root", default=default, help="runtime state directory: keys, ledger, approvals (default: $DHARMA_STATE_ROOT or ~/.dharma)"
    )


GLOBAL_OPTIONS = argparse.ArgumentParser(add_help=False)
add_global_options(GLOBAL_OPTIONS, argparse.SUPPRESS)


def add_command(sub: Any, name: str, help: str, **kwargs: Any) -> argparse.ArgumentParser:  # noqa: A002 - argparse's name
    """Add subcommand `name` to `sub` with the global options and `help` as its description."""
    return sub.add_parser(name, help=help, description=help, parents=[GLOBAL_OPTIONS], **kwargs)


def add_group(sub: Any, name: str, help: str, dest: str) -> Any:  # noqa: A002 - argparse's name
    """Add a command group (`dharma audit …`) and return its own subparsers."""
    return add_command(sub, name, help).add_subparsers(dest=dest, required=True, metavar="COMMAND")


def settings_of(args: argparse.Namespace) -> Any:
    """Settings from `--config`, the environment and the command's own overrides."""
    from gateway.config import load_settings

    overrides: dict[str, Any] = {}
    if getattr(args, "state_root", None):
        overrides["state_root"] = str(args.state_root)
    if getattr(args, "policy", None):
        overrides["policy"] = str(Path(args.policy).resolve())
    if getattr(args, "ledger", None):
        overrides["ledger"] = {"path": str(Path(args.ledger).resolve())}
    return load_settings(getattr(args, "config", None), os.environ, overrides)


def open_keys(args: argparse.Namespace, *, create: bool) -> Any:
    """The receipt and checkpoint keys under the state root."""
    from gateway.crypto.receipts import KeyStore

    return KeyStore.open(settings_of(args).state_dir, create=create)


class BadJson(UsageError):
    """A JSON input (inline or `@file`) the one strict decoder refused; `problem` says why (a
    duplicate key is named). A usage error unless the command checks that input (`receipt verify`)."""

    def __init__(self, what: str, problem: str) -> None:
        super().__init__(f"{what} is not valid JSON: {problem}")
        self.problem = problem


def json_arg(text: str | None, what: str) -> Any:
    """JSON given inline or as `@file`, read with the one strict decoder (`gateway.crypto.strict_json`:
    duplicate keys, NaN, lone surrogates and a BOM are refused, so the value is the one any reader
    sees); a usage error naming `what` (and the file) if it cannot be read, `BadJson` if it does not decode."""
    if text is None:
        return None
    from gateway.crypto.strict_json import StrictJSONError, loads

    data: str | bytes = text
    if text.startswith("@"):
        try:
            data = Path(text[1:]).read_bytes()
        except OSError as exc:
            raise UsageError(f"{what}: cannot read {text[1:]}: {exc.strerror}") from None
        what = f"{what} {text[1:]}"
    try:
        return loads(data)
    except StrictJSONError as exc:
        raise BadJson(what, exc.message) from None


def json_object_arg(text: str | None, what: str) -> dict[str, Any]:
    """Like json_arg, but the value must be an object; absent means {}."""
    value = json_arg(text, what)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise UsageError(f"{what} must be a JSON object like '{{\"path\": \"a.txt\"}}', not {type(value).__name__}")
    return value


def pinned_definitions(args: argparse.Namespace) -> dict[tuple[str, str], dict[str, Any]]:
    """The tool definitions the gateway has seen, from the pins under the state root (or Redis):
    {(backend, tool): definition}. Empty when there are none; a usage error if they cannot be read."""
    import anyio

    from gateway.core.errors import ConfigError
    from gateway.runtime import open_pin_store
    from gateway.stores.base import StoreUnavailable

    async def rows() -> list[dict[str, Any]]:
        async with open_pin_store(settings_of(args)) as store:
            return await store.list()

    try:
        found = anyio.run(rows)
    except (StoreUnavailable, ValueError, OSError) as exc:
        raise ConfigError(f"cannot read the tool pins: {exc}") from None
    return {(r["backend"], r["tool"]): r.get("seen_definition") or r.get("definition") or {} for r in found}


def out(line: str = "") -> None:
    """One line of the command's output on stdout (diagnostics go to the log on stderr)."""
    sys.stdout.write(line + "\n")
