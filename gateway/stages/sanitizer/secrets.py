"""Secret and personal-data detection in JSON values, and redaction of what it finds.

Finds API keys, tokens, private keys, passwords, payment cards, US SSNs and one-time codes in
strings (and by key names such as `password` or `otp`); JWTs (the header must decode to JSON
naming an `alg`), environment dumps, and, through `wallets`, BIP-39 seed phrases, WIF keys and
wallet addresses. The same scan runs on the text inside base64, hex and URL-encoded runs (nested,
bounded: see `decode`), and on the concatenation of a container's short string fields, so a secret
split across `part1`/`part2` is found too. Such findings say how in `Finding.via` ("base64>url",
"split"); redaction replaces the encoded run, or each piece of a split secret.

Documented example credentials (AWS's `AKIA...EXAMPLE` key ids, jwt.io's sample token, BIP-39's
test mnemonics, the Bitcoin wiki's WIF key) are reported as `example_secret`, not as secrets: they
are published, so passing them on leaks nothing, and tutorials quote them.

A finding's `detail` never contains the secret itself (at most a card's last four digits). No
I/O; the regexes are compiled at import.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Iterable, Iterator, Sequence
from functools import lru_cache
from typing import Any, Final

from gateway.core.call import Finding
from gateway.memo import MemoSet
from gateway.stages.sanitizer import decode
from gateway.stages.sanitizer.decode import MIN_TEXT, Layer, charcode_text, decode_base64, whole_text
from gateway.stages.sanitizer.formats import PREFIXES, credential_hits, documented_example, is_placeholder, joined_hits, key_body_hits, public_hits
from gateway.stages.sanitizer.paths import child_path
from gateway.stages.sanitizer.sessions import elided, masked, session_hits
from gateway.stages.sanitizer.wallets import is_test_key, wallet_hits

__all__ = ["detect_secrets", "redact_secrets"]

# One hit inside a string: (kind, start, end, detail, via, excerpt). A key-name hit spans the whole
# string; a hit in decoded text spans the outermost encoded run it came from.
_Hit = tuple[str, int, int, str, str, str]
MIN_SCAN: Final = 6  # shorter strings cannot hold anything we detect (key-name rules aside)

_GENERIC_KEY: Final = re.compile(
    r"(?<![a-z0-9])api[_-]?key(?![a-z0-9])[\"']?\s*[:=]\s*[\"']?([^\s\"',;&]{16,})", re.IGNORECASE
)
#: A secret under the name its vendor gives it (`aws_secret_access_key = …`, `client_secret: …`): the
#: value has no prefix of its own, so only the name says what it is; it must look random (upper
#: case, lower case and a digit), which names, digests and placeholders do not.
_NAMED_SECRET: Final = re.compile(
    r"(?<![a-z0-9])(aws_?secret_?access_?key|secret_?access_?key|client_?secret|api_?secret|app_?secret|secret_?key"
    r"|auth_?token|access_?token|private_?token)(?![a-z0-9_])[\"']?\s*[:=]\s*[\"']?([A-Za-z0-9/+_.=-]{20,})",
    re.IGNORECASE,
)
_BASIC_AUTH: Final = re.compile(r"(?<![A-Za-z0-9])[Bb]asic\s+([A-Za-z0-9+/]{6,}={0,2})(?![A-Za-z0-9+/=])")
_ENV_LINE: Final = re.compile(r"^[ \t]*(?:export[ \t]+)?([A-Za-z_][A-Za-z0-9_]{0,63})=(.*)$", re.MULTILINE)
_ENV_SECRET_NAME: Final = re.compile(r"KEY|SECRET|TOKEN|PASS|PWD|CREDENTIAL|AUTH|PRIVATE|SESSION|COOKIE", re.IGNORECASE)
_ENV_PLACEHOLDER: Final = re.compile(
    r"\A[\"']?(?:|\*+|x+|\.+|<[^>]*>|\$\{?[A-Za-z_][A-Za-z0-9_]*\}?|\{\{[^}]*\}\}|.*(?:example|your[_-]|changeme|placeholder|redacted).*)[\"']?\Z",
    re.IGNORECASE,
)
_ENV_PUBLIC_NAME: Final = re.compile(r"PUBLIC|PUBLISHABLE", re.IGNORECASE)
_ENV_OUTPUT_NAMES: Final = frozenset({"PATH", "HOME", "USER", "SHELL", "PWD", "OLDPWD", "LANG", "HOSTNAME", "TERM", "LOGNAME", "SHLVL", "_"})
# Not after `$` when a `:` follows: `"$PWD":/app` is the shell's working directory, not a key
# (`$password = "…"` in PHP or Perl is an assignment and still counts).
_PASSWORD_TEXT: Final = re.compile(
    r"(?<![a-z0-9])(?:(?<!\$)(?:password|passwd|passphrase|pwd)(?![a-z0-9])[\"']?[ \t]*[:=]|(?<=\$)(?:password|passwd|passphrase|pwd)(?![a-z0-9])[ \t]*=)[ \t]*"  # an empty `PASSWORD=` line ends there
    r"(?:\"([^\"\r\n]+)\"|'([^'\r\n]+)'|([^\s\"',;&]+))",
    re.IGNORECASE,
)
# Unquoted or in double quotes, a shell expands `$NAME` (an upper-case environment variable:
# `$Summer2024` may be a literal), `$(…)` and backticks: `--password=$DB_PASS` names a variable,
# it is not the password itself.
_SHELL_REFERENCE: Final = re.compile(r"\A(?:\$[A-Z_][A-Z0-9_]*|\$\([^()]*\)|`[^`]*`)\Z")
# An unquoted value that is code, not a literal: a comparison (`password===other`), a CSS rule
# (`.password:focus{...}`), a call (`pwd=document.getElementById(...)`).
_CODE_VALUE: Final = re.compile(r"\A=|[(){}\[\];]")
# A form label, not a password: one capitalised word, then lower-case words ("Passwort vergessen?").
_LABEL: Final = re.compile(r"[A-ZÀ-Þ][a-zß-ÿ]+(?:[ -][a-zß-ÿ]+)*[?.!:]?")
_URL_PASSWORD: Final = re.compile(r"(?<![A-Za-z0-9+.-])[A-Za-z][A-Za-z0-9+.-]*://[^\s:/@]+:([^\s/@]+)@")
# `[0-9](?<![0-9][0-9])` = a digit not preceded by one, written so the engine can skip to digits.
_DIGIT_BYTES: Final = b"0123456789"
_NUMERIC: Final = re.compile(r"[0-9][0-9 -]{5,}")  # where cards, SSNs and OTP codes can be
_NUMBER_RUN: Final = re.compile(r"[0-9]+(?:[ -][0-9]+)*")  # digits, single spaces or dashes between
_NUMBER_PIECE: Final = re.compile(r"[0-9]+(?:-[0-9]+)*")  # a space-free part of a run
_SSN: Final = re.compile(r"[0-9](?<![0-9][0-9])(?<![0-9-]-[0-9])[0-9]{2}-[0-9]{2}-[0-9]{4}(?![0-9]|-[0-9])")
_OTP_CANDIDATE: Final = re.compile(r"[0-9](?<![\w.,/-][0-9])[0-9]{5,7}(?![\w/]|[.,-][0-9])")
_OTP_WORDS: Final = re.compile(
    r"(?<![a-z0-9])(?:otp|totp|2fa|mfa|one[- ]time|verification|verify|passcode|code)(?![a-z0-9])",
    re.IGNORECASE,
)
_DIGITS: Final = re.compile(r"[0-9]+")
_KEY_NOISE: Final = re.compile(r"[\s_.\-]+")
_SPACE: Final = re.compile(r"\s")
SPLIT_MAX_PIECE: Final = 512  # longer strings are not pieces of a split secret
SPLIT_MAX_TOTAL: Final = 8_192  # characters joined per container
SPLIT_MAX_STARTS: Final = 32  # pieces a split secret may start in
SPLIT_MAX_PIECES: Final = 8  # pieces one split token may span
_SPLIT_KINDS: Final = frozenset({"api_key", "private_key", "password", "jwt", "seed_phrase", "wif_key"})
_KEPT: Final = frozenset({"wallet_address", "example_secret"})  # public values: reported, never redacted
NO_KINDS: Final = frozenset[str]()

_OTP_KEYS: Final = frozenset(
    {"otp", "totp", "hotp", "otpcode", "totpcode", "mfa", "mfacode", "mfatoken", "2fa", "2facode",
     "verificationcode", "onetimecode", "onetimepasscode", "smscode", "authcode"}
)  # fmt: skip
_PASSWORD_KEY_ENDS: Final = ("password", "passwd", "passphrase", "pwd", "secret")
_PASSWORD_KEY_TAILS: Final = frozenset({"confirm", "confirmation", "again", "repeat", "1", "2"})
_API_KEY_KEYS: Final = frozenset(
    {"apitoken", "accesstoken", "authtoken", "bearertoken", "secretkey", "secretaccesskey",
     "privatetoken", "clientkey"}
)  # fmt: skip


_RAW_KEY: Final = re.compile(r"(?:0x)?[0-9a-fA-F]{64,}|[A-Za-z0-9+/=_-]{40,}")


@lru_cache(maxsize=4096)
def kind_of_key(key: str) -> str | None:
    """Which finding kind a value under this key name is, if any (password, api_key, otp_code,
    private_key: a raw wallet or signing key under `privateKey`, `priv_key`, `signing_key`)."""
    k = _KEY_NOISE.sub("", key.lower())
    if k in _OTP_KEYS:
        return "otp_code"
    if k.endswith("apikey") or k in _API_KEY_KEYS:
        return "api_key"
    if k.endswith(("privatekey", "privkey", "signingkey", "walletkey")):
        return "private_key"
    if k.endswith(_PASSWORD_KEY_ENDS) or k == "pass" or (k.startswith("password") and k[8:] in _PASSWORD_KEY_TAILS):
        return "password"
    return None


def _luhn(digits: str) -> bool:
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = ord(ch) - 48
        if i & 1:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


def _card_brand(d: str) -> str | None:
    """The card network for this number's IIN and length, or None (then it is not a card)."""
    n = len(d)
    p2, p3, p4, p6 = int(d[:2]), int(d[:3]), int(d[:4]), int(d[:6])
    if d[0] == "4" and n in (13, 16, 19):
        return "Visa"
    if (51 <= p2 <= 55 or 2221 <= p4 <= 2720) and n == 16:
        return "Mastercard"
    if p2 in (34, 37) and n == 15:
        return "American Express"
    if (p4 == 6011 or 644 <= p3 <= 649 or p2 == 65 or 622126 <= p6 <= 622925) and 16 <= n <= 19:
        return "Discover"
    if 3528 <= p4 <= 3589 and 16 <= n <= 19:
        return "JCB"
    if p2 == 62 and 16 <= n <= 19:
        return "UnionPay"
    if (300 <= p3 <= 305 or p2 in (36, 38, 39) or p4 == 3095) and 14 <= n <= 19:
        return "Diners Club"
    return None


