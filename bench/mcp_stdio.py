"""mcp_stdio: latency added by `dharma stdio` in front of a stdio MCP server.

Backend: `bench/mcp_server.py stdio` (official `mcp` SDK, one trivial `echo` tool), run twice in
the same run: once direct, once as `dharma stdio --policy policies/permissive.yaml -- <server>`
(a real subprocess, as an agent launches it; a fresh state root under the temp dir, so a real
SQLite ledger (synchronous FULL, the default) and Ed25519 receipts; the default log level (info),
the gateway's stderr going to a file as an agent would capture it).

Client: raw newline-delimited JSON-RPC over the pipes (blocking writes, one buffered reader), so
the figures are the gateway's cost, not a client library's: `initialize` (2025-11-25) +
`notifications/initialized`, then sequential `tools/call echo`. Direct and gateway calls are
interleaved one by one (alternating which goes first), so both see the same machine load.
'cpu/call' is the CPU time of the process the client talks to (the gateway's own process through
the gateway, excluding its server child; the server direct), from /proc.
One extra pair of rows with the official SDK client (`mcp.Client`, stdio transport, legacy
handshake), interleaved the same way (not in --quick: two more processes to start).

Start-up: the wall time from spawning the process to the first `initialize` answer, the server
direct and `dharma stdio` in front of it (the state root the latency rows used), alternating, the
median of several launches; the gateway's added start-up is the difference of the medians. And
`dharma --help` to exit, beside `python -c pass` (the interpreter's own start-up).
The gateway's .pyc files are written first, as installing it would (see compile_gateway_bytecode).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO, Any

from bench import Options, Results, Stats, Target, fmt_time, table

REPO = Path(__file__).resolve().parent.parent
SERVER = REPO / "bench" / "mcp_server.py"
PERMISSIVE = REPO / "policies" / "permissive.yaml"
PROTOCOL = "2025-11-25"
TARGET_MS = 1.0
CPU_TARGET_MS = 1.0
STARTUP_TARGET_MS = 300.0
HELP_TARGET_MS = 150.0


def server_command() -> list[str]:
    return [sys.executable, str(SERVER), "stdio"]


def gateway_command(state_root: Path, policy: Path, server: list[str]) -> list[str]:
    return [sys.executable, "-m", "gateway", "--state-root", str(state_root), "stdio", "--policy", str(policy),
            "--", *server]


def child_env(**extra: str) -> dict[str, str]:
    """The environment for a gateway or server process: no stray DHARMA_* settings from the caller."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DHARMA_")}
    env.update(extra)
    return env


