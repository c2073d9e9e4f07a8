"""The one bounded memo (`gateway.memo`): read as a plain dict or set, stored through `remember`,
emptied when full so a table keyed on what clients send never outgrows its bound."""

from __future__ import annotations

import pytest

from gateway.memo import Memo, MemoSet


def test_memo_returns_what_it_stores_and_reads_as_a_dict() -> None:
    memo: Memo[tuple[str, str], bool] = Memo(4)
    assert memo.remember(("a/../b", "re"), True) is True
    value = ("x", 1)
    assert memo.remember(("k", "re"), value) is value  # the very object: sites return it
    assert memo.get(("a/../b", "re")) is True and memo[("k", "re")] is value
    assert memo.get(("missing", "re")) is None and ("missing", "re") not in memo
    assert isinstance(memo, dict) and memo == {("a/../b", "re"): True, ("k", "re"): value}
    with pytest.raises(KeyError):
        memo[("missing", "re")]


def test_memo_empties_itself_when_full_then_stores() -> None:
    memo: Memo[int, str] = Memo(3)
    for i in range(3):
        memo.remember(i, str(i))
    assert memo == {0: "0", 1: "1", 2: "2"}  # exactly `bound` entries are kept
    memo.remember(3, "3")
    assert memo == {3: "3"}  # full: emptied, then the new entry stored
    for i in range(4, 100):
        memo.remember(i, str(i))
        assert 1 <= len(memo) <= 3
    assert memo[99] == "99"


def test_memo_set_keeps_items_and_empties_when_full() -> None:
    clean: MemoSet[str] = MemoSet(2)
    assert clean.remember("text") is None
    clean.remember("ok: 3 items")
    assert "text" in clean and "ok: 3 items" in clean and "other" not in clean
    assert isinstance(clean, set) and clean == {"text", "ok: 3 items"}
    clean.remember("third")
    assert clean == {"third"}
    for i in range(50):
        clean.remember(f"s{i}")
        assert 1 <= len(clean) <= 2


def test_each_memo_has_its_own_bound_and_entries() -> None:
    a: Memo[str, int] = Memo(1)
    b: Memo[str, int] = Memo(5)
    a.remember("x", 1)
    b.remember("y", 2)
    assert (a, b, a.bound, b.bound) == ({"x": 1}, {"y": 2}, 1, 5)
    a.remember("z", 3)
    assert a == {"z": 3} and b == {"y": 2}


@pytest.mark.parametrize("bound", [0, -1, 2.5, "8", None])
def test_a_bound_that_keeps_nothing_is_refused(bound: object) -> None:
    for kind in (Memo, MemoSet):
        with pytest.raises(ValueError, match="bound must be a whole number of at least 1"):
            kind(bound)  # type: ignore[arg-type]


def test_the_module_level_sites_keep_their_bounds() -> None:
    """The module-level tables moved onto the helper kept their bounds."""
    from gateway.mcp import governance
    from gateway.policy.cel import helpers
    from gateway.stages import classify
    from gateway.stages.sanitizer import instructions, secrets, shell

    assert [(type(m), m.bound) for m in (helpers._MATCHED, classify._CLASSIFIED, shell._ANALYSED,
                                         governance._FINDINGS)] == [(Memo, 4096), (Memo, 2048), (Memo, 1024), (Memo, 4096)]
    assert [(type(s), s.bound) for s in (secrets._CLEAN, instructions._CLEAN)] == [(MemoSet, 8192), (MemoSet, 8192)]