def _cards(s: str, start: int, end: int, hits: list[_Hit]) -> None:
    """Find card numbers in one run of digits: whole space-separated pieces, 13 to 19 digits.

    Card numbers are printed in groups of three or more digits, so shorter pieces end a window.
    """
    pieces = [(m.start(), m.end(), "".join(_DIGITS.findall(m.group()))) for m in _NUMBER_PIECE.finditer(s, start, end)]
    i = 0
    while i < len(pieces):
        digits = ""
        for j in range(i, len(pieces)):
            if len(pieces[j][2]) < 3:
                break
            digits += pieces[j][2]
            if len(digits) > 19:
                break
            if len(digits) >= 13:
                brand = _card_brand(digits)
                if brand is not None and _luhn(digits):
                    hits.append(("payment_card", pieces[i][0], pieces[j][1], f"{brand} card number ending {digits[-4:]}", "", ""))
                    i = j
                    break
        i += 1


def _basic_auth(s: str, hits: list[_Hit]) -> None:
    """`Basic <base64 of user:password>` (an HTTP Authorization header) is a password."""
    for m in _BASIC_AUTH.finditer(s):
        data = decode_base64(m.group(1))
        try:
            text = data.decode("utf-8") if data else ""
        except UnicodeDecodeError:
            continue
        user, colon, password = text.partition(":")
        if colon and password and text.isprintable() and not is_placeholder(password):
            hits.append(("password", m.start(1), m.end(1), "HTTP Basic credentials", "base64", ""))


