"""Regenerate docs/img/overview.png: a day of demo traffic, then the overview page in headless chromium.

    .venv/bin/python -m examples.overview_screenshot [--out docs/img/overview.png] [--calls 1500]

1. A real Gateway (the demo profile, examples/policies/demo.yaml, in front of the demo backend) makes
   `--calls` governed calls in-process, seeded and spread over the last 24 hours by the Gateway's
   clock: readers read (a few try `../` and are refused by the traversal rule, a few ask for a file
   that is not there), operators write and delete (held for a human: most are approved and made
   again with their approval, some denied), a reader tries to
   write (refused by the tier gate), a clinician reads health records without a purpose (refused).
   Every call goes through the whole pipeline and into a real SQLite ledger in a temporary state root.
2. `dharma serve` opens that state root; Debian's chromium (Playwright, as the UI tests use) logs in
   with the published demo admin key, opens /ui/overview?range=24h, presses "Verify now" and takes
   the screenshot.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import yaml

ROOT = Path(__file__).resolve().parent.parent
PROFILE = ROOT / "examples" / "policies" / "demo.yaml"
CHROMIUM = "/usr/bin/chromium"
KEYS = {"reader": "demo-reader-key", "operator": "demo-operator-key", "clinician": "demo-clinician-key",
        "admin": "demo-admin-key"}
DAY = 86_400.0


async def make_traffic(state: Path, sandbox: Path, calls: int, seed: int) -> None:
    """`calls` governed calls spread over the last day (a busier afternoon), into `state`'s ledger."""
    import examples.demo_backend as demo
    from audit.sqlite import SqliteLedger
    from gateway.core.gateway import Gateway
    from gateway.crypto.keys import KeyStore
    from gateway.policy.compile import load_policy

    demo.SANDBOX = sandbox
    for name in ("notes.txt", "plan.md", "todo.txt"):
        (sandbox / name).write_text(f"{name}\n", encoding="utf-8")
    rng = random.Random(seed)
    start = time.time() - DAY
    times = sorted(start + DAY * min(0.999, abs(rng.gauss(0.6, 0.22))) for _ in range(calls))
    shift = [0.0]
    gw = Gateway(load_policy(PROFILE), [demo.backend()], ledger=await SqliteLedger.open(state / "ledger.db"),
                 keys=KeyStore.open(state), clock=lambda: time.time() - shift[0])
    try:
        shift[0] = DAY + 3600  # a first call outside the day shown: imports and caches warm up there
        await one_call(gw, rng)
        for at in times:
            shift[0] = time.time() - at
            await one_call(gw, rng)
    finally:
        await gw.aclose()


async def one_call(gw: object, rng: random.Random) -> None:
    """One call of the day's mix (see the module doc)."""
    roll = rng.random()
    call = gw.call  # type: ignore[attr-defined]
    if roll < 0.55:
        await call(*rng.choice(READS), api_key=KEYS["reader"])
    elif roll < 0.57:
        await call("read_file", {"path": "missing.txt"}, api_key=KEYS["reader"])  # the backend fails
    elif roll < 0.63:
        await call("read_file", {"path": rng.choice(("../etc/passwd", "../../.ssh/id_rsa", "a/../../x"))}, api_key=KEYS["reader"])
    elif roll < 0.78:
        await held(gw, rng, "write_file", {"path": f"out-{rng.randrange(99)}.txt", "content": "ok"})
    elif roll < 0.84:
        await call("write_file", {"path": "notes.txt", "content": "x"}, api_key=KEYS["reader"])
    elif roll < 0.90:
        await call("health_records", {"patient_id": f"p-{rng.randrange(1000, 1010)}"}, api_key=KEYS["clinician"])
    else:
        await held(gw, rng, "delete_file", {"path": "todo.txt"})


async def held(gw: object, rng: random.Random, tool: str, arguments: dict[str, str]) -> None:
    """A call held for a human: approved (and then made again with its approval) or denied."""
    out = await gw.call(tool, arguments, api_key=KEYS["operator"])  # type: ignore[attr-defined]
    approval = getattr(out, "approval_id", None)
    if approval:
        approve = rng.random() < 0.7
        await gw.decide(approval, approve=approve, by="demo-admin", via="cli", reason="reviewed")  # type: ignore[attr-defined]
        if approve:
            await gw.call(tool, arguments, api_key=KEYS["operator"], approval_id=approval)  # type: ignore[attr-defined]


READS = [("read_file", {"path": "notes.txt"}), ("read_file", {"path": "plan.md"}), ("list_directory", {}),
         ("search", {"query": "ledger"})]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def serving(work: Path, sandbox: Path) -> Iterator[str]:
    """`dharma serve` over the state root the traffic was written to, until the block ends."""
    port = free_port()
    config = {"policy": str(PROFILE), "state_root": str(work / "state"), "python_path": [str(ROOT)],
              "server": {"host": "127.0.0.1", "port": port}, "log_format": "json", "log_level": "warning",
              "upstreams": [{"id": "demo", "type": "python", "target": "examples.demo_backend:backend"}]}
    (work / "dharma.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DHARMA_DEMO_SANDBOX": str(sandbox)}
    proc = subprocess.Popen([sys.executable, "-m", "gateway", "serve", "--config", str(work / "dharma.yaml")], env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(base + "/healthz", timeout=2).status_code == 200:
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("dharma serve did not start")
            time.sleep(0.1)
        yield base
    finally:
        proc.terminate()
        proc.wait(30)


def screenshot(base: str, out: Path) -> None:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--headless", "--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page(viewport={"width": 1500, "height": 900})
            page.goto(base + "/ui/login")
            page.get_by_label("API key or bearer token").fill(KEYS["admin"])
            page.get_by_role("button", name="Log in").click()
            page.wait_for_url("**/ui/approvals")
            page.goto(base + "/ui/overview?range=24h")
            page.get_by_role("button", name="Verify now").click()
            page.locator("#last-verify .verify.ok").wait_for()
            page.screenshot(path=str(out), full_page=True)
        finally:
            browser.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "img" / "overview.png")
    parser.add_argument("--calls", type=int, default=1500)
    parser.add_argument("--seed", type=int, default=25)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="dharma-overview-") as tmp:
        work = Path(tmp)
        (work / "state").mkdir()
        sandbox = work / "sandbox"
        sandbox.mkdir()
        asyncio.run(make_traffic(work / "state", sandbox, args.calls, args.seed))
        with serving(work, sandbox) as base:
            screenshot(base, args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
