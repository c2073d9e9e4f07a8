"""Read policy YAML into validated models, keeping line numbers so every problem names file:line.

Duplicate mapping keys are errors (PyYAML would silently keep the last one, which lets a second
`effect:` override the first). Reading files is the only I/O here; `parse_documents` works on text.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from gateway.core.errors import PolicyErrors, PolicyProblem
from gateway.crypto.strict_json import has_surrogate
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
        return line_of(self.lines, loc) or 1


def line_of(lines: dict[Loc, int], loc: Loc) -> int | None:
    """Line of the deepest part of `loc` that `lines` knows, else None."""
    for end in range(len(loc), -1, -1):
        line = lines.get(tuple(loc[:end]))
        if line is not None:
            return line
    return None


def node_lines(node: yaml.Node) -> dict[Loc, int]:
    """The line of every mapping value and list item under a composed document."""
    lines: dict[Loc, int] = {}
    _node_lines(node, (), lines, [])
    return lines


def _node_lines(node: yaml.Node, loc: Loc, lines: dict[Loc, int], problems: list[tuple[int, Loc, str]],
                seen_nodes: set[int] | None = None, ancestors: frozenset[int] = frozenset()) -> None:
    """Record the line of every mapping value and list item; report duplicate keys, and aliases
    that refer to a node containing them (recursive data, which no policy field can hold). A
    node reached again through an alias is not walked again (nested aliases would be exponential)."""
    lines[loc] = node.start_mark.line + 1
    if id(node) in ancestors:
        problems.append((node.start_mark.line + 1, loc, RECURSIVE_ALIAS))
        return
    seen_nodes = set() if seen_nodes is None else seen_nodes
    if id(node) in seen_nodes:
        return
    seen_nodes.add(id(node))
    inner = ancestors | {id(node)}
    if isinstance(node, yaml.MappingNode):
        seen: dict[Any, int] = {}
        for key_node, value_node in node.value:
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else str(key_node.start_mark)
            line = key_node.start_mark.line + 1
            if key in seen:
                problems.append((line, loc, f"duplicate key {key!r} (first at line {seen[key]})"))
            seen[key] = line
            _node_lines(value_node, (*loc, key), lines, problems, seen_nodes, inner)
            lines[(*loc, key)] = line
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _node_lines(item, (*loc, index), lines, problems, seen_nodes, inner)


RECURSIVE_ALIAS = "malformed YAML: an alias refers to a node that contains it (recursive data)"


#: Deepest nesting of YAML flow collections (`[` and `{`) read. PyYAML's scanner is quadratic
#: in it (thousands of `[` take seconds) and its composer recursive; no policy or config nests 64.
YAML_MAX_FLOW_DEPTH = 64
_FLOW = re.compile(r"[\[\]{}]")


class YamlProblem(Exception):
    """YAML that cannot be read, at a 1-based line (policy files and dharma.yaml both use it)."""

    def __init__(self, line: int, reason: str) -> None:
        super().__init__(f"line {line}: {reason}")
        self.line = line
        self.reason = reason


def _flow_too_deep(text: str) -> int | None:
    """The line where `[`/`{` nesting first passes the limit, else None. Cheap when the text has
    fewer brackets than the limit; brackets in quoted scalars count too (no file needs that many)."""
    if text.count("[") + text.count("{") <= YAML_MAX_FLOW_DEPTH:
        return None
    depth = 0
    for match in _FLOW.finditer(text):
        depth += 1 if match.group() in "[{" else -1
        if depth > YAML_MAX_FLOW_DEPTH:
            return text.count("\n", 0, match.start()) + 1
    return None


def _problem(exc: yaml.YAMLError, text: str) -> YamlProblem:
    if isinstance(exc, yaml.reader.ReaderError):  # a character YAML does not allow: only an offset
        what = f"U+{exc.character:04X}" if isinstance(exc.character, int) else repr(exc.character)
        return YamlProblem(text.count("\n", 0, exc.position) + 1, f"character {what} is not allowed in YAML")
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    return YamlProblem(mark.line + 1 if mark else 1, str(getattr(exc, "problem", None) or exc))


def compose_yaml(text: str) -> list[yaml.Node]:
    """The nodes of every YAML document in `text` (safe tags only).

    Raises:
        YamlProblem: malformed YAML, or nesting too deep to read, never a RecursionError.
    """
    deep = _flow_too_deep(text)
    if deep is not None:
        raise YamlProblem(deep, f"[ and {{ nest deeper than {YAML_MAX_FLOW_DEPTH} levels")
    loader: yaml.SafeLoader | None = None
    nodes: list[yaml.Node] = []
    try:
        loader = yaml.SafeLoader(text)
        while loader.check_node():
            nodes.append(loader.get_node())
    except yaml.YAMLError as exc:
        raise _problem(exc, text) from None
    except RecursionError:
        raise YamlProblem(loader.line + 1 if loader is not None else 1, "nested too deeply to read") from None
    finally:
        if loader is not None:
            loader.dispose()
    _refuse_surrogates(nodes)
    return nodes


def _refuse_surrogates(nodes: list[yaml.Node]) -> None:
    """A double-quoted `"\\ud800"` decodes to a lone surrogate: not Unicode, it cannot be
    written back as UTF-8 (a path, a log line, a digest), so it is refused where it stands."""
    node = find_scalar(nodes, has_surrogate)
    if node is not None:
        raise YamlProblem(node.start_mark.line + 1, "a string holds a lone surrogate escape (not Unicode)")


def find_scalar(nodes: list[yaml.Node], predicate: Callable[[str], bool]) -> yaml.Node | None:
    """The first string scalar under `nodes` that `predicate` holds for (aliases walked once)."""
    stack, seen = list(nodes), set()
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.ScalarNode):
            if isinstance(node.value, str) and predicate(node.value):
                return node
        elif isinstance(node, yaml.MappingNode):
            stack.extend(part for pair in node.value for part in pair)
        elif isinstance(node, yaml.SequenceNode):
            stack.extend(node.value)
    return None


def construct_yaml(text: str, node: yaml.Node) -> Any:
    """The Python value of one composed document. Raises YamlProblem."""
    try:
        return yaml.SafeLoader(text).construct_document(node)
    except yaml.YAMLError as exc:
        raise _problem(exc, text) from None
    except RecursionError:
        raise YamlProblem(node.start_mark.line + 1, "nested too deeply to read") from None


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
        nodes = compose_yaml(text)
    except YamlProblem as exc:
        raise PolicyErrors([PolicyProblem(path, exc.line, "", f"malformed YAML: {exc.reason}")]) from None
    for node in nodes:
        if node is None:
            continue
        lines: dict[Loc, int] = {}
        dupes: list[tuple[int, Loc, str]] = []
        _node_lines(node, (), lines, dupes)
        if any(message == RECURSIVE_ALIAS for _, _, message in dupes):
            problems.extend(PolicyProblem(path, line, "", message) for line, _, message in dupes)
            continue
        try:
            data = construct_yaml(text, node)
        except YamlProblem as exc:
            problems.append(PolicyProblem(path, exc.line, "", f"malformed YAML: {exc.reason}"))
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