def _env_secret(name: str, value: str) -> bool:
    """Whether `NAME=value` holds a secret: a secret-like name that does not say it is public
    (`NEXT_PUBLIC_*`, `*_PUBLISHABLE_KEY`), with a value that is no placeholder and no public key."""
    if _ENV_SECRET_NAME.search(name) is None or _ENV_PUBLIC_NAME.search(name) is not None:
        return False
    return _ENV_PLACEHOLDER.match(value.strip()) is None and not is_placeholder(value) and not _public(value) and not documented_example(value)


def _env_dump(s: str, hits: list[_Hit]) -> None:
    """Many KEY=VALUE lines with secret-like names and real values, or the output of `env`."""
    lines = list(_ENV_LINE.finditer(s))
    if len(lines) < 3:
        return
    secret = sum(1 for m in lines if _env_secret(m.group(1), m.group(2)))
    env_names = sum(1 for m in lines if m.group(1) in _ENV_OUTPUT_NAMES)
    if secret >= 2 or (env_names >= 3 and len(lines) >= 5):
        detail = f"environment dump, {len(lines)} KEY=VALUE lines, {secret} with secret-like names"
        hits.append(("env_dump", lines[0].start(), lines[-1].end(), detail, "", ""))


def _scan_plain(s: str) -> list[_Hit]:
    """Find secrets and personal data in the text of one (cleaned) string, as it is."""
    hits: list[_Hit] = [(kind, start, end, detail, "", "") for kind, start, end, detail in credential_hits(s)]

    def add(hit: tuple[str, int, int, str]) -> None:
        hits.append((*hit, "", ""))

    if "asic" in s:
        _basic_auth(s, hits)
    if "=" in s and "\n" in s:
        _env_dump(s, hits)
    if len(s) >= 25:
        hits += [(kind, start, end, detail, "", excerpt) for kind, start, end, detail, excerpt in wallet_hits(s)]
    if "://" in s and "@" in s:
        for m in _URL_PASSWORD.finditer(s):
            if not is_placeholder(m.group(1)):
                add(("password", m.start(1), m.end(1), "password in a URL's userinfo"))
    low = s.lower()
    if "api" in low:
        for m in _GENERIC_KEY.finditer(s):
            if not is_placeholder(m.group(1)):
                add(_named_hit("api_key", m.start(1), m.end(1), m.group(1), "api_key assignment in text"))
    if "secret" in low or "token" in low:
        for m in _NAMED_SECRET.finditer(s):
            value = m.group(2)
            overlaps = any(h[1] < m.end(2) and m.start(2) < h[2] for h in hits)  # a JWT, a vendor key: found already
            if _mixed_case_digit(value) and not overlaps and not is_placeholder(value):
                add(_named_hit("api_key", m.start(2), m.end(2), value, f"{m.group(1).lower()} assignment in text"))
    if "pass" in low or "pwd" in low:
        for m in _PASSWORD_TEXT.finditer(s):
            g = 1 if m.group(1) is not None else 2 if m.group(2) is not None else 3
            if _password_literal(m.group(g), quoted=g < 3, single=g == 2):
                add(_named_hit("password", m.start(g), m.end(g), m.group(g), "password assignment in text"))
    if "bearer" in low or "sess" in low or "sid" in low or "token" in low:
        hits += [(*hit, "", "") for hit in session_hits(s, low)]
    _numbers(s, hits)
    if "pass" in low or "pin" in low or "contrase" in low or "senha" in low or "парол" in low:
        _prose_secrets(s, hits)
    if len(s) >= 40 and s.lstrip()[:1] not in ("{", "["):  # serialised JSON is walked as fields (`_embedded_json`)
        _text_pieces(s, hits)
    if "=" in s or ">" in s or "→" in s:
        _leet(s, hits)
    if ("…" in s or "..." in s or "*" in s or "•" in s or "xxxx" in low or "redact" in low or "mask" in low) and hits:
        hits = [h for h in hits if h[0] != "api_key" or not masked(s, h[1], h[2])]  # shown masked: no secret
    return hits


#: A password or PIN given in prose (round 8, ux-conversation-in-query): the word, an optional
#: "for <up to 4 words>", a copula or `:`/`=`, then the value ("my password for the bank is Tulip!77x",
#: "PIN is 4821", "mein Passwort ist …", "su contraseña del correo es …", "mon mot de passe est …").
_PROSE_SECRET: Final = re.compile(
    r"(?i)(?<![a-z])(password|passwort|passcode|mot de passe|contrase(?:ñ|n)a|senha|пароль|pin(?:[ -]?code)?|code pin)"
    r"(?:\s+(?:for|to|of|on|für|zum|zur|de|del|du|pour|per|para|для|от)\s+(?:[^\s.,;:!?]+\s+){0,3}?)?"
    r"\s*(?:is|was|ist|lautet|war|est|était|es|era|é|è|это|[:=])\s+[\"'“«]?([^\s\"'”»,;]+)"
)


