"""Receipt: sign what the client receives, bound to the call's ledger position.

A compact JWS over the request and the response exactly as returned (see
`gateway.crypto.receipts`). Skipped when the ledger refused the call: that answer is final.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

import structlog

from audit.canon import NotCanonicalizable
from gateway.core.call import CallContext, Status
from gateway.crypto.receipts import KeyStore, build_receipt
from gateway.policy.compile import CompiledPolicy
from gateway.stages.record import safe_digest

log = structlog.get_logger()


class Receipt:
    name = "receipt"

    def __init__(self, keys: KeyStore, clock: Callable[[], float]) -> None:
        self.keys = keys
        self.clock = clock

    async def __call__(self, ctx: CallContext, policy: CompiledPolicy) -> None:
        if ctx.response is not None:
            return
        call, outcome, appended, body = ctx.call, ctx.outcome, ctx.appended, ctx.body
        assert outcome is not None and body is not None and ctx.entry is not None
        req = ctx.receipt_request if ctx.receipt_request is not None else {"tool": call.tool, "arguments": call.arguments}
        try:
            token = build_receipt(
                self.keys,
                request_id=call.request_id,
                request=req,
                request_sha256=safe_digest(req),
                response=body,
                ledger_seq=appended.seq,
                ledger_hash=appended.hash,
                now=datetime.fromtimestamp(self.clock(), UTC),
                response_sha256=ctx.response_digest,
            )
        except NotCanonicalizable:
            token = None
        ctx.outcome = outcome.signed(token, appended.seq, appended.hash, ctx.latency_us / 1000)
        response = dict(body)
        if token is not None:
            response["receipt"] = token
        ctx.response = response
        # one info line per refusal or failure; a call that went through logs at debug (the hot path)
        (log.debug if outcome.status is Status.OK else log.info)(
            "call.decided",
            request_id=call.request_id,
            tool=call.tool,
            principal=ctx.entry["principal"],
            decision=ctx.entry["decision"],
            status=ctx.entry["status"],
            seq=appended.seq,
        )
