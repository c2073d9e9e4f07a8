"""Orders to the model in other languages: concepts found by word, combined by a small grammar.

Phrase patterns per language did not generalise (an attacker rewords, a language has many forms of
one order). This layer finds CONCEPTS instead (`lexicon_words`: the model addressed, "ignore",
"instructions", "previous", "send", "password", "the conversation", "do not", "tell", "the user",
"must", "before", "tool", "call", ... in es pt fr it de nl sv pl ru uk tr ar fa hi zh ja ko vi id,
and since round 4 th lo km my he el cs sk ro hu fi da no ms tl sw ha bn ta te mr gu pa ur bg sh sr am
ka hy: every major script) and a grammar over their co-occurrence inside one sentence (`GRAMMAR`;
a heading line of a few words naming the model addresses the sentence after it):

- override: ignore/forget + instructions/rules + previous / the model / its system prompt / must
  -> `hidden_instruction`, `rule_override`;
- extract: show/print/repeat + the system prompt + your/full/verbatim or the model named
  -> `hidden_instruction`, `prompt_extraction`;
- secrecy: do not + tell/mention + the user, or secretly + send/call/read -> `hidden_instruction`;
- exfil: send/upload/include (in a clause without a negation) + credentials or the conversation
  (an API key or a token only with the user, the model, secrecy or "must") + a URL or an address
  in the sentence -> `hidden_instruction`, `exfiltration`, `credential_request` / `data_request`;
- handover: send/read/include + credentials or the conversation + the model, "must", "before"
  or secrecy -> `hidden_instruction`, `credential_request` / `data_request`;
- tool: the model addressed (by a vocative "Asistente," or with "must") + call/use + a tool's
  name (snake_case) -> `hidden_instruction`, `tool_reference`;
- address: the model named at the head of the sentence ("Asistente, …", "KI-Assistent: …") and an
  order's verb right after it, whatever the object (English's vocative rule) -> `hidden_instruction`.

A rule fires only when one of its concept words is of a language other than English (loanwords like
"AI", "token", "API key" are neutral), so English text stays the English scanner's. Each finding's
`via` is `lang:<code>` (the language most of the sentence's concept words belong to). Quoted text
in a document that reports an attack ("inyección", "Angriff", "注入", ...) is not read: a news
article quoting an injection is not one. Text in code spans is not read. Pure: no I/O, tables
built at import, regexes compiled at import.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterator
from typing import Final, NamedTuple

from gateway.stages.sanitizer.lexicon_words import NEUTRAL, SUBSTRING_LANGS, WORDS

__all__ = ["GRAMMAR", "Hit", "concepts", "gate", "reported_quote", "scan"]


class Hit(NamedTuple):
    """A grammar rule that fired on a sentence: the finding kinds, a detail, the sentence's span."""

    kinds: tuple[str, ...]
    detail: str
    start: int
    end: int
    lang: str


_TOKEN_BREAKS: Final = "።፣፤။၊۔։ \t\r\n!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~’‘“”«»„،؛؟।。、，！？：；「」『』（）《》…"
_TOKEN: Final = re.compile("[^" + re.escape(_TOKEN_BREAKS) + "]+")


_Use = tuple[str, str, str]  # (text, concept, language)
_NON_LATIN: Final = re.compile("[\u0370-\u03ff\u0400-\u04ff\u0530-\u06ff\u0980-\u0dff\u0e00-\u0eff\u1000-\u10ff\u1200-\u137f\u1780-\u17ff\u0750-\u077f\u0900-\u097f\u3040-\u30ff\u3400-\u9fff\uac00-\ud7af\uf900-\ufaff]")
#: Scripts whose words take glued prefixes or particles ("وأرسل", "ולשלוח", "کو"): every entry a substring.
_GLUED: Final = frozenset(("ar", "fa", "he", "ur"))
_BREAKS: Final = str.maketrans({c: " " for c in _TOKEN_BREAKS})


