"""`dharma`: the operator's, policy author's and auditor's command line.

This module builds the parser (global options, one module per command group), dispatches, and
maps errors to exit codes (contract): 0 success, 1 a check failed (lint error, failing test,
tampered ledger, invalid receipt), 2 usage or configuration error. Never a traceback for bad
input. A reader that closes the pipe early (`dharma audit query | head`) ends the command
quietly with 0: it has what it asked for.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from gateway.cli import approvals, audit, keys, mcp, policy, serve
from gateway.cli.common import EXIT_OK, EXIT_USAGE, UsageError, add_global_options

COMMAND_GROUPS = (serve, mcp, policy, audit, approvals, keys)
"""Each adds its subcommands with `add_parsers(sub)`, in the order `dharma --help` lists them."""


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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dharma",
        description="Dharma Gateway: governed tool calls.",
        epilog="--config and --state-root are accepted before or after the subcommand; the later one wins. "
        "Exit codes: 0 success, 1 a check failed, 2 usage or configuration error.",
    )
    parser.add_argument("--version", action=_VersionAction, help="print `dharma <version>` and exit")
    add_global_options(parser, None)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for group in COMMAND_GROUPS:
        group.add_parsers(sub)
    return parser


def _run(args: argparse.Namespace) -> int:
    """Run the chosen command; map its errors to exit codes."""
    from audit.errors import LedgerError
    from gateway.core.errors import ConfigError, GatewayError, PolicyErrors
    from gateway.logging import configure_logging
    from gateway.stores.base import StoreUnavailable

    configure_logging("warning")  # on stderr: stdout carries the command's output (JSON, JWKS, ...)
    try:
        return int(args.func(args))
    except PolicyErrors as exc:
        for item in exc.problems:
            sys.stderr.write(f"{item}\n")
        return EXIT_USAGE
    # LedgerError: a ledger that cannot be opened or read; StoreUnavailable: a store that is down (names which)
    except (ConfigError, UsageError, GatewayError, LedgerError, StoreUnavailable) as exc:
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
    parser = build_parser()
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
