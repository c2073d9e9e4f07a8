"""scanners: what issue 10's scanners add to a governed call that has no findings.

Per call, in process, with the shipped standard profile and a durable (FULL) SQLite ledger, as in
`bench.governed`: the same calls with the new scanners on and off, alternating in blocks so both
see the same machine. "Off" replaces, for this benchmark only, the shell analysis (by an empty
one: the shell rules read it) and the call
classification and the URL analysis (sanitizer stage), the decoding of base64/hex/URL runs, the wallet/seed scan and the
split-secret join (secret scanner), and the instruction scan of results (disclosure stage) by
functions that find nothing; everything else (the rules, the ledger, the receipt) is the same.
Also printed: each scanner's own cost on these calls' inputs (p50/p99).
Calls (none has a finding): the governed benchmark's four (a file read, a shell command, a
listing, a search), each answered with a small text result.
Target (issue 10): the scanners make such a call at most 10 % slower (p50 and CPU per call).
"""

from __future__ import annotations

import contextlib
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench import Options, Results, Stats, Target, fmt_time, sample_sync, table
from bench.governed import CALLS, _open, choose_policy
from gateway.stages.classify import classify_call
from gateway.stages.sanitizer import secrets as secret_scan
from gateway.stages.sanitizer import stage as sanitizer_stage
from gateway.stages.sanitizer import instructions as instruction_scan
from gateway.stages.sanitizer import shell as shell_scan
from gateway.stages.sanitizer import walk
from gateway.stages.sanitizer.instructions import scan_result
from gateway.stages.sanitizer.secrets import decoded_layers, wallet_hits
from gateway.stages.sanitizer.shell import ShellAnalysis, shell_for
from gateway.stages.sanitizer.urls import analyse_urls

BLOCKS = 6
FETCHED = "https://docs.python.org/3/library/urllib.parse.html?highlight=urlsplit#urllib.parse.urlsplit"
RESULT = {"content": [{"type": "text", "text": "3 files: README.md, Makefile, src/ (12 entries). Build passed in 2.1 s."}]}


def _no_findings(*_args: Any, **_kwargs: Any) -> Any:
    return ()


@contextlib.contextmanager
def scanners_off() -> Iterator[None]:
    """Replace the new scanners by functions that find nothing (restored on exit)."""
    patched = [
        (shell_scan, "shell_for", lambda *a, **k: ShellAnalysis()),  # rules still read args_shell: an empty one (the stage imports it per call)
        (sanitizer_stage, "classify_call", lambda *a, **k: (set(), {})),
        (sanitizer_stage, "urls_for", lambda *a, **k: None),  # args_urls: the rules see an empty list
        (secret_scan, "decoded_layers", _no_findings),
        (secret_scan, "wallet_hits", lambda *a: []),
        (secret_scan, "split_secrets", lambda *a: []),
        (walk, "split_secrets", lambda *a: []),
        (instruction_scan, "scan_result", _no_findings),  # disclosure imports it per call
    ]
    saved = [(module, name, getattr(module, name)) for module, name, _ in patched]
    try:
        for module, name, fn in patched:
            setattr(module, name, fn)
        yield
    finally:
        for module, name, fn in saved:
            setattr(module, name, fn)


async def _block(gw: Any, key: str, n: int) -> tuple[list[float], float]:
    """`n` sequential governed calls: their latencies and the process CPU per call."""
    latencies = []
    cpu0 = time.process_time()
    for i in range(n):
        tool, args = CALLS[i % len(CALLS)]
        t0 = time.perf_counter()
        out = await gw.call(tool, args, api_key=key, session_id=f"bench-{i % 4}")
        latencies.append(time.perf_counter() - t0)
        if out.status.value != "ok":
            raise RuntimeError(f"{tool} was not forwarded ({out.status.value}: {out.message}): the figures would not measure a governed call")
    return latencies, (time.process_time() - cpu0) / n


def _component_rows(seconds: float) -> list[list[str]]:
    rows = []
    strings = [v for _, args in CALLS for v in args.values() if isinstance(v, str)]
    parts: list[tuple[str, Any]] = [
        ("shell analysis (shell-like tools only)", lambda: shell_for("run_command", {"command": CALLS[1][1]["command"]}, frozenset({"args_shell"}))),
        ("call classification", lambda: [classify_call(t, {}, a) for t, a in CALLS]),
        ("URL analysis of these calls (args_urls)", lambda: [analyse_urls(t, a) for t, a in CALLS]),
        ("URL analysis of a fetch of a public page", lambda: analyse_urls("fetch", {"url": FETCHED})),
        ("decoding + wallet scan of the arguments' strings", lambda: [(list(decoded_layers(s)), wallet_hits(s)) for s in strings]),
        ("instruction scan of the result", lambda: scan_result(RESULT)),
    ]
    for label, fn in parts:
        st = sample_sync(fn, seconds=seconds)
        rows.append([label, fmt_time(st.p50), fmt_time(st.p99)])
    return rows


async def run(opts: Options, results: Results) -> None:
    per_block = 40 if opts.quick else 300
    with contextlib.ExitStack() as stack:
        tmp = Path(opts.workdir) if opts.workdir else Path(stack.enter_context(
            tempfile.TemporaryDirectory(prefix="dharma-bench-scanners-")))
        tmp.mkdir(parents=True, exist_ok=True)
        policy, what, key = choose_policy(tmp)
        gw = await _open(tmp, "scanners", policy, "FULL")
        on: list[float] = []
        off: list[float] = []
        cpu_on: list[float] = []
        cpu_off: list[float] = []
        try:
            await _block(gw, key, 20)  # warm up both paths
            with scanners_off():
                await _block(gw, key, 20)
            for _ in range(2 if opts.quick else BLOCKS):
                lat, cpu = await _block(gw, key, per_block)
                on += lat
                cpu_on.append(cpu)
                with scanners_off():
                    lat, cpu = await _block(gw, key, per_block)
                off += lat
                cpu_off.append(cpu)
        finally:
            await gw.aclose()
    s_on, s_off = Stats.of(on), Stats.of(off)
    c_on, c_off = sum(cpu_on) / len(cpu_on), sum(cpu_off) / len(cpu_off)
    added_p50 = (s_on.p50 - s_off.p50) / s_off.p50 * 100
    added_cpu = (c_on - c_off) / c_off * 100
    table("scanners: a governed call without findings, issue 10's scanners on and off",
          ["scanners", "p50", "p99", "cpu/call", "added p50", "added cpu"],
          [["off", fmt_time(s_off.p50), fmt_time(s_off.p99), fmt_time(c_off), "-", "-"],
           ["on", fmt_time(s_on.p50), fmt_time(s_on.p99), fmt_time(c_on), f"{added_p50:+.1f} %", f"{added_cpu:+.1f} %"]],
          note=f"policy: {what}; ledger FULL; {len(on)} calls each, in alternating blocks of {per_block}")
    table("scanners: each scanner's own cost on these calls' inputs", ["scanner", "p50", "p99"],
          _component_rows(0.2 if opts.quick else 1.0))
    results.add(Target("scanners' added p50 on a governed call without findings", added_p50, 10, "%",
                       higher_is_better=False, note=f"CPU per call {added_cpu:+.1f} %"))
