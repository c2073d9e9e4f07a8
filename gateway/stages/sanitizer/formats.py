"""Credentials in the formats vendors issue, placeholders that only look like them, and public keys.

`credential_hits(s)` finds vendor-format credentials (AWS, GitHub, GitLab, npm, Slack, Stripe,
Anthropic, OpenAI, Google, Hugging Face, SendGrid, PyPI, ... and PEM private keys and JWTs) in a
string. Each format is a literal that every match contains (a cheap `in` test first), the token's
grammar, the characters that may not touch it on either side, and a check of its body: a value
made only of placeholder words and filler (`sk_live_xxxx`, `sk-proj-your-api-key-here`,
`AKIAXXXXXXXXXXXXXXXX`) is no credential, and neither is a documented example value (a body
carrying the upper-case word EXAMPLE, the convention AWS's and other vendors' documentation use:
`AKIAIOSFODNN7EXAMPLE`, `wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY`; jwt.io's token): those are
`example_secret` (`documented_example`). Stripe test-mode keys
(`sk_test_`) are not live secrets and are not looked for.

With `glued` (a text whose separators were removed to rejoin a token cut by spaces, pipes,
quotes or concatenation), a match may touch the text after it, and the character before it is
checked in the original string instead.

A private key is also found without its PEM armour: a base64 body whose first bytes are a DER
private-key structure (PKCS#1 RSA/DSA, SEC 1 EC, PKCS#8, PKCS#12: a SEQUENCE opening with a small
version INTEGER, which certificates, CSRs and public keys never do), an OpenSSH key body
(`openssh-key-v1`) or a PuTTY key file (`key_body_hits`): what is left when an attacker drops or
cuts the BEGIN line.

`public_hits(s)` finds public key material: PEM certificates and public keys, PGP public key
blocks, SSH public keys (the blob must name its key type), Stripe publishable keys and age
recipients: public by design, so a value that is one is no secret whatever its field is called
(`stripe_api_key: pk_live_...`). What is found inside such material still counts: real public
keys hold nothing a credential format matches, and a fake one must not hide a secret.

`is_placeholder(value)` is the one test of "this is a template value, not a secret".

Hits are `(kind, start, end, detail)`; a detail never holds the value. No I/O.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

from gateway.stages.sanitizer.decode import decode_base64

__all__ = ["FORMATS", "PREFIXES", "credential_hits", "documented_example", "is_placeholder", "joined_hits", "jwt_alg", "key_body_hits", "public_hits"]

FormatHit = tuple[str, int, int, str]
_ALNUM: Final = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789")
_TOKEN: Final = _ALNUM | {"_", "-"}

# ---- placeholders --------------------------------------------------------------------------

#: Whole values that are templates: ***, xxxx, <token>, ${VAR}, {{ secret }}, {password}, %(password)s, %s, [REDACTED].
PLACEHOLDER_FORM: Final = re.compile(
    r"\A(?:\*+|x+|•+|\.+|…|\[REDACTED[^\]]*\]|<[^>]*>|\$\{[^}]*\}|\{\{[^}]*\}\}|\{[A-Za-z0-9_.]*\}|%\([^)]*\)s"
    r"|%[-+ #0]*[0-9]*(?:\.[0-9]+)?[sdifqrvx])\Z",
    re.IGNORECASE,
)
_PARTS: Final = re.compile(r"[\s\-_.:/|+=<>\[\](){}\"'`]+")
_FILLER: Final = re.compile(r"(?:[a-z]{2,4})?(?:x{3,}|\*+|0{4,}|•+|#{3,}|\.{3,}|…)")  # AKIAXXXX..., sk_xxxx
#: Words that say "put the real value here", or name the value instead of being it (`user:password@`).
_MARKER_WORDS: Final = frozenset(
    {"your", "my", "example", "sample", "placeholder", "changeme", "changeit", "change", "replace", "replaceme",
     "redacted", "dummy", "fake", "insert", "todo", "tbd", "fixme", "here", "goes", "enter", "xxx", "foo", "bar",
     "password", "passwd", "pass", "pwd", "secret", "token", "apikey", "credential", "credentials", "username"}
)  # fmt: skip
#: Words a template puts around them ("your-api-key-here", "sk_live_xxxx", "REPLACE_WITH_YOUR_TOKEN").
_NEUTRAL_WORDS: Final = frozenset(
    {"a", "an", "the", "me", "with", "this", "that", "to", "of", "for", "and", "or", "in", "value", "string", "api",
     "key", "keys", "access", "id", "user", "app", "client", "private", "public", "bot", "auth", "account",
     "project", "service", "org", "db", "database", "sk", "pk", "rk", "live", "test", "proj", "ant", "api03",
     "admin", "svcacct", "ghp", "github", "pat", "npm", "xoxb", "xoxp", "akia", "aiza", "hf", "glpat", "whsec",
     "real", "actual", "new", "own", "personal", "env", "var", "name", "s", "1", "2"}
)  # fmt: skip


#: Example credentials vendors publish in their documentation, with a random-looking body (the
#: AWS CLI and STS guides' secret keys and session token). Exact values only: a real secret with
#: EXAMPLE appended or inserted is still a secret.
PUBLISHED_EXAMPLES: Final = frozenset({
    "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "je7MtGbClwBF/2Zp9Utk/h3yCo8nvbEXAMPLEKEY",
    "wJalrXUtnFEMI/K7MDENG/bPxRfiCYzEXAMPLEKEY", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
    "AQoEXAMPLEH4aoAH0gNCAPyJxz4BlCFFxWNE1OPTgk5TthT+FvwqnKwRcOIfrRh3c/LTo6UDdyJwOOvEVPvLXCrrrUtdnniCEXAMPLE/"
    "IvU1dYUg2RVAJBanLiHb4IgRmpRV3zrkuWJOgQs8IZZaIv2BXIa2R4Olgk",
})  # fmt: skip
_RUN: Final = re.compile(r"[A-Za-z0-9+/]+")


def documented_example(value: str) -> bool:
    """Whether a credential-shaped value is a documented example: one of the values vendors publish
    (`PUBLISHED_EXAMPLES`), or a value marked EXAMPLE whose every other run is no random body
    (`sk_test_EXAMPLE0000000000000000`, `ghp_EXAMPLEEXAMPLE…`: at most 7 characters, or at most 3
    distinct ones). Appending EXAMPLE to a real secret keeps its random body, so it stays a secret."""
    v = value.strip().strip("\"'`")
    if v in PUBLISHED_EXAMPLES:
        return True
    if "EXAMPLE" not in v:
        return False
    return all(len(run) <= 7 or len(set(run)) <= 3 for run in _RUN.findall(v.replace("EXAMPLE", " ")))


def is_placeholder(value: str) -> bool:
    """Whether `value` is a template value rather than a secret: a placeholder form (`<token>`,
    `${VAR}`, `***`), or only placeholder words and filler with at least one of them ("your",
    "example", "changeme", "xxxx", or a word that names the value: "password", "secret"). A value
    with one part that is neither (a random body) is not a placeholder, whatever words surround it."""
    v = value.strip().strip("\"'`")
    if not v or PLACEHOLDER_FORM.match(v) is not None:
        return True
    marked = False
    for part in _PARTS.split(v.lower()):
        if not part:
            continue
        if part in _MARKER_WORDS or _FILLER.fullmatch(part) is not None:
            marked = True
        elif part not in _NEUTRAL_WORDS:
            return False
    return marked


# ---- credential formats --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Format:
    """One vendor format: `gate` (a literal every match holds), its grammar, what it is."""

    gate: str
    pattern: re.Pattern[str]
    label: str
    kind: str = "api_key"
    prefix: int = 0  # characters of the match that are the vendor prefix (the rest is checked for placeholders)
    left: frozenset[str] = _ALNUM  # may not come right before the match
    right: frozenset[str] = _ALNUM  # may not come right after it
    named: bool = False  # the detail names the prefix the match starts with (`GitHub token (ghp_)`)
    check: Callable[[str], bool] | None = None  # on the whole match
    example: Callable[[str], bool] | None = None  # a documented example value (example_secret)
    glueable: bool = True  # may be rejoined from pieces cut by separators
    public_next: re.Pattern[str] | None = None  # text right after a match that makes it public (see _SIGV4_SCOPE)


def _mixed(token: str) -> bool:
    """Upper case, lower case and a digit: what a random base62 body has and words do not."""
    return any(c.isupper() for c in token) and any(c.islower() for c in token) and any(c.isdigit() for c in token)


def _hex_and_digit(token: str) -> bool:
    return any(c.isdigit() for c in token) and any(c in "abcdefABCDEF" for c in token)


#: An AWS key id followed by a SigV4 credential scope (`AKIA…/20260301/eu-west-1/s3/aws4_request`,
#: slashes percent-encoded in a presigned URL's `X-Amz-Credential`) is the public half of a
#: signature that the signature authorises: presigned S3 URLs and `Authorization: AWS4-HMAC-SHA256
#: Credential=…` headers are made to be handed out. The secret key never appears in them.
_SIGV4_SCOPE: Final = re.compile(r"(?:/|%2[Ff]|%252[Ff])\d{8}(?:/|%2[Ff]|%252[Ff])[a-z0-9-]{2,30}(?:/|%2[Ff]|%252[Ff])[a-z0-9-]{2,30}(?:/|%2[Ff]|%252[Ff])aws4_request")


def _f(gate: str, pattern: str, label: str, **kw: object) -> _Format:
    return _Format(gate, re.compile(pattern), label, **kw)  # type: ignore[arg-type]


FORMATS: Final[tuple[_Format, ...]] = (
    _f("AKIA", r"AKIA[0-9A-Z]{16}", "AWS access key id", prefix=4, public_next=_SIGV4_SCOPE,
       example=lambda t: t.endswith("EXAMPLE")),  # AWS's documentation convention: AKIAIOSFODNN7EXAMPLE
    _f("ASIA", r"ASIA[0-9A-Z]{16}", "AWS access key id", prefix=4, public_next=_SIGV4_SCOPE,
       example=lambda t: t.endswith("EXAMPLE")),
    _f("gh", r"gh[pousr]_[A-Za-z0-9]{36,251}", "GitHub token", prefix=4, named=True, right=_TOKEN - {"-"}),
    _f("github_pat_", r"github_pat_[A-Za-z0-9_]{22,255}", "GitHub token", prefix=11, named=True, right=_TOKEN - {"-"}),
    _f("gl", r"gl(?:pat|ptt|dt|rt)-[A-Za-z0-9_-]{20,}", "GitLab token", prefix=6, named=True, right=_TOKEN),
    _f("npm_", r"npm_[A-Za-z0-9]{36}", "npm access token", prefix=4, check=_mixed),
    _f("xox", r"xox[bpaser]-(?=[A-Za-z0-9-]*[0-9])[A-Za-z0-9-]{10,}", "Slack token", prefix=5, named=True),
    _f("xapp-", r"xapp-[0-9]-[A-Z0-9]+-[0-9]+-[a-z0-9]{16,}", "Slack app token", prefix=5),
    _f("_live_", r"(?:sk|rk)_live_[A-Za-z0-9]{16,}", "Stripe live key", prefix=8, named=True),
    _f("whsec_", r"whsec_[A-Za-z0-9+/]{24,}={0,2}", "Stripe webhook signing secret", prefix=6),
    _f("sk-", r"sk-ant-[A-Za-z0-9_-]{20,}", "Anthropic API key", prefix=7, right=_TOKEN),
    _f("sk-", r"sk-(?!ant-)(?:(?:proj|svcacct|admin)-)?[A-Za-z0-9_-]{20,}", "OpenAI API key", prefix=3,
       right=_TOKEN, check=lambda m: _mixed(m[3:])),
    _f("AIza", r"AIza[0-9A-Za-z_-]{35}", "Google API key", prefix=4, left=_TOKEN, right=_TOKEN),
    _f("hf_", r"hf_[A-Za-z]{34,40}", "Hugging Face token", prefix=3,
       check=lambda m: any(c.isupper() for c in m[3:]) and any(c.islower() for c in m[3:])),
    _f("SG.", r"SG\.[A-Za-z0-9_-]{22}\.[A-Za-z0-9_-]{43}", "SendGrid API key", prefix=3, right=_TOKEN, glueable=False),
    _f("pypi-", r"pypi-AgE[A-Za-z0-9_-]{50,}", "PyPI API token", prefix=5, right=_TOKEN),
    _f("_v1_", r"do[opr]_v1_[a-f0-9]{64}", "DigitalOcean token", prefix=7),
    _f("shp", r"shp(?:at|ss|ca|pa)_[a-fA-F0-9]{32}", "Shopify access token", prefix=6),
    _f(":AA", r"[0-9]{8,10}:AA[A-Za-z0-9_-]{33}", "Telegram bot token", right=_TOKEN, glueable=False),
    _f("AGE-SECRET-KEY-1", r"AGE-SECRET-KEY-1[QPZRY9X8GF2TVDW0S3JN54KHCE6MUA7L]{58}", "age secret key",
       kind="private_key", prefix=16),
)
#: (gate, the formats it gates), each gate tested once per string.
_GATED: Final = tuple((gate, tuple(f for f in FORMATS if f.gate == gate)) for gate in dict.fromkeys(f.gate for f in FORMATS))
#: The literal starts of the formats above (and of PEM blocks and JWTs), for finding them rotated
#: (rot13) or reversed before decoding.
PREFIXES: Final = (
    "AKIA", "ASIA", "ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_", "glpat-", "npm_", "xoxb-", "xoxp-", "xoxa-",
    "xoxs-", "xoxe-", "xapp-", "sk_live_", "rk_live_", "whsec_", "sk-ant-", "sk-proj-",
    "sk-svcacct-", "sk-admin-", "AIza", "hf_", "SG.", "pypi-AgE", "dop_v1_", "shpat_", "shpss_", "AGE-SECRET-KEY-1",
    "eyJ",
)  # fmt: skip

_PRIVATE_KEY: Final = re.compile(
    r"-----BEGIN ((?:[A-Z0-9]+ )*)PRIVATE KEY( BLOCK)?-----(?:.*?-----END \1PRIVATE KEY\2-----|.*)",
    re.DOTALL,
)
_JWT: Final = re.compile(r"(?<![A-Za-z0-9_-])(eyJ[A-Za-z0-9_-]{5,})=*\.([A-Za-z0-9_-]{5,})=*\.[A-Za-z0-9_-]*")
_JWT_IO_SAMPLE: Final = (  # jwt.io's default token (header, payload), quoted in every JWT tutorial
    "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9",
    "eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4gRG9lIiwiaWF0IjoxNTE2MjM5MDIyfQ",
)


def jwt_alg(header: str) -> str | None:
    """The `alg` a JWT header segment names, or None if it is not a JSON object with one."""
    data = decode_base64(header)
    try:
        parsed = json.loads(data) if data else None
    except ValueError:
        return None
    alg = parsed.get("alg") if isinstance(parsed, dict) else None
    return alg if isinstance(alg, str) else None


def _describe(fmt: _Format, token: str) -> tuple[str, str] | None:
    """(kind, detail) for one match of `fmt`, or None when it is a placeholder or fails its check."""
    if (fmt.example or documented_example)(token[fmt.prefix :]):
        return "example_secret", f"{fmt.label}: a documented example value"
    if (fmt.check is not None and not fmt.check(token)) or is_placeholder(token[fmt.prefix :]):
        return None
    name = f" ({token[: fmt.prefix]})" if fmt.named else ""
    return fmt.kind, f"{fmt.label}{name}, {len(token)} chars"


def credential_hits(s: str, glued: Sequence[int] | None = None, original: str = "") -> list[FormatHit]:
    """Vendor-format credentials, PEM private keys and JWTs in `s` (see the module doc).

    `glued`: `s` is `original` with separators removed and `glued[i]` the offset in `original`
    of `s[i]`; then a match may run into the text after it, the character before it is looked up
    in `original`, and PEM blocks and JWTs (whose own separators are gone) are not looked for.
    """
    hits: list[FormatHit] = []
    for gate, formats in _GATED:
        if gate in s:
            for fmt in formats:
                if glued is None or fmt.glueable:
                    _format_hits(fmt, s, glued, original, hits)
    if glued is None:
        _pem_and_jwt(s, hits)
        if len(s) >= _KEY_BODY_MIN:
            key_body_hits(s, hits)
    return hits


def _format_hits(fmt: _Format, s: str, glued: Sequence[int] | None, original: str, hits: list[FormatHit]) -> None:
    """The matches of one format in `s` (see `credential_hits`)."""
    for m in fmt.pattern.finditer(s):
        a, b = m.span()
        before = (original[glued[a] - 1] if glued[a] > 0 else "") if glued is not None else (s[a - 1] if a else "")
        if before in fmt.left or (glued is None and b < len(s) and s[b] in fmt.right):
            continue
        if glued is not None and _placeholder_head(fmt, s, glued, a, b):
            continue
        if fmt.public_next is not None and fmt.public_next.match(original if glued is not None else s, glued[b - 1] + 1 if glued is not None else b):
            continue
        described = _describe(fmt, m.group())
        if described is not None:
            hits.append((described[0], a, b, described[1]))


def _placeholder_head(fmt: _Format, s: str, glued: Sequence[int], a: int, b: int) -> bool:
    """Whether the first piece of a rejoined match (up to the first removed separator) is a
    placeholder: `sk_live_xxxx` at the end of a line, glued to the next line's name, is still one."""
    k = a + 1
    while k < b and glued[k] == glued[k - 1] + 1:
        k += 1
    return k - a > fmt.prefix and is_placeholder(s[a + fmt.prefix : k])


