"""A learned score for text addressed to the model, in any language (issue 27, round 5).

Phrase grammars and word lists per language did not generalise to fresh wording. This is a
logistic regression over word unigrams and bigrams (NFKC, casefolded; Chinese, Japanese, Korean,
Thai, Lao, Khmer and Burmese as character bigrams, since they do not put spaces between words)
that scores SENTENCE WINDOWS (one sentence and the next) of a definition, a result or a fetched
page. Beside the words, each word's character 3- to 5-grams (padded with `<` `>`, hashed into a fixed
number of buckets, averaged per word: round 6) carry what is learned in one language to related
languages and spellings the training set lacks. Its weights are a data file (`data/instruction_model.json`, only nonzero weights, sorted)
written by `tests/corpus/tools/train_instruction_model.py` from the labelled sentences of
`tests/corpus/tools/instruction_training.tsv`; scoring is a dict lookup per feature. Pure: no I/O
after import, no randomness, sorted iteration.
"""

from __future__ import annotations

import base64
import bisect
import functools
import json
import math
import re
import unicodedata
import zlib
from array import array
from collections.abc import Iterable, Iterator
from importlib import resources
from typing import Final, NamedTuple

from gateway.stages.sanitizer import lexicon

__all__ = ["MODEL", "THRESHOLD", "Hit", "features", "grams", "score", "scan", "subword_tokens", "tokens", "windows"]

_DATA: Final = "data/instruction_model.json"
MAX_TEXT: Final = 8_192  # characters of one string scored; the rest is not read by the model
MAX_WINDOW: Final = 400  # characters of one window
_MAX_WINDOWS: Final = 64

#: Letters, digits and the combining marks Indic, Hebrew and Arabic spelling needs.
_WORD_CHARS: Final = (
    r"[\w\u0300-\u036f\u0483-\u0489\u0591-\u05c7\u0610-\u061a\u064b-\u065f\u0670\u06d6-\u06ed"
    r"\u0900-\u0963\u0966-\u0dff\u0e00-\u0e4f\u0e50-\u0eff\u1000-\u109f\u1780-\u17ff\u1ab0-\u1aff]+"
)
#: A token: a shape that stands for what it is whatever its text (a URL, an e-mail address, a file
#: path, a tool-like snake_case or camelCase name), else a word.
_TOKEN: Final = re.compile(
    r"(?P<xurl>\bhttps?://\S+|\bwww\.\S+)|(?P<xmail>[\w.+-]+@[\w-]+\.[\w.-]+)"
    r"|(?P<xpath>(?<![\w/])(?:~|\.{1,2}|/(?:etc|home|root|users|var|tmp))?/[\w.-]+(?:/[\w.-]+)+|(?<!\w)\.(?:env|ssh|aws|npmrc|netrc)\b)"
    r"|(?P<xname>\b[a-z][a-z0-9]*(?:_[a-z0-9]+)+\b|\b[a-z]+(?:[A-Z][a-z0-9]+)+\b)"
    r"|(?P<word>" + _WORD_CHARS + ")"
)
_WORD: Final = re.compile(_WORD_CHARS)
_SHAPE_TOKENS: Final = frozenset(("xurl", "xmail", "xpath", "xname"))
#: Scripts written without spaces between words: read as character bigrams.
_UNSPACED: Final = re.compile(
    r"[\u0e00-\u0eff\u1000-\u109f\u1780-\u17ff\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]+"
)
#: The end of a sentence (any script) or of a line.
_SENTENCE_END: Final = re.compile(r"[.!?;:](?=\s)|[。！？；：\n]|[।॥؟۔።]")


class Hit(NamedTuple):
    """A window scored at or above THRESHOLD: its score, its span and where its strongest word is."""

    score: float
    start: int
    end: int
    at: int
    concepts: tuple[str, ...]
    shapes: frozenset[str]


_GRAM_SIZES: Final = (3, 4, 5)
_GRAM_WORD: Final = 24  # characters of a word read for its character n-grams


def _load() -> tuple[str, float, float, dict[str, float], int, float, list[float]]:
    """The shipped weights (package data, read once at import): word and concept features by name,
    character n-gram buckets as int8 (base64) times a scale (a file without them scores words only)."""
    data = json.loads(resources.files("gateway.stages.sanitizer").joinpath(_DATA).read_text("utf-8"))
    sub = data.get("subwords", {"buckets": 1, "scale": 0.0, "int8": "AA=="})
    scale = float(sub["scale"])
    grams = [v * scale for v in array("b", base64.b64decode(sub["int8"]))]
    return (data["model"], float(data["bias"]), float(data["threshold"]), {k: float(v) for k, v in data["weights"].items()},
            int(sub["buckets"]), float(sub.get("power", 1.0)), grams)


MODEL, _BIAS, THRESHOLD, _WEIGHTS, BUCKETS, _POWER, _GRAMS = _load()


def grams(word: str, buckets: int = BUCKETS) -> tuple[int, ...]:
    """The distinct buckets of a word's character 3- to 5-grams (padded `<word>`, crc32 mod `buckets`)."""
    padded = f"<{word[:_GRAM_WORD]}>"
    return tuple(sorted({zlib.crc32(padded[i:i + n].encode()) % buckets
                         for n in _GRAM_SIZES for i in range(max(1, len(padded) - n + 1))}))


