"""A throwaway Redis server started from the installed Debian binary, for tests and benchmarks.

`redis-server` on a free loopback port with persistence off, in a temp dir. Outage tests stop
it (`stop`: SIGTERM, as a crash), hang it (`pause`: SIGSTOP, `resume`: SIGCONT) and start it
again on the same port (`start`), as notes/services.md describes.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import redis

READY_SECONDS = 30.0


def redis_bin() -> str | None:
    """The redis-server binary, or None when it is not installed."""
    return shutil.which("redis-server")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    """One redis-server process on a fixed port; `url` stays valid across stop/start."""

    def __init__(self, binary: str, root: Path) -> None:
        self.binary = binary
        self.root = root
        self.port = _free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen[bytes] | None = None
        self.extra_args: list[str] = []  # e.g. ["--requirepass", PW]: `url` then needs the password

    def start(self) -> None:
        """Start (or restart) the server and wait until it answers PING."""
        log = open(self.root / "redis.log", "ab")  # noqa: SIM115 - the child holds it
        self.process = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(self.root), *self.extra_args],
            stdout=log, stderr=subprocess.STDOUT,
        )
        log.close()
        deadline = time.monotonic() + READY_SECONDS
        while True:
            try:
                with redis.Redis.from_url(self.url, socket_connect_timeout=0.5) as client:
                    client.ping()
                return
            except redis.exceptions.AuthenticationError:  # up, and asking for the password it was given
                return
            except redis.exceptions.ConnectionError:
                if self.process.poll() is not None:
                    raise RuntimeError(f"redis-server exited with {self.process.returncode}: "
                                       f"{(self.root / 'redis.log').read_text()[-2000:]}") from None
                if time.monotonic() > deadline:
                    raise RuntimeError(f"redis-server on port {self.port} did not answer within {READY_SECONDS:g} s") from None
                time.sleep(0.05)

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL) and wait for it to be gone."""
        if self.process is None or self.process.poll() is not None:
            return
        self.resume()
        self.process.terminate()
        try:
            self.process.wait(timeout=READY_SECONDS)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def pause(self) -> None:
        """Freeze the server (it accepts connections but answers nothing): a hung Redis."""
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGCONT)

    def flush(self) -> None:
        with redis.Redis.from_url(self.url) as client:
            client.flushall()


@contextlib.contextmanager
def running_redis(binary: str) -> Iterator[RedisServer]:
    """A started server in a temp dir; stopped and removed after."""
    root = Path(tempfile.mkdtemp(prefix="dharma-redis-"))
    server = RedisServer(binary, root)
    try:
        server.start()
        yield server
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def redis_or_skip() -> Iterator[RedisServer]:
    """A test's server; the test is skipped when redis-server is not installed (.ci/run installs it)."""
    import pytest

    binary = redis_bin()
    if binary is None:
        pytest.skip("redis-server not installed; .ci/run installs it (apt-get install -y redis-server)")
    with running_redis(binary) as server:
        yield server