_OIDC_HINT: Final = re.compile(r"[?&](?:id_token_hint|request|logout_hint)=\Z")
_URL_HOST: Final = re.compile(r"\s*https?://([A-Za-z0-9.-]+)[/?:]")


def _oidc_hint_home(s: str, start: int, payload: str) -> bool:
    """Whether the JWT at `start` is the `id_token_hint`/`request` of a URL (the whole string) on the
    same registered domain as the JWT's `iss` or `aud`: an OIDC logout or request object going back
    to the identity provider it names. Sent to any other host it stays a `jwt`."""
    if start < 8 or _OIDC_HINT.search(s, max(0, start - 16), start) is None:
        return False
    url, claims = _URL_HOST.match(s), decode_base64(payload)
    try:
        parsed = json.loads(claims) if claims else None
    except ValueError:
        return False
    if url is None or not isinstance(parsed, dict):
        return False
    aud = parsed.get("aud")
    named = [parsed.get("iss"), *(aud if isinstance(aud, list) else [aud])]
    site = url.group(1).lower().split(".")[-2:]
    return any(isinstance(u, str) and (h := _URL_HOST.match(u + "/")) is not None and h.group(1).lower().split(".")[-2:] == site
               for u in named)


def _pem_and_jwt(s: str, hits: list[FormatHit]) -> None:
    if "-----BEGIN" in s:
        for m in _PRIVATE_KEY.finditer(s):
            label = m.group(1).strip()
            hits.append(("private_key", m.start(), m.end(), f"{label + ' ' if label else ''}private key block"))
    if "eyJ" in s:
        for m in _JWT.finditer(s):
            alg = jwt_alg(m.group(1))
            if alg is None:
                continue
            if _oidc_hint_home(s, m.start(), m.group(2)):
                continue  # an ID token handed back to its own identity provider (urls._home_tokens)
            if m.group(1, 2) == _JWT_IO_SAMPLE:
                hits.append(("example_secret", m.start(), m.end(), "jwt.io's sample JWT"))
            else:
                hits.append(("jwt", m.start(), m.end(), f"JWT (alg {alg[:16]}), {m.end() - m.start()} chars"))
        _jwt_undotted(s, hits)