def _prose_secrets(s: str, hits: list[_Hit]) -> None:
    """Passwords and PINs given in a sentence (`_PROSE_SECRET`): a PIN is 4-8 digits; a password is
    6-64 characters with a letter and a digit or symbol, not a placeholder ("is required", "is
    <your password>", "was changed" are words, not values)."""
    for m in itertools.islice(_PROSE_SECRET.finditer(s), 8):
        word, value = m.group(1).lower(), m.group(2).rstrip(".!?)")
        if "pin" in word:
            if value.isdigit() and 4 <= len(value) <= 8:
                hits.append(("password", m.start(2), m.start(2) + len(value), f"{len(value)}-digit PIN given in prose", "", ""))
        elif 6 <= len(value) <= 64 and any(c.isalpha() for c in value) and not value.isalpha() and not is_placeholder(value):
            if not any(h[1] < m.end(2) and m.start(2) < h[2] for h in hits):
                hits.append(_named_hit("password", m.start(2), m.start(2) + len(value), value, "password given in prose") + ("", ""))


#: A token of a text that may be a piece of a cut credential: 4+ characters of the base64/base64url
#: alphabet with a digit next to a letter or a lower-case letter before an upper-case one (not a word),
#: not touching a `%` (`%20said` is an escape and a word, not a token).
_PIECE_TOKEN: Final = re.compile(
    r"(?<![A-Za-z0-9+/_.%-])(?=[A-Za-z0-9+/_.-]{0,38}?(?:[0-9][A-Za-z]|[A-Za-z][0-9]|[a-z][A-Z]))[A-Za-z0-9+/_.-]{4,400}(?![A-Za-z0-9+/_.=%-])"
)
_PIECE_GAP: Final = 48  # characters between two pieces of one credential ("\npart B: ", "\n2) ")


def _text_pieces(s: str, hits: list[_Hit]) -> None:
    """A credential cut into pieces written apart in a text ("part A: … / part B: …", numbered
    lines): consecutive random-looking tokens at most `_PIECE_GAP` apart, joined
    (`formats.joined_hits`); the hit spans the first piece's start to the last piece's end."""
    tokens = [m.span() for m in itertools.islice(_PIECE_TOKEN.finditer(s), 256)]
    run: list[tuple[int, int]] = []
    for span in tokens + [(len(s) + _PIECE_GAP + 1, 0)]:
        if run and span[0] - run[-1][1] > _PIECE_GAP:
            if len(run) > 1:
                for kind, first, end, detail in joined_hits([s[a:b] for a, b in run]):
                    if not any(h[0] == kind and h[1] < run[end - 1][1] and run[first][0] < h[2] for h in hits):
                        hits.append((kind, run[first][0], run[end - 1][1], f"{detail}, split across {end - first} pieces", "split", ""))
            run = []
        run.append(span)


#: A stated letter substitution ("a=4 e=3", "4->A", "o → 0"): a letter and a digit paired.
_LEET_PAIR: Final = re.compile(r"(?<![A-Za-z0-9])(?:([A-Za-z])\s*(?:=|->|→|=>)\s*([0-9])|([0-9])\s*(?:=|->|→|=>)\s*([A-Za-z]))(?![A-Za-z0-9])")


def _leet(s: str, hits: list[_Hit]) -> None:
    """A credential written with digits swapped in for letters, the substitution stated in the text
    (round 8, es-leetspeak-credential): two or more letter/digit pairs, undone in the text after
    them (digit to the stated letter, as written and in the other case), read for vendor formats;
    a match that needed the undoing is a finding `via` `leet`."""
    pairs = list(itertools.islice(_LEET_PAIR.finditer(s), 16))
    if len(pairs) < 2:
        return
    table = {m.group(2) or m.group(3): m.group(1) or m.group(4) for m in pairs}
    tail = pairs[-1].end()
    for letters in (table, {d: c.swapcase() for d, c in table.items()}):
        undone = s[:tail] + s[tail:].translate(str.maketrans(letters))
        for kind, a, b, detail in credential_hits(undone):
            if a >= tail and undone[a:b] != s[a:b] and not any(h[0] == kind and h[1] < b and a < h[2] for h in hits):
                hits.append((kind, a, b, f"{detail}, after undoing a stated letter substitution", "leet", ""))


def _named_hit(kind: str, start: int, end: int, value: str, what: str) -> tuple[str, int, int, str]:
    """A value found by the name it is given: `kind`, or `example_secret` when it is a documented
    example (AWS's `wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY` under `aws_secret_access_key`)."""
    if documented_example(value):
        return "example_secret", start, end, f"{what}: a documented example value"
    return kind, start, end, f"{what}, {end - start} chars"


def _password_literal(value: str, quoted: bool, single: bool) -> bool:
    """Whether the value of a `password: ...` in text is a password: not a placeholder, a form label,
    nor (unquoted) code or (unquoted or in double quotes) a shell variable."""
    if is_placeholder(value) or _LABEL.fullmatch(value) is not None:
        return False
    if not quoted and _CODE_VALUE.search(value) is not None:
        return False
    return single or _SHELL_REFERENCE.match(value) is None


def _mixed_case_digit(value: str) -> bool:
    return any(c.isupper() for c in value) and any(c.islower() for c in value) and any(c.isdigit() for c in value)


def _numbers(s: str, hits: list[_Hit]) -> None:
    """Payment cards, SSNs and one-time codes. A run of digits glued to letters (inside a hex digest,
    a base64 string or an identifier) is not a card number."""
    raw = s.encode("utf-8", "surrogatepass")
    if len(raw) - len(raw.translate(None, _DIGIT_BYTES)) < 6:  # fewer digits than the shortest code
        return
    for region in _NUMERIC.finditer(s):  # one pass over the text; the rest looks only at regions
        a, b = region.span()
        for m in _NUMBER_RUN.finditer(s, a, b):
            if m.end() - m.start() >= 13 and not _glued(s, m.start(), m.end()):
                _cards(s, m.start(), m.end(), hits)
        if "-" in region.group():
            for m in _SSN.finditer(s, a, b):
                area, group, serial = m.group()[:3], m.group()[4:6], m.group()[7:]
                if area not in ("000", "666") and area[0] != "9" and group != "00" and serial != "0000":
                    hits.append(("ssn", m.start(), m.end(), "US social security number", "", ""))
        for m in _OTP_CANDIDATE.finditer(s, a, b):
            start, end = m.start(), m.end()
            word = _OTP_WORDS.search(s, max(0, start - 40), start) or _OTP_WORDS.search(s, end, end + 30)
            if word is not None:
                hits.append(("otp_code", start, end, f"{end - start}-digit code near {word.group().lower()!r}", "", ""))


