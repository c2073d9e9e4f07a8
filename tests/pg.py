"""A throwaway PostgreSQL server started from the installed Debian binaries, for tests and benchmarks.

`tests/audit/conftest.py` (the `postgres` fixture) and `bench/` (the PostgreSQL ledger rows) both
start their server here: `initdb` + `pg_ctl` on a free port in a temp dir, as the `postgres` user
when we are root. Tests run it with fsync off (no durable storage needed); the benchmarks keep
fsync on, so their commit rates are those of a durable server.
"""

from __future__ import annotations

import contextlib
import glob
import itertools
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg


def pg_bin() -> Path | None:
    """The newest installed PostgreSQL's bin directory, or None when none is installed."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    return Path(found[-1]).parent if found else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PostgresServer:
    """A throwaway PostgreSQL server; `new_database()` gives each ledger its own database."""

    def __init__(self, url: str, stop: Callable[[], None], start: Callable[[], None]) -> None:
        self.url = url
        self.stop = stop
        self.start = start
        self._names = itertools.count(1)

    def admin(self) -> psycopg.Connection[Any]:
        return psycopg.connect(self.url + "/postgres", autocommit=True)

    def new_database(self) -> str:
        name = f"ledger_{os.getpid()}_{next(self._names)}"
        with self.admin() as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return f"{self.url}/{name}"

    def drop_database(self, url: str) -> None:
        with self.admin() as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {url.rsplit('/', 1)[1]} WITH (FORCE)")


@contextlib.contextmanager
def running_postgres(bindir: Path, *, fsync: bool = False) -> Iterator[PostgresServer]:
    """Start PostgreSQL from the binaries in `bindir` in a temp dir; stop it and remove the dir after.

    Raises:
        RuntimeError: initdb or pg_ctl failed (their message is included).
    """
    root = Path(tempfile.mkdtemp(prefix="dharma-pg-"))
    root.chmod(0o777)
    as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    port = _free_port()
    data = root / "data"

    def run(*argv: str) -> None:
        done = subprocess.run([*as_user, *argv], capture_output=True, text=True, check=False)
        if done.returncode:
            raise RuntimeError(f"{argv[0]} failed: {done.stderr or done.stdout}")

    def start() -> None:
        run(str(bindir / "pg_ctl"), "-D", str(data), "-w", "-l", str(root / "pg.log"), "start",
            "-o", f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync={'on' if fsync else 'off'}")

    def stop() -> None:
        run(str(bindir / "pg_ctl"), "-D", str(data), "-w", "-m", "immediate", "stop")

    try:
        run(str(bindir / "initdb"), "-D", str(data), "-U", "dharma", "--auth=trust", "--no-locale", "-E", "UTF8")
        start()
        yield PostgresServer(f"postgresql://dharma@127.0.0.1:{port}", stop, start)
    finally:
        subprocess.run([*as_user, str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"],
                       capture_output=True, check=False)
        shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def postgres_or_skip() -> Iterator[PostgresServer]:
    """A test's server (fsync off); the test is skipped when no PostgreSQL binaries are installed."""
    import pytest

    bindir = pg_bin()
    if bindir is None:
        pytest.skip("PostgreSQL binaries not installed (/usr/lib/postgresql/*/bin); .ci/run installs them")
    with running_postgres(bindir) as server:
        yield server