#: A JWT whose dots were replaced (round 6, es-session-token): header, payload (a JSON object's
#: base64 starts `eyJ`) and signature with the same other separator (`~`, a space, a line break).
_JWT_SEP: Final = re.compile(
    r"(?<![A-Za-z0-9_-])(eyJ[A-Za-z0-9_-]{10,})([^A-Za-z0-9_.=-]{1,2})(eyJ[A-Za-z0-9_-]{5,})\2([A-Za-z0-9_-]{16,})"
)
#: A run that may be a JWT with its dots removed: header and payload both start `eyJ`.
_JWT_RUN: Final = re.compile(r"(?<![A-Za-z0-9_-])eyJ[A-Za-z0-9_-]{60,}")
_JWT_HEADER_LONGEST: Final = 1024  # where a header may end (bounded: each candidate is decoded)
_JWT_LONGEST: Final = 16_384  # payload and signature decoded at most


def _jwt_undotted(s: str, hits: list[FormatHit]) -> None:
    """JWTs with their dots replaced or removed: found by their structure (a header naming an
    `alg`, a JSON payload, then a signature of 16+ characters), never by the separator."""
    for m in _JWT_SEP.finditer(s):
        alg = jwt_alg(m.group(1))
        if alg is not None and (m.group(1), m.group(3)) != _JWT_IO_SAMPLE:
            hits.append(("jwt", m.start(), m.end(), f"JWT (alg {alg[:16]}) with its dots replaced, {m.end() - m.start()} chars"))
    for m in _JWT_RUN.finditer(s):
        run = m.group()
        i = run.find("eyJ", 16, _JWT_HEADER_LONGEST)
        while i != -1 and (alg := jwt_alg(run[:i])) is None:
            i = run.find("eyJ", i + 3, _JWT_HEADER_LONGEST)
        if i == -1 or alg is None:
            continue
        sig = _after_json(run[i : i + _JWT_LONGEST])
        if sig is not None and len(sig) >= 16 and (run[:i], run[i : len(run) - len(sig)]) != _JWT_IO_SAMPLE:
            hits.append(("jwt", m.start(), m.end(), f"JWT (alg {alg[:16]}) with its dots removed, {len(run)} chars"))


