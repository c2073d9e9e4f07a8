"""The last verification of a ledger, pass or fail, in a small JSON file cheap to read.

`dharma audit verify` and the overview page's "Verify now" both write it (`record_verify`); the
overview shows it (`last_verify`). Like `<ledger>.verified` (`audit.verify.write_stamp`, passes
only, read by queries) it is a reminder, not evidence: whoever can edit the ledger can edit this
file; re-run `dharma audit verify` to know.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

import structlog
from pydantic import BaseModel, ConfigDict, ValidationError

from audit.verify import VerifyReport

log = structlog.get_logger()

SUFFIX = ".last-verify.json"


class VerifyLog(BaseModel):
    """One verification: when, by which means and whom, and what it found."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ok: bool
    size: int
    root: str
    problem: str = ""
    first_bad_seq: int | None = None
    verified_at: str
    via: Literal["cli", "ui"]
    by: str | None = None
    seconds: float | None = None


def record_verify(path: Path, report: VerifyReport, *, via: Literal["cli", "ui"], by: str | None = None,
                  seconds: float | None = None) -> VerifyLog:
    """Write `report` to `path` (atomically); a directory that cannot be written is only logged."""
    entry = VerifyLog(ok=report.ok, size=report.size, root=report.root.hex(), problem="" if report.ok else report.problem,
                      first_bad_seq=report.first_bad_seq, verified_at=datetime.now(UTC).isoformat(timespec="seconds"),
                      via=via, by=by, seconds=None if seconds is None else round(seconds, 3))
    scratch = path.with_name(path.name + ".tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        scratch.write_text(entry.model_dump_json() + "\n", encoding="utf-8")
        os.replace(scratch, path)
    except OSError as exc:
        log.warning("ledger.verify_log_not_written", path=str(path), error=str(exc))
    return entry


def last_verify(path: Path) -> VerifyLog | str | None:
    """The last verification recorded at `path`; None when there is none; a sentence when it cannot be read."""
    try:
        return VerifyLog.model_validate_json(path.read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, ValidationError) as exc:
        return f"{path} is unreadable: {str(exc).splitlines()[0]}"
