"""Live reload at the edge: SIGHUP and file watching ask the gateway to reload its policy.

`Gateway.reload` does the work (load, check, record, swap); this module only notices when to
ask. The watched files are the ones the serving policy was built from (the profile, the profiles
it extends, its rule files) plus the configured `rules` paths; a YAML file added to a watched
rule directory counts too. A burst of writes (an editor's save) is one reload (`debounce_ms`).
Each replica watches its own files: several replicas reload independently.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import structlog

from gateway.config import Settings
from gateway.core.gateway import Gateway

log = structlog.get_logger()
YAML_SUFFIXES = (".yaml", ".yml")
TEST_SUFFIXES = ("_test.yaml", "_test.yml")


def watched(gateway: Gateway, settings: Settings) -> tuple[set[Path], set[Path]]:
    """(files, rule directories) whose change asks for a reload: the serving policy's files, the
    profile named in the settings, and the configured `rules` paths (a directory: its YAML files)."""
    files = {Path(f).resolve() for f in gateway.policy.files}
    files.add(settings.policy.resolve())
    dirs: set[Path] = set()
    for entry in settings.rules:
        path = entry.resolve()
        (dirs if path.is_dir() else files).add(path)
    return files, dirs


def wanted(path: Path, files: set[Path], dirs: set[Path]) -> bool:
    """Whether a change at `path` should reload: a known file, or a rule file in a watched rule directory."""
    if path in files:
        return True
    return path.parent in dirs and path.name.endswith(YAML_SUFFIXES) and not path.name.endswith(TEST_SUFFIXES)


async def watch_files(gateway: Gateway, settings: Settings, stop: asyncio.Event) -> None:
    """Reload whenever a watched file changes, until `stop` is set. The set of files is read again
    after every reload (a new rule set named by the profile is watched from then on)."""
    from watchfiles import awatch  # only when watching is on

    while not stop.is_set():
        files, dirs = watched(gateway, settings)
        roots = sorted({f.parent for f in files if f.parent.is_dir()} | {d for d in dirs if d.is_dir()})
        if not roots:
            log.warning("policy.watch_nothing", reason="none of the policy's files or directories exist")
            return
        log.info("policy.watching", directories=[str(r) for r in roots], files=len(files))
        version = gateway.policy.version
        async for changes in awatch(*roots, debounce=settings.reload.debounce_ms, recursive=False, stop_event=stop,
                                    watch_filter=lambda _change, path: wanted(Path(path).resolve(), files, dirs)):
            changed = sorted({str(Path(path)) for _change, path in changes})
            log.info("policy.files_changed", files=changed)
            await gateway.reload(trigger="file")
            if gateway.policy.version != version:
                break  # the policy's files may have changed: watch the new set


@contextlib.asynccontextmanager
async def live_reload(gateway: Gateway, settings: Settings) -> AsyncIterator[None]:
    """While inside: SIGHUP reloads the policy, and (with `reload.watch`) so does a change to its files."""
    loop = asyncio.get_running_loop()
    tasks: set[asyncio.Task[Any]] = set()

    def on_sighup() -> None:
        log.info("policy.sighup")
        task = loop.create_task(gateway.reload(trigger="signal"))
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    hup = getattr(signal, "SIGHUP", None)
    if hup is not None:
        loop.add_signal_handler(hup, on_sighup)
    stop = asyncio.Event()
    watcher = loop.create_task(watch_files(gateway, settings, stop)) if settings.reload.watch else None
    try:
        yield
    finally:
        if hup is not None:
            loop.remove_signal_handler(hup)
        stop.set()
        for task in [*tasks, *([watcher] if watcher else [])]:
            task.cancel()
        for task in [*tasks, *([watcher] if watcher else [])]:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
