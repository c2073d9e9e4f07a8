"""A fork server for the corpus runner: imports the MCP SDK server (tests/corpus/server.py)
and the `dharma` command once, then forks a fresh process per request.

    python tests/corpus/zygote.py SOCKET

Importing the SDK or the gateway costs about a second of CPU each; with one process pair per
case that import, not the case, dominated a corpus run. A request comes from `launch.py` (the
tiny command the SDK client and `dharma stdio` actually start): that process's stdin, stdout and
stderr, its working directory, and a program with arguments, `server CASE_FILE CASE_ID` or
`dharma ARGS...`. The forked child takes over the three descriptors and runs the program's
ordinary entry point (`tests.corpus.server.main` or `gateway.cli.main.main`, what `python -m
gateway` runs), and reports its exit status back to `launch.py`, which exits with it. So each
case still gets its own `dharma stdio` process and its own MCP server process; only the imports
are shared. Terminating the zygote (SIGTERM) also terminates the children it forked that are
still running.
"""

from __future__ import annotations

import importlib
import os
import signal
import socket
import sys
from collections.abc import Callable
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `tests.corpus` and `gateway` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from gateway.cli.main import main as dharma_main  # noqa: E402
from tests.corpus.server import main as server_main  # noqa: E402

#: What `dharma stdio` imports as it runs (its CLI imports lazily, to start fast): imported here
#: once. A module missing from this list is imported in each child instead: slower, not wrong.
PRELOAD = (
    "gateway.cli.mcp", "gateway.runtime", "gateway.logging", "gateway.transports.mcp_stdio.proxy",
    "gateway.transports.mcp_stdio.supervisor", "gateway.transports.upstreams.mcp_stdio",
    "gateway.transports.upstreams.python", "gateway.policy.compile", "gateway.policy.cel.celpython",
    "gateway.policy.cel.rust", "gateway.stores.sqlite_approvals", "gateway.stores.file_pins", "gateway.health",
    "audit.sqlite", "anyio._backends._asyncio", "rich", "getpass", "pwd", "resource",
)

PROGRAMS: dict[str, Callable[[list[str]], int]] = {
    "server": server_main,
    "dharma": lambda argv: dharma_main(argv),
}


def serve(path: str) -> None:
    """Accept requests on the Unix socket `path` until terminated; fork one child per request."""
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:  # an optional engine that is not installed: the child does without it
            pass
    children: set[int] = set()

    def stop(signum: int, frame: object) -> None:
        for pid in children:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        os._exit(0)

    def reap(signum: int, frame: object) -> None:
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            children.discard(pid)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGCHLD, reap)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(128)
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    while True:
        try:
            conn, _ = listener.accept()
            message, fds, _, _ = socket.recv_fds(conn, 1 << 16, 3)
        except InterruptedError:
            continue
        except OSError:
            continue
        if len(fds) != 3:
            for fd in fds:
                os.close(fd)
            conn.close()
            continue
        pid = os.fork()
        if pid == 0:
            listener.close()
            _child(conn, fds, message.decode("utf-8").split("\0"))
        children.add(pid)
        for fd in fds:
            os.close(fd)
        conn.close()


def _child(conn: socket.socket, fds: list[int], request: list[str]) -> None:
    """In the forked child: take over the launcher's stdio and directory, run, report the status."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    code = 1
    try:
        cwd, program, *argv = request
        os.chdir(cwd)
        sys.argv = [program, *argv]
        code = PROGRAMS[program](argv)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if isinstance(exc.code, str):
            sys.stderr.write(exc.code + "\n")
    except BaseException as exc:  # the launcher must learn the program failed, whatever it was
        sys.stderr.write(f"corpus zygote: {type(exc).__name__}: {exc}\n")
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except BaseException:  # noqa: S110 - a closed pipe must not keep the status from the launcher
            pass
        try:
            conn.sendall(bytes([code & 0xFF]))
        finally:
            os._exit(code & 0xFF)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.stderr.write("usage: zygote.py SOCKET\n")
        sys.exit(2)
    serve(sys.argv[1])
