"""Web sessions in text: session cookies and bearer tokens, and masked (redacted) credentials.

A session cookie or an OAuth bearer token has no vendor prefix, yet whoever holds it is logged in.
It is told by where it stands, never by its value alone:

- a **session cookie**: a cookie whose name says session (`sessionid`, `PHPSESSID`, `JSESSIONID`,
  `connect.sid`, `_shop_session`, `__Secure-next-auth.session-token`, `remember_user_token`) in a
  cookie position: a `name=value` pair in a `Cookie:`/`Set-Cookie:` header, in a `;`-separated
  cookie list, or after the word "cookie"; a browser cookie export (`"name": …, "value": …`); a
  Netscape `cookies.txt` line. The framework names (`PHPSESSID`, `JSESSIONID`, `ASP.NET_SessionId`,
  `connect.sid`, `laravel_session`, `*.session-token`) count without the cookie position;
- a **bearer token**: `Bearer <token>` (an `Authorization` header, a curl `-H`, a JSON header).

The value must look random: 16+ characters (20+ for a bearer) with letters and digits, and be no
placeholder (`<value>`, `$TOKEN`, `${{ secrets.X }}`, `YOUR_ACCESS_TOKEN`, `********`). A session or
request id in a log line (`session_id=7f3c…` without a cookie position) is an identifier, not a
credential. Hits are `(kind, start, end, detail)`, kind `api_key` (the rules that refuse
credentials act on them); the detail names the cookie, never the value.

`masked(s, start, end)` says whether a credential-shaped match is shown masked, the way
dashboards and loggers show keys (`sk-proj-Ab3d…Xy9Z`, `wJal****EKEY`, `sk_live_51H8...redacted...`):
its token holds a mask (`…`, `...`, `***`, `•••`, `xxxx`, `[REDACTED]`) and too few visible
characters to be a whole key; `elided` keeps the separator-removing reassembly from rejoining a
masked value across its mask. No I/O.
"""

from __future__ import annotations

import re
from typing import Final
from urllib.parse import unquote

from gateway.stages.sanitizer.formats import is_placeholder

__all__ = ["elided", "masked", "session_hits"]

SessionHit = tuple[str, int, int, str]

_VALUE: Final = r"[A-Za-z0-9%._~+/=:-]{16,4096}"
#: Cookie names that say session: any name holding `sess`, a `.sid`/`sid`, an auth/remember token.
_SESSION_NAME: Final = r"[A-Za-z0-9_.-]*(?:[Ss][Ee][Ss][Ss]|[Ss][Ii][Dd](?![A-Za-z])|[Aa]uth[_-]?[Tt]oken|remember_[a-z_]*token)[A-Za-z0-9_.-]*"
_PAIR: Final = re.compile(rf"(?<![A-Za-z0-9_.%-])({_SESSION_NAME})=({_VALUE})")
#: Framework cookie names: a session wherever they stand.
_FRAMEWORK: Final = re.compile(
    r"(?i)\A(?:phpsessid|jsessionid|aspsessionid\w*|asp\.net_sessionid|\.aspnetcore\.session|connect\.sid"
    r"|laravel_session|ci_session|_gh_sess|.*session-token|.*_session)\Z"
)
_COOKIE_WORD: Final = re.compile(r"(?i)cookie")
_EXPORT: Final = re.compile(rf'"name"\s*:\s*"({_SESSION_NAME})"[^{{}}]{{0,300}}?"value"\s*:\s*"({_VALUE})"')
_JAR_LINE: Final = re.compile(rf"\t(?:TRUE|FALSE)\t[^\t\n]*\t(?:TRUE|FALSE)\t\d+\t({_SESSION_NAME})\t({_VALUE})")
_BEARER: Final = re.compile(r"(?<![A-Za-z0-9])[Bb]earer\s+([A-Za-z0-9._~+/-]{20,4096}=*)(?![A-Za-z0-9._~+/=-])")
_MASK: Final = re.compile(r"…|\.{3}|\*{3}|•{3}|●{3}|[xX]{4}|(?i:redacted|masked)")
_MASK_RUNS: Final = re.compile(r"…|\.{2,}|\*+|•+|●+|[xX]{4,}|(?i:redacted|masked)")
_ELISION: Final = re.compile(r"…|\.{3}|\*{3}|•{3}|●{3}|(?i:redacted)")
_TOKEN_EDGE: Final = frozenset(" \t\r\n\"'`<>,;=:|()[]{}")
MASKED_VISIBLE: Final = 28  # alphanumerics a masked value may show: less than any whole key


def _random(value: str) -> bool:
    """Letters and digits, several distinct characters, and no placeholder."""
    v = unquote(value)
    return (any(c.isalpha() for c in v) and any(c.isdigit() for c in v) and len(set(v)) >= 8
            and not is_placeholder(v) and not masked(v, 0, len(v)))


def _cookie_position(s: str, start: int, end: int) -> bool:
    """A pair in a cookie header or list: "cookie" in the 120 characters before it, or `; ` next to it."""
    return (_COOKIE_WORD.search(s, max(0, start - 120), start) is not None
            or s[max(0, start - 2) : start].strip() == ";" or s[end : end + 1] == ";")


def session_hits(s: str, low: str) -> list[SessionHit]:
    """Session cookies and bearer tokens in `s` (`low` is `s.lower()`, the cheap gates' text)."""
    hits: list[SessionHit] = []
    if "bearer" in low:
        for m in _BEARER.finditer(s):
            token = m.group(1)
            if not token.startswith("eyJ") and _random(token):  # a JWT is found (and named) as one
                hits.append(("api_key", m.start(1), m.end(1), f"bearer token, {len(token)} chars"))
    if "sess" not in low and "sid" not in low and "token" not in low:
        return hits
    if "=" in s:
        for m in _PAIR.finditer(s):
            name, value = m.group(1), m.group(2)
            if (_FRAMEWORK.match(name) or _cookie_position(s, m.start(), m.end())) and _random(value):
                hits.append(("api_key", m.start(2), m.end(2), f"session cookie {name!r}, {len(value)} chars"))
    if '"value"' in s:
        for m in _EXPORT.finditer(s):
            if _random(m.group(2)):
                hits.append(("api_key", m.start(2), m.end(2), f"session cookie {m.group(1)!r} in a cookie export"))
    if "\t" in s:
        for m in _JAR_LINE.finditer(s):
            if _random(m.group(2)):
                hits.append(("api_key", m.start(2), m.end(2), f"session cookie {m.group(1)!r} in a cookies.txt line"))
    return hits


def elided(s: str, start: int, end: int) -> bool:
    """Whether s[start:end] holds an elision mark (`…`, `...`, `***`, `•••`, "redacted"): a token
    rejoined across one (separators removed) is a masked value shown in parts, not a split secret."""
    return _ELISION.search(s, start, end) is not None


def masked(s: str, start: int, end: int) -> bool:
    """Whether the token around s[start:end] is a masked credential: a mask in it and fewer than
    `MASKED_VISIBLE` visible letters and digits (a mask word such as "redacted" does not count)."""
    a, b = start, end
    while a > 0 and s[a - 1] not in _TOKEN_EDGE and start - a < 256:
        a -= 1
    while b < len(s) and s[b] not in _TOKEN_EDGE and b - end < 256:
        b += 1
    if b < len(s) and s[b] == "]" and s[a - 1 : a] == "[":
        b += 1
    token = s[a:b]
    if _MASK.search(token) is None:
        return False
    visible = _MASK_RUNS.sub("", token)
    return sum(c.isalnum() for c in visible) < MASKED_VISIBLE