class _Index(NamedTuple):
    """The word tables indexed: whole words, stems (by length), phrases by their first three
    letters (tried only when a word of the text starts so), texts found anywhere: those of a
    non-Latin script by their first character (tried only when the text holds it and the second),
    Latin ones (compounds: "*anweisung") by language (tried only when the text has a word of it)."""

    words: dict[str, list[tuple[str, str]]]
    stems: dict[str, list[tuple[str, str]]]
    stem_lens: tuple[int, ...]
    phrases: dict[str, list[_Use]]
    by_char: dict[str, list[_Use]]
    by_lang: dict[str, list[_Use]]


def _spellings(entries: str) -> list[str]:
    """The entries of a table cell, each also in its NFKC form when that differs (text is scanned
    after NFKC: Thai "คำ" becomes "คํา", Lao "ຳ" splits the same way)."""
    out = list(filter(None, entries.split("|")))
    return out + [n for n in (unicodedata.normalize("NFKC", e) for e in out) if n not in out]


def _build() -> _Index:
    index = _Index({}, {}, (), {}, {}, {})
    for lang, table in [("", NEUTRAL), *WORDS.items()]:
        for concept, entries in table.items():
            for entry in _spellings(entries):
                text = entry.strip("*")
                pieces = text.translate(_BREAKS).split()
                if lang in SUBSTRING_LANGS or _NON_LATIN.search(text) and (entry.startswith("*") or lang in _GLUED):
                    index.by_char.setdefault(text[0], []).append((text, concept, lang))
                elif entry.startswith("*") and pieces == [text]:
                    index.by_lang.setdefault(lang, []).append((text, concept, lang))
                elif entry.startswith("*") or pieces != [text]:
                    index.phrases.setdefault(pieces[0][:3], []).append((text, concept, lang))
                elif entry.endswith("*"):
                    index.stems.setdefault(text, []).append((concept, lang))
                else:
                    index.words.setdefault(text, []).append((concept, lang))
    return index._replace(stem_lens=tuple(sorted({len(s) for s in index.stems})))


_INDEX: Final = _build()
_WORDS: Final = _INDEX.words
#: Lower-case words of the covered languages that English text does not use: a text made only of
#: ASCII pays for this layer only when it holds one (transliterated and diacritic-free text).
_FOREIGN_STOP: Final = frozenset((
    # es, pt
    "el", "los", "las", "del", "por", "para", "una", "que", "con", "su", "sus", "tu", "tus", "usuario", "seu", "sua", "da",
    "dos", "das", "em", "um", "nao", "voce", "usuario", "modelo", "asistente", "assistente",
    # fr, it
    "le", "les", "des", "du", "et", "vous", "ton", "votre", "vos", "pas", "une", "est", "il", "di", "che", "non", "gli",
    "della", "tuo", "utente", "utilisateur",
    # de, nl, sv
    "der", "die", "das", "und", "ist", "nicht", "mit", "dein", "deine", "ihr", "eine", "het", "een", "niet", "je", "jouw", "uw",
    "naar", "och", "att", "det", "inte", "till", "din", "ditt", "dina",
    # id, tr, pl, vi, transliterated ru and hi
    "dan", "yang", "ke", "ini", "itu", "anda", "kamu", "tidak", "untuk", "dengan", "ve", "bir", "bu", "icin", "ile", "nie",
    "sie", "jest", "na", "khong", "cua", "va", "la", "vse", "ne", "aur", "ka", "ki", "ko", "ke", "hai", "karo", "mat",
    "sahayak",
    # tl, sw, ha, ro, cs, hu, da, no, sh (round 4; words English text does not use, short ones left out)
    "mga", "ang", "kwa", "kuwa", "cikin", "kuma", "este", "sau", "aby", "hogy", "egy", "ikke", "jeg", "kako", "til", "og",
))  # fmt: skip


