"""The demo backend `make run` serves: file tools in a sandbox directory, a search tool, and a
health-records tool over synthetic data. Plain Python callables behind a CallableBackend."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from gateway.core.backends import ToolSpec
from gateway.transports.upstreams.python import CallableBackend

SANDBOX = Path(os.environ.get("DHARMA_DEMO_SANDBOX", Path(__file__).resolve().parent / "sandbox"))
NO_RECORDS = {"content": [{"type": "text", "text": "No matching records found."}]}

DOCUMENTS = {
    "gateway-overview": "Dharma Gateway governs agent tool calls: rules, approvals, a karma ledger, receipts.",
    "ledger-howto": "Run `dharma audit verify` to recompute the karma ledger and find tampering.",
    "policy-howto": "Policies are YAML with CEL conditions; `dharma test` runs their test cases.",
}

PATIENTS = {
    "p-1001": {"name": "Ada Example", "dob": "1970-01-01", "conditions": ["hypertension"], "ssn": "123-45-6789"},
    "p-1002": {"name": "Ben Sample", "dob": "1985-06-15", "conditions": ["asthma"], "ssn": "219-09-9999"},
}


def text(value: str) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": value}]}


def _inside(path: str) -> Path:
    """Resolve a sandbox-relative path; the backend's own last line of defence."""
    target = (SANDBOX / path).resolve()
    if target != SANDBOX.resolve() and SANDBOX.resolve() not in target.parents:
        raise ValueError(f"{path!r} is outside the sandbox")
    return target


def read_file(path: str) -> dict[str, Any]:
    return text(_inside(path).read_text(encoding="utf-8"))


def write_file(path: str, content: str) -> dict[str, Any]:
    target = _inside(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(content, encoding="utf-8")
    return text(f"wrote {len(content)} characters to {path}")


def list_directory(path: str = ".") -> dict[str, Any]:
    return text("\n".join(sorted(p.name for p in _inside(path).iterdir())))


def delete_file(path: str) -> dict[str, Any]:
    _inside(path).unlink()
    return text(f"deleted {path}")


def search(query: str, depth: str = "shallow") -> dict[str, Any]:
    hits = [k for k, v in DOCUMENTS.items() if query.lower() in v.lower() or query.lower() in k]
    if not hits:
        return text("no results")
    if depth == "deep":
        return text("\n\n".join(f"{k}: {DOCUMENTS[k]}" for k in hits))
    return text(", ".join(hits))


def health_records(patient_id: str) -> dict[str, Any]:
    record = PATIENTS.get(patient_id)
    if record is None:
        return dict(NO_RECORDS)
    lines = [f"{k}: {', '.join(v) if isinstance(v, list) else v}" for k, v in record.items()]
    return text("\n".join(lines))


def _schema(**props: str) -> dict[str, Any]:
    required = [k for k in props if not k.endswith("?")]
    return {
        "type": "object",
        "properties": {k.rstrip("?"): {"type": "string", "description": d} for k, d in props.items()},
        "required": required,
        "additionalProperties": False,
    }


TOOLS = {
    "read_file": (read_file, ToolSpec("read_file", "Read a text file in the sandbox.", _schema(path="sandbox-relative path"), annotations={"readOnlyHint": True})),
    "write_file": (write_file, ToolSpec("write_file", "Write a text file in the sandbox.", _schema(path="sandbox-relative path", content="text"), annotations={"destructiveHint": True})),
    "list_directory": (list_directory, ToolSpec("list_directory", "List a sandbox directory.", _schema(**{"path?": "sandbox-relative path"}), annotations={"readOnlyHint": True})),
    "delete_file": (delete_file, ToolSpec("delete_file", "Delete a file in the sandbox.", _schema(path="sandbox-relative path"), annotations={"destructiveHint": True})),
    "search": (search, ToolSpec("search", "Search the demo documents.", _schema(query="words to find", **{"depth?": "shallow or deep"}), annotations={"readOnlyHint": True})),
    "health_records": (health_records, ToolSpec("health_records", "Look up a patient's health record (synthetic data).", _schema(patient_id="e.g. p-1001"), annotations={"readOnlyHint": True})),
}


def backend(backend_id: str = "demo") -> CallableBackend:
    """The demo backend (seeds the sandbox with one file on first use)."""
    SANDBOX.mkdir(parents=True, exist_ok=True)
    readme = SANDBOX / "README.txt"
    if not readme.exists():
        readme.write_text("This is the Dharma Gateway demo sandbox.\n", encoding="utf-8")
    return CallableBackend(backend_id, TOOLS)
