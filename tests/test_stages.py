"""The stateful stages' pure cores: GCRA and the circuit breaker's state machine."""

from __future__ import annotations

from collections import OrderedDict

from gateway.stores.memory import BreakerState, admit, check, gcra, record, release


def test_gcra_allows_a_burst_then_spaces_calls():
    tats: OrderedDict[str, float] = OrderedDict()
    waits = [gcra(tats, "k", interval=1.0, burst=3, cost=1, now=100.0, max_keys=10) for _ in range(4)]
    assert waits[:3] == [0.0, 0.0, 0.0] and waits[3] > 0.9
    assert gcra(tats, "k", interval=1.0, burst=3, cost=1, now=101.0, max_keys=10) == 0.0
    assert gcra(tats, "other", interval=1.0, burst=3, cost=1, now=100.0, max_keys=10) == 0.0


def test_gcra_cost_and_key_eviction():
    tats: OrderedDict[str, float] = OrderedDict()
    assert gcra(tats, "k", interval=1.0, burst=3, cost=3, now=0.0, max_keys=2) == 0.0
    assert gcra(tats, "k", interval=1.0, burst=3, cost=1, now=0.0, max_keys=2) > 0
    for key in ("a", "b", "c"):
        gcra(tats, key, interval=1.0, burst=1, cost=1, now=0.0, max_keys=2)
    assert list(tats) == ["b", "c"]


def test_breaker_opens_half_opens_and_closes():
    s = BreakerState()
    for _ in range(3):
        assert admit(s, now=0.0, reset_seconds=10) == 0.0
        record(s, ok=False, now=0.0, threshold=3)
    assert s.state == "open"
    assert admit(s, now=5.0, reset_seconds=10) == 5.0
    assert admit(s, now=10.0, reset_seconds=10) == 0.0 and s.state == "half_open"
    assert admit(s, now=10.0, reset_seconds=10) > 0  # only one probe at a time
    record(s, ok=True, now=10.5, threshold=3)
    assert s.state == "closed" and admit(s, now=10.5, reset_seconds=10) == 0.0


def test_breaker_failed_probe_reopens():
    s = BreakerState(state="open", failures=3, opened_at=0.0)
    assert admit(s, now=10.0, reset_seconds=10) == 0.0
    record(s, ok=False, now=10.0, threshold=3)
    assert s.state == "open" and s.opened_at == 10.0


def test_breaker_check_changes_nothing_and_admit_claims_the_probe():
    s = BreakerState(state="open", failures=3, opened_at=0.0)
    assert check(s, now=5.0, reset_seconds=10) == 5.0
    assert check(s, now=10.0, reset_seconds=10) == 0.0 and s.state == "open" and not s.probing
    assert check(s, now=10.0, reset_seconds=10) == 0.0  # any number of checks: still no probe claimed
    assert admit(s, now=10.0, reset_seconds=10) == 0.0 and s.state == "half_open" and s.probing
    assert check(s, now=10.0, reset_seconds=10) > 0  # the probe is out: others fail fast
    release(s)
    assert check(s, now=10.0, reset_seconds=10) == 0.0 and admit(s, now=10.0, reset_seconds=10) == 0.0
