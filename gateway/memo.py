"""The one bounded memo: a dict (or set) that a hot path reads like any other and that empties
itself when full, so a table keyed on what clients send can never grow without limit.

Emptying everything (rather than dropping the oldest) keeps a hit a plain `dict.get` / `in`
and a store one length check: the tables hold answers that are cheap to rebuild, and a working
set that fits comes back within a few calls. No I/O and no project imports: every layer may use it.
"""

from __future__ import annotations

from typing import TypeVar

K = TypeVar("K")
V = TypeVar("V")
T = TypeVar("T")


def _checked(bound: int) -> int:
    if type(bound) is not int or bound < 1:
        raise ValueError(f"a memo's bound must be a whole number of at least 1, not {bound!r}")
    return bound


class Memo(dict[K, V]):
    """A dict of at most `bound` entries: read it as a dict, store through `remember`."""

    __slots__ = ("bound",)

    def __init__(self, bound: int) -> None:
        super().__init__()
        self.bound = _checked(bound)

    def remember(self, key: K, value: V) -> V:
        """Store `value` under `key` (emptying the memo first when it is full) and return it."""
        if len(self) >= self.bound:
            self.clear()
        self[key] = value
        return value


class MemoSet(set[T]):
    """A set of at most `bound` items: test it with `in`, add through `remember`."""

    __slots__ = ("bound",)

    def __init__(self, bound: int) -> None:
        super().__init__()
        self.bound = _checked(bound)

    def remember(self, item: T) -> None:
        """Add `item` (emptying the set first when it is full)."""
        if len(self) >= self.bound:
            self.clear()
        self.add(item)