def _glued(s: str, start: int, end: int) -> bool:
    """Whether s[start:end] touches a letter on either side."""
    return (start > 0 and s[start - 1].isalpha()) or (end < len(s) and s[end].isalpha())


#: Strings up to `_CLEAN_MAX_LEN` characters that `_scan` found nothing in. The same short strings
#: come back in every answer of a tool (`"text"` content types, `resultType`, a server's `_meta`
#: name and version), and a miss costs 3-10 µs of pattern and decoding work each time. Only clean
#: strings are kept, so a detected secret is never held; the set is emptied when full.
_CLEAN: MemoSet[str] = MemoSet(8192)
_CLEAN_MAX_LEN: Final = 256


def _scan(s: str) -> list[_Hit]:
    """Find secrets and personal data in one (cleaned) string and in the encoded text inside it."""
    if s in _CLEAN:
        return []
    hits = _scan_hits(s)
    if not hits and len(s) <= _CLEAN_MAX_LEN:
        _CLEAN.remember(s)
    return hits


_PREFIXES: Final = decode.Prefixes.of(PREFIXES)


def decoded_layers(s: str) -> Iterator[Layer]:
    """The decoded layers the secret scanner reads: every decoding and reassembly `decode` knows."""
    return decode.decoded_layers(s, _PREFIXES)


def _layer_hits(layer: Layer, s: str) -> list[_Hit]:
    """Hits in one layer's text, in that text's coordinates."""
    if not layer.formats_only:
        return _scan_plain(layer.text)
    glued = layer.index if layer.glued else None
    return [(kind, a, b, detail, "", "") for kind, a, b, detail in credential_hits(layer.text, glued, s)]


def _scan_hits(s: str) -> list[_Hit]:
    """`_scan` without the memo of clean strings."""
    hits = _scan_plain(s)
    if len(s) < 6:
        return hits
    if not s.isascii():
        _look_alikes(s, hits)
    jwts = [(h[1], h[2]) for h in hits if h[0] == "jwt"]  # a JWT's own segments are not hiding anything
    seen = {(h[0], h[3]) for h in hits}
    for layer in decoded_layers(s):
        if any(a <= layer.start and layer.end <= b for a, b in jwts):
            continue
        for kind, a, b, detail, via, excerpt in _layer_hits(layer, s):
            start, end = layer.span_of(a, b)
            if (kind, detail) in seen:
                continue
            if layer.glued and (end - start == b - a or elided(s, start, end)):
                continue  # nothing was rejoined (the token was found as it is), or it was rejoined across a mask
            if layer.index is not None and any(h[0] == kind and h[1] < end and start < h[2] for h in hits):
                continue  # the same secret, found already
            seen.add((kind, detail))
            hits.append((kind, start, end, detail, f"{layer.via}>{via}" if via else layer.via, excerpt))
    return hits


def _look_alikes(s: str, hits: list[_Hit]) -> None:
    """Credentials written with look-alike letters (`ghр_…` with a Cyrillic `р`, `ΑΚΙΑ…` in Greek
    capitals): the text folded to ASCII as the shell analysis folds it (Unicode TR39 confusables)
    and read again for vendor formats; a match that holds a folded letter is a finding `via`
    `homoglyph`, its span in the original text. The shell analysis is imported here, not at the
    top: `dharma stdio` defers its patterns until a call needs them (tests/test_cli.py)."""
    from gateway.stages.sanitizer.shell import fold_mapped  # noqa: PLC0415

    folded, origin = fold_mapped(s)
    if origin is None or folded == s:
        return
    for kind, a, b, detail in credential_hits(folded):
        start, end = origin[a], origin[b]
        if end - start != b - a or any(not ch.isascii() for ch in s[start:end]):
            if not any(h[0] == kind and h[1] < end and start < h[2] for h in hits):
                hits.append((kind, start, end, detail, "homoglyph", ""))


def value_hits(value: Any, key_kind: str | None) -> list[_Hit]:
    """Hits for a scalar value: its text, plus what its key's name says it is."""
    if type(value) is str:
        hits = _scan(value) if len(value) >= MIN_SCAN else []
        if not hits and (inner := _embedded_json(value)) is not None:
            hits = _embedded_hits(inner)
        if key_kind is not None and value and documented_example(value):
            hits.append(("example_secret", 0, len(value), f"{key_kind} field: a documented example value", "", ""))
        elif key_kind is not None and value and not is_placeholder(value) and not _public(value):
            if key_kind == "password":
                hit: _Hit | None = ("password", 0, len(value), f"password-like field, {len(value)} chars", "", "")
            elif key_kind == "private_key":  # a raw key under its name: hex, base58, base64 (a PEM is found as text)
                ok = _RAW_KEY.fullmatch(value) is not None and value[0] not in "/~." and not is_test_key(value)
                hit = ("private_key", 0, len(value), f"private-key field, {len(value)} chars", "", "") if ok else None
            elif key_kind == "otp_code":
                code = value.replace(" ", "").replace("-", "")
                ok = code.isdigit() and 6 <= len(code) <= 8
                hit = ("otp_code", 0, len(value), f"{len(code)}-digit code in a one-time-code field", "", "") if ok else None
            else:
                ok = len(value) >= 16 and not any(c.isspace() for c in value) and not masked(value, 0, len(value))
                hit = ("api_key", 0, len(value), f"API-key field, {len(value)} chars", "", "") if ok else None
            if hit is not None and not any(h[0] == hit[0] for h in hits):
                hits.append(hit)
        return hits
    if key_kind == "otp_code" and type(value) is int and 1_000 <= value <= 99_999_999:
        return [("otp_code", 0, 0, f"{len(str(value))}-digit code in a one-time-code field", "", "")]
    return []