#: English words that are also another language's concept words ("ignore" is French, "model" Dutch).
_ENGLISH: Final = frozenset((
    "ignore", "model", "agent", "instructions", "instruction", "post", "upload", "token", "tool", "open", "print", "public",
    "assistant", "message", "messages", "use", "run", "call", "include", "function", "user", "agents", "ignores", "visa",
    "posting", "passe", "dime", "joins", "si", "pon", "mets", "toon", "cole", "gib", "password", "conversation", "parol",
))
#: The same for words of an order: an ASCII text (transliterated, or written without diacritics)
#: holding one of them pays for this layer ("zignoruj", "abaikan", "ignoriruy").
_ASCII_GATE: Final = _FOREIGN_STOP | frozenset(
    w for w, uses in _WORDS.items() if w.isascii() and w not in _ENGLISH
    and any(lang and concept in ("addr", "override", "move", "user", "reveal", "secret", "cred", "data") for concept, lang in uses))


def gate(low: str, words: frozenset[str]) -> bool:
    """Whether a text may hold another language's words (non-ASCII, or a foreign word of an order)."""
    return not low.isascii() or not words.isdisjoint(_ASCII_GATE)


Concepts = dict[str, list[tuple[str, int]]]  # concept -> (language, position in the text)
_TOKEN_CHARS_BREAK: Final = frozenset(_TOKEN_BREAKS)


def _word_uses(token: str) -> list[tuple[str, str]]:
    """(concept, language) of one word: as a whole word and by its stems."""
    uses = list(_INDEX.words.get(token, ()))
    for n in _INDEX.stem_lens:
        if n > len(token):
            break
        uses.extend(_INDEX.stems.get(token[:n], ()))
    return uses


def _occurrences(low: str, text: str, whole_word: bool) -> Iterator[int]:
    """Positions of `text` in `low` (as a whole word when `whole_word`), at most 32."""
    at = low.find(text)
    seen = 0
    while at >= 0 and seen < 32:
        end = at + len(text)
        if not whole_word or ((at == 0 or low[at - 1] in _TOKEN_CHARS_BREAK) and (end == len(low) or low[end] in _TOKEN_CHARS_BREAK)):
            seen += 1
            yield at
        at = low.find(text, end)


def concepts(low: str) -> Concepts:
    """The concepts in a lower-case text, each with its language(s) ("" for a loanword) and positions."""
    found: Concepts = {}
    langs = {""}
    tokens = set(_TOKEN.findall(low))
    for token in tokens:
        for concept, lang in _word_uses(token):
            langs.add(lang)
            found.setdefault(concept, []).extend((lang, at) for at in _occurrences(low, token, True))
    uses: list[_Use] = [u for p in {t[:3] for t in tokens} for u in _INDEX.phrases.get(p, ())]
    uses.extend(u for lang in langs for u in _INDEX.by_lang.get(lang, ()))
    if not low.isascii():
        chars = set(low)
        uses.extend(u for c in chars.intersection(_INDEX.by_char) for u in _INDEX.by_char[c] if len(u[0]) < 2 or u[0][1] in chars)
    for text, concept, lang in uses:
        if text in low:
            found.setdefault(concept, []).extend((lang, at) for at in _occurrences(low, text, False))
    return found


def _within(found: Concepts, a: int, b: int) -> Concepts:
    """The concepts whose positions fall in [a, b)."""
    out: Concepts = {}
    for concept, hits in found.items():
        inside = [(lang, at) for lang, at in hits if a <= at < b]
        if inside:
            out[concept] = inside
    return out


# ---- the grammar -------------------------------------------------------------------------------

_SENTENCE_STOP: Final = re.compile(r"[.!?](?=\s|\Z)|[。！？؟।\n።။۔։]")
_CLAUSE_STOP: Final = re.compile(r"[,;:，、；：،؛፣፤၊]|\s[-–—]\s")
#: Where a destination is written out: a URL or an e-mail address.
_DESTINATION: Final = re.compile(r"\b(?:https?|ftp|wss?)://\S|[\w.+-]+@[\w-]+\.[a-z]{2,}", re.I)
#: A tool's name: snake_case or camelCase (a word of prose is neither).
_TOOL_NAME: Final = re.compile(r"\b[a-z][a-z0-9]*(?:_[a-z0-9]+)+\b|\b[a-z]{2,}[0-9]*(?:[A-Z][a-z0-9]+)+\b")
#: A tool whose call does harm or moves data: "delete_repository", "send_payment", "run_shell_command".
_RISKY_TOOL: Final = re.compile(
    r"delete|drop|remove|wipe|destroy|purge|send|post|upload|transfer|pay|exec|shell|command|forward|share|publish|mail"
    r"|webhook|gist|invite|grant|fund", re.I)
