"""Live policy reload: what an attempt records and how the gateway reports the policy it serves.

A reload loads and compiles the policy files in full (everything `dharma check` checks of a
profile: YAML, the schema, `extends`, rule sets, CEL compilation), records the attempt in the
karma ledger (`kind: "reload"`), and only then swaps the compiled policy in, as one reference
assignment: a call reads the policy once when it starts and finishes under it. A policy that
does not load, or an attempt the ledger cannot record, leaves the last good policy serving.
No I/O here: the loader the gateway is given reads the files.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from audit.records import KIND_RELOAD
from gateway.core.errors import PolicyProblem

Trigger = Literal["file", "signal", "http", "api"]
"""What asked for a reload: a watched file changed, SIGHUP, `POST /v1/admin/reload`, or Python."""


class ReloadAttempt(BaseModel):
    """One reload attempt, as `/healthz`, the approvals page and `Gateway.reload()` report it."""

    model_config = ConfigDict(frozen=True)

    at: str
    trigger: Trigger
    by: str | None
    ok: bool
    old_version: str
    new_version: str | None
    changed: bool
    error: str | None = None
    problems: list[str] = []
    ledger_seq: int | None = None


class PolicyStatus(BaseModel):
    """The policy being served and the last reload attempt. `state` is "degraded" while the last
    attempt failed: the gateway still serves the last good policy (so `/healthz` stays 200)."""

    model_config = ConfigDict(frozen=True)

    name: str
    version: str
    files: list[str]
    loaded_at: str
    state: Literal["ok", "degraded"]
    last_reload: ReloadAttempt | None = None


def failure_text(problems: list[PolicyProblem]) -> str:
    """One line for logs and status: the first problem (`file:line [rule] error: …`) and how many more."""
    if not problems:
        return "the policy did not load"
    more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
    return f"{problems[0]}{more}"


def reload_entry(attempt: ReloadAttempt, *, serving: str, files: list[str]) -> dict[str, Any]:
    """The ledger record of one reload attempt (contract: keep every field and its meaning; see
    `audit.records.KIND_RELOAD`)."""
    entry: dict[str, Any] = {
        "kind": KIND_RELOAD,
        "time": attempt.at,
        "trigger": attempt.trigger,
        "by": attempt.by,
        "ok": attempt.ok,
        "old_version": attempt.old_version,
        "new_version": attempt.new_version,
        "policy_version": serving,
        "changed": attempt.changed,
        "files": files,
        # null, present as in every record: these name one call's records and decision, and this is neither
        "request_id": None,
        "decision": None,
    }
    if not attempt.ok:
        entry["error"] = attempt.error
        entry["problems"] = attempt.problems
    return entry
