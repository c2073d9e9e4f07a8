"""`dharma`: the operator's, policy author's and auditor's command line.

This module builds the parser (global options, one module per command group), dispatches, and
maps errors to exit codes (contract): 0 success, 1 a check failed (lint error, failing test,
tampered ledger, invalid receipt), 2 usage or configuration error. Never a traceback for bad
input. A reader that closes the pipe early (`dharma audit query | head`) ends the command
quietly with 0: it has what it asked for.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from typing import Any

from gateway.cli.common import COMMANDS, EXIT_OK, EXIT_USAGE, UsageError, add_command, add_global_options

COMMAND_GROUPS = ("serve", "mcp", "policy", "audit", "approvals", "keys")
"""The modules of `gateway.cli`; each adds its subcommands with `add_parsers(sub)`."""
GROUP_OF = {"serve": "serve", "stdio": "mcp", "tools": "mcp", "check": "policy", "test": "policy", "eval": "policy",
            "schema": "policy", "replay": "audit", "audit": "audit", "approvals": "approvals", "keys": "keys",
            "receipt": "keys"}
"""Which module adds each top-level command of `COMMANDS`."""
_GLOBAL_WITH_VALUE = ("--config", "--state-root")


def version() -> str:
    """The installed distribution's version."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("dharma-gateway")
    except PackageNotFoundError:
        return "unknown (not installed)"


class _VersionAction(argparse.Action):
    """`--version`: print `dharma <version>`, read from package metadata only when asked."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS, help: str | None = None) -> None:  # noqa: A002
        super().__init__(option_strings, dest=dest, default=argparse.SUPPRESS, nargs=0, help=help)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object, option_string: str | None = None) -> None:
        sys.stdout.write(f"dharma {version()}\n")
        parser.exit()


def chosen_command(argv: Sequence[str]) -> str | None:
    """The top-level command `argv` names (its first positional word), or None."""
    skip = False
    for word in argv:
        if skip:
            skip = False
        elif word.startswith("--") and "=" not in word and any(o.startswith(word) for o in _GLOBAL_WITH_VALUE):
            skip = True  # argparse takes an unambiguous prefix of a long option too
        elif word == "--":
            return None
        elif not word.startswith("-"):
            return word if word in COMMANDS else None
    return None


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The `dharma` parser. With `only` (a command of `COMMANDS`), only that command's module is
    imported and its parsers built; every other command is listed with its help and no parser
    of its own (`dharma --help` and each command start without loading the others)."""
    parser = argparse.ArgumentParser(
        prog="dharma",
        description="Dharma Gateway: governed tool calls.",
        epilog="--config and --state-root are accepted before or after the subcommand; the later one wins. "
        "Exit codes: 0 success, 1 a check failed, 2 usage or configuration error.",
    )
    parser.add_argument("--version", action=_VersionAction, help="print `dharma <version>` and exit")
    add_global_options(parser, None)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    built: set[str] = set()
    for name, summary in COMMANDS.items():
        group = GROUP_OF[name]
        if only is not None and GROUP_OF.get(only) != group:
            add_command(sub, name, summary)
        elif group not in built:
            built.add(group)
            module: Any = importlib.import_module(f"gateway.cli.{group}")
            module.add_parsers(sub)
    return parser


def import_structlog_without_rich() -> None:
    """Import structlog as this process's first user, with `rich` hidden for that import only.

    structlog imports rich (about 50 ms of a command's start-up, twice that on a busy box) only
    for its console renderer's pretty tracebacks; the gateway renders JSON lines and formats
    exceptions as plain text. `rich` stays importable afterwards. No-op when either is loaded.
    """
    if "structlog" in sys.modules or "rich" in sys.modules:
        return
    sys.modules["rich"] = None  # type: ignore[assignment]  # makes `import rich` raise ImportError
    try:
        import structlog  # noqa: F401
    finally:
        del sys.modules["rich"]


#: The errors a command reports as one line and exit 2, by module: LedgerError (a ledger that cannot
#: be opened or read), StoreUnavailable (a store that is down, named). Looked up only in modules
#: already imported (one that was not cannot have raised): `dharma stdio` starts relaying before
#: pydantic, which gateway.stores.base needs, is loaded.
USAGE_ERRORS = (("gateway.core.errors", "ConfigError"), ("gateway.core.errors", "GatewayError"),
                ("audit.errors", "LedgerError"), ("gateway.stores.base", "StoreUnavailable"))


def _usage_error(exc: Exception) -> bool:
    """Whether `exc` is one of `USAGE_ERRORS` (or a UsageError)."""
    loaded = (getattr(sys.modules[m], name) for m, name in USAGE_ERRORS if m in sys.modules)
    return isinstance(exc, (UsageError, *loaded))


def _run(args: argparse.Namespace) -> int:
    """Run the chosen command; map its errors to exit codes."""
    import_structlog_without_rich()
    from gateway.core.errors import PolicyErrors
    from gateway.logging import configure_logging

    configure_logging("warning")  # on stderr: stdout carries the command's output (JSON, JWKS, ...)
    try:
        return int(args.func(args))
    except PolicyErrors as exc:
        for item in exc.problems:
            sys.stderr.write(f"{item}\n")
        return EXIT_USAGE
    except Exception as exc:
        if not _usage_error(exc):
            raise
        sys.stderr.write(f"dharma: {exc}\n")
        return EXIT_USAGE


def _silence_stdout() -> None:
    """After the reader closed the pipe: point stdout at /dev/null so the exit flush cannot fail."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # no real file descriptor (an in-process caller's capture)
        pass


def main(argv: Sequence[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else list(argv)
    only = chosen_command(words)
    if only is None and not any(word in COMMANDS for word in words):
        only = ""  # no command at all (`dharma --help`): list them, build none
    parser = build_parser(only)  # None (a command word where it was not expected): build every command
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0) and EXIT_USAGE
    try:
        code = _run(args)
        sys.stdout.flush()
    except BrokenPipeError:
        _silence_stdout()
        return EXIT_OK
    except KeyboardInterrupt:
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