#: A vocative: the addressee's word followed by a comma, colon or "!" (also full-width).
_VOCATIVE_MARK: Final = re.compile(r"[^\S\n]{0,2}[,:!，：！、]")
#: Quoted text (what a report quotes); only skipped in a document that reports an attack.
_QUOTED: Final = re.compile(r"\"[^\"\n]{3,400}\"|“[^”\n]{3,400}”|«[^»\n]{3,400}»|„[^“”\n]{3,400}[“”]|「[^」\n]{1,400}」|『[^』\n]{1,400}』")
#: A sentence of so few words that names the model heads the next one ("Бележка за асистента." then
#: the order): the order split over two sentences is one order to the model.
_HEADER_WORDS: Final = 4
#: How far into its sentence the model's name may stand ("Hola, asistente, …") and how soon after it
#: an order's verb must follow ("Asistente, por favor, reenvía …"), for a vocative address.
_ADDRESS_LEAD: Final = 24
_ADDRESS_LEAD_WORDS: Final = 3
_ORDER_REACH: Final = 28
#: Verb-final languages: a negation after the verb ("送信しないで", "보내지 마세요") negates it.
_NEG_AFTER: Final = frozenset(("ja", "ko", "tr", "bn", "ta", "te", "mr", "gu", "pa"))
#: The rules: (name, kinds, detail); the conditions are in `_fires`.
GRAMMAR: Final = (
    ("override", ("hidden_instruction", "rule_override"), "an order to ignore the model's instructions"),
    ("extract", ("hidden_instruction", "prompt_extraction"), "asks for the model's instructions"),
    ("exfil", ("hidden_instruction", "exfiltration"), "an order to send private data to a destination"),
    ("handover", ("hidden_instruction",), "an order to hand over credentials or private data"),
    ("tool", ("hidden_instruction", "tool_reference"), "an order to the model to call a tool"),
    ("secrecy", ("hidden_instruction",), "an order to keep something from the user"),
    ("address", ("hidden_instruction",), "an order addressed to the model"),
)


def scan(prose: str, low: str, code: list[tuple[int, int]]) -> list[Hit]:
    """The grammar's hits in one text (`low`: `prose` lower-cased, same length; `code`: inline
    code spans, not read). At most one hit per rule."""
    if len(low) != len(prose):  # "İ" lower-cases to two characters: keep positions the text's
        low = "".join(c if len(c) == 1 else c[0] for c in map(str.lower, prose))
    found_all = concepts(low)
    if not _possible(found_all):
        return []
    skipped = code + ([m.span() for m in _QUOTED.finditer(low)] if "meta" in found_all else [])
    if skipped:
        found_all = {c: [(lang, at) for lang, at in hits if not any(x <= at < y for x, y in skipped)] for c, hits in found_all.items()}
        found_all = {c: hits for c, hits in found_all.items() if hits}
    hits: list[Hit] = []
    done: set[str] = set()
    transcript = _transcript(found_all, low)
    header: list[tuple[str, int]] = []
    for a, b in _sentences(low):
        found = _within(found_all, a, b)
        heading, header = header, (found.get("addr", []) if len(_TOKEN.findall(low, a, b)) <= _HEADER_WORDS else [])
        if not _possible(found):
            continue
        if heading and "addr" not in found:
            found["addr"] = heading
        for name, kinds, detail, lang in _fires(found, low, a, b, bool(heading), transcript):
            if name not in done:
                done.add(name)
                hits.append(Hit(kinds, detail, a, b, lang))
        if len(done) == len(GRAMMAR):
            break
    return hits