def _after_json(run: str) -> str | None:
    """What follows the base64url of a JSON object at the start of `run` (a JWT's signature when
    its dots are gone), or None when the run does not start with one. The object's closing brace
    decodes right whatever the alignment (base64's first byte of a group needs only 2 characters)."""
    data = decode_base64(run[: len(run) // 4 * 4])
    if not data:
        return None
    try:
        obj, end = json.JSONDecoder().raw_decode(data.decode("latin-1"))
    except ValueError:
        return None
    chars = -(-end * 4 // 3)  # the unpadded base64 length of `end` bytes
    return run[chars:] if isinstance(obj, dict) else None


#: Where an armour-less private key body can start: base64 of a DER SEQUENCE (0x30: `M`, then a
#: length byte: `C`-`J`), of `openssh-key-v1`, or a PuTTY key file's header.
_KEY_BODY_MIN: Final = 19  # the shortest start looked for (`b3BlbnNzaC1rZXktdjE`)
_DER_START: Final = re.compile(r"M[C-J][A-Za-z0-9+/]{38}")  # a literal first character: the engine skips to it
_OTHER_STARTS: Final = ("b3BlbnNzaC1rZXktdjE", "PuTTY-User-Key-File-")


def _der_private(head: str) -> str | None:
    """What DER private-key structure a base64 run starts with, or None: a SEQUENCE whose first
    element is INTEGER 0, 1 or 3 followed by an INTEGER (PKCS#1), an OCTET STRING (SEC 1 EC) or a
    SEQUENCE (PKCS#8, PKCS#12). Certificates, CSRs and public keys open with a SEQUENCE instead."""
    data = decode_base64(head[:16])
    if data is None or len(data) < 8 or data[0] != 0x30:
        return None
    n = 2 if data[1] < 0x80 else 2 + (data[1] & 0x7F)
    if n > 5 or data[n : n + 2] != b"\x02\x01" or len(data) <= n + 3:
        return None
    version, nxt = data[n + 2], data[n + 3]
    if version == 0 and nxt == 0x02:
        return "RSA (PKCS#1)"
    if version in (0, 1) and nxt == 0x30:
        return "PKCS#8"
    if version == 1 and nxt == 0x04:
        return "EC (SEC 1)"
    if version == 3 and nxt == 0x30:
        return "PKCS#12"
    return None


def key_body_hits(s: str, hits: list[FormatHit]) -> None:
    """Private keys without their PEM armour in `s` (see the module doc): a hit spans from the start
    of the body to the end of its base64 run (line breaks included)."""
    starts: list[tuple[int, str]] = [(m.start(), "") for m in _DER_START.finditer(s)]
    for lead in _OTHER_STARTS:
        if lead in s:
            starts += [(m.start(), lead) for m in re.finditer(re.escape(lead), s)]
    for a, lead in starts:
        if (a and s[a - 1] in _BASE64_CHARS) or any(h[1] <= a < h[2] for h in hits):
            continue  # inside a longer run, or a PEM block found already
        label = ("PuTTY" if lead[0] == "P" else "OpenSSH") if lead else _der_private(s[a : a + 16])
        if label is None:
            continue
        end = a + len(lead)
        while end < len(s) and s[end] in _BASE64_RUN:
            end += 1
        hits.append(("private_key", a, end, f"{label} private key body without PEM armour"))


_BASE64_CHARS: Final = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/")
_BASE64_RUN: Final = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=\r\n")

# ---- public key material -------------------------------------------------------------------

_PUBLIC_PEM: Final = re.compile(
    r"-----BEGIN ((?:TRUSTED |X509 )?CERTIFICATE(?: REQUEST)?|NEW CERTIFICATE REQUEST|(?:RSA |DSA |EC )?PUBLIC KEY"
    r"|PGP PUBLIC KEY BLOCK|PGP SIGNATURE|X509 CRL|PKCS7|CMS|SSH2 PUBLIC KEY)-----.*?-----END \1-----",
    re.DOTALL,
)
_SSH_PUBLIC: Final = re.compile(
    r"(?<![A-Za-z0-9_-])((?:ssh-(?:rsa|dss|ed25519|ed448)|ecdsa-sha2-nistp(?:256|384|521)"
    r"|sk-(?:ssh-ed25519|ecdsa-sha2-nistp256)@openssh\.com)(?:-cert-v01@openssh\.com)?)[ \t]+(AAAA[A-Za-z0-9+/]{16,}={0,3})"
)
_PUBLISHABLE: Final = re.compile(r"(?<![A-Za-z0-9])pk_(?:live|test)_[A-Za-z0-9]{16,}")
_AGE_RECIPIENT: Final = re.compile(r"(?<![A-Za-z0-9])age1[02-9ac-hj-np-z]{58}(?![A-Za-z0-9])")


def _ssh_blob_names(blob: str, key_type: str) -> bool:
    """Whether an SSH public key's base64 blob starts with its length-prefixed key type, as every one does."""
    data = decode_base64(blob[:64])
    if data is None or len(data) < 4:
        return False
    n = int.from_bytes(data[:4], "big")
    return data[4 : 4 + n].decode("ascii", "replace") == key_type


def public_hits(s: str) -> list[FormatHit]:
    """Public key material in `s`, as hits of kind `public_key` (see the module doc)."""
    hits: list[FormatHit] = []
    if "-----BEGIN" in s:
        hits += [("public_key", m.start(), m.end(), f"PEM {m.group(1)} block") for m in _PUBLIC_PEM.finditer(s)]
    if "ssh-" in s or "ecdsa-" in s:
        for m in _SSH_PUBLIC.finditer(s):
            if _ssh_blob_names(m.group(2), m.group(1)):
                hits.append(("public_key", m.start(), m.end(), f"SSH public key ({m.group(1)[:32]})"))
    if "pk_" in s:
        hits += [("public_key", m.start(), m.end(), "Stripe publishable key") for m in _PUBLISHABLE.finditer(s)]
    if "age1" in s:
        hits += [("public_key", m.start(), m.end(), "age recipient (public key)") for m in _AGE_RECIPIENT.finditer(s)]
    return hits



# ---- credentials that only appear once pieces are joined (round 8) ----------------------------

AWS_SECRET_LEN: Final = 40
_AWS_PIECE: Final = re.compile(r"[A-Za-z0-9+/]{2,39}")
_AWS_SHAPE: Final = re.compile(r"[A-Za-z0-9+/]{40}")
JOIN_MAX_PIECES: Final = 8  # pieces one joined credential may span
JOIN_MAX_STARTS: Final = 32  # pieces a joined credential may start at


def aws_secret_shape(text: str) -> bool:
    """Whether `text` has the shape of an AWS secret access key: 40 characters of the base64
    alphabet, upper case, lower case and digits, at least 20 distinct (random, not a word run), and
    no documented example. Alone it is no finding (PGP armour lines and ids have it too); it is
    one when it appears only by joining pieces (`joined_hits`)."""
    return (
        _AWS_SHAPE.fullmatch(text) is not None
        and _mixed(text)
        and len(set(text)) >= 20
        and not documented_example(text)
    )


def joined_hits(pieces: Sequence[str]) -> list[tuple[str, int, int, str]]:
    """Credentials that only appear when consecutive pieces are joined with nothing between them:
    `(kind, first, end, detail)`, the pieces `first..end-1` (two or more). Two shapes: pieces of
    the base64 alphabet that together are exactly an AWS secret access key's shape (a piece boundary
    at both ends: the value was cut, not found inside a longer run), and a JWT that parses starting
    at a piece's start and running past its end. Vendor-prefixed tokens are rejoined by callers."""
    out: list[tuple[str, int, int, str]] = []
    n = len(pieces)
    for i in range(min(n - 1, JOIN_MAX_STARTS)):
        total = 0
        for j in range(i, min(n, i + JOIN_MAX_PIECES)):
            if _AWS_PIECE.fullmatch(pieces[j]) is None or not _random_piece(pieces[j]):
                break
            total += len(pieces[j])
            if total >= AWS_SECRET_LEN:
                if total == AWS_SECRET_LEN and j > i and aws_secret_shape("".join(pieces[i : j + 1])):
                    out.append(("api_key", i, j + 1, "AWS secret access key shape (unlabelled)"))
                break
        if pieces[i].startswith("eyJ"):
            _joined_jwt(pieces, i, out)
    return out


def _random_piece(piece: str) -> bool:
    """Whether a piece can be a cut of a random base64 value: from 8 characters on it holds upper and
    lower case (a random 8-character cut lacks one ~3 % of the time; `SPRING26`, `ORDER2291`, hex
    digests and words do)."""
    return len(piece) < 8 or (not piece.isupper() and not piece.islower() and not piece.isdigit())


def _joined_jwt(pieces: Sequence[str], i: int, out: list[tuple[str, int, int, str]]) -> None:
    """A JWT starting at piece `i` that runs past it once the next pieces are joined (with nothing
    between them, or with dots when the cuts fell on the token's own dots)."""
    group = pieces[i : i + JOIN_MAX_PIECES]
    for sep in ("", "."):
        joined = sep.join(group)
        for kind, a, b, detail in credential_hits(joined):
            if kind == "jwt" and a == 0 and b > len(group[0]):
                end, pos = i, 0
                while end < i + len(group) and pos < b:
                    pos += len(pieces[end]) + len(sep)
                    end += 1
                out.append(("jwt", i, end, detail))
                return
