"""The long fuzz campaign: `python -m tests.fuzz [--seconds N] [--hang-seconds S] [--target NAME]`
(`make fuzz`, `FUZZ_SECONDS` default 600).

Runs every target of `tests.fuzz.targets` in turn, in rounds of fresh random inputs, until the
time is up. Unlike the suite, a failure does not stop the campaign: each distinct crash (target,
exception type, place) is kept with its first input, an input that runs longer than the hang
limit is a hang (interrupted by an alarm), and the end reports inputs tried, crashes and hangs.
Exit status 1 when anything was found, 0 otherwise.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

import structlog
from hypothesis import given, settings

from tests.fuzz.targets import TARGETS, Target

log = structlog.get_logger()

ROUND_EXAMPLES = 200


class Hang(Exception):
    """One input ran past the hang limit."""


@dataclass
class Found:
    target: str
    kind: str
    where: str
    detail: str
    example: str
    count: int = 1


@dataclass
class Campaign:
    deadline: float
    hang_seconds: float
    tried: dict[str, int] = field(default_factory=dict)
    crashes: dict[tuple[str, str, str], Found] = field(default_factory=dict)
    hangs: dict[str, Found] = field(default_factory=dict)

    def run_round(self, target: Target, check: Any) -> None:
        @settings(settings.get_profile("fuzz"), max_examples=ROUND_EXAMPLES)
        @given(target.strategy)
        def one(value: Any) -> None:
            if time.monotonic() >= self.deadline:
                return  # the round ends quickly: the rest of its inputs are only drawn
            self.tried[target.name] = self.tried.get(target.name, 0) + 1
            signal.setitimer(signal.ITIMER_REAL, self.hang_seconds)
            try:
                check(value)
            except Hang:
                self._hang(target.name, value)
            except Exception as exc:  # every other exception is a finding, recorded, not raised
                self._crash(target.name, exc, value)
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)

        one()

    def _hang(self, name: str, value: Any) -> None:
        found = self.hangs.get(name)
        if found is None:
            self.hangs[name] = Found(name, "hang", "", f"over {self.hang_seconds:g}s", _show(value))
            log.error("fuzz.hang", target=name, example=_show(value))
        else:
            found.count += 1

    def _crash(self, name: str, exc: Exception, value: Any) -> None:
        frames = traceback.extract_tb(exc.__traceback__)
        inner = next((f for f in reversed(frames) if "/tests/fuzz/" not in f.filename), frames[-1] if frames else None)
        where = f"{inner.filename}:{inner.lineno}" if inner else "?"
        key = (name, type(exc).__name__, where)
        found = self.crashes.get(key)
        if found is None:
            self.crashes[key] = Found(name, type(exc).__name__, where, str(exc)[:300], _show(value))
            log.error("fuzz.crash", target=name, error=type(exc).__name__, where=where, detail=str(exc)[:300], example=_show(value))
        else:
            found.count += 1


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 400 else text[:400] + f"... ({len(text)} chars)"


def _alarm(signum: int, frame: Any) -> None:
    raise Hang


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.fuzz", description="Fuzz every parser of hostile input.")
    parser.add_argument("--seconds", type=float, default=float(os.environ.get("FUZZ_SECONDS", 600)),
                        help="total campaign time (default: $FUZZ_SECONDS or 600)")
    parser.add_argument("--hang-seconds", type=float, default=float(os.environ.get("FUZZ_HANG_SECONDS", 5)),
                        help="an input running longer than this is a hang (default: $FUZZ_HANG_SECONDS or 5)")
    parser.add_argument("--target", action="append", choices=[t.name for t in TARGETS],
                        help="fuzz only this target (repeatable; default: all)")
    args = parser.parse_args(argv)
    targets = [t for t in TARGETS if not args.target or t.name in args.target]
    started = time.monotonic()
    campaign = Campaign(deadline=started + args.seconds, hang_seconds=args.hang_seconds)
    signal.signal(signal.SIGALRM, _alarm)
    opened = [(t, t.open()) for t in targets]
    checks = [(t, ctx.__enter__()) for t, ctx in opened]
    try:
        while time.monotonic() < campaign.deadline:
            for target, check in checks:
                campaign.run_round(target, check)
                if time.monotonic() >= campaign.deadline:
                    break
    finally:
        for _, ctx in reversed(opened):
            ctx.__exit__(None, None, None)
    return report(campaign, time.monotonic() - started)


def report(campaign: Campaign, elapsed: float) -> int:
    """Print the summary table (the campaign's output, for a person): inputs, crashes, hangs."""
    out = sys.stdout
    out.write(f"\nfuzz: {elapsed:.0f}s, {sum(campaign.tried.values())} inputs tried\n")
    for name, count in campaign.tried.items():
        crashes = sum(f.count for f in campaign.crashes.values() if f.target == name)
        hangs = campaign.hangs[name].count if name in campaign.hangs else 0
        out.write(f"  {name:24} {count:9} inputs  {crashes:4} crashes  {hangs:4} hangs\n")
    for found in [*campaign.crashes.values(), *campaign.hangs.values()]:
        out.write(f"\n{found.kind} in {found.target} at {found.where} ({found.count}x): {found.detail}\n  input: {found.example}\n")
    crashes, hangs = len(campaign.crashes), len(campaign.hangs)
    out.write(f"\ncrashes: {crashes}  hangs: {hangs}\n")
    return 1 if crashes or hangs else 0


if __name__ == "__main__":
    sys.exit(main())