def _public(value: str) -> bool:
    """Whether all of `value` is public key material (a publishable key under a field named `api_key`)."""
    return any(start == 0 and end == len(value.strip()) for _kind, start, end, _detail in public_hits(value.strip()))


def add_findings(hits: list[_Hit], path: str, out: list[Finding]) -> None:
    seen: set[tuple[str, str, str]] = set()
    for kind, _start, _end, detail, via, excerpt in hits:
        if (kind, detail, via) not in seen:
            seen.add((kind, detail, via))
            out.append(Finding(kind, path, detail, excerpt, via))


def split_piece(v: str) -> bool:
    """Whether a string can be a piece of a secret split across fields: short, no whitespace."""
    return 0 < len(v) <= SPLIT_MAX_PIECE and _SPACE.search(v) is None


Piece = tuple[str | int, str, frozenset[str]]  # (key, text, kinds found in that text alone)


def split_secrets(parent: str, pieces: Sequence[Piece]) -> list[tuple[Finding, list[tuple[int, _Hit]]]]:
    """Secrets that only show when a container's string fields are joined, in order.

    `pieces` are (key, text, kinds found in that text alone) for the container at `parent`. Each
    result is a finding whose path names every field it spans ("$.a+$.b", via "split") and the
    part of each piece to redact. The fields are joined with nothing between them (a token cut
    in two) and, for twelve or more, with spaces (a seed phrase one word per field). Numbers are
    not joined (card, SSN and code look-alikes are too easy to make from separate fields), and
    a kind already found inside one of the pieces alone is not reported again.
    """
    out: list[tuple[Finding, list[tuple[int, _Hit]]]] = []
    seen: set[tuple[str, str]] = set()
    texts: list[str] = []
    total = 0
    for _key, text, _kinds in pieces:
        total += len(text) + 1
        if total > SPLIT_MAX_TOTAL:
            break
        texts.append(text)
    # (first piece, separator): a token cut in pieces, joined from each piece on so that the text
    # of the fields before it cannot hide its start; a seed phrase one word per field, joined once.
    joins = [(first, "") for first in range(min(len(texts) - 1, SPLIT_MAX_STARTS))]
    if len(texts) >= 12:
        joins.append((0, " "))
    for first, sep in joins:
        group = texts[first : first + SPLIT_MAX_PIECES] if not sep else texts
        offsets, pos = [], 0
        for text in group:
            offsets.append(pos)
            pos += len(text) + len(sep)
        for kind, start, end, detail, via, excerpt in _scan(sep.join(group)):
            if kind not in _SPLIT_KINDS or (sep and kind != "seed_phrase") or (not sep and start >= len(group[0])):
                continue
            covered = [first + i for i, off in enumerate(offsets) if off < end and off + len(group[i]) > start]
            if len(covered) < 2 or any(kind in pieces[i][2] for i in covered) or (kind, detail) in seen:
                continue
            seen.add((kind, detail))
            offsets_of = dict(zip(range(first, first + len(group)), offsets))
            path = "+".join(child_path(parent, pieces[i][0]) for i in covered)
            finding = Finding(kind, path, f"{detail}, split across {len(covered)} fields", excerpt, f"split>{via}" if via else "split")
            parts = [
                (i, (kind, max(start - offsets_of[i], 0), min(end - offsets_of[i], len(texts[i])), detail, "split", ""))
                for i in covered
            ]
            out.append((finding, parts))
    return out + _joined_pieces(parent, pieces, texts, seen) + _encoded_pieces(parent, pieces, seen)


def _joined_pieces(parent: str, pieces: Sequence[Piece], texts: list[str], seen: set[tuple[str, str]]) -> list[tuple[Finding, list[tuple[int, _Hit]]]]:
    """Unlabelled credentials that only the joined pieces make (`formats.joined_hits`: an AWS
    secret key's shape cut in fields, a JWT cut inside its segments); each piece is redacted whole."""
    out: list[tuple[Finding, list[tuple[int, _Hit]]]] = []
    for kind, first, end, detail in joined_hits(texts):
        covered = range(first, end)
        if any(kind in pieces[i][2] for i in covered) or (kind, detail) in seen:
            continue
        seen.add((kind, detail))
        path = "+".join(child_path(parent, pieces[i][0]) for i in covered)
        finding = Finding(kind, path, f"{detail}, split across {len(covered)} fields", "", "split")
        out.append((finding, [(i, (kind, 0, len(texts[i]), detail, "split", "")) for i in covered]))
    return out


def _encoded_pieces(parent: str, pieces: Sequence[Piece], seen: set[tuple[str, str]]) -> list[tuple[Finding, list[tuple[int, _Hit]]]]:
    """A credential cut in pieces that were encoded one by one (`{"a": b64(first half), "b": b64(rest)}`):
    the pieces that are each one encoded run, decoded, joined in order from each on, and looked at
    for credential formats."""
    decoded = [(i, d) for i, (_key, text, _kinds) in enumerate(pieces[:SPLIT_MAX_STARTS]) if (d := whole_text(text)) is not None]
    out: list[tuple[Finding, list[tuple[int, _Hit]]]] = []
    for first in range(len(decoded) - 1):
        group = decoded[first : first + SPLIT_MAX_PIECES]
        offsets = list(itertools.accumulate((len(d[1]) for _i, d in group), initial=0))
        for kind, start, end, detail in credential_hits("".join(d[1] for _i, d in group)):
            covered = [group[k][0] for k in range(len(group)) if offsets[k] < end and offsets[k + 1] > start]
            if start >= offsets[1] or len(covered) < 2 or any(kind in pieces[i][2] for i in covered) or (kind, detail) in seen:
                continue
            seen.add((kind, detail))
            path = "+".join(child_path(parent, pieces[i][0]) for i in covered)
            finding = Finding(kind, path, f"{detail}, split across {len(covered)} fields", "", f"split>{group[0][1][0]}")
            out.append((finding, [(i, (kind, 0, len(pieces[i][1]), detail, "split", "")) for i in covered]))
    return out


