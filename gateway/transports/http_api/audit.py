"""The auditor's HTTP API under `/v1/audit/`, for principals with role `auditor` or `admin`.

- `GET /v1/audit/records`: the filters of `dharma audit query`, one page (`limit`, then `cursor` =
  the last seq of the page before) streamed as `{"records": [...], "next_cursor": N | null}`.
- `GET /v1/audit/records/{seq}`: one record with its inclusion proof against the latest signed checkpoint.
- `GET /v1/audit/checkpoint`: the latest signed checkpoint (text/plain), signed afresh if the tree grew.
- `GET /v1/audit/consistency?from=M&to=N`: the consistency proof between two sizes, with both checkpoints.

Every request opens its own read-only ledger reader (SQLite file or PostgreSQL URL, as the
settings name it) and reads it in worker threads: the ledger is iterated, never loaded. Proofs
and filters are the CLI's (`audit.proofs`, `audit.query`); fresh checkpoints are signed by the
ledger's writer, as the periodic signer does, so they are stored too.
"""

from __future__ import annotations

import base64
import contextlib
import itertools
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, Literal

import anyio
import structlog
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from audit import proofs
from audit.canon import canonical_bytes
from audit.checkpoint import CheckpointSigner, parse_checkpoint
from audit.errors import LedgerError
from audit.query import call_rows, check_kind, check_time, query_records
from audit.records import index_fields, normalize_time
from gateway.core.errors import ConfigError, ErrorCode
from gateway.core.gateway import LEDGER_ORIGIN, Gateway
from gateway.ledger_access import ledger_location, open_ledger_reader, query_choices
from gateway.transports.http_api.common import credentials_from, error_envelope

log = structlog.get_logger()

AUDIT_ROLES = frozenset({"auditor", "admin"})
PAGE_SIZE = 100
"""Records per page when `limit` is not given."""
MAX_PAGE_SIZE = 1000
CHUNK = 64
"""Records read per worker-thread hop while a page streams."""


class BadQuery(Exception):
    """A query parameter the API cannot use; the message names it."""


class RecordsQuery(BaseModel):
    """The query string of `GET /v1/audit/records`: `dharma audit query`'s filters, a page, a view."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    principal: str | None = None
    tool: str | None = None
    decision: str | None = None
    status: str | None = None
    error_code: str | None = None
    rule: str | None = None
    policy_version: str | None = None
    request_id: str | None = None
    approval_id: str | None = None
    kind: str | None = None
    since: str | None = None
    until: str | None = None
    limit: int = Field(PAGE_SIZE, ge=1, le=MAX_PAGE_SIZE)
    cursor: int | None = Field(None, ge=0)
    show: Literal["calls", "records", "unknown"] = "calls"

    @field_validator("decision", "status", "error_code")
    @classmethod
    def _known(cls, value: str | None, info: Any) -> str | None:
        allowed = query_choices()[info.field_name]
        if value is not None and value not in allowed:
            raise ValueError(f"{value!r} is not one of: {', '.join(allowed)}")
        return value

    @field_validator("kind")
    @classmethod
    def _kind(cls, value: str | None) -> str | None:
        return None if value is None else check_kind(value)

    @field_validator("since", "until")
    @classmethod
    def _time(cls, value: str | None) -> str | None:
        return None if value is None else check_time(value)

    def filters(self) -> dict[str, Any]:
        """The keyword arguments of `audit.query.query_records`."""
        return self.model_dump(exclude={"limit", "cursor", "show"})


def parse_query(model: type[BaseModel], request: Request, *, drop_empty: bool = False) -> Any:
    """The query string as `model`; a repeated, unknown or bad parameter is a BadQuery naming it.
    `drop_empty` treats `name=` as absent (what an HTML form sends for a field left blank)."""
    items = [(name, value) for name, value in request.query_params.multi_items() if value or not drop_empty]
    seen: set[str] = set()
    for name, _ in items:
        if name in seen:
            raise BadQuery(f"query parameter `{name}` is given more than once")
        seen.add(name)
    try:
        return model.model_validate(dict(items))
    except ValidationError as exc:
        first = exc.errors()[0]
        name = ".".join(str(part) for part in first["loc"]) or "query"
        if first["type"] == "extra_forbidden":
            raise BadQuery(f"unknown query parameter `{name}`; expected some of {', '.join(model.model_fields)}") from None
        raise BadQuery(f"query parameter `{name}`: {first['msg'].removeprefix('Value error, ')}") from None


class ConsistencyQuery(BaseModel):
    """The query string of `GET /v1/audit/consistency`: two tree sizes, `from` <= `to`."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    old: int = Field(alias="from", ge=0)
    new: int = Field(alias="to", ge=0)