def reported_quote(text: str, start: int) -> bool:
    """Whether `start` is inside a quoted passage (guillemets, „…“, 「…」, "…") of a non-English
    document that reports an attack ("inyección", "Angriff", "注入"): a news article quoting an
    injection, not one. English reports are `instructions._quoted_report`'s."""
    if text.isascii():
        return False
    line_start = text.rfind("\n", 0, start) + 1
    line_end = text.find("\n", start)
    for m in _QUOTED.finditer(text, line_start, len(text) if line_end < 0 else line_end):
        if m.start() < start < m.end():
            return "meta" in concepts(text.lower())
    return False


def _possible(found: Concepts) -> bool:
    """A cheap test that some rule could fire: an order's verb and a foreign word are there."""
    return any(c in found for c in ("override", "reveal", "move", "read", "tell", "secret", "call")) and any(
        lang for hits in found.values() for lang, _ in hits)


def _sentences(text: str) -> Iterator[tuple[int, int]]:
    start = 0
    for m in _SENTENCE_STOP.finditer(text):
        if m.end() - start > 3:
            yield start, m.end()
        start = m.end()
    if len(text) - start > 3:
        yield start, len(text)


def _fires(f: Concepts, text: str, a: int, b: int, heading: bool = False,
           transcript: bool = False) -> Iterator[tuple[str, tuple[str, ...], str, str]]:
    """(rule, kinds, detail, language) for each rule whose concepts the sentence `text[a:b]` holds
    (`heading`: the sentence before it was a short line naming the model, "Note for the agent.",
    which addresses this one; `transcript`: the text labels the user as a speaker)."""
    has = f.__contains__
    sentence = text[a:b]
    free = _unnegated(f, text, a, b)
    addressed = heading or has("addr") and (has("must") or _vocative(f, text))
    names = _TOOL_NAME.findall(sentence) if has("call") and has("addr") else []
    sensitive = has("cred") or has("data") or (has("key") and (has("user") or has("addr") or has("secret") or has("must")))
    rules = (
        ("override", has("override") and has("rules") and (has("prior") or has("addr") or has("sysprompt") or has("must")),
         ("override", "rules", "prior", "sysprompt")),
        ("extract", has("reveal") and has("sysprompt") and (has("own") or has("addr") or has("prior")) and "reveal" in free,
         ("reveal", "sysprompt", "own")),
        ("exfil", bool(free & {"move"}) and sensitive and _DESTINATION.search(sentence) is not None,
         ("move", "cred", "data", "key", "user")),
        ("handover", bool(free & {"move", "read"}) and sensitive and (addressed or has("must") or has("pre") or has("secret")),
         ("move", "read", "cred", "data", "key", "must", "pre")),
        ("tool", addressed and has("call") and bool(names) and (
            _vocative(f, text) or has("secret") or sensitive or _DESTINATION.search(sentence) is not None
            or any(_RISKY_TOOL.search(n) for n in names)), ("addr", "call", "tool", "must")),
        ("secrecy", (has("neg") and has("tell") and has("user")) or (has("secret") and (has("move") or has("call") or has("read"))),
         ("neg", "tell", "user", "secret")),
        ("address", _called_then_ordered(f, text, a, heading, transcript, free), ("addr", "move", "read", "reveal", "override")),
    )
    fired = False
    for name, ok, core in rules:
        if not ok or (fired and name == "address"):  # "address" only when no rule that says more fired
            continue
        lang = _language(f, core)
        if not lang:
            continue
        kinds, detail = next((k, d) for n, k, d in GRAMMAR if n == name)
        if name in ("exfil", "handover"):
            kinds = kinds + (("credential_request",) if has("cred") or has("key") else ()) + (("data_request",) if has("data") else ())
        elif name == "address" and _DESTINATION.search(sentence) is not None:
            # what it wants done: something sent to, or a page opened at, a place the text names
            kinds = kinds + (("exfiltration",) if "move" in free else ("tool_reference",))
        fired = True
        yield name, kinds, detail, lang