_KEY_HEADER: Final = re.compile(r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----")
_EDGE_TAIL: Final = 48  # characters of a value's end and of the next value's start joined at a seam
_EDGE_HEAD: Final = 64


def key_edges(parent: str, values: Sequence[tuple[str | int, str, frozenset[str]]]) -> list[Finding]:
    """Private keys cut at the seam between two consecutive string values of a container, where
    `split_secrets` does not look (values with line breaks or longer than a piece: a PEM block cut
    inside its BEGIN line, an armour-less body cut in its first characters). Only the end of one
    value and the start of the next are joined, so the cost is bounded per seam; a key found in
    either value alone is not reported again."""
    out: list[Finding] = []
    for (ka, a, kinds_a), (kb, b, kinds_b) in zip(values[:SPLIT_MAX_STARTS], values[1 : SPLIT_MAX_STARTS + 1]):
        if "private_key" in kinds_a or "private_key" in kinds_b or (split_piece(a) and split_piece(b)):
            continue
        tail = a[-_EDGE_TAIL:]
        seam = tail + b[:_EDGE_HEAD]
        hits: list[tuple[str, int, int, str]] = []
        if "-----BEGIN" in seam:
            hits += [("private_key", m.start(), m.end(), "private key block") for m in _KEY_HEADER.finditer(seam)]
        key_body_hits(seam, hits)
        for _kind, start, end, detail in hits:
            if start < len(tail) < end:
                path = f"{child_path(parent, ka)}+{child_path(parent, kb)}"
                out.append(Finding("private_key", path, f"{detail}, split across 2 fields", "", "split"))
                break
    return out


class Spread:
    """The short strings of a whole JSON value, for a secret split across fields of different
    objects (`$.headers.a` + `$.body`): added per container as the walk meets them, joined in
    document order at the end."""

    __slots__ = ("containers",)

    def __init__(self) -> None:
        self.containers: list[tuple[tuple[int, ...], str, list[Piece], list[int], Any]] = []

    def add(self, order: tuple[int, ...], parent: str, pieces: list[Piece], indexes: list[int], place: Any = None) -> None:
        """A container's pieces: `order` is its indexes from the root, `indexes` each piece's index in
        it, `place` what a redaction must change (the rebuilt container), if any."""
        self.containers.append((order, parent, pieces, indexes, place))

    def secrets(self) -> list[tuple[Finding, list[tuple[Any, str | int, str]]]]:
        """Credentials spanning pieces of two containers, each with the (place, key, kind) of every
        piece it covers. One pass: the pieces, in document order, are joined with nothing between
        them and looked at for credential formats as a text whose separators were removed (a line
        break between pieces: a token must start at a piece's start or after a non-letter)."""
        if len(self.containers) < 2:
            return []
        entries = sorted(
            (order + (index,), group, parent, piece, place)
            for group, (order, parent, pieces, indexes, place) in enumerate(self.containers)
            for piece, index in zip(pieces, indexes)
        )
        texts, offsets, index, pos = [], [], [], 0
        for entry in entries:
            text = entry[3][1]
            if pos + len(text) > SPLIT_MAX_TOTAL:
                break
            texts.append(text)
            offsets.append(pos)
            index.extend(range(pos, pos + len(text)))
            pos += len(text) + 1
        index.append(pos - 1)
        out: list[tuple[Finding, list[tuple[Any, str | int, str]]]] = []
        seen: set[tuple[str, str]] = set()
        for kind, a, b, detail in credential_hits("".join(texts), index, "\n".join(texts)):
            start, end = index[a], index[b - 1] + 1
            covered = [i for i, off in enumerate(offsets) if off < end and off + len(texts[i]) > start]
            if len({entries[i][1] for i in covered}) < 2 or any(kind in entries[i][3][2] for i in covered) or (kind, detail) in seen:
                continue
            seen.add((kind, detail))
            path = "+".join(child_path(entries[i][2], entries[i][3][0]) for i in covered)
            finding = Finding(kind, path, f"{detail}, split across {len(covered)} fields", "", "split")
            out.append((finding, [(entries[i][4], entries[i][3][0], kind) for i in covered]))
        for kind, first, end, detail in joined_hits(texts):
            covered = list(range(first, end))
            if len({entries[i][1] for i in covered}) < 2 or any(kind in entries[i][3][2] for i in covered) or (kind, detail) in seen:
                continue
            seen.add((kind, detail))
            path = "+".join(child_path(entries[i][2], entries[i][3][0]) for i in covered)
            out.append((Finding(kind, path, f"{detail}, split across {len(covered)} fields", "", "split"),
                        [(entries[i][4], entries[i][3][0], kind) for i in covered]))
        return out


def charcode_hits(values: Sequence[Any]) -> list[_Hit]:
    """Secrets spelled by a list of integers (character codes, e.g. `[115, 107, 45, ...]`)."""
    if len(values) < MIN_TEXT or type(values[0]) is not int or not all(type(v) is int for v in values):
        return []
    text = charcode_text(values)
    if text is None:
        return []
    return [(kind, 0, 0, detail, f"charcodes>{via}" if via else "charcodes", excerpt)
            for kind, _a, _b, detail, via, excerpt in _scan(text)]


def _redact_string(s: str, hits: list[_Hit]) -> str:
    spans = sorted((h[1], h[2], h[0]) for h in hits if h[0] not in _KEPT)
    if not spans:
        return s
    parts: list[str] = []
    pos = 0
    cur_start, cur_end, cur_kind = spans[0]
    for start, end, kind in spans[1:]:
        if start < cur_end:  # overlapping: one marker for the union, named after the first
            cur_end = max(cur_end, end)
            continue
        parts += (s[pos:cur_start], f"[REDACTED:{cur_kind}]")
        pos = cur_end
        cur_start, cur_end, cur_kind = start, end, kind
    parts += (s[pos:cur_start], f"[REDACTED:{cur_kind}]", s[cur_end:])
    return "".join(parts)


def _leaf(v: Any, hits: list[_Hit], extra: list[_Hit], key_kind: str | None) -> Any:
    """A scalar's redacted copy: its hits' spans replaced (a value flagged by its key: whole)."""
    if not (hits or extra):
        return v
    if type(v) is not str:
        return f"[REDACTED:{hits[0][0]}]"
    for kind, start, end, *_ in hits:
        if kind == key_kind and start == 0 and end == len(v):  # flagged by its key: replace whole
            return f"[REDACTED:{kind}]"
    return _redact_string(v, hits + extra)


def _secret_walk(value: Any, path: str, rebuild: bool) -> tuple[Any, list[Finding]]:
    """Walk any JSON value (iteratively) collecting findings; optionally build a redacted copy."""
    findings: list[Finding] = []
    if not isinstance(value, (dict, list, tuple)):
        hits = value_hits(value, None)
        add_findings(hits, path, findings)
        return (_leaf(value, hits, [], None) if rebuild else value), findings
    root: Any = {} if isinstance(value, dict) else []
    spread = Spread()
    stack: list[tuple[Any, Any, str, tuple[int, ...]]] = [(value, root, path, ())]
    while stack:
        _walk_container(*stack.pop(), rebuild, stack, spread, findings)
    for finding, places in spread.secrets():
        findings.append(finding)
        for place, key, kind in places:
            if rebuild:
                place[key] = f"[REDACTED:{kind}]"
    return (root if rebuild else value), findings


def _walk_container(src: Any, dst: Any, here: str, order: tuple[int, ...], rebuild: bool,
                    stack: list[tuple[Any, Any, str, tuple[int, ...]]], spread: Spread, findings: list[Finding]) -> None:
    """One container of `_secret_walk`: its scalars' findings (alone, joined, as character codes),
    its pieces for `spread`, its nested containers pushed on `stack`, and its redacted copy in `dst`."""
    pairs: list[tuple[Any, Any]] = list(src.items() if isinstance(src, dict) else enumerate(src))
    scalar_hits: dict[int, tuple[list[_Hit], str | None]] = {}
    pieces: list[Piece] = []
    piece_index: list[int] = []
    texts: list[Piece] = []
    for i, (key, v) in enumerate(pairs):
        if isinstance(v, (dict, list, tuple)):
            continue
        key_kind = kind_of_key(key) if type(key) is str else None
        hits = value_hits(v, key_kind)
        scalar_hits[i] = (hits, key_kind)
        if hits and isinstance(key, (str, int)):
            add_findings(hits, child_path(here, key), findings)
        if type(v) is str and isinstance(key, (str, int)):
            kinds = frozenset(h[0] for h in hits) if hits else NO_KINDS
            texts.append((key, v, kinds))
            if split_piece(v):
                pieces.append((key, v, kinds))
                piece_index.append(i)
    if pieces:
        spread.add(order, here, pieces, piece_index, dst)
    extra: dict[int, list[_Hit]] = {}
    if len(pieces) > 1:
        for finding, parts in split_secrets(here, pieces):
            findings.append(finding)
            for piece, hit in parts:
                extra.setdefault(piece_index[piece], []).append(hit)
    if len(texts) > 1:
        findings.extend(key_edges(here, texts))
    codes = charcode_hits(src) if type(src) is not dict and len(scalar_hits) == len(pairs) else []
    add_findings(codes, here, findings)
    for i, (key, v) in enumerate(pairs):
        if isinstance(v, (dict, list, tuple)):
            new: Any = ({} if isinstance(v, dict) else []) if rebuild else None
            stack.append((v, new, child_path(here, key) if isinstance(key, (str, int)) else here, order + (i,)))
            if not rebuild:
                continue
        elif rebuild:
            hits, key_kind = scalar_hits[i]
            new = _leaf(v, hits, extra.get(i, []), key_kind)
        else:
            continue
        if type(dst) is dict:
            dst[key] = new
        else:
            dst.append(new)
    if codes and rebuild:
        dst[:] = [f"[REDACTED:{codes[0][0]}]"]


def _embedded_json(v: str) -> Any:
    """The object or array a string holds as serialised JSON (an HTTP body, a webhook payload),
    or None: its fields are walked as fields are, so a key split over them is found (round 6)."""
    text = v.strip()
    if len(text) < 16 or len(text) > _EMBEDDED_LONGEST or text[0] + text[-1] not in ("{}", "[]"):
        return None
    try:
        inner = json.loads(text)
    except ValueError:
        return None
    return inner if isinstance(inner, (dict, list)) else None


_EMBEDDED_LONGEST: Final = 65_536


#: What a walk of embedded JSON reports: secrets, not what a field's name alone suggests (a
#: translation file's `"password": "Passwort"` is a label) nor personal data.
_EMBEDDED_KINDS: Final = frozenset({"api_key", "private_key", "jwt", "seed_phrase", "wif_key"})


def _embedded_hits(inner: Any) -> list[_Hit]:
    """What the walk of an embedded JSON value finds, as hits spanning its whole string (the
    string is redacted whole: its parts are escaped inside it)."""
    found = _secret_walk(inner, "$", rebuild=False)[1]
    return [(f.kind, 0, _EMBEDDED_LONGEST, f.detail, "json>" + (f.via or "field"), "") for f in found if f.kind in _EMBEDDED_KINDS]


def detect_secrets(value: Any, path: str = "$") -> tuple[Finding, ...]:
    """Find secrets and personal data in every string of a JSON value (and by key names)."""
    return tuple(_secret_walk(value, path, rebuild=False)[1])


def redact_secrets(value: Any) -> tuple[Any, tuple[Finding, ...]]:
    """Return a copy with each detected secret replaced by "[REDACTED:<kind>]", and the findings.

    Text hits replace only the matched span; a value flagged by its key name (a `password`
    field, an `otp` field) is replaced whole. The input is not modified.
    """
    copy, findings = _secret_walk(value, "$", rebuild=True)
    return copy, tuple(findings)


def redact_text(text: str) -> str:
    hits = _scan(text)
    return _redact_string(text, hits) if hits else text