class LedgerView:
    """The ledger reads the auditor's HTTP API and the approvals page share: a reader per request
    (worker threads), a page of query hits, one record with its inclusion proof, the checkpoint."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway

    def location(self) -> Path | str:
        settings = getattr(self.gateway, "settings", None)
        if settings is not None:
            return ledger_location(settings)
        path = getattr(self.gateway.ledger, "path", None)
        if path is None:
            raise ConfigError("the gateway's ledger has no location to read it from")
        return Path(path)

    async def open_reader(self) -> Any:
        return await anyio.to_thread.run_sync(open_ledger_reader, self.location())

    def signer(self) -> CheckpointSigner:
        keys = self.gateway.keys
        return CheckpointSigner(keys.checkpoint_key, keys.checkpoint_key_name, LEDGER_ORIGIN)

    async def latest_checkpoint(self, reader: Any, covering: int) -> str:
        """The latest stored checkpoint; a fresh one, signed and stored by the writer, if it covers fewer than `covering` records."""
        note = await anyio.to_thread.run_sync(reader.latest_checkpoint)
        if note is None or parse_checkpoint(note).size < covering:
            keys = self.gateway.keys
            note = await self.gateway.ledger.checkpoint(keys.checkpoint_key, keys.checkpoint_key_name, LEDGER_ORIGIN)
        return str(note)

    async def checkpoint(self) -> str:
        """A signed checkpoint covering every record there is now."""
        with contextlib.closing(await self.open_reader()) as reader:
            size = await anyio.to_thread.run_sync(reader.size)
            return await self.latest_checkpoint(reader, size)

    async def record(self, seq: int) -> dict[str, Any] | None:
        """Record `seq` (`seq`, `hash`, `record`: its bytes in base64, `entry`) with its verified
        inclusion proof anchored to the latest signed checkpoint, or None if there is no such record."""
        with contextlib.closing(await self.open_reader()) as reader:
            stored = await anyio.to_thread.run_sync(reader.get, seq)
            if stored is None:
                return None
            note = await self.latest_checkpoint(reader, seq)
            size = parse_checkpoint(note).size
            sign = self.signer()
            proof = await anyio.to_thread.run_sync(proofs.inclusion, reader, seq, size, sign)
            proof["checkpoint"] = await anyio.to_thread.run_sync(proofs.anchor_checkpoint, reader, sign, size,
                                                                 bytes.fromhex(proof["root"]))
        return {"seq": stored.seq, "hash": stored.hash, "record": base64.b64encode(stored.body).decode("ascii"),
                "entry": stored.to_dict(), "inclusion": proof}

    async def page(self, query: RecordsQuery) -> tuple[list[dict[str, Any]], int | None]:
        """One page of the query's rows and the cursor of the next page (None on the last)."""
        with contextlib.closing(await self.open_reader()) as reader:
            def read() -> list[dict[str, Any]]:
                rows = page_rows(reader, query)
                try:
                    return list(itertools.islice(rows, query.limit + 1))
                finally:
                    rows.close()  # type: ignore[attr-defined]

            found = await anyio.to_thread.run_sync(read)
        more = len(found) > query.limit
        found = found[: query.limit]
        return found, (found[-1]["seq"] if more else None)


