"""`dharma serve` tunes the cyclic garbage collector once it listens (`gateway.runtime.settle_collector`)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

PROBE = """
import gc, json
from gateway.runtime import GC_YOUNG_THRESHOLD, settle_collector
kept = [[i] for i in range(1000)]  # start-up's long-lived objects
before = gc.get_threshold()
settle_collector()
print(json.dumps({"before": before, "after": gc.get_threshold(), "frozen": gc.get_freeze_count(),
                  "young": GC_YOUNG_THRESHOLD, "enabled": gc.isenabled(),
                  "kept_tracked": any(o is kept for o in gc.get_objects())}))
"""


def test_settle_collector_freezes_start_up_and_raises_the_young_threshold() -> None:
    """In a fresh interpreter (the test process's collector is left alone): the young threshold is
    raised to `GC_YOUNG_THRESHOLD`, the older ones kept, start-up's objects frozen (no longer scanned),
    the collector still on."""
    proc = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert got["before"][0] < got["young"] == got["after"][0] and got["after"][1:] == got["before"][1:]
    assert got["frozen"] > 1000 and not got["kept_tracked"] and got["enabled"]
