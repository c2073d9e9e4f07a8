"""The auditor's pages of `/ui`: the overview (auditor, admin) with "Verify now", the ledger with
`dharma audit query`'s filters and a record with its inclusion proof checked against the
checkpoint key (auditor, admin), and the loaded policy (every `/ui` role)."""

from __future__ import annotations

import base64
from urllib.parse import urlencode

import anyio
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from audit.errors import LedgerError
from audit.proofs import check_inclusion
from gateway.ledger_access import query_choices
from gateway.transports.http_api.audit import BadQuery, RecordsQuery, parse_query
from gateway.transports.ui.overview import (DEFAULT_RANGE, RANGES, VerifyBusy, aggregate, bucket_text, charts, fmt_ms,
                                            last_verification, settings_of, utc_text)
from gateway.transports.ui.web import AUDIT_ROLES, HEADERS, PREFIX, UI_ROLES, Refused, Ui

LEDGER_PAGE = 50


def chosen_range(value: str | None) -> str:
    """The overview's time range: the default when none is given, else one of RANGES."""
    if value is None or value == "":
        return DEFAULT_RANGE
    if value not in RANGES:
        raise Refused(400, f"range {value[:20]!r} is not one of: {', '.join(RANGES)}")
    return value


def ledger_routes(ui: Ui) -> list[Route]:
    """The ledger page and one record with its inclusion proof."""
    view = ui.view

    async def ledger(request: Request) -> Response:
        found = await ui.require(request, AUDIT_ROLES, "the ledger")
        values = {k: v for k, v in request.query_params.items() if v}
        error, rows, cursor = None, [], None
        try:
            query: RecordsQuery = parse_query(RecordsQuery, request, drop_empty=True)
            if "limit" not in values:
                query = query.model_copy(update={"limit": LEDGER_PAGE})
            rows, cursor = await view.page(query)
        except BadQuery as exc:
            error = str(exc)
        checkpoint = await view.checkpoint()
        more = None
        if cursor is not None:
            more = f"{PREFIX}/ledger?" + urlencode({**values, "cursor": str(cursor)})
        return await ui.page(request, "ledger.html", found, status=400 if error else 200, error=error, rows=rows, values=values,
                             choices=query_choices(), checkpoint=checkpoint, more=more)

    async def record(request: Request) -> Response:
        found = await ui.require(request, AUDIT_ROLES, "the ledger")
        seq = request.path_params["seq"]
        doc = await view.record(seq)
        if doc is None:
            raise Refused(404, f"there is no record {seq} in the ledger")
        keys = ui.gateway.keys
        try:
            verified, ok = check_inclusion(base64.b64decode(doc["record"]), doc["inclusion"], doc["inclusion"]["checkpoint"],
                                           keys.checkpoint_key.public_key(), keys.checkpoint_key_name), True
        except (LedgerError, KeyError, ValueError) as exc:
            verified, ok = str(exc), False
        return await ui.page(request, "record.html", found, doc=doc, entry=doc["entry"], proof=doc["inclusion"], verified=verified, ok=ok)

    return [
        Route(f"{PREFIX}/ledger", ui.guarded(ledger), methods=["GET"]),
        Route(PREFIX + "/ledger/{seq:int}", ui.guarded(record), methods=["GET"]),
    ]


def overview_routes(ui: Ui) -> list[Route]:
    """The overview page and its "Verify now" form."""
    view = ui.view

    async def overview(request: Request) -> Response:
        found = await ui.require(request, AUDIT_ROLES, "the overview")
        key = chosen_range(request.query_params.get("range"))
        got = await aggregate(view, RANGES[key])
        ov = got.overview
        verified = await anyio.to_thread.run_sync(last_verification, view)
        return await ui.page(request, "overview.html", found, ov=ov, size=got.size, charts=charts(ov), ranges=list(RANGES),
                             since=utc_text(ov.since), until=utc_text(ov.until), per=bucket_text(ov.step),
                             read_since=utc_text(ov.read_since) if ov.read_since else "",
                             range=key, verified=verified, p50=fmt_ms(ov.latency(50)), p99=fmt_ms(ov.latency(99)),
                             fmt_ms=fmt_ms, max_records=settings_of(view).overview_max_records)

    async def verify(request: Request) -> Response:
        found = await ui.require(request, AUDIT_ROLES, "verifying the ledger")
        fields = await ui.form(request)
        ui.checked_post(found, request, fields)
        key = chosen_range(fields.get("range"))
        try:
            result = await ui.verify_now(found[1].id)
        except VerifyBusy as exc:
            raise Refused(409, str(exc)) from None
        except ValueError as exc:
            raise Refused(413, str(exc)) from None
        said = (f"Verified: {result.size} records intact" if result.ok else
                f"Verification FAILED at record {result.first_bad_seq}: {result.problem}")
        await ui.sessions.set_flash(found[0], said)
        return RedirectResponse(f"{PREFIX}/overview?range={key}", status_code=303, headers=HEADERS)

    return [
        Route(f"{PREFIX}/overview", ui.guarded(overview), methods=["GET"]),
        Route(f"{PREFIX}/overview/verify", ui.guarded(verify), methods=["POST"]),
    ]


def policy_routes(ui: Ui) -> list[Route]:
    """The loaded policy's tiers, principals and rules with their `file:line`."""

    async def policy(request: Request) -> Response:
        found = await ui.require(request, UI_ROLES, "the policy page")
        return await ui.page(request, "policy.html", found, policy=ui.gateway.policy, policy_status=ui.gateway.policy_status())

    return [Route(f"{PREFIX}/policy", ui.guarded(policy), methods=["GET"])]