def audit_routes(gateway: Gateway) -> list[Route]:
    """The `/v1/audit/` routes over `gateway`'s ledger."""
    view = LedgerView(gateway)

    def refusal(request: Request) -> Response | None:
        principal = gateway.principal_for(credentials_from(request))
        if principal is None:
            return JSONResponse(error_envelope("", ErrorCode.UNAUTHENTICATED, "no valid credentials"), status_code=401)
        if not AUDIT_ROLES & set(principal.roles):
            return JSONResponse(error_envelope("", ErrorCode.FORBIDDEN, "the audit API needs a principal with role auditor or admin"),
                                status_code=403)
        return None

    async def records(request: Request) -> Response:
        query: RecordsQuery = parse_query(RecordsQuery, request)
        reader = await view.open_reader()
        try:
            rows = await anyio.to_thread.run_sync(page_rows, reader, query)
        except BaseException:
            reader.close()
            raise
        return StreamingResponse(stream_page(reader, rows, query.limit), media_type="application/json")

    async def record(request: Request) -> Response:
        seq = request.path_params["seq"]
        found = await view.record(seq)
        if found is None:
            return JSONResponse(error_envelope("", ErrorCode.INVALID_PARAMS, f"no record {seq} in the ledger"), status_code=404)
        return JSONResponse(found)

    async def checkpoint(request: Request) -> Response:
        return PlainTextResponse(await view.checkpoint(), headers={"cache-control": "no-store"})

    async def consistency(request: Request) -> Response:
        query: ConsistencyQuery = parse_query(ConsistencyQuery, request)
        with contextlib.closing(await view.open_reader()) as reader:
            size = await anyio.to_thread.run_sync(reader.size)
            if not query.old <= query.new <= size:
                raise BadQuery(f"query parameters `from` {query.old} and `to` {query.new}: need from <= to <= {size} (the ledger size)")
            sign = view.signer()
            doc = await anyio.to_thread.run_sync(proofs.consistency, reader, query.old, query.new, sign)
            doc["checkpoint"] = await anyio.to_thread.run_sync(proofs.anchor_checkpoint, reader, sign, query.new, bytes.fromhex(doc["root"]))
            doc["old_checkpoint"] = await anyio.to_thread.run_sync(proofs.anchor_checkpoint, reader, sign, query.old,
                                                                   bytes.fromhex(doc["old_root"]))
        return JSONResponse(doc)

    def guarded(endpoint: Any) -> Any:
        """Refuse callers without the role; a bad parameter is a 400 naming it; a ledger that cannot
        be read or proven (tampered, gone) a 500 saying why, never a traceback."""

        async def answer(request: Request) -> Response:
            if (refused := refusal(request)) is not None:
                return refused
            try:
                return await endpoint(request)  # type: ignore[no-any-return]
            except BadQuery as exc:
                return JSONResponse(error_envelope("", ErrorCode.INVALID_PARAMS, str(exc)), status_code=400)
            except (LedgerError, ConfigError) as exc:
                log.error("audit_api.failed", path=request.url.path, error=str(exc))
                return JSONResponse(error_envelope("", ErrorCode.INTERNAL_ERROR, f"the ledger cannot answer: {exc}"), status_code=500)

        return answer

    return [
        Route("/v1/audit/records", guarded(records), methods=["GET"]),
        Route("/v1/audit/records/{seq:int}", guarded(record), methods=["GET"]),
        Route("/v1/audit/checkpoint", guarded(checkpoint), methods=["GET"]),
        Route("/v1/audit/consistency", guarded(consistency), methods=["GET"]),
    ]


async def stream_page(reader: Any, rows: Iterator[dict[str, Any]], limit: int) -> AsyncIterator[bytes]:
    """Write one page as a JSON object, a chunk of records at a time; the reader is closed at the end.

    `next_cursor` is the page's last seq when more records match, else null. A failure after the
    first bytes ends the object with `"error"` (the status line has gone already).
    """
    sent, last, more = 0, None, False
    try:
        yield b'{"records":['
        while not more:
            chunk = await anyio.to_thread.run_sync(lambda: list(itertools.islice(rows, CHUNK)))
            for row in chunk:
                if sent == limit:
                    more = True
                    break
                yield (b"," if sent else b"") + canonical_bytes(row)
                sent, last = sent + 1, row["seq"]
            if len(chunk) < CHUNK:
                break
        tail: dict[str, Any] = {"next_cursor": last if more else None}
    except (LedgerError, OSError) as exc:
        log.error("audit_api.stream_failed", error=str(exc), sent=sent)
        tail = {"next_cursor": None, "error": f"the ledger could not be read past seq {last}: {exc}"}
    finally:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(_close, rows, reader)
    yield b"]," + canonical_bytes(tail)[1:]


def page_rows(reader: Any, query: RecordsQuery) -> Iterator[dict[str, Any]]:
    """The matching rows after `cursor`, in the query's order, as `dharma audit query` shows them (lazily).

    Queries are ordered by (time, seq), so the cursor's record gives the time to restart from: the
    indexed `since` skips what lies before it, and the rows at that same time up to the cursor are dropped.
    """
    filters = query.filters()
    after: tuple[str, int] | None = None
    if query.cursor is not None:
        stored = reader.get(query.cursor)
        if stored is None:
            raise BadQuery(f"query parameter `cursor`: no record {query.cursor} in the ledger")
        after = (index_fields(stored.to_dict()).time or "", query.cursor)
        if after[0] and (filters["since"] is None or normalize_time(filters["since"]) < after[0]):
            filters["since"] = after[0]
    matched = query_records(reader, **filters)
    found: Iterator[dict[str, Any]] = matched
    if after is not None:
        found = (row for row in matched if (index_fields(row).time or "", row["seq"]) > after)
    return _closing_rows(matched, call_rows(reader, found, show=query.show))


def _closing_rows(source: Any, rows: Iterator[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    try:
        yield from rows
    finally:
        close = getattr(source, "close", None)
        if close is not None:
            close()


def _close(rows: Any, reader: Any) -> None:
    try:
        rows.close()
    finally:
        reader.close()
