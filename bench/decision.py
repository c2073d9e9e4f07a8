"""decision: the pipeline's decision for one call, in process, no ledger, no backend.

What is timed, per call (the same code Gateway.govern runs before it forwards):
  build the CallContext, resolve the tool, authenticate (API key, SHA-256 + constant-time
  compare), look up session history and karma, then `gateway.core.pipeline.decide()` over the
  Gateway's real stage tuple: authenticate → tool visibility → sanitizer (limits, cleaning,
  schema, secret scan, argument digest) → circuit breaker → rate limiter (no limits in the
  generated profile) → tier gate (sensitivity + escalation probe + CEL activation) → dharma
  rules (only the rules whose tool globs match) → approval.
Baseline: a bare `gateway.stages.sanitizer.walk.sanitize()` of the same arguments with the same schema.
Calls cycle through `policygen.CALL_MIX` (16 calls over 15 tools; one traversal, one secret).
"""

from __future__ import annotations

import statistics
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import Options, Results, Stats, Target, fmt_time, sample_async, sample_sync, table
from bench.policygen import CALL_MIX, OPERATOR_KEY, backend, input_schema, write_generated_policy
from gateway.policy import cel
from gateway.core.call import CallContext, Credentials, ToolCall
from gateway.core.gateway import Gateway
from gateway.core.pipeline import decide
from gateway.policy.compile import CompiledPolicy, load_policy
from gateway.stages.sanitizer.walk import SanitizerLimits, sanitize
from gateway.stages.tier_gate import authenticate

FAST = "common-expression-language"
SIZES = (10, 100, 1000)


class _NoLedger:
    async def append(self, entry: dict[str, Any]) -> Any:  # pragma: no cover - never called
        raise AssertionError("decision benchmark does not record")

    async def aclose(self) -> None:
        return None


def _calls() -> list[ToolCall]:
    return [
        ToolCall(tool=tool, arguments=args, request_id=f"req_bench{i:04d}",
                 credentials=Credentials(api_key=OPERATOR_KEY), purpose=purpose, session_id="s1")
        for i, (tool, args, purpose) in enumerate(CALL_MIX)
    ]


def make_decider(gw: Gateway) -> Any:
    """One decision exactly as Gateway.govern takes it (up to, not including, the forward)."""
    clock = time.time
    tools = gw._tools  # noqa: SLF001 - the benchmark mirrors govern()
    history = gw.history
    stages = gw.stages

    async def decide_one(call: ToolCall) -> Any:
        policy = gw.policy
        started = clock()
        ctx = CallContext(call=call, now=datetime.fromtimestamp(started, UTC), clock=started)
        entry = tools.get(call.tool)
        if entry is not None:
            ctx.tool = entry[0]
        ctx.principal = authenticate(policy, call.credentials)
        if ctx.principal is not None:
            ctx.session, ctx.karma = await history.read(call.session_id, ctx.principal.id, started)
        return await decide(stages, ctx, policy)

    return decide_one


def _rules_per_call(policy: CompiledPolicy) -> float:
    return statistics.fmean(len(policy.rules_for(tool)) for tool, _, _ in CALL_MIX)


def _outcomes(decisions: list[Any]) -> str:
    blocked = sum(1 for d in decisions if d.blocks)
    return f"{len(decisions) - blocked}/{blocked}"


async def run(opts: Options, results: Results) -> None:
    seconds = 0.25 if opts.quick else 2.0
    engines = [e for e in (FAST, "cel-python") if e in cel.available_engines()]
    calls = _calls()
    n_calls = len(calls)

    # Baseline: bare sanitize() of the same arguments, same limits and schemas.
    limits = SanitizerLimits()
    schemas = [input_schema(c.tool) for c in calls]
    i = 0

    def bare() -> None:
        nonlocal i
        k = i % n_calls
        i += 1
        sanitize(calls[k].arguments, limits, schemas[k])

    base = sample_sync(bare, seconds=seconds)

    rows: list[list[str]] = [["sanitize() only (baseline)", "-", "-", "-", fmt_time(base.p50), fmt_time(base.p99),
                              fmt_time(base.mean), f"{1 / base.mean:,.0f}", "1.0x", "-"]]
    fast_1000: Stats | None = None
    with tempfile.TemporaryDirectory(prefix="dharma-bench-decision-") as tmp:
        for engine in engines:
            for size in SIZES:
                if opts.quick and engine != FAST and size > 100:
                    continue  # quick run: cel-python's 1,000-rule load alone takes seconds
                path = write_generated_policy(Path(tmp) / f"p{size}", size)
                t0 = time.perf_counter()
                policy = load_policy(path, engine=engine)
                compile_s = time.perf_counter() - t0
                gw = Gateway(policy, [backend()], ledger=_NoLedger(), keys=None)  # type: ignore[arg-type]
                decide_one = make_decider(gw)
                decisions = [await decide_one(c) for c in calls]
                j = 0

                async def one() -> Any:
                    nonlocal j
                    k = j % n_calls
                    j += 1
                    return await decide_one(calls[k])

                st = await sample_async(one, seconds=seconds)
                if engine == FAST and size == 1000:
                    fast_1000 = st
                rows.append([
                    "decide()", engine, f"{size:,}", f"{_rules_per_call(policy):.1f}", fmt_time(st.p50), fmt_time(st.p99),
                    fmt_time(st.mean), f"{1 / st.mean:,.0f}", f"{st.mean / base.mean:.1f}x",
                    f"{compile_s:.2f} s / {_outcomes(decisions)}",
                ])
    table(
        "decision: sanitizer → tier gate → dharma rules, in process (no ledger, no backend)",
        ["path", "engine", "rules", "rules eval/call", "p50", "p99", "mean", "calls/s", "x sanitize", "load / allow/block"],
        rows,
        note=(f"per call: CallContext + authenticate + pipeline.decide() over Gateway.stages; {n_calls} calls cycled;\n"
              f"{'quick' if opts.quick else 'full'} run, ~{seconds:g} s per row; 'rules eval/call' = mean candidate rules "
              "after the glob index"),
    )
    results.add(Target("decision p99 @1,000 rules (common-expression-language)",
                       None if fast_1000 is None else fast_1000.p99 * 1e3, 0.25, "ms", higher_is_better=False,
                       note="" if fast_1000 is not None else "fast engine not installed"))
