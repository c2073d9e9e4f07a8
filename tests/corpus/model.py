"""The corpus case format (tests/corpus/README.md): pydantic models and the loader, shared by
the runner and the corpus server."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import jsonschema
import mcp_types as types
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

CASES = Path(__file__).resolve().parent / "cases"


class Step(BaseModel):
    """One `tools/call`: what the client sends, what the backend answers, what must happen."""

    model_config = ConfigDict(extra="forbid")
    call: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    result: dict[str, Any] = Field(default_factory=lambda: {"content": [{"type": "text", "text": "ok"}]})
    expect: Literal["allow", "block", "any"]
    note: str = ""


class Case(BaseModel):
    """One labelled case: the backend's tools, the calls, and whether the attack must be stopped."""

    model_config = ConfigDict(extra="forbid")
    id: str = Field(pattern=r"^[a-z0-9][a-z0-9_.-]*$")
    family: Literal["tool_poisoning", "injected_results", "obfuscated_shell", "encoded_secrets", "exfil_chains",
                    "ssrf", "url_exfil", "fetched_injection", "benign"]
    looks_like: Literal["tool_poisoning", "injected_results", "obfuscated_shell", "encoded_secrets", "exfil_chains",
                        "ssrf", "url_exfil", "fetched_injection"] | None = None
    expected: Literal["block", "allow"]
    why: str = Field(min_length=10)
    source: str = ""
    tools: list[dict[str, Any]] = Field(min_length=1)
    tools_later: list[dict[str, Any]] | None = None
    steps: list[Step] = Field(min_length=1)
    file: str = ""  # the corpus file it came from (set by the loader)

    @model_validator(mode="after")
    def _consistent(self) -> Case:
        benign = self.family == "benign"
        if benign != (self.expected == "allow"):
            raise ValueError("benign cases expect allow and attack cases expect block")
        if benign and self.looks_like is None:
            raise ValueError("a benign case names the family it looks like (looks_like)")
        if not benign and self.looks_like is not None:
            raise ValueError("only benign cases have looks_like")
        expects = {s.expect for s in self.steps}
        if benign and expects != {"allow"}:
            raise ValueError("every step of a benign case expects allow")
        if not benign and "block" not in expects:
            raise ValueError("an attack case has at least one step that expects block")
        for label, listing in (("tools", self.tools), ("tools_later", self.tools_later or [])):
            names = [t.get("name") for t in listing]
            if len(set(names)) != len(names) or not all(isinstance(n, str) for n in names):
                raise ValueError(f"{label}: every tool has a unique string name")
            for tool in listing:
                types.Tool.model_validate(tool)
                jsonschema.Draft202012Validator.check_schema(tool.get("inputSchema", {}))
        for i, step in enumerate(self.steps):
            types.CallToolResult.model_validate(step.result)
            listing = self.tools if self.tools_later is None or i == 0 else self.tools_later
            tool = next((t for t in listing if t["name"] == step.call), None)
            if tool is None:
                raise ValueError(f"step {i + 1} calls {step.call!r}, which the backend does not list then")
            errors = sorted(jsonschema.Draft202012Validator(tool.get("inputSchema", {})).iter_errors(step.arguments), key=str)
            if errors:
                raise ValueError(f"step {i + 1}: arguments do not match {step.call}'s inputSchema: {errors[0].message}")
        return self


class CorpusError(Exception):
    """A corpus file that cannot be used: names the file and, where known, the case."""


def load_file(path: Path) -> list[Case]:
    """The cases of one corpus file (a JSON list), each checked. Raises CorpusError naming the
    file and the case."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CorpusError(f"{path.name}: not readable JSON: {exc}") from None
    if not isinstance(data, list):
        raise CorpusError(f"{path.name}: a corpus file is a JSON list of cases")
    cases = []
    for i, raw in enumerate(data):
        label = raw.get("id", f"#{i + 1}") if isinstance(raw, dict) else f"#{i + 1}"
        try:
            cases.append(Case.model_validate({**raw, "file": str(path.resolve())} if isinstance(raw, dict) else raw))
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'case'}: {e['msg']}" for e in exc.errors())
            raise CorpusError(f"{path.name}: case {label}: {problems}") from None
    return cases


def load_cases(folder: Path = CASES) -> list[Case]:
    """Every case of every `*.json` file in `folder`, checked (valid schemas, arguments and
    results, consistent labels) and with unique ids. Raises CorpusError naming file and case."""
    files = sorted(folder.glob("*.json"))
    if not files:
        raise CorpusError(f"no corpus files (*.json) in {folder}")
    cases: list[Case] = []
    seen: dict[str, str] = {}
    for path in files:
        for case in load_file(path):
            if case.id in seen:
                raise CorpusError(f"{path.name}: case id {case.id!r} is also used in {seen[case.id]}")
            seen[case.id] = path.name
            cases.append(case)
    return cases


def find_case(path: Path, case_id: str) -> Case:
    """The case `case_id` of one corpus file (what the server serves)."""
    for case in load_file(path):
        if case.id == case_id:
            return case
    raise CorpusError(f"{path.name}: no case {case_id!r}")
