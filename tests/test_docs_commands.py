"""Every `dharma` command shown in README.md and docs/*.md exists and parses, so a doc cannot drift.

Sources: lines of fenced code blocks that start with `dharma ` (or `$ dharma `), and inline code
spans that start with `dharma `. The synopsis notation is read as written: `[...]` optional,
`a|b` alternatives of one word, UPPERCASE words and `<words>` placeholders (given real values
below), `…` "and so on", `# …` a comment, ` | ` or ` > ` a shell pipe or redirection (only the
command before it counts).

- Every span and line: its command path exists and every flag it names exists on that command.
- Full commands (fenced lines and the commands in the first cell of docs/cli.md's command table):
  every variant, with all optional parts and without them, parses with the real parser.
  Long-running commands (`serve`, `stdio`) also run through `main()` with `--help` added (before
  `--`), which must print that command's help and exit 0; the rest are not run.
"""

from __future__ import annotations

import argparse
import itertools
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gateway.cli.main import build_parser, main

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
COMMAND_TABLE = "docs/cli.md"
LONG_RUNNING = {("serve",), ("stdio",)}
PLACEHOLDERS = {
    "F": "dharma.yaml", "FILE": "checkpoint.txt", "DIR": "state", "CMD": "python3", "ARGS": "server.py",
    "P": "policies/standard.yaml", "T": "read_file", "JSON": '{"path": "a.txt"}', "ID": "apr_1", "id": "apr_1",
    "PATHS": "rules", "B": "demo", "BACKEND": "demo", "TOOL": "read_file", "NAME": "demo", "N": "1048576",
    "S": "5", "H": "127.0.0.1", "GLOB": "read_*", "CODE": "policy_blocked", "RESPONSE.json": "response.json",
    "JWKS.json": "jwks.json", "REQUEST.json": "request.json", "SEQ": "42", "OLD": "10", "NEW": "20", "L": "ledger.db",
    "URL": "postgresql://admin@db:5432/karma", "ROLE": "auditor",
}
SAMPLE_VALUES = ("x", "1", "2026-11-22T00:00:00Z")


@dataclass(frozen=True)
class Shown:
    """One `dharma …` text in the docs; `full` when it is meant as a whole command."""

    where: str
    text: str
    full: bool


def shown_commands() -> Iterator[Shown]:
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        name = doc.relative_to(ROOT).as_posix()
        for block in re.findall(r"^```[^\n]*\n(.*?)^```", text, re.S | re.M):
            lines = block.splitlines()
            for i, line in enumerate(lines):
                command = re.sub(r"^\$ ", "", line.strip())
                if not command.startswith("dharma "):
                    continue
                for more in lines[i + 1:]:  # a usage wrapped onto indented lines, or `\` continuations
                    if not (more.startswith((" ", "\t")) or command.endswith("\\")):
                        break
                    command = command.rstrip("\\") + " " + more.strip()
                yield Shown(name, command, full=True)
        prose = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
        for row in prose.splitlines():  # docs/cli.md's command table: the first cell holds whole commands
            if name == COMMAND_TABLE and row.startswith("| `dharma "):
                first_cell = re.split(r"(?<!\\)\|", row)[1]
                yield from (Shown(name, span, full=True) for span in re.findall(r"`(dharma [^`]+)`", first_cell))
        for span in re.findall(r"`([^`]+)`", prose):
            span = " ".join(span.split())
            if span.startswith("dharma "):
                yield Shown(name, span, full=False)


SHOWN = sorted(set(shown_commands()), key=lambda s: (s.where, s.text, s.full))


def _tokens(text: str) -> list[str]:
    text = re.sub(r"\s#.*$", "", text)  # comment
    text = re.split(r"\s(?:\||>>?|2>|<)\s", text)[0]  # a shell pipe or redirection ends the command
    text = text.replace("\\|", "|").replace("[", " [ ").replace("]", " ] ")
    return shlex.split(text)[1:]  # without `dharma`


def _variants(tokens: list[str], with_optional: bool) -> list[list[str]]:
    """Expand `[...]` (kept or dropped) and one-word alternatives `a|b` into argv lists."""
    kept: list[str] = []
    depth = 0
    for token in tokens:
        if token == "[":
            depth += 1
        elif token == "]":
            depth -= 1
        elif with_optional or depth == 0:
            kept.append(token)
    assert depth == 0, f"unbalanced [ ] in {tokens}"
    choices = [token.split("|") if "|" in token else [token] for token in kept]
    return [list(combo) for combo in itertools.product(*choices)]


PLACEHOLDER = re.compile(r"[A-Z][A-Z0-9_]*(\.json)?(…|\.\.\.)?|<[a-z_-]+>")