def proc_cpu(pid: int) -> float:
    """User + system CPU seconds of one process (not its children), from /proc; NaN if unavailable."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return float("nan")


class RawStdio:
    """A minimal MCP client: JSON-RPC lines over a subprocess's pipes, blocking, one call at a time."""

    def __init__(self, cmd: list[str], stderr: IO[bytes]) -> None:
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, cwd=REPO,
                                     env=child_env(), bufsize=0)
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self._fd = self.proc.stdin.fileno()
        self._out = open(self.proc.stdout.fileno(), "rb", buffering=1 << 16, closefd=False)  # noqa: SIM115
        self._id = 0

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _send(self, message: dict[str, Any]) -> None:
        os.write(self._fd, json.dumps(message, separators=(",", ":")).encode() + b"\n")

    def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        self._id += 1
        wanted = self._id
        self._send({"jsonrpc": "2.0", "id": wanted, "method": method, "params": params})
        while True:
            line = self._out.readline()
            if not line:
                raise RuntimeError(f"{method}: the process exited (code {self.proc.poll()})")
            msg = json.loads(line)
            if msg.get("id") == wanted:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg["result"]  # type: ignore[no-any-return]

    def initialize(self) -> None:
        self.request("initialize", {"protocolVersion": PROTOCOL, "capabilities": {},
                                    "clientInfo": {"name": "dharma-bench", "version": "1"}})
        self._send({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def echo(self, text: str = "hello") -> dict[str, Any]:
        result = self.request("tools/call", {"name": "echo", "arguments": {"text": text}})
        if result.get("isError"):
            raise RuntimeError(f"echo failed: {result}")
        return result

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.proc.stdin.close()  # type: ignore[union-attr]
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._out.close()
        self.proc.stdout.close()  # type: ignore[union-attr]


def time_to_initialize(cmd: list[str], stderr: IO[bytes]) -> tuple[float, float]:
    """Seconds from spawning `cmd` to its answer to `initialize`, and the CPU seconds the spawned
    process itself (not its children) used by then."""
    t0 = time.perf_counter()
    client = RawStdio(cmd, stderr)
    try:
        client.initialize()
        return time.perf_counter() - t0, proc_cpu(client.pid)
    finally:
        client.close()


def compile_gateway_bytecode() -> None:
    """Write the gateway's .pyc files first, as installing the package does: the server's SDK
    comes from site-packages already compiled, and with PYTHONDONTWRITEBYTECODE set (as on the
    CI box) an uncompiled checkout recompiles ~100 modules (~150 ms of CPU) on every launch."""
    import compileall

    for package in ("gateway", "audit"):
        compileall.compile_dir(REPO / package, quiet=1)


def startup_rows(state: Path, runs: int, stderr: IO[bytes]) -> tuple[float, ...]:
    """Medians over `runs` launches each, in seconds: server direct to initialize answered, through
    `dharma stdio`, `dharma --help` to exit, `python -c pass` to exit, then the CPU the server
    direct and the gateway process (without its server) used until initialize was answered."""
    compile_gateway_bytecode()
    direct: list[float] = []
    governed: list[float] = []
    cpu: dict[int, list[float]] = {id(direct): [], id(governed): []}
    for i in range(runs):
        pair = [(direct, server_command()), (governed, gateway_command(state, PERMISSIVE, server_command()))]
        for out, cmd in pair if i % 2 == 0 else pair[::-1]:
            wall, used = time_to_initialize(cmd, stderr)
            out.append(wall)
            cpu[id(out)].append(used)
    helps: list[float] = []
    bare: list[float] = []
    dharma = [sys.executable, "-m", "gateway", "--help"]
    for _ in range(runs * 2):
        for out, cmd in ((helps, dharma), (bare, [sys.executable, "-c", "pass"])):
            t0 = time.perf_counter()
            subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=stderr, cwd=REPO, env=child_env(), check=True)
            out.append(time.perf_counter() - t0)
    return tuple(statistics.median(x) for x in (direct, governed, helps, bare, cpu[id(direct)], cpu[id(governed)]))


def interleaved(a: Any, b: Any, *, seconds: float, min_n: int = 30, warmup: int = 30) -> tuple[list[float], list[float]]:
    """Call `a()` and `b()` alternately (alternating which goes first) for ~`seconds`: their latencies."""
    for _ in range(warmup):
        a()
        b()
    clock = time.perf_counter
    ta: list[float] = []
    tb: list[float] = []
    gc.collect()
    deadline = clock() + seconds
    i = 0
    while len(ta) < min_n or clock() < deadline:
        first, first_out, second, second_out = (a, ta, b, tb) if i % 2 == 0 else (b, tb, a, ta)
        t0 = clock()
        first()
        t1 = clock()
        second()
        t2 = clock()
        first_out.append(t1 - t0)
        second_out.append(t2 - t1)
        i += 1
    return ta, tb


async def sdk_rows(tmp: Path, state: Path, seconds: float, log: IO[str]) -> tuple[Stats, Stats]:
    """The official SDK client (stdio transport, legacy handshake): direct and through the gateway, interleaved."""
    from mcp import Client
    from mcp.client.stdio import StdioServerParameters, stdio_client

    def params(cmd: list[str]) -> StdioServerParameters:
        return StdioServerParameters(command=cmd[0], args=cmd[1:], cwd=REPO)

    direct = Client(stdio_client(params(server_command()), errlog=log), mode="legacy")  # type: ignore[arg-type]
    governed = Client(stdio_client(params(gateway_command(state, PERMISSIVE, server_command())), errlog=log),  # type: ignore[arg-type]
                      mode="legacy")
    async with direct, governed:
        async def call(client: Any) -> None:
            out = await client.call_tool("echo", {"text": "hello"})
            if out.is_error:
                raise RuntimeError(f"echo failed: {out}")

        for _ in range(20):
            await call(direct)
            await call(governed)
        clock = time.perf_counter
        td: list[float] = []
        tg: list[float] = []
        deadline = clock() + seconds
        i = 0
        while len(td) < 30 or clock() < deadline:
            order = ((direct, td), (governed, tg)) if i % 2 == 0 else ((governed, tg), (direct, td))
            for client, out in order:
                t0 = clock()
                await call(client)
                out.append(clock() - t0)
            i += 1
    return Stats.of(td), Stats.of(tg)


async def run(opts: Options, results: Results) -> None:
    seconds = 0.5 if opts.quick else 8.0
    sdk_seconds = 0.3 if opts.quick else 3.0
    with contextlib.ExitStack() as stack:
        tmp = Path(opts.workdir) if opts.workdir else Path(stack.enter_context(
            tempfile.TemporaryDirectory(prefix="dharma-bench-mcp-stdio-")))
        tmp = tmp / "mcp_stdio"
        tmp.mkdir(parents=True, exist_ok=True)
        log_path = tmp / "stderr.log"
        log = stack.enter_context(open(log_path, "w+b"))
        t_start = time.perf_counter()
        direct = RawStdio(server_command(), log)
        stack.callback(direct.close)
        governed = RawStdio(gateway_command(tmp / "state", PERMISSIVE, server_command()), log)
        stack.callback(governed.close)
        try:
            direct.initialize()
            governed.initialize()
        except RuntimeError as exc:
            log.flush()
            raise RuntimeError(f"{exc}; stderr:\n{log_path.read_text(errors='replace')[-2000:]}") from None
        startup = time.perf_counter() - t_start
        receipt = governed.echo().get("_meta", {}).get("dharma.gateway/receipt")
        cpu_d0, cpu_g0 = proc_cpu(direct.pid), proc_cpu(governed.pid)
        td, tg = interleaved(direct.echo, governed.echo, seconds=seconds)
        cpu_d = (proc_cpu(direct.pid) - cpu_d0) / len(td)
        cpu_g = (proc_cpu(governed.pid) - cpu_g0) / len(tg)
        d, g = Stats.of(td), Stats.of(tg)
        n_ledger = _ledger_size(tmp / "state" / "ledger.db")
        direct.close()
        governed.close()
        runs = 3 if opts.quick else 9
        up_direct, up_governed, up_help, up_python, cpu_direct, cpu_governed = startup_rows(tmp / "state", runs, log)
        sdk_error = "skipped in --quick"
        sd = sg = None
        if not opts.quick:
            with open(tmp / "sdk.log", "w") as sdk_log:
                try:
                    sd, sg = await sdk_rows(tmp, tmp / "state-sdk", sdk_seconds, sdk_log)
                except Exception as exc:  # noqa: BLE001 - the SDK row is extra; say why it is missing
                    sdk_error = f"{type(exc).__name__}: {exc}"[:200]

    def row(label: str, st: Stats, base: Stats | None, cpu: float | None) -> list[str]:
        added = "-" if base is None else f"+{fmt_time(st.p50 - base.p50)}"
        added99 = "-" if base is None else f"+{fmt_time(st.p99 - base.p99)}"
        ratio = "1.0x" if base is None else f"{st.p50 / base.p50:.2f}x"
        return [label, str(st.n), fmt_time(st.p50), fmt_time(st.p99), fmt_time(st.mean), f"{1 / st.mean:,.0f}",
                "-" if cpu is None else fmt_time(cpu), added, added99, ratio]

    rows = [row("raw JSON-RPC, server direct (baseline)", d, None, cpu_d),
            row("raw JSON-RPC, through dharma stdio", g, d, cpu_g)]
    if sd is not None and sg is not None:
        rows += [row("SDK mcp.Client, server direct", sd, None, None),
                 row("SDK mcp.Client, through dharma stdio", sg, sd, None)]
    else:
        rows.append([f"SDK mcp.Client: not measured ({sdk_error})", *["-"] * 9])
    table("mcp_stdio: sequential tools/call echo over stdio, direct vs through `dharma stdio`",
          ["client / path", "calls", "p50", "p99", "mean", "calls/s", "cpu/call", "added p50", "added p99", "x direct"],
          rows,
          note=f"permissive policy, SQLite ledger FULL + Ed25519 receipts (receipt returned: {'yes' if receipt else 'NO'}), "
               f"info log to a file; ledger records after the raw rows: {n_ledger}\n"
               f"direct and gateway calls interleaved; ~{seconds:g} s raw, ~{sdk_seconds:g} s SDK; "
               f"start-up of both processes + initialize: {startup:.2f} s\n"
               "cpu/call = CPU of the process the client talks to (the gateway alone, or the server direct)")
    table("start-up: spawn to first `initialize` answered, and `dharma --help`",
          ["process", "median wall", "added", "own cpu"],
          [["server direct (baseline)", fmt_time(up_direct), "-", fmt_time(cpu_direct)],
           ["dharma stdio -- server", fmt_time(up_governed), f"+{fmt_time(up_governed - up_direct)}", fmt_time(cpu_governed)],
           ["python -c pass (baseline)", fmt_time(up_python), "-", "-"],
           ["python -m gateway --help", fmt_time(up_help), f"+{fmt_time(up_help - up_python)}", "-"]],
          note=f"median of {runs} launches each (help: {runs * 2}), alternating; dharma stdio spawns its server, "
               "then loads while the server boots\n'own cpu' = CPU of that process alone until initialize was "
               "answered (the gateway's excludes its server): on a busy core the two boots add up, on idle "
               "cores they overlap")
    results.add(Target("mcp stdio added p50 (raw JSON-RPC client, echo tool)", (g.p50 - d.p50) * 1e3, TARGET_MS, "ms",
                       higher_is_better=False,
                       note=f"direct p50 {fmt_time(d.p50)}, through the gateway {fmt_time(g.p50)}; "
                            f"gateway CPU {fmt_time(cpu_g)}/call"))
    results.add(Target("mcp stdio gateway CPU per call (raw JSON-RPC client)", cpu_g * 1e3, CPU_TARGET_MS, "ms",
                       higher_is_better=False, note="the gateway process alone, from /proc"))
    results.add(Target("dharma stdio start-up added (first initialize answered, vs the server direct)",
                       (up_governed - up_direct) * 1e3, STARTUP_TARGET_MS, "ms", higher_is_better=False,
                       note=f"server direct {fmt_time(up_direct)}, through dharma stdio {fmt_time(up_governed)}; "
                            f"the gateway's own start-up CPU {fmt_time(cpu_governed)}"))
    results.add(Target("dharma --help (process start to exit)", up_help * 1e3, HELP_TARGET_MS, "ms",
                       higher_is_better=False, note=f"python -c pass takes {fmt_time(up_python)} here"))


def _ledger_size(path: Path) -> str:
    import sqlite3

    try:
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
            return f"{db.execute('select count(*) from records').fetchone()[0]:,}"
    except sqlite3.Error as exc:
        return f"? ({exc})"


if __name__ == "__main__":  # pragma: no cover
    asyncio.run(run(Options(quick="--quick" in sys.argv), Results()))