@functools.lru_cache(maxsize=1 << 15)
def _subword(word: str) -> float:
    """A word's n-gram weight: its buckets' weights summed, divided by their number to the file's
    `power` (0.5: a long word weighs more than a short one, not in proportion). Memoised: a word is hashed once."""
    found = grams(word)
    return sum(_GRAMS[b] for b in found) / len(found) ** _POWER


def subword_tokens(toks: Iterable[str]) -> list[str]:
    """The distinct words (not shapes) whose n-grams count, sorted."""
    return sorted({t for t in toks if t not in _SHAPE_TOKENS})


def _split(word: str, at: int, out: list[tuple[int, str]]) -> None:
    """Append a casefolded word, its runs of an unspaced script as character bigrams."""
    if word.isascii() or _UNSPACED.search(word) is None:
        out.append((at, word))
        return
    i = 0
    for m in _UNSPACED.finditer(word):
        if m.start() > i:
            out.append((at + i, word[i:m.start()]))
        run = m.group()
        out.extend([(at + m.start(), run)] if len(run) == 1 else [(at + m.start() + k, run[k:k + 2]) for k in range(len(run) - 1)])
        i = m.end()
    if i < len(word):
        out.append((at + i, word[i:]))


def _tokens_at(text: str) -> list[tuple[int, str]]:
    """(offset, token) of every token of an NFKC text, in order."""
    out: list[tuple[int, str]] = []
    for m in _TOKEN.finditer(text):
        kind = m.lastgroup
        if kind == "word":
            _split(m.group().casefold(), m.start(), out)
        else:
            out.append((m.start(), str(kind)))
    return out


def tokens(text: str) -> list[str]:
    """The tokens of `text` (NFKC, shaped, casefolded; unspaced scripts as character bigrams)."""
    return [t for _, t in _tokens_at(unicodedata.normalize("NFKC", text))]


def _combine(toks: list[str], found: list[str]) -> list[str]:
    pairs = {f"@{a}+{b}" for i, a in enumerate(found) for b in found[i + 1:]}
    return sorted(set(toks) | {a + " " + b for a, b in zip(toks, toks[1:])} | {"@" + c for c in found} | pairs)


def features(text: str) -> list[str]:
    """The unigrams and bigrams of `text`, and the concepts `lexicon` finds in it (any of 60 languages:
    "ignore", "the user", "send"...) alone and in pairs, each once, sorted. The concept features carry
    what the model learned in one language to every language the concept tables cover."""
    text = unicodedata.normalize("NFKC", text)
    return _combine(tokens(text), sorted(lexicon.concepts(text.lower())))


def _probability(feats: list[str], words: list[str]) -> float:
    z = _BIAS + sum(_WEIGHTS.get(f, 0.0) for f in feats) + sum(map(_subword, words))
    return 1.0 / (1.0 + math.exp(-max(-30.0, min(30.0, z))))


def score(text: str) -> float:
    """The model's probability that `text` (one window) is an instruction addressed to the model."""
    return _probability(features(text), subword_tokens(tokens(text)))


def _sentences(text: str) -> list[tuple[int, int]]:
    spans, at = [], 0
    for m in _SENTENCE_END.finditer(text):
        if text[at:m.end()].strip():
            spans.append((at, m.end()))
        at = m.end()
    if text[at:].strip():
        spans.append((at, len(text)))
    return spans


def windows(text: str) -> Iterator[tuple[int, int]]:
    """Spans of one sentence and the next (a heading line and the order under it), each at most MAX_WINDOW characters."""
    spans = _sentences(text[:MAX_TEXT])
    for i, (a, b) in enumerate(spans[:_MAX_WINDOWS]):
        end = spans[i + 1][1] if i + 1 < len(spans) and spans[i + 1][1] - a <= MAX_WINDOW else b
        yield a, min(end, a + MAX_WINDOW)


def _strongest(toks: list[tuple[int, str]], a: int) -> int:
    """The offset of the window's word that weighs most towards an instruction (where quoting is judged)."""
    best, at = 0.0, a
    for i, tok in toks:
        if (w := _WEIGHTS.get(tok, 0.0)) > best:
            best, at = w, i
    return at


def scan(text: str) -> list[Hit]:
    """The windows of `text` (NFKC already, as `instructions` reads it) scored at or above THRESHOLD,
    best first. Tokens and concepts are found once for the whole text, then counted per window."""
    spans = list(windows(text))
    if not spans:
        return []
    text = text[:spans[-1][1]]  # what the windows cover: nothing further is tokenized
    toks = _tokens_at(text)
    starts = [i for i, _ in toks]
    found = lexicon.concepts(text.lower())
    hits = []
    for a, b in spans:
        inside = toks[bisect.bisect_left(starts, a):bisect.bisect_left(starts, b)]
        concepts = sorted(c for c, uses in found.items() if any(a <= at < b for _, at in uses))
        toks_in = [t for _, t in inside]
        s = _probability(_combine(toks_in, concepts), subword_tokens(toks_in))
        if s >= THRESHOLD:
            shapes = frozenset(t for _, t in inside if t in _SHAPE_TOKENS)
            hits.append(Hit(s, a, b, _strongest(inside, a), tuple(concepts), shapes))
    return sorted(hits, key=lambda h: (-h.score, h.start))
