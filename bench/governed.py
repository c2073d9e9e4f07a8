"""governed: a whole governed call in process, through `Gateway.call`.

Per call: decision (all stages, the policy below) → CallableBackend returning a small result →
disclosure → durable SQLite ledger appends (two-phase: the decision record before the backend, the
outcome after; group commit, one writer thread) → Ed25519 receipt.
Policy: the shipped `policies/standard.yaml` (rule sets resolved next to it); its rate limits
are raised so the benchmark measures the limiter's cost instead of being throttled by it. If
it does not load, a rule set that is missing is dropped (and named); failing that, a generated
100-rule policy is used. Principal: bench-operator (API key, added to the profile: the shipped
profiles hold no keys); each caller has its own session.
Baseline: the same CallableBackend's `send()` awaited directly, in the same run.
Logging: warnings only (the production `call.decided` info line is measured in its own row).
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from audit.sqlite import SqliteLedger
from bench import Options, Results, Stats, Target, fmt_time, info_logging_to_devnull, quiet_logging, sample_async, table
from bench.policygen import OPERATOR_KEY, backend, profile_document, standard_document, write_generated_policy
from gateway.core.call import Status
from gateway.core.errors import PolicyErrors
from gateway.core.gateway import Gateway
from gateway.policy.compile import CompiledPolicy, load_policy
from gateway.crypto.receipts import KeyStore


#: Calls an operator may make under the standard profile; all allowed and forwarded.
CALLS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("read_file", {"path": "docs/readme.md"}),
    ("run_command", {"command": "ls -la build && make test"}),
    ("list_directory", {"path": "src"}),
    ("search_docs", {"query": "rate limiter burst"}),
)
TOOLS = tuple(dict.fromkeys(t for t, _ in CALLS))


def _standard_policy(tmp: Path) -> tuple[CompiledPolicy, str, str]:
    """The standard profile with raised rate limits; returns (policy, description, api key)."""
    doc, missing = standard_document(profile_document([])["principals"][0])
    path = tmp / "standard-bench.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    policy = load_policy(path)
    what = f"policies/standard.yaml ({len(policy.rules)} rules, rate limits raised"
    if missing:
        what += f"; MISSING rule sets skipped: {', '.join(missing)}"
    return policy, what + ")", OPERATOR_KEY


def choose_policy(tmp: Path) -> tuple[CompiledPolicy, str, str]:
    try:
        return _standard_policy(tmp)
    except (PolicyErrors, OSError, yaml.YAMLError) as exc:
        path = write_generated_policy(tmp / "generated", 100)
        reason = str(exc).splitlines()[0][:120]
        return load_policy(path), f"generated 100-rule policy (standard.yaml did not load: {reason})", OPERATOR_KEY


async def _open(tmp: Path, name: str, policy: CompiledPolicy, synchronous: str) -> Gateway:
    ledger = await SqliteLedger.open(tmp / f"{name}.db", synchronous=synchronous)  # type: ignore[arg-type]
    keys = KeyStore.open(tmp / "state")
    return Gateway(policy, [backend(TOOLS)], ledger=ledger, keys=keys)


async def _throughput(gw: Gateway, key: str, callers: int, seconds: float) -> tuple[float, float, float, dict[str, int]]:
    """`callers` concurrent loops calling for ~`seconds`: (calls/s, cpu s per call, mean latency s, statuses)."""
    statuses: dict[str, int] = {}
    latencies: list[float] = []
    clock = time.perf_counter
    deadline = clock() + seconds

    async def caller(c: int) -> None:
        i = 0
        while clock() < deadline or i == 0:
            tool, args = CALLS[(c + i) % len(CALLS)]
            i += 1
            t0 = clock()
            out = await gw.call(tool, args, api_key=key, session_id=f"caller-{c}")
            latencies.append(clock() - t0)
            statuses[out.status.value] = statuses.get(out.status.value, 0) + 1

    cpu0, wall0 = time.process_time(), clock()
    await asyncio.gather(*(caller(c) for c in range(callers)))
    wall, cpu = clock() - wall0, time.process_time() - cpu0
    n = len(latencies)
    return n / wall, cpu / n, sum(latencies) / n, statuses


async def run(opts: Options, results: Results) -> None:
    seconds = 0.3 if opts.quick else 2.5
    tput_seconds = 0.3 if opts.quick else 2.0
    concurrency = (1, 8, 32, 128)
    with contextlib.ExitStack() as stack:
        tmp = Path(opts.workdir) if opts.workdir else Path(stack.enter_context(
            tempfile.TemporaryDirectory(prefix="dharma-bench-governed-")))
        tmp.mkdir(parents=True, exist_ok=True)
        policy, what, key = choose_policy(tmp)
        bk = backend(TOOLS)
        k = 0

        async def direct() -> Any:
            nonlocal k
            tool, args = CALLS[k % len(CALLS)]
            k += 1
            return await bk.send(tool, args, timeout=30.0)

        base = await sample_async(direct, seconds=min(seconds, 1.0))
        seq_rows: list[list[str]] = [["backend.send() direct (baseline)", fmt_time(base.p50), fmt_time(base.p99),
                                      fmt_time(base.mean), "-", f"{1 / base.mean:,.0f}", "-", "1.0x", "-"]]
        tput_rows: list[list[str]] = []
        full_seq: Stats | None = None
        full_best = 0.0
        full_cpu_1: float | None = None
        statuses_seen: dict[str, int] = {}
        variants = [("FULL", "FULL", False, False), ("NORMAL", "NORMAL", False, False),
                    ("FULL + info log→/dev/null", "FULL", True, False), ("FULL, uvloop", "FULL", False, True)]
        uv_seq: Stats | None = None
        uv_best = 0.0

        async def measure(label: str, sync: str, logged: bool) -> tuple[Stats, float, list[float]]:
            """One variant: its sequential row, then (unless logged) a throughput row per concurrency."""
            gw = await _open(tmp, f"ledger-{len(seq_rows)}", policy, sync)
            sink = info_logging_to_devnull() if logged else None
            rates: list[float] = []
            try:
                j = 0

                async def one() -> Any:
                    nonlocal j
                    tool, args = CALLS[j % len(CALLS)]
                    j += 1
                    out = await gw.call(tool, args, api_key=key, session_id="seq")
                    statuses_seen[out.status.value] = statuses_seen.get(out.status.value, 0) + 1
                    return out

                cpu0, n0 = time.process_time(), j
                st = await sample_async(one, seconds=seconds)
                cpu_per = (time.process_time() - cpu0) / max(1, j - n0)
                seq_rows.append([f"Gateway.call, ledger {label}", fmt_time(st.p50), fmt_time(st.p99), fmt_time(st.mean),
                                 fmt_time(cpu_per), f"{1 / st.mean:,.0f}", f"+{fmt_time(st.p50 - base.p50)}",
                                 f"{st.p50 / base.p50:.0f}x", f"{1 / cpu_per:,.0f}"])
                if not logged:
                    for callers in concurrency:
                        rate, cpu_call, lat, statuses = await _throughput(gw, key, callers, tput_seconds)
                        for s, c in statuses.items():
                            statuses_seen[s] = statuses_seen.get(s, 0) + c
                        tput_rows.append([f"ledger {label}", str(callers), f"{rate:,.0f}", fmt_time(lat),
                                          fmt_time(cpu_call), f"{1 / cpu_call:,.0f}"])
                        rates.append(rate)
            finally:
                await gw.aclose()
                if sink is not None:
                    quiet_logging()
                    sink.close()
            return st, cpu_per, rates

        for label, sync, logged, on_uvloop in variants:
            if on_uvloop:  # the loop `dharma serve` and `dharma stdio` run on, in a thread of its own
                try:
                    import uvloop
                except ImportError:
                    continue
                uv_seq, _, rates = await asyncio.to_thread(uvloop.run, measure(label, sync, logged))
                uv_best = max(rates, default=0.0)
                continue
            st, cpu_per, rates = await measure(label, sync, logged)
            if label == "FULL":
                full_seq, full_cpu_1, full_best = st, cpu_per, max(rates, default=0.0)
    table("governed: sequential in-process calls (decision + 2 ledger appends + backend + receipt)",
          ["path", "p50", "p99", "mean", "cpu/call", "calls/s", "added p50", "x direct", "calls/s per core"],
          seq_rows, note=f"policy: {what}\ncalls cycle over {', '.join(TOOLS)}; ~{seconds:g} s per row; "
                         "'calls/s per core' = 1 / process CPU time per call")
    table("governed: throughput with concurrent callers (asyncio.gather; group commit)",
          ["ledger", "callers", "calls/s", "mean latency", "cpu/call", "calls/s per core"], tput_rows,
          note=f"~{tput_seconds:g} s per row; statuses over the whole benchmark: "
               + ", ".join(f"{s}={c}" for s, c in sorted(statuses_seen.items())))
    if statuses_seen.get(Status.OK.value, 0) == 0:
        print("   WARNING: no call was forwarded; the figures do not measure a governed call")
    uv_note = "" if uv_seq is None else f"on uvloop, as dharma serve/stdio run: {fmt_time(uv_seq.p50)}"
    results.add(Target("governed p50 (ledger FULL, sequential)", None if full_seq is None else full_seq.p50 * 1e3,
                       0.5, "ms", higher_is_better=False, note=uv_note))
    results.add(Target("governed throughput (ledger FULL, best of 1-128 callers)", full_best, 3000, "calls/s",
                       higher_is_better=True,
                       note=(f"per core from CPU time at 1 caller: {1 / full_cpu_1:,.0f} calls/s" if full_cpu_1 else "")
                       + (f"; on uvloop: {uv_best:,.0f} calls/s" if uv_seq is not None else "")))
