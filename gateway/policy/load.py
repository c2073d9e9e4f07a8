"""Read policy YAML into validated models, keeping line numbers so every problem names file:line.

Duplicate mapping keys are errors (PyYAML would silently keep the last one, which lets a second
`effect:` override the first). Reading files is the only I/O here; `parse_documents` works on text.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from gateway.core.errors import PolicyErrors, PolicyProblem
from gateway.policy.models import KINDS, Document

Loc = tuple[str | int, ...]


@dataclass(frozen=True, slots=True)
class LoadedDocument:
    """One validated YAML document and where each part of it came from."""

    path: str
    model: Document
    lines: dict[Loc, int]
    text_digest: str

    def line_of(self, loc: Loc) -> int:
        """Line of the deepest known part of `loc` (1-based)."""
        for end in range(len(loc), -1, -1):
            line = self.lines.get(tuple(loc[:end]))
            if line is not None:
                return line
        return 1


def _node_lines(node: yaml.Node, loc: Loc, lines: dict[Loc, int], problems: list[tuple[int, Loc, str]]) -> None:
    """Record the line of every mapping value and list item; report duplicate keys."""
    lines[loc] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        seen: dict[Any, int] = {}
        for key_node, value_node in node.value:
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else str(key_node.start_mark)
            line = key_node.start_mark.line + 1
            if key in seen:
                problems.append((line, loc, f"duplicate key {key!r} (first at line {seen[key]})"))
            seen[key] = line
            _node_lines(value_node, (*loc, key), lines, problems)
            lines[(*loc, key)] = line
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _node_lines(item, (*loc, index), lines, problems)


def _rule_id_at(data: Any, loc: Loc) -> str:
    """The id of the rule (or case name) a location falls in, for error messages."""
    if isinstance(data, dict) and len(loc) >= 2 and loc[0] in ("rules", "cases") and isinstance(loc[1], int):
        items = data.get(loc[0])
        if isinstance(items, list) and loc[1] < len(items) and isinstance(items[loc[1]], dict):
            return str(items[loc[1]].get("id") or items[loc[1]].get("name") or "")
    return ""


def _format_pydantic(error: Any) -> str:
    loc = ".".join(str(part) for part in error["loc"])
    if error["type"] == "extra_forbidden":
        return f"unknown key {error['loc'][-1]!r}" + (f" in {'.'.join(map(str, error['loc'][:-1]))}" if len(error["loc"]) > 1 else "")
    if error["type"] == "literal_error" and error["loc"] and error["loc"][-1] == "kind":
        return f"unknown kind {error.get('input')!r}: expected one of {', '.join(KINDS)}"
    if error["type"] == "enum":
        return f"{loc}: {error['msg']} (got {error.get('input')!r})"
    return f"{loc}: {error['msg']}" if loc else error["msg"]


def parse_documents(text: str, path: str) -> list[LoadedDocument]:
    """Parse and validate every YAML document in `text`. Raises PolicyErrors with file:line."""
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
    problems: list[PolicyProblem] = []
    loaded: list[LoadedDocument] = []
    try:
        nodes = list(yaml.compose_all(text, Loader=yaml.SafeLoader))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        line = mark.line + 1 if mark else 1
        reason = getattr(exc, "problem", None) or str(exc)
        raise PolicyErrors([PolicyProblem(path, line, "", f"malformed YAML: {reason}")]) from None
    for node in nodes:
        if node is None:
            continue
        lines: dict[Loc, int] = {}
        dupes: list[tuple[int, Loc, str]] = []
        _node_lines(node, (), lines, dupes)
        try:
            data = yaml.SafeLoader(text).construct_document(node)
        except yaml.YAMLError as exc:
            problems.append(PolicyProblem(path, node.start_mark.line + 1, "", f"malformed YAML: {exc}"))
            continue
        for line, loc, message in dupes:
            problems.append(PolicyProblem(path, line, _rule_id_at(data, loc), message))
        if not isinstance(data, dict):
            problems.append(PolicyProblem(path, lines[()], "", "a policy document must be a YAML mapping"))
            continue
        kind = data.get("kind")
        model_cls = KINDS.get(kind) if isinstance(kind, str) else None
        if model_cls is None:
            line = lines.get(("kind",), lines[()])
            problems.append(
                PolicyProblem(path, line, "", f"unknown kind {kind!r}: expected one of {', '.join(KINDS)}")
            )
            continue
        try:
            model = model_cls.model_validate(data)
        except ValidationError as exc:
            for error in exc.errors():
                loc = tuple(error["loc"])
                doc = LoadedDocument(path, Document.model_construct(), lines, digest)
                problems.append(
                    PolicyProblem(path, doc.line_of(loc), _rule_id_at(data, loc), _format_pydantic(error))
                )
            continue
        loaded.append(LoadedDocument(path, model, lines, digest))
    if problems:
        raise PolicyErrors(problems)
    return loaded


def read_documents(path: Path) -> list[LoadedDocument]:
    """Read one policy file. Unreadable files and bad encodings become PolicyErrors."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise PolicyErrors([PolicyProblem(str(path), 0, "", f"cannot read: {exc.strerror or exc}")]) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PolicyErrors([PolicyProblem(str(path), 0, "", f"not UTF-8 text (byte {exc.start})")]) from None
    return parse_documents(text, str(path))


def expand_paths(paths: list[Path]) -> list[Path]:
    """Files named, plus every *.yaml/*.yml under directories named, in a stable order."""
    files: list[Path] = []
    for path in paths:
        if path.is_dir():
            files.extend(sorted(p for p in path.rglob("*") if p.suffix in (".yaml", ".yml") and p.is_file()))
        else:
            files.append(path)
    return files