def _unnegated(f: Concepts, text: str, a: int, b: int) -> set[str]:
    """The order verbs ("move", "read", "reveal") of the sentence that some clause holds without a
    negation of them: "never send your password" sends nothing."""
    overrides = {at for _, at in f.get("override", ())}
    negs = [(lang, n) for lang, n in f.get("neg", ()) if n not in overrides]  # "не обращай внимания" is an override
    free: set[str] = set()
    for concept in ("move", "read", "reveal"):
        for lang, at in f.get(concept, ()):
            lo, hi = _clause(text, at, a, b)
            if not any(lo <= n < hi and _negates(nlang, n, lang, at) for nlang, n in negs):
                free.add(concept)
                break
    return free


def _negates(nlang: str, n: int, lang: str, at: int) -> bool:
    """A negation at `n` negates a verb at `at` of its clause: before it, or just after it in a
    verb-final language."""
    if n <= at:
        return True
    return (nlang in _NEG_AFTER or lang in _NEG_AFTER) and n - at <= 12


def _clause(text: str, at: int, a: int, b: int) -> tuple[int, int]:
    lo = a
    for m in _CLAUSE_STOP.finditer(text, a, at):
        lo = m.end()
    m = _CLAUSE_STOP.search(text, at, b)
    return lo, (m.start() if m is not None else b)


def _vocative(f: Concepts, text: str) -> bool:
    """The model addressed by name: its word followed by a comma, colon or "!" ("Asistente, …")."""
    for _, at in f.get("addr", ()):
        m = _TOKEN.match(text, at)
        end = m.end() if m is not None else at + 1
        if _VOCATIVE_MARK.match(text, end) is not None or _VOCATIVE_MARK.match(text, _word_end(text, at)) is not None:
            return True
    return False


def _called_then_ordered(f: Concepts, text: str, a: int, heading: bool, transcript: bool, free: set[str]) -> bool:
    """The model named at the head of the sentence ("Asistente, …", "KI-Assistent: …", or a heading line
    before it) and an order's verb right after (`_ORDER_REACH`): what English's vocative rule sees. A
    speaker label in a transcript ("Asistente:" after a "Usuario:" line) is not an address."""
    verbs = sorted(at for c in ("move", "read", "reveal", "override") for _, at in f.get(c, ()) if c == "override" or c in free)
    if not verbs:
        return False
    if heading:
        return verbs[0] - a <= _ORDER_REACH
    for _, at in f.get("addr", ()):
        if at - a > _ADDRESS_LEAD or len(_TOKEN.findall(text, a, at)) > _ADDRESS_LEAD_WORDS:
            continue
        m = _VOCATIVE_MARK.match(text, _word_end(text, at))
        if m is None or (transcript and m.group().strip() in (":", "：")):
            continue
        if any(0 <= v - m.end() <= _ORDER_REACH for v in verbs):
            return True
    return False


def _transcript(f: Concepts, text: str) -> bool:
    """Whether the text labels a speaker as the user ("Usuario:", "Benutzer:"): a chat transcript."""
    return any(_VOCATIVE_MARK.match(text, _word_end(text, at)) is not None for _, at in f.get("user", ()))


def _word_end(text: str, at: int) -> int:
    """The end of the word or CJK run at `at` (CJK addressees: "致AI助手：")."""
    end = at
    while end < len(text) and end - at < 12 and not text[end].isspace() and text[end] not in ",:!，：！、":
        end += 1
    return end


def _language(f: Concepts, core: tuple[str, ...]) -> str:
    """The language most of the rule's concept words belong to ("" when all are neutral)."""
    counts: dict[str, int] = {}
    for concept in core:
        for lang, _ in f.get(concept, ()):
            if lang:
                counts[lang] = counts.get(lang, 0) + 1
    if not counts:
        return ""
    return max(counts, key=counts.__getitem__)
