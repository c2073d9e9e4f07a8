"""optimisations: what each non-obvious optimisation of the governed call pays, side by side (issue 26).

    python -m bench.optimisations [--rounds 12] [--quick]

Each row times a plain form and the optimised form of one piece of per-call work in this process,
alternating them round by round (the order flipped every round), so a drift of the machine's speed
falls on both alike. A row's figure is the median over rounds of (plain - optimised) per call, scaled
by how many times a governed call does that work. Forms the gateway no longer ships (removed by
issue 26 because they paid under ~10 µs a call) are kept here, as they were, so the figure can be
reproduced. The CEL fast path is measured at the level it matters: the decision on each shipped
profile (`policies/*.yaml` with their rule sets) and a whole governed call (`bench.governed`'s setup,
durable SQLite ledger, receipt) with the policy compiled with and without it; CPU time per call.
Not part of `python -m bench`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import os
import secrets
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import structlog
import yaml

from bench import positive, quiet_logging, table
from bench.policygen import OPERATOR_KEY, STANDARD, backend, profile_document, standard_document

Row = list[str]


# ---- the forms removed by issue 26, kept to reproduce their figures ----------------------------

_IDS_PER_BLOCK = 512
_blocks: dict[int, bytes] = {}
_numbers = iter(range(1 << 62))


def block_request_id() -> str:
    """The request id cut from shared blocks of random bytes (gateway.core.gateway before issue 26)."""
    block, index = divmod(next(_numbers), _IDS_PER_BLOCK)
    data = _blocks.get(block)
    if data is None:
        data = _blocks.setdefault(block, secrets.token_bytes(8 * _IDS_PER_BLOCK))
        for done in [b for b in list(_blocks) if b < block - 1]:
            _blocks.pop(done, None)
    index *= 8
    return "req_" + data[index:index + 8].hex()


def plain_request_id() -> str:
    return "req_" + secrets.token_hex(8)


def settle(proxy: Any) -> tuple[Any, bool]:
    """audit.hotlog.settle before issue 26: the logger structlog settled on, and whether it drops debug."""
    import logging

    bound = proxy.bind()
    if proxy.bind() is not bound:
        return proxy, False
    enabled = getattr(bound, "is_enabled_for", None)
    return bound, enabled is not None and not enabled(logging.DEBUG)


class Deadline:
    """gateway.transports.mcp_http.forward.Deadline before issue 26: asyncio.timeout for a known loop."""

    __slots__ = ("_loop", "_seconds", "_task", "_cancelling", "_handle", "_expired")

    def __init__(self, seconds: float, loop: asyncio.AbstractEventLoop) -> None:
        self._loop, self._seconds, self._handle, self._expired = loop, seconds, None, False

    async def __aenter__(self) -> None:
        task = asyncio.current_task(self._loop)
        assert task is not None
        self._task, self._cancelling = task, task.cancelling()
        self._handle = self._loop.call_later(self._seconds, self._expire)

    def _expire(self) -> None:
        self._expired = True
        self._task.cancel()

    async def __aexit__(self, kind: Any, exc: Any, tb: Any) -> None:
        if self._handle is not None:
            self._handle.cancel()
        if self._expired and self._task.uncancel() <= self._cancelling and kind is asyncio.CancelledError:
            raise TimeoutError from exc


@functools.lru_cache(maxsize=256)
def cached_rfc3339(ts: float) -> str:
    """gateway.stages.record.rfc3339 before issue 26: formatted by hand, cached."""
    d = datetime.fromtimestamp(ts, UTC)
    return (f"{d.year:04d}-{d.month:02d}-{d.day:02d}T{d.hour:02d}:{d.minute:02d}:{d.second:02d}"
            f".{d.microsecond:06d}Z")


# ---- side by side ---------------------------------------------------------------------------------


def side_by_side(plain: Callable[[], Any], fast: Callable[[], Any], rounds: int, n: int) -> tuple[float, float, float]:
    """(plain, optimised, median of plain - optimised) seconds per run, rounds alternating."""
    a: list[float] = []
    b: list[float] = []
    clock = time.perf_counter
    for r in range(rounds):
        for fn, out in ((plain, a), (fast, b)) if r % 2 == 0 else ((fast, b), (plain, a)):
            fn()
            t0 = clock()
            for _ in range(n):
                fn()
            out.append((clock() - t0) / n)
    return statistics.median(a), statistics.median(b), statistics.median(x - y for x, y in zip(a, b, strict=True))


def _row(name: str, where: str, per_call: int, timed: tuple[float, float, float], verdict: str) -> Row:
    plain, fast, gain = timed
    return [name, where, str(per_call), f"{plain * 1e6:.2f}", f"{fast * 1e6:.2f}", f"{gain * per_call * 1e6:+.2f}", verdict]


def micro_rows(rounds: int, n: int) -> list[Row]:
    from gateway.stages.record import rfc3339

    rows = [_row("request id from shared random blocks", "gateway/core/gateway.py (removed)", 1,
                 side_by_side(plain_request_id, block_request_id, rounds, n), "removed")]

    stamp = [time.time()]

    def cached() -> None:
        stamp[0] += 1e-6
        for _ in range(3):
            cached_rfc3339(stamp[0])

    def iso() -> None:
        stamp[0] += 1e-6
        for _ in range(3):
            rfc3339(stamp[0])

    rows.append(_row("cached RFC 3339 timestamp (3 formats a call)", "gateway/stages/record.py (removed)", 1,
                     side_by_side(iso, cached, rounds, n), "removed"))

    from gateway.logging import configure_logging

    with open(os.devnull, "w") as sink, contextlib.redirect_stderr(sink):
        configure_logging("info")
        proxy = structlog.get_logger("bench.optimisations")
        proxy.info("first use")  # the proxy settles on its logger
        settled = settle(proxy)

        def shim() -> None:
            logger, quiet = settled
            if not quiet:
                logger.debug("ledger.batch_committed", first_seq=1, count=1, ms=0.1)

        def direct() -> None:
            proxy.debug("ledger.batch_committed", first_seq=1, count=1, ms=0.1)

        rows.append(_row("settled-logger shim (2 debug lines a call)", "audit/hotlog.py (removed)", 2,
                         side_by_side(direct, shim, rounds, n), "removed"))
    quiet_logging()
    rows += _json_rows(rounds, n)
    rows += _stores_rows(rounds, n)
    rows += _http_rows(rounds, n)
    rows.append(_row("Deadline instead of asyncio.timeout", "gateway/transports/mcp_http/forward.py (removed)", 1,
                     _deadline(rounds, n // 4), "removed"))
    rows.append(_row("one-statement commit instead of BEGIN…COMMIT", "audit/sqlite.py `_write` (removed)", 2,
                     _commit(rounds, max(50, n // 100)), "removed"))
    return rows


def _json_rows(rounds: int, n: int) -> list[Row]:
    """`/mcp`'s JSON: the request and the upstream's answer decoded (the full strict path is what a
    `bytearray` takes), the forwarded call and the answer written (the `json` encoder is `_COMPACT`)."""
    from gateway.crypto import strict_json
    from gateway.mcp import jsonrpc

    request = b'{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"echo","arguments":{"text":"hello"}}}'
    answer = (b'{"jsonrpc":"2.0","id":7,"result":{"content":[{"type":"text","text":"hello"}],'
              b'"structuredContent":{"result":"hello"},"isError":false}}')
    out = {"jsonrpc": "2.0", "id": 7, "result": {**strict_json.loads(answer)["result"], "_meta": {
        "io.dharma/decision": {"status": "ok", "error_code": None, "retryable": False, "request_id": "r" * 26,
                               "receipt": "x" * 420}}}}

    def loads_full() -> None:
        strict_json.loads(bytearray(request)), strict_json.loads(bytearray(answer))

    def loads_fast() -> None:
        strict_json.loads(request), strict_json.loads(answer)

    request_value = strict_json.loads(request)

    def dumps_msgspec() -> None:
        jsonrpc.dumps(out), jsonrpc.dumps(request_value)

    def dumps_json() -> None:
        jsonrpc._COMPACT(out).encode(), jsonrpc._COMPACT(request_value).encode()

    return [_row("strict JSON by msgspec when compact (request + answer)", "audit/strict_json.py `_compact`", 1,
                 side_by_side(loads_full, loads_fast, rounds, n), "kept"),
            _row("jsonrpc.dumps by msgspec when plain (forward + answer)", "gateway/mcp/jsonrpc.py `dumps`", 1,
                 side_by_side(dumps_json, dumps_msgspec, rounds, n), "kept")]


def _stores_rows(rounds: int, n: int) -> list[Row]:
    """The legacy session's copy on load, and the pin file's "unchanged?" look."""
    from gateway.stores.base import SessionFacts
    from gateway.stores.memory_sessions import detached

    facts = SessionFacts(id="dgs_" + "x" * 43, principal="alice", nonce="0a1b2c3d4e5f", version="2025-11-25",
                         capabilities={"roots": {"listChanged": True}, "sampling": {}, "elicitation": {"form": {}}},
                         upstream_sids={"default": "up-session-1"}, upstream_versions={"default": "2025-11-25"})
    rows = [_row("session facts copied field by field", "gateway/stores/memory_sessions.py `detached`", 1,
                 side_by_side(lambda: facts.model_copy(deep=True), lambda: detached(facts), rounds, n), "kept")]
    with tempfile.NamedTemporaryFile(prefix="dharma-bench-pins-") as f:
        fd, name = f.fileno(), f.name
        rows.append(_row("pin file: fstat of a kept descriptor", "gateway/stores/file_pins.py:39-90", 1,
                         side_by_side(lambda: os.stat(name), lambda: os.fstat(fd), rounds, n), "kept"))
    return rows


def _http_rows(rounds: int, n: int) -> list[Row]:
    """`/mcp`'s front: the auth guard's route table and one-pass header scan, the header-map memo."""
    from starlette.datastructures import Headers

    from gateway.transports.http_auth import STRIPPED_HEADERS, HttpAuth
    from gateway.transports.mcp_http.headers import header_map

    auth = HttpAuth(None, resource_url="http://127.0.0.1:8080/mcp", protect=("/mcp", "/v1/"), defer=("/v1/tools",),
                    anonymous={"/healthz": "anonymous"})  # type: ignore[arg-type]

    def routes() -> Any:
        return auth._under("/mcp", auth.protect), auth._anonymous_user("/mcp"), auth._under("/mcp", auth.defer)

    table: dict[str, Any] = {}

    def memoised() -> Any:
        known = table.get("/mcp")
        if known is None:
            known = table["/mcp"] = routes()
        return known

    rows = [_row("auth guard: route answers memoised by path", "gateway/transports/http_auth.py (removed)", 1,
                 side_by_side(routes, memoised, rounds, n), "removed")]
    raw = [(b"host", b"127.0.0.1:8080"), (b"content-type", b"application/json"), (b"content-length", b"212"),
           (b"accept", b"application/json, text/event-stream"), (b"authorization", b"Bearer dk_" + b"x" * 40),
           (b"mcp-protocol-version", b"2025-11-25"), (b"mcp-session-id", b"dgs_" + b"y" * 43),
           (b"user-agent", b"python-httpx/0.28.1"), (b"accept-encoding", b"gzip, deflate")]

    def starlette() -> Any:
        h = Headers(raw=raw)
        return (h.get("origin"), h.getlist("authorization"), h.getlist("x-api-key"),
                [p for p in raw if p[0].lower() not in STRIPPED_HEADERS])

    def one_pass() -> Any:
        origin, authorization, api_keys, kept = None, [], [], []
        for pair in raw:
            name = pair[0]
            if name == b"origin":
                origin = origin or pair[1].decode("latin-1")
            elif name == b"authorization":
                authorization.append(pair[1].decode("latin-1"))
            elif name == b"x-api-key":
                api_keys.append(pair[1].decode("latin-1"))
            if name.lower() not in STRIPPED_HEADERS:
                kept.append(pair)
        return origin, authorization, api_keys, kept

    rows.append(_row("auth guard: one pass over the headers", "gateway/transports/http_auth.py (removed)", 1,
                     side_by_side(starlette, one_pass, rounds, n), "removed"))
    schema = {"type": "object", "properties": {"path": {"type": "string", "x-mcp-header": "Path"},
                                               "text": {"type": "string"}, "n": {"type": "integer"}}}
    maps: dict[int, Any] = {}

    def memo_map() -> Any:
        hit = maps.get(id(schema))
        if hit is not None and hit[0] is schema:
            return hit[1]
        maps[id(schema)] = (schema, header_map(schema))
        return maps[id(schema)][1]

    rows.append(_row("header map memo (3 looks a call)", "gateway/transports/mcp_http/headers.py (removed)", 3,
                     side_by_side(lambda: header_map(schema), memo_map, rounds, n), "removed"))
    from gateway.transports.upstreams.http1 import HttpPool

    pool = HttpPool("up", "http://127.0.0.1:9000/mcp")
    up = {"content-type": "application/json", "accept": "application/json, text/event-stream",
          "mcp-protocol-version": "2025-11-25", "mcp-session-id": "f3b1c0de" * 4, "traceparent": "00-" + "a" * 32 + "-" + "b" * 16 + "-01"}

    heads: dict[tuple[object, ...], bytes] = {}

    def memoised() -> bytes:
        key = ("POST", *up.items())
        head = heads.get(key)
        if head is None:
            head = heads[key] = pool._head("POST", up)
        return head

    rows.append(_row("upstream request head memo", "gateway/transports/upstreams/http1.py (removed)", 1,
                     side_by_side(lambda: pool._head("POST", up), memoised, rounds, n), "removed"))
    from gateway.transports.groups import Group

    group = Group("files", ("read_*", "list_*", "search_docs"))
    seen: dict[str, bool] = {}

    def member() -> bool:
        known = seen.get("search_docs")
        if known is None:
            known = seen["search_docs"] = group.has("search_docs")
        return known

    rows.append(_row("tool group membership memo", "gateway/transports/groups.py (removed)", 1,
                     side_by_side(lambda: group.has("search_docs"), member, rounds, n), "removed"))
    return rows + [_infos_row(rounds, n, True), _infos_row(rounds, n, False), _findings_row(rounds, n)]


def _findings_row(rounds: int, n: int) -> Row:
    """The called tool's definition scan (instructions, tool references), memoised per digest."""
    from gateway.mcp import governance as gov
    from gateway.stages.sanitizer.instructions import scan_definition

    definition = {"name": "read_file", "description": "Read a text file under the workspace root and return it.",
                  "inputSchema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}
    digest, names = gov.definition_digest(definition), frozenset({"read_file", "write_file", "search_docs"})
    return _row("definition findings memo", "gateway/mcp/governance.py:113-124", 1,
                side_by_side(lambda: scan_definition(definition, names),
                             lambda: gov.definition_findings(definition, digest, names), rounds, max(200, n // 20)), "kept")


def _infos_row(rounds: int, n: int, same_name: bool) -> Row:
    """`tools/call`'s ToolInfo of the called tool, built from its catalog entry or memoised."""
    from gateway.mcp import governance as gov

    definition = {"name": "read_file", "description": "Read a text file under the workspace root and return it.",
                  "inputSchema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
                  "annotations": {"readOnlyHint": True}}
    digest = gov.definition_digest(definition)
    names = frozenset({"read_file", "write_file", "list_directory", "search_docs"})
    infos: dict[tuple[Any, ...], Any] = {}

    name = "read_file" if same_name else "files_read_file"

    def build() -> Any:  # a prefixed name's renamed definition is digested anew
        return gov.tool_info({**definition, "name": name}, "default", changed=False,
                             digest=digest if same_name else None, accepted=False, names=names)

    def memoised() -> Any:
        key = ("default", name, digest, False, False, names)
        info = infos.get(key)
        if info is None:
            info = infos[key] = build()
        return info

    what = "" if same_name else ", prefixed name"
    return _row(f"ToolInfo memo of the called tool{what}", "gateway/mcp/calls.py (removed)", 1,
                side_by_side(build, memoised, rounds, n), "removed")


def _deadline(rounds: int, n: int) -> tuple[float, float, float]:
    async def main() -> tuple[float, float, float]:
        loop = asyncio.get_running_loop()
        a: list[float] = []
        b: list[float] = []
        for r in range(rounds):
            for kind, out in (("plain", a), ("fast", b)) if r % 2 == 0 else (("fast", b), ("plain", a)):
                t0 = time.perf_counter()
                for _ in range(n):
                    async with (asyncio.timeout(30.0) if kind == "plain" else Deadline(30.0, loop)):
                        pass
                out.append((time.perf_counter() - t0) / n)
        return statistics.median(a), statistics.median(b), statistics.median(x - y for x, y in zip(a, b, strict=True))

    return asyncio.run(main())


def _commit(rounds: int, n: int) -> tuple[float, float, float]:
    """CPU per commit of one row in WAL mode, synchronous FULL (the ledger's default): one INSERT in
    autocommit against BEGIN IMMEDIATE; INSERT; COMMIT. Process CPU, so the sync's wait is not counted."""
    with tempfile.TemporaryDirectory(prefix="dharma-bench-opt-") as tmp:
        conn = sqlite3.connect(str(Path(tmp) / "t.db"), isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("CREATE TABLE r(seq INTEGER PRIMARY KEY, body BLOB, digest BLOB)")
        row = (b"x" * 600, b"d" * 32)

        def one() -> None:
            conn.execute("INSERT INTO r(body, digest) VALUES (?, ?)", row)

        def wrapped() -> None:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT INTO r(body, digest) VALUES (?, ?)", row)
            conn.execute("COMMIT")

        a: list[float] = []
        b: list[float] = []
        for r in range(rounds):
            for fn, out in ((wrapped, a), (one, b)) if r % 2 == 0 else ((one, b), (wrapped, a)):
                t0 = time.process_time()
                for _ in range(n):
                    fn()
                out.append((time.process_time() - t0) / n)
        conn.close()
    return statistics.median(a), statistics.median(b), statistics.median(x - y for x, y in zip(a, b, strict=True))


# ---- the ledger's inline commit and the CEL fast path, on whole calls -------------------------------


def profile_policy(tmp: Path, profile: Path, fast: bool, guards: bool = True) -> Any:
    """A shipped profile (benchmark principal first, rate limits raised), compiled with or without the
    CEL fast path and the rules' static guards (`has(args.x) && …` and the like, gateway/policy/compile.py)."""
    from gateway.policy import cel
    from gateway.policy import compile as compiler

    principal = dict(profile_document([])["principals"][0])
    tiers = [t["name"] for t in yaml.safe_load(profile.read_text(encoding="utf-8"))["tiers"]]
    principal["tier"] = "operator" if "operator" in tiers else tiers[0]
    doc, missing = standard_document(principal, profile)
    if missing:
        raise SystemExit(f"{profile}: rule sets missing: {missing}")
    path = tmp / f"{profile.stem}-{fast}-{guards}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    none = lambda source: None  # noqa: E731
    switched = ([] if fast else [(cel, "compile_fast")]) + (
        [] if guards else [(compiler, "leading_guard"), (compiler, "class_guard"), (compiler, "empty_guard")])
    saved = [(module, name, getattr(module, name)) for module, name in switched]
    for module, name in switched:
        setattr(module, name, none)
    try:
        return compiler.load_policy(path)
    finally:
        for module, name, value in saved:
            setattr(module, name, value)


async def _cpu_blocks(runs: dict[str, Callable[[], Any]], rounds: int, calls: int) -> dict[str, list[float]]:
    """Process CPU per call of each run, `calls` at a time, the order rotated every round."""
    out: dict[str, list[float]] = {k: [] for k in runs}
    names = list(runs)
    for r in range(rounds + 1):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            t0 = time.process_time()
            for _ in range(calls):
                await runs[name]()
            if r:  # round 0 warms every run
                out[name].append((time.process_time() - t0) / calls)
    return out


async def whole_call_rows(rounds: int, calls: int) -> list[Row]:
    from audit import canon
    from audit.sqlite import SqliteLedger
    from bench.decision import _NoLedger, make_decider
    from bench.governed import CALLS, TOOLS
    from gateway.core.call import Credentials, ToolCall
    from gateway.core.gateway import Gateway
    from gateway.crypto.receipts import KeyStore
    from gateway.policy.cel import helpers
    from gateway.stages import classify

    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="dharma-bench-opt-") as name:
        tmp = Path(name)
        runs: dict[str, Callable[[], Any]] = {}
        closers = []
        for profile in sorted(STANDARD.parent.glob("*.yaml")):
            for fast in (False, True):
                gw = Gateway(profile_policy(tmp, profile, fast), [backend(TOOLS)], ledger=_NoLedger(), keys=None)  # type: ignore[arg-type]
                decide = make_decider(gw)
                todo = [ToolCall(tool=t, arguments=a, request_id=f"req_{i}", credentials=Credentials(api_key=OPERATOR_KEY),
                                 session_id="s") for i, (t, a) in enumerate(CALLS)]
                runs[f"decision {profile.name} fast={fast}"] = _cycle(decide, todo)
                if profile == STANDARD and fast:
                    standard_gw = gw
        standard = runs["decision standard.yaml fast=True"]
        gw0 = standard_gw
        gw = Gateway(profile_policy(tmp, STANDARD, True, guards=False), [backend(TOOLS)], ledger=_NoLedger(), keys=None)  # type: ignore[arg-type]
        runs["decision standard.yaml guards off"] = _cycle(make_decider(gw), todo)
        runs["decision standard.yaml classify memo off"] = _switched(classify, "_CLASSIFIED_LONGEST", -1, standard)
        runs["decision standard.yaml regex memo off"] = _switched(helpers.HELPERS, "matches", helpers.Helper(
            "matches", _searching(helpers), bool, True), standard)
        runs["decision standard.yaml policy memos off"] = _policy_memos_off(gw0, standard)
        keys = KeyStore.open(tmp / "state")
        for label, fast, inline in (("engine", False, 2.0), ("fast", True, 2.0), ("fast, no inline", True, 0.0)):
            ledger = await SqliteLedger.open(tmp / f"{label}.db", inline_max_ms=inline)
            gw = Gateway(profile_policy(tmp, STANDARD, fast), [backend(TOOLS)], ledger=ledger, keys=keys)
            closers.append(gw)
            calls_of = [(t, a) for t, a in CALLS]
            runs[f"governed standard {label}"] = _cycle(
                lambda c, gw=gw: gw.call(c[0], c[1], api_key=OPERATOR_KEY, session_id="s"), calls_of)
        runs["governed standard canon fast path off"] = _switched(canon, "plain", lambda value: False,
                                                                  runs["governed standard fast"])
        try:
            cpu = await _cpu_blocks(runs, rounds, calls)
        finally:
            for gw in closers:
                await gw.aclose()
    med = {k: statistics.median(v) for k, v in cpu.items()}
    for profile in sorted(STANDARD.parent.glob("*.yaml")):
        plain, fast = med[f"decision {profile.name} fast=False"], med[f"decision {profile.name} fast=True"]
        rows.append([f"CEL fast path: decision, {profile.name}", "gateway/policy/cel/fast.py", "1",
                     f"{plain * 1e6:.1f}", f"{fast * 1e6:.1f}", f"{(plain - fast) * 1e6:+.1f}", "kept"])
    fast = med["decision standard.yaml fast=True"]
    for what, where in (("guards", "gateway/policy/compile.py:310-380, evaluate.py:262"),
                        ("policy memos", "gateway/policy/compile.py:118-146,189-290"),
                        ("classify memo", "gateway/stages/classify.py:235-256"),
                        ("regex memo", "gateway/policy/cel/helpers.py:146-170")):
        plain = med[f"decision standard.yaml {what} off"]
        rows.append([f"{what}: decision, standard.yaml", where, "1", f"{plain * 1e6:.1f}", f"{fast * 1e6:.1f}",
                     f"{(plain - fast) * 1e6:+.1f}", "kept"])
    plain, fast, slow = (med["governed standard engine"], med["governed standard fast"],
                         med["governed standard fast, no inline"])
    rows.append(["CEL fast path: governed call, standard.yaml", "gateway/policy/cel/fast.py", "1",
                 f"{plain * 1e6:.0f}", f"{fast * 1e6:.0f}", f"{(plain - fast) * 1e6:+.0f}", "kept"])
    plain = med["governed standard canon fast path off"]
    rows.append(["canonical JSON by msgspec, rfc8785 only for the rest", "audit/canon.py:31-80", "1",
                 f"{plain * 1e6:.0f}", f"{fast * 1e6:.0f}", f"{(plain - fast) * 1e6:+.0f}", "kept"])
    rows.append(["inline ledger commit (2 appends a call)", "audit/sqlite.py `_append_inline`", "1",
                 f"{slow * 1e6:.0f}", f"{fast * 1e6:.0f}", f"{(slow - fast) * 1e6:+.0f}", "kept"])
    return rows


def _policy_memos_off(gw: Any, run: Callable[[], Any]) -> Callable[[], Any]:
    """`run` with the compiled policy's memos off: `CompiledPolicy._cached` builds every time and the
    glob indexes' candidate tables are emptied before each call."""
    from gateway.policy.compile import CompiledPolicy

    def uncached(self: Any, kind: str, tool: Any, build: Any) -> Any:
        return build()

    async def memos_off() -> Any:
        policy = gw.policy
        for index in (policy.rule_index, policy.disclosure_index, policy.visibility_index):
            index._cache.clear()
        saved = CompiledPolicy._cached
        CompiledPolicy._cached = uncached  # type: ignore[method-assign]
        try:
            return await run()
        finally:
            CompiledPolicy._cached = saved  # type: ignore[method-assign]

    return memos_off


def _searching(helpers: Any) -> Callable[[str, str], bool]:
    """CEL's `matches()` without the memo of answers: the cached compiled RE2 searched every time."""

    def search(s: str, pattern: str) -> bool:
        helpers._need_str("matches", s, pattern)
        return helpers._regex(pattern).search(s) is not None

    return search


def _switched(where: Any, name: str, value: Any, run: Callable[[], Any]) -> Callable[[], Any]:
    """`run` with `where.name` (or `where[name]`, for a dict) set to `value` for the length of each call."""
    get, put = ((where.__getitem__, where.__setitem__) if isinstance(where, dict)
                else (lambda n: getattr(where, n), lambda n, v: setattr(where, n, v)))

    async def switched() -> Any:
        saved = get(name)
        put(name, value)
        try:
            return await run()
        finally:
            put(name, saved)

    return switched


def _cycle(fn: Callable[[Any], Any], items: list[Any]) -> Callable[[], Any]:
    state = [0]

    def next_call() -> Any:
        state[0] += 1
        return fn(items[state[0] % len(items)])

    return next_call


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.optimisations", description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=positive(int), default=12)
    parser.add_argument("--quick", action="store_true", help="fewer runs per round (a smoke run)")
    args = parser.parse_args()
    quiet_logging()
    load0, t0 = os.getloadavg()[0], time.perf_counter()
    n = 2_000 if args.quick else 20_000
    rows = micro_rows(args.rounds, n)
    rows += asyncio.run(whole_call_rows(args.rounds, 20 if args.quick else 200))
    table("optimisations: plain form vs optimised, side by side (µs)",
          ["optimisation", "where", "times a call", "plain µs", "optimised µs", "gain µs a call", "verdict"], rows,
          note=f"{args.rounds} rounds, alternating; load average {load0:.1f} at start, {os.getloadavg()[0]:.1f} at end")
    print(f"   (took {time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