def _is_placeholder(token: str) -> bool:
    return PLACEHOLDER.fullmatch(token) is not None


def _value_of(token: str) -> str:
    name = token.strip("<>").rstrip("…").removesuffix("...") if not token.endswith(".json") else token
    assert name in PLACEHOLDERS, f"placeholder {token!r}: give it a real value in PLACEHOLDERS"
    return PLACEHOLDERS[name]


def _resolve(argv: list[str]) -> tuple[tuple[str, ...], argparse.ArgumentParser, list[str]]:
    """Walk the subcommands named in argv; return the command path, its parser and the rest."""
    parser, path, rest = build_parser(), (), list(argv)
    while rest:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]  # noqa: SLF001
        if not subs:
            break
        if rest[0].startswith("-"):  # a global option before the subcommand
            rest = rest[2:] if rest[0] in ("--config", "--state-root") else rest[1:]
            continue
        if rest[0] in ("…", "..."):
            break
        assert rest[0] in subs[0].choices, f"no command `dharma {' '.join((*path, rest[0]))}`"
        parser, path, rest = subs[0].choices[rest[0]], (*path, rest[0]), rest[1:]
    return path, parser, rest


def _flags(argv: list[str]) -> list[str]:
    before_separator = argv[: argv.index("--")] if "--" in argv else argv
    return [t.split("=")[0] for t in before_separator if t.startswith("-") and t != "-"]


def _concrete(argv: list[str], parser: argparse.ArgumentParser) -> list[str]:
    """Placeholders replaced by values; a flag shown without its value gets one it accepts."""
    options = parser._option_string_actions  # noqa: SLF001
    out: list[str] = []
    for i, token in enumerate(argv):
        after_separator = "--" in argv[:i]
        out.append(_value_of(token) if _is_placeholder(token) and (after_separator or not token.startswith("-")) else token)
        action = options.get(token) if not after_separator else None
        if action is not None and action.nargs is None:
            following = argv[i + 1] if i + 1 < len(argv) else None
            if following is None or following.startswith("-"):
                candidates = [str(c) for c in action.choices or ()] + list(SAMPLE_VALUES)
                out.append(next(v for v in candidates if _accepts(action, v)))
    return out


def _accepts(action: argparse.Action, value: str) -> bool:
    try:
        converted = action.type(value) if callable(action.type) else value
    except (argparse.ArgumentTypeError, TypeError, ValueError):
        return False
    return action.choices is None or converted in action.choices


def test_the_docs_show_commands() -> None:
    assert len([s for s in SHOWN if s.full]) >= 15, SHOWN
    assert {s.where for s in SHOWN} >= {"README.md", "docs/mcp.md", "docs/ledger-and-receipts.md", "docs/policy.md", COMMAND_TABLE}
    assert len([s for s in SHOWN if s.full and s.where == COMMAND_TABLE]) >= 20  # the table's rows are read as commands


@pytest.mark.parametrize("shown", SHOWN, ids=lambda s: f"{s.where}: {s.text}")
def test_every_command_and_flag_shown_exists(shown: Shown) -> None:
    for argv in _variants(_tokens(shown.text), with_optional=True):
        path, parser, _rest = _resolve(argv)
        assert path or _flags(argv) == argv, f"{shown.where}: `{shown.text}` names no command"
        known = set(parser._option_string_actions) | set(build_parser()._option_string_actions)  # noqa: SLF001
        missing = [flag for flag in _flags(argv) if flag not in known]
        assert missing == [], f"{shown.where}: `{shown.text}`: dharma {' '.join(path)} has no {missing}"


@pytest.mark.parametrize("shown", [s for s in SHOWN if s.full], ids=lambda s: f"{s.where}: {s.text}")
def test_every_full_command_shown_parses(shown: Shown, capsys: pytest.CaptureFixture[str]) -> None:
    tokens = _tokens(shown.text)
    for argv in [*_variants(tokens, with_optional=True), *_variants(tokens, with_optional=False)]:
        path, parser, _rest = _resolve(argv)
        argv = _concrete(argv, parser)
        try:  # parsing alone: `--help` would hide an unknown option behind its early exit
            build_parser().parse_args(argv)
        except SystemExit as exc:  # 0 for a command that only prints (`dharma --version`)
            assert not exc.code, f"{shown.where}: `{shown.text}` does not parse as {argv}: {capsys.readouterr().err}"
        if path in LONG_RUNNING:
            at = argv.index("--") if "--" in argv else len(argv)
            assert main([*argv[:at], "--help", *argv[at:]]) == 0, f"{shown.where}: `{shown.text}` → {argv}"
            assert capsys.readouterr().out.startswith(f"usage: dharma {' '.join(path)}")
