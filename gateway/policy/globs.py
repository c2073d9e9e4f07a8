"""Whether two tool-name globs (fnmatch syntax: `*`, `?`, `[seq]`, `[!seq]`) can match one name.

The policy compiler uses it to find settings that collide for some tool without naming it, e.g. a
tool cost that no rate limit covering that tool could ever admit. Exact, not a heuristic: each glob
is a sequence of "any string" and "one character of a set"; two globs overlap when a walk through
both can reach both ends together.
"""

from __future__ import annotations

from dataclasses import dataclass

STAR = None


@dataclass(frozen=True, slots=True)
class CharSet:
    """One character position: any character in `ranges` (or, `negated`, any character not in them)."""

    ranges: tuple[tuple[str, str], ...]
    negated: bool = False

    def nonempty(self) -> bool:
        return self.negated or bool(self.ranges)

    def meets(self, other: CharSet) -> bool:
        """Some character is in both sets."""
        if self.negated and other.negated:
            return True  # two finite exclusions leave characters over
        if not self.negated and not other.negated:
            return any(lo <= o_hi and o_lo <= hi for lo, hi in self.ranges for o_lo, o_hi in other.ranges)
        positive, negative = (other, self) if self.negated else (self, other)
        return any(not _covered(lo, hi, negative.ranges) for lo, hi in positive.ranges)


Token = CharSet | None


def _covered(lo: str, hi: str, ranges: tuple[tuple[str, str], ...]) -> bool:
    """Every character from `lo` to `hi` lies in `ranges`."""
    point = ord(lo)
    for r_lo, r_hi in sorted(ranges):
        if ord(r_lo) <= point <= ord(r_hi):
            point = ord(r_hi) + 1
            if point > ord(hi):
                return True
    return False


def _bracket(pattern: str, start: int) -> tuple[CharSet, int] | None:
    """The set `[...]` opening at `start` and the index after it, as fnmatch reads it (None: a literal `[`)."""
    i = start + 1
    negated = i < len(pattern) and pattern[i] == "!"
    if negated:
        i += 1
    end = i + 1 if i < len(pattern) and pattern[i] == "]" else i
    end = pattern.find("]", end)
    if end < 0:
        return None
    body = pattern[i:end]
    ranges: list[tuple[str, str]] = []
    k = 0
    while k < len(body):
        if k + 2 < len(body) and body[k + 1] == "-":
            if body[k] <= body[k + 2]:
                ranges.append((body[k], body[k + 2]))
            k += 3
        else:
            ranges.append((body[k], body[k]))
            k += 1
    return CharSet(tuple(ranges), negated), end + 1


def tokens(pattern: str) -> list[Token]:
    """The glob as a sequence of STAR (any string) and CharSet (one character)."""
    out: list[Token] = []
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == "*":
            if not out or out[-1] is not STAR:
                out.append(STAR)
            i += 1
        elif c == "?":
            out.append(CharSet((), negated=True))
            i += 1
        elif c == "[" and (found := _bracket(pattern, i)) is not None:
            out.append(found[0])
            i = found[1]
        else:
            out.append(CharSet(((c, c),)))
            i += 1
    return out


def globs_overlap(a: str, b: str) -> bool:
    """Some tool name matches both globs (fnmatch, case-sensitive)."""
    ta, tb = tokens(a), tokens(b)
    seen: set[tuple[int, int]] = set()
    todo = [(0, 0)]
    while todo:
        i, j = todo.pop()
        if (i, j) in seen:
            continue
        seen.add((i, j))
        if i == len(ta) and j == len(tb):
            return True
        x = ta[i] if i < len(ta) else False
        y = tb[j] if j < len(tb) else False
        if x is STAR:
            todo.append((i + 1, j))  # the star ends here
            if isinstance(y, CharSet) and y.nonempty():
                todo.append((i, j + 1))  # the star takes b's next character
        if y is STAR:
            todo.append((i, j + 1))
            if isinstance(x, CharSet) and x.nonempty():
                todo.append((i + 1, j))
        if isinstance(x, CharSet) and isinstance(y, CharSet) and x.meets(y):
            todo.append((i + 1, j + 1))
    return False
