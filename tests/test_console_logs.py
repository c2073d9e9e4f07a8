"""Log lines for a person on a terminal, JSON lines for a collector, secrets in neither.

A real `dharma serve` with stderr on a pseudo-terminal (the TTY case) and on a pipe, the
`log_format` setting overriding both ways, and the scrubber checked under both renderers."""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import re

import pytest
import yaml

from tests.conftest import DEMO_UPSTREAM, REPO, write_policy
from tests.mcp_http.conftest import free_port

WAIT_S = 60.0
SECRET_KEY = "sk-live-0123456789abcdefghijklmnop"
AWS_KEY = "AKIAQ3EGUCHMZ7RWXP4K"
STRIPE_KEY = "sk_live_51HqZ8kq2LmV9xR4tY7wP1sN6b"


def env_without_dharma(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DHARMA_") and k != "NO_COLOR"}
    env.update(PYTHONPATH=str(REPO), **extra)
    return env


@contextlib.contextmanager
def on_terminal(argv: list[str], env: dict[str, str], cwd: Path) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """Run `argv` with stderr on a pseudo-terminal; yield the process and the terminal's master end."""
    master, slave = os.openpty()
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=slave, env=env, cwd=cwd,
                            start_new_session=True)
    os.close(slave)
    try:
        yield proc, master
    finally:
        stop(proc)
        os.close(master)


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)


def read_until(fd: int, wanted: str, seconds: float = WAIT_S) -> str:
    """What the terminal (or pipe) `fd` shows until `wanted` appears on it, within a deadline."""
    seen = b""
    deadline = time.monotonic() + seconds
    while wanted.encode() not in seen:
        left = deadline - time.monotonic()
        assert left > 0, f"{wanted!r} never appeared; saw {seen.decode(errors='replace')!r}"
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # EIO: the terminal's other end closed
                chunk = b""
            assert chunk, f"the stream ended before {wanted!r}; saw {seen.decode(errors='replace')!r}"
            seen += chunk
    return seen.decode(errors="replace")


def serve_config(tmp_path: Path, **extra: object) -> Path:
    policy = write_policy(tmp_path / "policy")
    config = {"policy": str(policy), "state_root": str(tmp_path / "state"), "python_path": [str(REPO)],
              "server": {"host": "127.0.0.1", "port": free_port()}, "upstreams": [DEMO_UPSTREAM], **extra}
    path = tmp_path / "dharma.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


ANSI = re.compile(r"\x1b\[[0-9;]*m")


def plain(line: str) -> str:
    return ANSI.sub("", line)


def serving_line(text: str) -> str:
    return next(line for line in text.replace("\r", "").splitlines() if "dharma.serving" in line)


def test_serve_on_a_terminal_logs_console_lines(tmp_path: Path) -> None:
    config = serve_config(tmp_path)
    with on_terminal([sys.executable, "-m", "gateway", "serve", "--config", str(config)], env_without_dharma(), tmp_path) as (_, fd):
        line = serving_line(read_until(fd, "dharma.serving"))
    with pytest.raises(ValueError):
        json.loads(line)
    assert re.search(r"\[info\s*\] dharma\.serving\s.*\bpolicy=test-profile\b", plain(line)), line
    assert "\x1b[" in line, "a terminal gets colours unless NO_COLOR is set"


def test_log_format_json_overrides_the_terminal(tmp_path: Path) -> None:
    config = serve_config(tmp_path)
    env = env_without_dharma(DHARMA_LOG_FORMAT="json")
    with on_terminal([sys.executable, "-m", "gateway", "serve", "--config", str(config)], env, tmp_path) as (_, fd):
        line = serving_line(read_until(fd, "dharma.serving"))
    event = json.loads(line)
    assert event["event"] == "dharma.serving" and event["level"] == "info" and event["policy"] == "test-profile"


@pytest.mark.parametrize("setting", [None, "console"])
def test_serve_on_a_pipe_logs_json_unless_told_console(tmp_path: Path, setting: str | None) -> None:
    config = serve_config(tmp_path, **({"log_format": setting} if setting else {}))
    proc = subprocess.Popen([sys.executable, "-m", "gateway", "serve", "--config", str(config)], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env_without_dharma(NO_COLOR="1"),
                            cwd=tmp_path, start_new_session=True)
    try:
        assert proc.stderr is not None
        line = serving_line(read_until(proc.stderr.fileno(), "dharma.serving"))
    finally:
        stop(proc)
        if proc.stderr is not None:
            proc.stderr.close()
    if setting is None:
        assert json.loads(line)["event"] == "dharma.serving"
    else:
        assert re.search(r"\[info\s*\] dharma\.serving\s.*\bpolicy=test-profile\b", line), line
        assert "\x1b[" not in line, "NO_COLOR=1 turns the colours off"
        with pytest.raises(ValueError):
            json.loads(line)


PROBE = f"""
import structlog, sys
from gateway.logging import configure_logging
configure_logging("info", sys.argv[1])
try:
    raise RuntimeError("upstream said Authorization: Bearer {SECRET_KEY}")
except RuntimeError:
    structlog.get_logger().exception("probe.failed", api_key="{SECRET_KEY}", note="key {AWS_KEY} in the text", url="https://x/?k={STRIPE_KEY}")
structlog.get_logger().info("probe.done")
"""


@pytest.mark.parametrize("fmt", ["auto", "json", "console"])
def test_no_secret_reaches_the_terminal_in_either_form(tmp_path: Path, fmt: str) -> None:
    with on_terminal([sys.executable, "-c", PROBE, fmt], env_without_dharma(), tmp_path) as (proc, fd):
        text = read_until(fd, "probe.done")
        assert proc.wait(WAIT_S) == 0
    assert "probe.failed" in text and "RuntimeError" in text, text
    assert SECRET_KEY not in text and AWS_KEY not in text and STRIPE_KEY not in text, text
    assert "Bearer [REDACTED]" in text, text
    first = next(line for line in text.replace("\r", "").splitlines() if "probe.failed" in line)
    if fmt == "json":
        assert json.loads(first)["api_key"] == "[REDACTED]"
    else:
        with pytest.raises(ValueError):
            json.loads(first)
