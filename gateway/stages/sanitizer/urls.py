"""Where a call's URLs lead: every URL in its arguments, parsed as the backends would (`args_urls`).

`urls_for(tool, arguments, references)` finds the URL-like strings of a call's (cleaned) arguments,
in any field at any depth: URLs with a scheme in free text or as a whole value (backslashes and
missing slashes as WHATWG reads them: `http:\\\\127.0.0.1`, `http:127.0.0.1`), URLs hidden behind
percent-encoding (`http%3A%2F%2F…`), URLs nested in another URL's query or path, plain or encoded
(`?next=http://10.0.0.1/`, `?u=aHR0cDovLzEyNy4wLjAuMS8=`, `jar:http://…!/`), and scheme-less
hosts in a field named for one (`url: 127.0.0.1:8080/admin`, `endpoint: metadata/computeMetadata`,
and for fetch-like tools `host: 10.0.0.5`). Each becomes one map for the rules: scheme, host as
written and as a connection would reach it (`hosts.host_facts`: every IPv4 and IPv6 spelling, IDNA,
internal and metadata names), port, path, query keys, the host's classes, whether the call sends
the tool there (`destination`), and what the URL carries out: encoded data in host labels, path
segments, query values and userinfo, and the secret scanner's findings in the decoded parts.

Which URLs are destinations (docs/detection.md, "Egress"): for a fetch-like tool (its name has a
word such as fetch, http, request, curl, browser, navigate, web, url, download, scrape, crawl), every
URL outside body-like fields (`body`, `content`, `text`, `message`, `query`, …); for any other tool,
URLs in fields named for a URL (`url`, `uri`, `endpoint`, `webhook`, `callback`, `proxy`, `*_url`,
…). A `file:` URL is a destination only for fetch-like tools. URLs a destination's query or path
carries are destinations too (`nested`): fetch tools follow redirects. A `localhost` in the text a
non-fetch tool writes is data, not a destination.

No I/O: names are not resolved (a public-looking name is public here; the backend resolves it
again anyway). Bounded: `MAX_STRINGS` strings, `MAX_SCAN` characters of each, `MAX_URLS` URLs per
call (more: one entry that says so, `kind: "too_many"`), nested URLs `MAX_NESTED` deep.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import unquote, unquote_plus

from gateway.memo import Memo
from gateway.stages.classify import tool_words
from gateway.stages.sanitizer import spelled
from gateway.stages.sanitizer.decode import decode_base64
from gateway.stages.sanitizer.formats import credential_hits, documented_example, is_placeholder, joined_hits
from gateway.stages.sanitizer.hosts import CLASSES, HostFacts, host_facts
from gateway.stages.sanitizer.paths import child_path
from gateway.stages.sanitizer.personal import identifies_person, personal_kinds
from gateway.stages.sanitizer.secrets import detect_secrets

__all__ = ["MAX_URLS", "UrlAnalysis", "analyse_urls", "decode_token", "is_json", "urls_for"]

MAX_URLS: Final = 64
MAX_STRINGS: Final = 4096
MAX_SCAN: Final = 65_536
MAX_URL: Final = 4096  # characters of one URL analysed
MAX_NESTED: Final = 2
MAX_PARTS: Final = 64  # path segments or query pairs looked at per URL
MIN_TOKEN: Final = 16  # shortest host label, path segment or query value decoded
MAX_LABELS: Final = 16  # host labels whose runs are joined and decoded

#: Schemes whose URLs name a host a client connects to.
NETWORK_SCHEMES: Final = frozenset({
    "http", "https", "ws", "wss", "ftp", "ftps", "sftp", "ssh", "git", "svn", "rsync", "gopher", "dict", "ldap",
    "ldaps", "tftp", "telnet", "smb", "nfs", "rtsp", "redis", "rediss", "mongodb", "mysql", "postgres",
    "postgresql", "amqp", "amqps", "mqtt", "nntp", "imap", "imaps", "pop3", "smtp", "smtps", "irc", "ircs",
    "memcached", "sip", "xmpp", "ldapi",
})  # fmt: skip
#: Schemes that read local files or run code (their "host" is not one, when they have any).
LOCAL_SCHEMES: Final = frozenset({"file", "jar", "netdoc", "php", "phar", "expect", "javascript", "vbscript", "data"})
_OPAQUE: Final = frozenset({"jar", "javascript", "vbscript", "php", "phar", "expect", "data"})
#: Media types a `data:` URL may carry into a URL field and stay inert (an inline picture for an image
#: tool); any other (HTML, SVG, script, text, none) is a document a browser renders and runs.
_INERT_MEDIA: Final = ("image/png", "image/jpeg", "image/jpg", "image/gif", "image/webp", "image/avif", "image/bmp",
                       "image/x-icon", "image/vnd.microsoft.icon", "image/tiff", "audio/", "video/", "font/")
_SPECIAL: Final = frozenset({"http", "https", "ws", "wss", "ftp", "file"})  # WHATWG: `\` is `/`, slashes optional
_DEFAULT_PORTS: Final = {
    "http": 80, "https": 443, "ws": 80, "wss": 443, "ftp": 21, "ftps": 990, "sftp": 22, "ssh": 22, "git": 9418,
    "gopher": 70, "dict": 2628, "ldap": 389, "ldaps": 636, "tftp": 69, "telnet": 23, "smb": 445, "redis": 6379,
    "rediss": 6379, "mongodb": 27017, "mysql": 3306, "postgres": 5432, "postgresql": 5432, "amqp": 5672,
    "mqtt": 1883, "memcached": 11211, "smtp": 25, "imap": 143, "pop3": 110, "rtsp": 554,
}  # fmt: skip

_FETCH_WORDS: Final = frozenset({
    "fetch", "http", "https", "request", "requests", "curl", "wget", "browser", "browse", "navigate", "web", "url",
    "urls", "uri", "download", "scrape", "scraper", "crawl", "crawler", "visit", "goto", "proxy", "puppeteer",
    "playwright", "screenshot", "webhook",
})  # fmt: skip
_BODY_KEYS: Final = frozenset({
    "body", "data", "json", "payload", "form", "content", "contents", "text", "message", "messages", "html",
    "markdown", "md", "description", "note", "notes", "comment", "comments", "summary", "title", "caption",
    "query", "q", "search", "code", "diff", "patch", "log", "logs", "document", "snippet", "example", "examples",
    "readme", "answer", "response", "result", "output", "subject", "reason",
})  # fmt: skip
_URL_KEYS: Final = frozenset({"url", "uri", "urls", "uris", "endpoint", "endpoints", "webhook", "callback", "src",
                              "proxy", "remote", "link_url", "base"})
_URL_KEY_ENDS: Final = ("url", "uri", "urls", "uris", "endpoint", "webhook", "callback")
_HOST_KEYS: Final = frozenset({"host", "hostname", "hosts", "server", "domain", "ip", "target_host", "remote_host"})
#: Tools that run commands or code, and the fields that hold one: a URL there is a destination when
#: the command calls an HTTP client on it (`curl -H 'Metadata-Flavor: Google' http://metadata…`,
#: `python3 -c "urllib.request.urlopen('http://[fd00:ec2::254]/…')"`, `Invoke-RestMethod -Uri …`);
#: an `echo` or a `grep` of the same URL sends nothing.
_RUN_WORDS: Final = frozenset({
    "run", "exec", "execute", "shell", "bash", "sh", "zsh", "command", "cmd", "terminal", "powershell", "pwsh",
    "python", "node", "script", "eval", "process", "console",
})  # fmt: skip
_COMMAND_KEYS: Final = frozenset({"command", "cmd", "commands", "script", "shell", "argv", "args", "code", "source", "line"})
_CLIENT: Final = re.compile(
    r"""(?:^|[\s;&|(`'"$])(?:curl|wget|wget2|aria2c|http|https|xh|httpie|lynx|w3m|links|nc|ncat|socat|telnet|openssl\s+s_client|
        Invoke-WebRequest|Invoke-RestMethod|iwr|irm|Start-BitsTransfer|certutil|bitsadmin)(?:\.exe)?(?=[\s'"])
      | urlopen\s*\( | urlretrieve\s*\( | requests\.(?:get|post|put|head|request|Session)\b | httpx\.\w+\s*\(
      | http\.client | fetch\s*\( | axios | XMLHttpRequest | WebClient | HttpClient | net/http | open-uri | LWP::
      | file_get_contents\s*\( | curl_exec""",
    re.X | re.I,
)
#: Tools that resolve names: a name looked up is a name sent to every resolver on the way.
_DNS_WORDS: Final = frozenset({"dns", "nslookup", "dig", "resolve", "resolver", "whois"})
_DNS_KEYS: Final = frozenset({"name", "fqdn", "query", "target", "record", "domains", "names"})

_FIND: Final = re.compile(
    r"""(?<![A-Za-z0-9+.\-])(?:
        ([A-Za-z][A-Za-z0-9+.\-]{1,31}):[/\\]{1,3}[^\s"'<>`]*   # scheme:// (also one slash, backslashes)
      | (jar|javascript|vbscript|netdoc|php|phar|expect):[^\s"'<>`]+   # opaque schemes that fetch or run
    )""",
    re.X,
)
_NO_SLASHES: Final = re.compile(r"(https?|wss?|ftp):([^/\\\s][^\s]*)\Z", re.I)  # `http:127.0.0.1`: WHATWG adds `//`
_TRAILING: Final = ".,;:!?)]}'\""
_ENCODED_URL: Final = re.compile(r"%(?:3a|2f|5c|25)", re.I)
_SCP: Final = re.compile(r"([A-Za-z0-9._-]+@)?([A-Za-z0-9.-]+):(?![0-9]+(?:/|\Z))([^\s]*)\Z")  # git@host:org/repo
_BARE_HOST: Final = re.compile(r"\[[0-9A-Fa-f:.%A-Za-z]+\]|[^\s/\\?#@\[\]]+")
_HEX: Final = re.compile(r"[0-9A-Fa-f]{2}(?:[:\-. ,]?[0-9A-Fa-f]{2}){7,}\Z")
_B32: Final = re.compile(r"[A-Za-z2-7]+=*\Z")
_B64: Final = re.compile(r"[A-Za-z0-9+/_-]+=*\Z")
_ESCAPED_ALNUM: Final = re.compile(r"%(?:3[0-9]|[46][1-9A-Fa-f]|[57][0-9Aa])")
#: Finding kinds that say nothing secret left in a URL: documented examples, public wallet addresses
#: (block explorers put them in paths), and the one-time-code heuristic (`?code=123456`).
_PUBLIC_KINDS: Final = frozenset({"example_secret", "wallet_address", "otp_code"})
_CC_SLD: Final = frozenset({"co", "com", "net", "org", "gov", "edu", "ac", "or", "ne", "go", "ltd", "plc"})


#: Words of a tool name that say it only records what it is given (a bookmark, a note, a file): its
#: URL fields are data, not destinations, unless the name also says it fetches.
_RECORD_WORDS: Final = frozenset({
    "save", "store", "bookmark", "bookmarks", "note", "notes", "remember", "memo", "memory", "record", "log",
    "comment", "annotate", "write", "edit", "rename", "delete", "remove",
})  # fmt: skip


def _host_key(key: str, resolver: bool = False) -> bool:
    return key in _HOST_KEYS or key.endswith(("_host", "hostname")) or (resolver and key in _DNS_KEYS)


@dataclass(slots=True)
class UrlAnalysis:
    """The URLs of one call as the rules see them (`as_cel()` is `args_urls`)."""

    urls: list[dict[str, Any]] = field(default_factory=list)

    def as_cel(self) -> list[dict[str, Any]]:
        return self.urls


def urls_for(tool: str, arguments: dict[str, Any], references: frozenset[str]) -> UrlAnalysis | None:
    """The URL analysis of a call whose rules read `args_urls` (None when none does)."""
    if "args_urls" not in references:
        return None
    return analyse_urls(tool, arguments)


def analyse_urls(tool: str, arguments: Any) -> UrlAnalysis:
    """Every URL-like string of `arguments` (see the module docstring)."""
    out = UrlAnalysis()
    words = tool_words(tool)
    fetcher = bool(words & _FETCH_WORDS)
    resolver = bool(words & _DNS_WORDS)
    records = not fetcher and bool(words & _RECORD_WORDS)
    runner = bool(words & _RUN_WORDS)
    renderer = bool(words & _RENDER_WORDS)
    for parent, step, key, text in _strings(arguments):
        url_key = key in _URL_KEYS or key.endswith(_URL_KEY_ENDS)
        host_field = _host_key(key, resolver)
        if not url_key and not host_field and ":" not in text and "%" not in text:
            continue  # the cheap test most strings stop at
        destination = (fetcher or (url_key or host_field) and not records) and (host_field or key not in _BODY_KEYS)
        client = not destination and (runner or key in _COMMAND_KEYS) and "://" in text and _CLIENT.search(text, 0, MAX_SCAN) is not None
        where = parent if step is None else child_path(parent, step)
        first = len(out.urls)
        images = _image_urls(text) if not destination and not client else ()
        fetched = _markup_urls(text) | frozenset(images) if renderer and not destination else frozenset()
        for url, via in _found(text, url_key, host_field and (fetcher or resolver)):
            image = any(i.startswith(url) for i in images)
            here = (destination or client or image or url in fetched) and (fetcher or url.partition(":")[0].lower() != "file")
            before = len(out.urls)
            if not _add(out, url, where, here, via, nested=False):
                return out
            if image and not client and url not in fetched:
                _client_destinations(out.urls[before:])
        if client:
            _client_destinations(out.urls[first:])
    return out


#: Where written text has an image whose URL a reader's client fetches when it renders the text: a
#: markdown image (inline, or by reference: `![a][1]` with `[1]: url`), an HTML `<img>`/`<source>` `src` or `srcset`.
_MD_IMAGE: Final = re.compile(r"!\[[^\]\n]{0,200}\](?:\(\s*<?([a-z][a-z0-9+.-]*://[^\s)>]+)|\[([^\]\n]{1,60})\])", re.I)
_HTML_IMAGE: Final = re.compile(r"<(?:img|source)\b(?:[^>\"']++|\"[^\"]{0,4000}+\"|'[^']{0,4000}+')*+>", re.I)
_SOURCE_ATTR: Final = re.compile(r"\b(?:src|srcset)\s*=\s*[\"']?([^\"'>]{8,4000})", re.I)
_REF_DEFINITION: Final = re.compile(r"^[ \t]{0,3}\[([^\]\n]{1,60})\]:[ \t]*<?(\S+?)>?(?=\s|$)", re.M)


def _image_urls(text: str) -> tuple[str, ...]:
    """The image URLs of a written text (`_MD_IMAGE`, `_HTML_IMAGE`; every candidate of a `srcset`):
    rendering the text fetches them, so each is a destination when it carries data or a secret out."""
    if "![" not in text and "<img" not in text and "<source" not in text and "<IMG" not in text:
        return ()
    found: list[str] = []
    refs: set[str] = set()
    for m in _MD_IMAGE.finditer(text, 0, MAX_SCAN):
        if m.group(1):
            found.append(m.group(1))
        else:
            refs.add(m.group(2).lower())
    if refs:
        found.extend(m.group(2) for m in _REF_DEFINITION.finditer(text, 0, MAX_SCAN) if m.group(1).lower() in refs)
    for tag in _HTML_IMAGE.finditer(text, 0, MAX_SCAN):
        for m in _SOURCE_ATTR.finditer(tag.group()):
            found.extend(part.split()[0] for part in m.group(1).split(",") if part.strip())
    return tuple(found[:MAX_URLS])


#: Words of a tool name that say it renders a document (HTML, SVG, markdown to PDF or an image) on the
#: server: the subresources of the markup it is given are fetched from there (round 5, ss-ssrf-in-markup).
_RENDER_WORDS: Final = frozenset({
    "render", "renderer", "rendering", "pdf", "html2pdf", "wkhtmltopdf", "weasyprint", "rasterize", "rasterise",
    "rasterizer", "svg", "thumbnail", "preview", "print", "chromium", "headless",
})  # fmt: skip
#: A start tag (not `<a>`/`<area>`, whose links are not followed when rendering) and the attributes
#: a renderer loads: src, srcset, href (stylesheets, SVG `<image>`/`<use>`), xlink:href, data
#: (`<object>`), poster, background, and a meta refresh's `content="0;url=…"`; CSS `url(…)` and `@import`.
_TAG: Final = re.compile(r"<(?!/|a\b|area\b|!)([A-Za-z][\w:-]*)((?:[^>\"']++|\"[^\"]{0,4000}+\"|'[^']{0,4000}+')*+)>", re.I)
_LOADED_ATTR: Final = re.compile(r"(?<![\w:-])(?:src|srcset|href|xlink:href|data|poster|background|content)\s*=\s*(?:\"([^\"]{4,4000})\"|'([^']{4,4000})'|([^\s>]{4,4000}))", re.I)
_CSS_URL: Final = re.compile(r"(?:url\(\s*[\"']?|@import\s+[\"'])([A-Za-z][A-Za-z0-9+.-]*:[^\"')\s]{2,4000})", re.I)


def _markup_urls(text: str) -> frozenset[str]:
    """The URLs a renderer fetches while it renders `text` (`_TAG`'s attributes, CSS `url()` and
    `@import`); these, and its images (`_image_urls`), are destinations for a renderer."""
    if "<" not in text and "url(" not in text and "@import" not in text:
        return frozenset()
    values: list[str] = [m.group(1) for m in _CSS_URL.finditer(text, 0, MAX_SCAN)]
    for tag in _TAG.finditer(text, 0, MAX_SCAN):
        values.extend(m.group(1) or m.group(2) or m.group(3) for m in _LOADED_ATTR.finditer(tag.group(2)))
    return frozenset(_trim(m.group()) for v in values[:MAX_URLS] for m in _FIND.finditer(v))


def _client_destinations(entries: list[dict[str, Any]]) -> None:
    """URLs of a command that runs an HTTP client (`curl …`, `urlopen(…)`, `Invoke-RestMethod …`):
    a destination when it reaches a cloud metadata service or carries data or a secret out. Other
    internal addresses stay data: a shell is where a developer calls their own services
    (`curl localhost:3000/health`), and the shell rules judge the command."""
    for entry in entries:
        entry["destination"] = entry["destination"] and (
            entry["metadata"] or bool(entry["secrets"]) or any(d != "userinfo_host" for d in entry["data"])
        )


def _strings(value: Any) -> Iterator[tuple[str, str | int | None, str, str]]:
    """(parent path, key or index, nearest key in lower case, string) for each string, bounded."""
    if type(value) is dict and all(type(v) is not dict and type(v) is not list for v in value.values()):
        for k, v in list(value.items())[:MAX_STRINGS]:  # flat arguments, the common case
            if type(v) is str:
                yield "$", k, k.lower(), v[:MAX_SCAN]
        return
    stack: list[tuple[Any, str, str | int | None, str]] = [(value, "$", None, "")]
    seen = 0
    while stack and seen < MAX_STRINGS:
        item, parent, step, key = stack.pop()
        if isinstance(item, str):
            seen += 1
            yield parent, step, key, item[:MAX_SCAN]
            continue
        here = parent if step is None else child_path(parent, step)
        if isinstance(item, dict):
            stack.extend((v, here, k, str(k).lower()) for k, v in reversed(list(item.items())))
        elif isinstance(item, list):
            stack.extend((v, here, i, key) for i, v in reversed(list(enumerate(item))))


def _found(text: str, url_field: bool, host_field: bool) -> Iterator[tuple[str, str]]:
    """(URL, how it was found) for each URL in one string: "" plain, "url" percent-decoded, "bare"
    scheme-less (in a URL field, or a host field of a tool that connects to or resolves it)."""
    whole = text.strip()
    spans: list[tuple[int, int]] = []
    decoded_any = False
    for m in _FIND.finditer(text):
        scheme = (m.group(1) or m.group(2)).lower()
        if scheme not in NETWORK_SCHEMES and scheme not in LOCAL_SCHEMES:
            continue
        url = m.group()
        if m.start() != 0 or m.end() != len(text.rstrip()):
            url = _trim(url)
        spans.append(m.span())
        yield url, ""
    if not spans and url_field and whole[:5].lower() == "data:":
        if not whole[5:].split(",", 1)[0].split(";", 1)[0].strip().lower().startswith(_INERT_MEDIA):
            yield whole[:4096], ""  # a document the client renders: the `data` scheme (egress.yaml)
        return
    if not spans:
        bare = _NO_SLASHES.match(whole)
        if bare is not None:
            yield f"{bare.group(1)}://{bare.group(2)}", ""
            return
    if "%" in text and _ENCODED_URL.search(text):
        rest = "".join(text[b:e] for b, e in _gaps(spans, len(text)))
        decoded = rest
        for _ in range(3):
            if "%" not in decoded:
                break
            decoded = unquote(decoded)
        if decoded != rest:
            for m in _FIND.finditer(decoded):
                scheme = (m.group(1) or m.group(2)).lower()
                if scheme in NETWORK_SCHEMES or scheme in LOCAL_SCHEMES:
                    decoded_any = True
                    yield _trim(m.group()), "url"
    if not spans and not decoded_any and whole and (url_field or host_field):
        bare_url = _bare(whole, host_field)
        if bare_url is not None:
            yield bare_url, "bare"


def _gaps(spans: list[tuple[int, int]], size: int) -> Iterator[tuple[int, int]]:
    start = 0
    for b, e in spans:
        yield start, b
        start = e
    yield start, size


def _trim(url: str) -> str:
    """A URL found in prose without the punctuation that ends the sentence around it."""
    while url and url[-1] in _TRAILING:
        if url[-1] == ")" and url.count("(") >= url.count(")"):
            break
        url = url[:-1]
    return url


def _bare(value: str, host_field: bool) -> str | None:
    """A scheme-less value of a URL or host field as a URL (`127.0.0.1:8080/x`, `git@host:org/repo`), or None."""
    if any(c.isspace() for c in value) or value[0] in "/.~$" or "://" in value:
        return None
    scp = _SCP.match(value)
    if scp is not None and "." in scp.group(2):
        return f"ssh://{scp.group(1) or ''}{scp.group(2)}/{scp.group(3)}"
    m = _BARE_HOST.match(value.rpartition("@")[2] if "@" in value.split("/", 1)[0] else value)
    if m is None:
        return None
    host = m.group().rsplit(":", 1)[0] if not m.group().startswith("[") else m.group()
    facts = host_facts(host)
    named = bool(facts.classes - {"internal_name"})  # localhost, metadata: a bare word that is still a host
    if host_field or "." in host or ":" in m.group() or facts.ip or named:
        return "http://" + value
    return None


def _add(out: UrlAnalysis, url: str, where: str, destination: bool, via: str, *, nested: bool, depth: int = 0) -> bool:
    """Analyse one URL (and those it carries) into `out`; False once `MAX_URLS` is reached."""
    if len(out.urls) >= MAX_URLS:
        if not out.urls[-1]["kind"] == "too_many":
            out.urls.append(_overflow(where, destination))
        else:
            out.urls[-1]["destination"] = out.urls[-1]["destination"] or destination
        return False
    entry, carried = _analyse(url[:MAX_URL])
    out.urls.append({**entry, "field": where, "destination": destination, "nested": nested, "via": via})
    if depth < MAX_NESTED:
        for inner, how in carried:
            if not _add(out, inner, where, destination, how, nested=True, depth=depth + 1):
                return False
    return True


def _overflow(where: str, destination: bool) -> dict[str, Any]:
    entry = _entry(_Parts("", "", "", "", "", "", ""), HostFacts("", invalid=f"more than {MAX_URLS} URLs in one call"))
    return {**entry, "kind": "too_many", "field": where, "destination": destination, "nested": False, "via": ""}


@dataclass(slots=True)
class _Parts:
    scheme: str
    userinfo: str
    host: str
    port: str
    path: str
    query: str
    alt_host: str  # what a parser that does not take `\` for `/` reads as the host ("" if the same)


def _split(url: str) -> _Parts:
    """A URL's parts as WHATWG reads them (and the host an RFC 3986 parser would read instead)."""
    scheme, _, rest = url.partition(":")
    scheme = scheme.lower()
    if scheme in _OPAQUE:
        return _Parts(scheme, "", "", "", rest, "", "")
    special = scheme in _SPECIAL
    if scheme == "file" or not special:
        if not rest.startswith(("//", "\\\\" if special else "//")):
            return _Parts(scheme, "", "", "", rest, "", "")
        after = rest[2:]
    else:
        after = rest.lstrip("/\\")
    tail_at = _first(after, "/\\?#" if special else "/?#")
    at = after.rfind("@", 0, tail_at) + 1
    if "$" in after[at:tail_at] and after[tail_at - 1 : tail_at] != "]":  # `http://169.254.170.2$RELATIVE_URI`: a shell
        tail_at = after.index("$", at)  # expansion ends the host (no host has a `$`); what it expands to is the path
    authority, tail = after[:tail_at], after[tail_at:]
    userinfo, _, hostport = authority.rpartition("@")
    host, port = _host_port(hostport)
    alt = ""
    if special and rest.startswith("//") and "\\" in after[:_first(after, "/?#")]:  # `http://a\@b`: WHATWG goes to a, RFC 3986 to b
        alt_authority = after[:_first(after, "/?#")]
        alt = _host_port(alt_authority.rpartition("@")[2])[0]
    tail = tail.split("#", 1)[0]
    path, _, query = tail.partition("?")
    return _Parts(scheme, userinfo, host, port, path.replace("\\", "/") if special else path, query,
                  alt if alt != host else "")


def _first(text: str, delimiters: str) -> int:
    return min((i for i in (text.find(d) for d in delimiters) if i >= 0), default=len(text))


def _host_port(hostport: str) -> tuple[str, str]:
    if hostport.startswith("["):
        end = hostport.find("]")
        if end < 0:
            return hostport, ""
        return hostport[:end + 1], hostport[end + 2:] if hostport[end + 1:end + 2] == ":" else hostport[end + 1:]
    host, _, port = hostport.partition(":")
    return host, port


_ANALYSED: Memo[str, tuple[dict[str, Any], tuple[tuple[str, str], ...]]] = Memo(1024)


def _analyse(url: str) -> tuple[dict[str, Any], tuple[tuple[str, str], ...]]:
    """One URL's map (without `field`, `destination`, `nested`, `via`) and the URLs it carries.
    Memoised for short URLs that carry no secret (agents fetch the same pages again)."""
    hit = _ANALYSED.get(url)
    if hit is not None:
        return hit
    parts = _split(url)
    facts = host_facts(parts.host) if parts.host or parts.scheme not in LOCAL_SCHEMES else HostFacts("")
    entry = _entry(parts, facts)
    entry["url"] = url[:512]
    carried: list[tuple[str, str]] = []
    if parts.scheme == "jar":  # jar:<url of the archive>!/<entry>: the archive is fetched
        carried.append((parts.path.split("!", 1)[0], "jar"))
    data, secrets, entropy = _carried(url, parts, facts, carried)
    entry["data"], entry["secrets"], entry["label_entropy"] = data, secrets, entropy
    entry["site"] = _site(facts.name, data, secrets)
    if parts.alt_host:
        _merge_alt(entry, host_facts(parts.alt_host))
    result = entry, tuple(carried)
    if not secrets and len(url) <= 1024:
        _ANALYSED.remember(url, result)
    return result


def _entry(parts: _Parts, facts: HostFacts) -> dict[str, Any]:
    """The map of one URL from its parts and its host's facts (fields in a fixed order, all present)."""
    hostless = not parts.host and parts.scheme in LOCAL_SCHEMES
    port = -1
    if parts.port:
        port = int(parts.port) if parts.port.isdigit() and len(parts.port) <= 5 else -1
    invalid = "" if hostless else facts.invalid or ("" if not parts.port or 0 <= port <= 65535 else "a port that is not a number")
    entry: dict[str, Any] = {
        "url": "", "scheme": parts.scheme, "host": facts.name, "site": facts.name, "host_written": parts.host[:255],
        "alt_host": "",
        "port": port if port >= 0 else _DEFAULT_PORTS.get(parts.scheme, 0), "path": parts.path[:512],
        "query_keys": _query_keys(parts.query), "userinfo": bool(parts.userinfo), "ip": facts.ip,
        "kind": "none" if hostless else "invalid" if invalid else facts.kind,
    }
    for cls in CLASSES:
        entry[cls] = cls in facts.classes
    entry["internal"] = bool(facts.classes)
    entry["invalid"] = bool(invalid)
    entry["public"] = not hostless and not invalid and not facts.classes
    entry.update(idna=facts.idna, obfuscated=facts.obfuscated, trailing_dot=facts.trailing_dot, zone=facts.zone,
                 data=[], secrets=[], label_entropy=0.0)
    return entry


def _merge_alt(entry: dict[str, Any], alt: HostFacts) -> None:
    """A second reading of the host: its classes count too (a rule must hold for either)."""
    entry["alt_host"] = alt.name or "(invalid)"
    for cls in alt.classes:
        entry[cls] = True
    entry["internal"] = entry["internal"] or bool(alt.classes)
    entry["public"] = entry["public"] and not alt.classes and not alt.invalid
    if alt.classes and CLASSES.index(alt.kind) < (CLASSES.index(entry["kind"]) if entry["kind"] in CLASSES else 99):
        entry["kind"] = alt.kind


def _query_keys(query: str) -> list[str]:
    keys: list[str] = []
    for pair in query.split("&")[:MAX_PARTS]:
        name = unquote_plus(pair.partition("=")[0])[:64]
        if name and name not in keys:
            keys.append(name)
    return keys


# ---- what a URL carries out ------------------------------------------------------------------


def _carried(url: str, parts: _Parts, facts: HostFacts, nested: list[tuple[str, str]]) -> tuple[list[str], list[str], float]:
    """(data tags, secret kinds, the highest host-label entropy) of one URL; nested URLs go to `nested`."""
    data: list[str] = []
    secrets: set[str] = set()
    entropy = 0.0
    pairs = parts.query.split("&")[:MAX_PARTS]
    oauth = _oauth_request(pairs)
    home = _home_tokens(pairs, parts.host) if oauth else set()
    _scan_secrets(_without(url, home) if home else url, secrets)
    if parts.host and not facts.ip and not facts.invalid:
        entropy = _host_labels(parts.host, data, secrets)
    if parts.userinfo:
        user = unquote(parts.userinfo.partition(":")[0])
        if re.fullmatch(r"[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+\.?", user) and re.search(r"\.[A-Za-z]{2,}\.?\Z", user):
            data.append("userinfo_host")  # http://trusted.example@evil.example/
        _token(unquote(parts.userinfo), "userinfo", data, secrets, nested)
    _path(parts.path, data, secrets, nested)
    fields: list[str] = []  # `key: value`, the query's pairs as personal_kinds reads labels
    for pair in pairs:
        value = pair.partition("=")[2] or (pair if "=" not in pair else "")
        if value and value not in home:
            text, hidden = _unquoted(value, plus=True)
            if hidden >= 8:
                data.append("query_encoded")
            name = unquote_plus(pair.partition("=")[0]).lower()
            opaque = oauth and name in _OAUTH_OPAQUE
            inner: list[tuple[str, str]] = []
            _value(text, hidden, "query", [] if opaque else data, secrets, inner)
            nested.extend(_browser_bound(inner) if name in _OAUTH_REDIRECTS and _client_request(pairs) else inner)
            fields.append(f"{_unquoted(pair.partition('=')[0], plus=True)[0]}: {text}")
    segments = [unquote(seg) for seg in parts.path.split("/")[:MAX_PARTS] if seg]
    fields.extend(segments)
    values = [f.partition(": ")[2] for f in fields[: len(fields) - len(segments)]]
    if _transcript(values + segments):
        data.append("url_conversation")
    fields.extend(_path_fields(segments))
    if len(segments) >= 2 and _segment_person(segments):
        data.append("url_personal")
    _chunked(segments[:-1] + [_FILE_EXT.sub("", segments[-1])] if segments else segments, secrets)  # `<chunk>.js`
    _chunked(values, secrets)
    if parts.host and not facts.ip:
        labels = parts.host.split(".")
        _chunked(labels[: -_registrable(labels)], secrets)
    if fields and identifies_person(personal_kinds("\n".join(fields))):
        data.append("url_personal")
    return sorted(set(data)), sorted(secrets), entropy


#: A chat turn's role label (`User:`, `Assistant:`, `Human:`, `AI:`): two roles in a URL's values are
#: a conversation carried out (round 7, ux-conversation-in-query).
_ROLE: Final = re.compile(
    r"(?i)(?<![\w-])(user|human|assistant|ai|bot|model|system|chatgpt|claude|gpt)\s*:\s*\w"  # a label then the turn's text, not a quoted label
    r"|\"role\"\s*:\s*\"(user|assistant|system|model)\""  # a chat API's messages as JSON
)
#: A path segment that labels the next one (`/name/Jane Smith/address/…`): letters, at most 24.
_PATH_LABEL: Final = re.compile(r"[A-Za-z][A-Za-z_-]{1,23}")


#: Reported speech about the person the assistant serves (round 8, ux-conversation-in-query): the
#: user, customer, client, caller or patient as the subject of a verb of saying or asking, in
#: English, German, French, Spanish, Italian, Dutch, Russian.
_REPORTED: Final = re.compile(
    r"(?i)(?<!\w)(?:user|customer|client|caller|patient|human|nutzer(?:in)?|benutzer(?:in)?|kunde|kundin|utilisat(?:eur|rice)"
    r"|cliente|usuari[oa]|utente|gebruiker|klant|пользователь|клиент)\s+(?:\w+\s+)?"
    r"(?:said|says|asked|asks|mentioned|told|wrote|typed|shared|wants|revealed|confirmed|sagte|fragte|erwähnte|schrieb|hat\s+gesagt"
    r"|a\s+dit|a\s+demandé|a\s+mentionné|dijo|preguntó|mencionó|contó|ha\s+detto|ha\s+chiesto|zei|vroeg|сказал[аи]?|спросил[аи]?)(?!\w)"
)
_DATA_DIGITS: Final = re.compile(r"[0-9]{3}")


def _reported(text: str) -> bool:
    """Whether a decoded URL value is prose reporting what the user said, with data in it (a run of
    three digits: an amount, a number, a date, a phone; or personal data): a conversation carried
    out. An issue search for "user said login fails" has no data; a search query is not reported speech."""
    return _REPORTED.search(text) is not None and (_DATA_DIGITS.search(text) is not None or bool(personal_kinds(text)))


#: Path segments read as unlabelled fields (round 8, ux-personal-data-in-path): a birth-date-shaped
#: date (a year 1920-2012, year first or last), a passport/national-id-like number (one or two
#: capitals and 6-9 digits, or 9 digits), a person's name (two or three capitalised words joined by
#: `-`, `_` or a space).
_BIRTH_SHAPE: Final = re.compile(
    r"(?:19[2-9][0-9]|200[0-9]|201[0-2])[-./](?:0?[1-9]|1[0-2])[-./](?:0?[1-9]|[12][0-9]|3[01])"
    r"|(?:0?[1-9]|[12][0-9]|3[01])[-./](?:0?[1-9]|1[0-2])[-./](?:19[2-9][0-9]|200[0-9]|201[0-2])"
)
_ID_SHAPE: Final = re.compile(r"[A-Z]{1,2}[0-9]{6,9}|[0-9]{9}|[0-9]{3}-[0-9]{2}-[0-9]{4}")
_NAME_SHAPE: Final = re.compile(r"[A-ZÀ-Þ][a-zß-ÿ]+(?:[-_ ][A-ZÀ-Þ][a-zß-ÿ]+){1,2}")


def _segment_person(segments: list[str]) -> bool:
    """Whether unlabelled path segments together identify a person: two or more different kinds
    among name, birth date, id number, IBAN, e-mail and phone, one of them identifying (a birth
    date, an id number or an IBAN). An order id with a travel date, a blog date with a slug, a
    wiki title alone do not."""
    kinds: set[str] = set()
    for seg in segments:
        if _BIRTH_SHAPE.fullmatch(seg):
            kinds.add("birthdate")
        elif _ID_SHAPE.fullmatch(seg):
            kinds.add("national_id")
        elif _NAME_SHAPE.fullmatch(seg):
            kinds.add("name")
        elif any(c.isdigit() for c in seg) or "@" in seg:
            kinds.update(personal_kinds(seg))
    return len(kinds) >= 2 and bool(kinds & {"birthdate", "national_id", "iban"})


def _transcript(values: list[str]) -> bool:
    """Whether a URL's query values and path segments hold a conversation: two different chat roles."""
    roles = {(m.group(1) or m.group(2)).lower() for v in values if ":" in v for m in _ROLE.finditer(v, 0, 8_192)}
    return len(roles - {"user", "human"}) >= 1 and len(roles & {"user", "human"}) >= 1


def _path_fields(segments: list[str]) -> list[str]:
    """What a path says as fields (round 7, ux-personal-data-in-path): a label segment before a value
    (`/name/Jane Smith/city/Leeds` reads `name: Jane Smith`) and words joined by `-`, `_` or `+`
    (`12-Oak-Road-Leeds`) read apart."""
    out = [f"{a}: {b}" for a, b in zip(segments, segments[1:]) if _PATH_LABEL.fullmatch(a) and not _PATH_LABEL.fullmatch(b)]
    out.extend(seg.replace("-", " ").replace("_", " ").replace("+", " ") for seg in segments if "-" in seg or "_" in seg or "+" in seg)
    return out


#: An OAuth 2.0 / OpenID Connect request or redirect (RFC 6749, OIDC Core and RP-Initiated Logout):
#: its query names a client, a redirect or a logout hint, or carries an authorization code with its state.
_OAUTH_MARKS: Final = frozenset({"client_id", "response_type", "redirect_uri", "id_token_hint", "post_logout_redirect_uri",
                                 "code_challenge", "logout_hint"})
#: Parameters whose values are opaque by design (random, or the client's own encoded state): what they
#: decode to is not data carried out. Their secrets still count (a token hidden in a state).
_OAUTH_OPAQUE: Final = frozenset({"state", "nonce", "code_challenge", "code", "session_state", "relaystate", "login_hint"})
#: Parameters that hand a JWT to the identity provider: fine when the JWT names that provider.
_OAUTH_TOKENS: Final = frozenset({"id_token_hint", "request", "logout_hint"})


#: Where an OAuth/OIDC request sends the user's browser back to (RFC 6749 §3.1.2, OIDC RP-Initiated Logout).
_OAUTH_REDIRECTS: Final = frozenset({"redirect_uri", "post_logout_redirect_uri"})


def _client_request(pairs: list[str]) -> bool:
    """Whether a query is a client's OAuth/OIDC request: it names its `client_id` and a redirect or response type."""
    names = {unquote_plus(p.partition("=")[0]).lower() for p in pairs if "=" in p}
    return "client_id" in names and bool(names & {"redirect_uri", "post_logout_redirect_uri", "response_type"})


def _browser_bound(inner: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """A client request's redirect URLs without the loopback ones (round 7, bn-public-destination): a
    native app's loopback redirect (RFC 8252 §7.3) is where the user's browser returns after consent,
    which the identity provider checks against the client's registration; nothing fetches it from
    the host the call reaches. Any other redirect host stays a destination."""
    return [(url, where) for url, where in inner
            if "loopback" not in host_facts(_split(url).host).classes or _FIND.search(url, 3) is not None
            or "%3a" in url.lower()]  # a loopback redirect that carries a URL of its own stays one


def _oauth_request(pairs: list[str]) -> bool:
    """Whether a URL's query pairs are an OAuth/OIDC request or redirect (`_OAUTH_MARKS`, or a code with its state)."""
    names = {unquote_plus(p.partition("=")[0]).lower() for p in pairs if "=" in p}
    return bool(names & _OAUTH_MARKS) or {"code", "state"} <= names


def _home_tokens(pairs: list[str], host: str) -> set[str]:
    """The raw values of an OAuth URL's JWT parameters (`id_token_hint`, `request`) that go back to
    the identity provider they name: the JWT's `iss` or `aud` is a URL on the same site as the
    URL's host. An ID token sent to any other host is a token leaving, and is judged as one."""
    home: set[str] = set()
    for pair in pairs:
        name, _, value = pair.partition("=")
        if unquote_plus(name).lower() not in _OAUTH_TOKENS or value.count(".") != 2:
            continue
        raw = decode_base64(unquote_plus(value).split(".")[1])
        try:
            claims = json.loads(raw) if raw else None
        except ValueError:
            continue
        if not isinstance(claims, dict):
            continue
        named = [claims.get("iss"), *(claims.get("aud") if isinstance(claims.get("aud"), list) else [claims.get("aud")])]
        if any(isinstance(u, str) and "://" in u and _same_site(_split(u.strip()).host, host) for u in named):
            home.add(value)
    return home


def _same_site(a: str, b: str) -> bool:
    """Whether two host names share their registered domain (`login.microsoftonline.com`, `sso.acme.com`/`acme.com`)."""
    la, lb = a.lower().rstrip(".").split("."), b.lower().rstrip(".").split(".")
    n = _registrable(la)
    return len(la) >= n and la[-n:] == lb[-n:]


def _without(url: str, values: set[str]) -> str:
    """`url` with the given query values cut out (the JWTs `_home_tokens` let through)."""
    for value in values:
        url = url.replace(value, "")
    return url


_FILE_EXT: Final = re.compile(r"\.[A-Za-z0-9]{1,5}\Z")
_CHUNK_KINDS: Final = frozenset({"api_key", "private_key", "jwt"})
#: The start of a vendor credential with only part of its body: the first chunk of a secret sent in
#: pieces over several requests (`?d=ghp_dGlMoiyrl`, then the rest), or a PEM block's first line.
_SECRET_HEAD: Final = re.compile(
    r"(?:gh[pousr]_|github_pat_|glpat-|npm_|xox[bpaser]-|xapp-|[sr]k_live_|whsec_|sk-ant-|sk-(?:proj|svcacct|admin)-|"
    r"AKIA|ASIA|AIza|hf_|pypi-AgE|do[opr]_v1_|shp(?:at|ss|ca|pa)_|AGE-SECRET-KEY-1)([A-Za-z0-9_-]{4,})\Z"
    r"|-----BEGIN [A-Z0-9 ]*PRIVATE KEY"
)


def _head(text: str, where: str, data: list[str]) -> None:
    """`<where>_secret_head` when a query value or path segment (or what it decodes to) is a vendor
    credential's prefix with part of a body (`_SECRET_HEAD`): no whole credential, yet nothing but
    a credential starts so. Placeholders (`ghp_xxxx`) and documented examples are not."""
    if len(text) < 8 or len(text) > 512:
        return
    m = _SECRET_HEAD.match(text)
    if m is None:
        return
    body = m.group(1)
    if body is None or (_random_body(body) and not is_placeholder(body) and not documented_example(body)):
        data.append(f"{where}_secret_head")


def _random_body(body: str) -> bool:
    """Two of upper case, lower case and digits: a random token's body, not a word (`npm_lazy`)."""
    return sum((any(c.isupper() for c in body), any(c.islower() for c in body), any(c.isdigit() for c in body))) >= 2


def _chunked(pieces: list[str], secrets: set[str]) -> None:
    """A credential cut in chunks across the query values, the path segments or the host labels of
    one URL (`?p1=ghp_dGlM&p2=oiyrlfx…`, `/ghp_dGlM/oiyrlfx…/`): the chunks joined in order (each
    boundary remembered, as the scanner rejoins a token cut by separators) and read for credential
    formats; one spanning two chunks counts (a credential inside one chunk was found already)."""
    if len(pieces) < 2 or sum(map(len, pieces)) > 4_096:
        return
    original = "\n".join(pieces)
    index = [i for i, ch in enumerate(original) if ch != "\n"]
    joined = original.replace("\n", "")
    if len(joined) < 16 or len(joined) != len(index):
        return
    index.append(len(original))
    for kind, start, end, _detail in credential_hits(joined, index, original):
        if kind in _CHUNK_KINDS and "\n" in original[index[start] : index[end - 1]]:
            secrets.add(kind)
    secrets.update(kind for kind, _first, _end, _detail in joined_hits(pieces))


def _path(path: str, data: list[str], secrets: set[str], nested: list[tuple[str, str]]) -> None:
    """Path segments one by one, and runs of encoded segments together: data chunked across
    segments (`/R0lUSFVC/X1RPS0VO/…`, or an image proxy's chunked source URL) is judged whole."""
    segments = [_unquoted(seg, plus=False) for seg in path.split("/")[:MAX_PARTS] if seg]
    run: list[str] = []
    for text, hidden in [*segments, ("", 0)]:
        if hidden >= 8:
            data.append("path_encoded")
        _head(text, "path", data)
        stem = text.rpartition(".")[0]  # `<chunk>.png`: a file name made of an encoded chunk
        if len(stem) >= 12 and (chunk := decode_token(stem, minimum=12)) is not None:
            _head(chunk[1].strip(), "path", data)
        if _B64.match(text) and len(text) >= 8:
            run.append(text)
            continue
        if len(run) >= 2:
            joined = _joined(run)
            if joined is not None:
                _judge(joined[1], joined[0], "path", data, secrets, nested)
            else:
                for piece in run:
                    _token(piece, "path", data, secrets, nested)
        elif run:
            _token(run[0], "path", data, secrets, nested)
        run = []
        if text:
            _value(text, hidden, "path", data, secrets, nested)


def _joined(run: list[str]) -> tuple[str, str] | None:
    """What a run of encoded path segments says together: each decoded and the texts joined (chunks
    encoded one by one), or the segments joined and decoded (one encoding cut into chunks)."""
    pieces = [decode_token(piece, minimum=8) for piece in run]
    if all(pieces):
        return pieces[0][0], "".join(p[1] for p in pieces if p)  # type: ignore[index]
    return decode_token("".join(piece.rstrip("=") for piece in run))


def _unquoted(raw: str, *, plus: bool) -> tuple[str, int]:
    """`raw` percent-decoded until nothing changes (at most 4 layers), and how many letters and digits
    were percent-encoded on the way: no encoder needs to escape them, so many of them hide data."""
    text, hidden = raw, 0
    if plus and "%" not in text:
        return text.replace("+", " "), 0  # form encoding without escapes: `+` is still a space
    for _ in range(4):
        if "%" not in text:
            break
        decoded = unquote_plus(text) if plus else unquote(text)
        if decoded == text:
            break
        hidden += len(_ESCAPED_ALNUM.findall(text))
        text = decoded
    return text, hidden


def _value(text: str, hidden: int, where: str, data: list[str], secrets: set[str], nested: list[tuple[str, str]]) -> None:
    """A percent-decoded path segment or query value (`hidden`: letters and digits it had escaped):
    the URLs it holds, its secrets, and what it decodes to."""
    if ":" in text:
        nested.extend((_trim(m.group()), where) for m in _FIND.finditer(text) if _fetches(m))
    if hidden or text.count(" ") >= 3:  # escaped, or prose the raw URL hides behind `+`/`%20`
        _scan_secrets(text, secrets)  # the scanner itself decodes 3 layers of the whole URL
        if _reported(text):
            data.append("url_conversation")
    _head(text, where, data)
    _token(text, where, data, secrets, nested)


def _fetches(m: re.Match[str]) -> bool:
    scheme = (m.group(1) or m.group(2)).lower()
    return scheme in NETWORK_SCHEMES or scheme in LOCAL_SCHEMES


def _token(text: str, where: str, data: list[str], secrets: set[str], nested: list[tuple[str, str]]) -> None:
    """One encoded token (hex, base32, base64): see `_judge`."""
    decoded = decode_token(text)
    if decoded is not None:
        _judge(decoded[1], decoded[0], where, data, secrets, nested)


def _judge(plain: str, how: str, where: str, data: list[str], secrets: set[str], nested: list[tuple[str, str]]) -> None:
    """What decoded text is: a URL (nested), a JSON token (a cursor, a state: only its secrets count)
    or data (`<where>_encoded` when it holds a secret, is long or spans lines)."""
    if "://" in plain:
        nested.extend((_trim(m.group()), f"{where}>{how}") for m in _FIND.finditer(plain) if _fetches(m))
        return
    found = _scan_secrets(plain, secrets)
    _head(plain.strip(), where, data)
    if identifies_person(personal_kinds(plain)):  # before the JSON test: a person as a JSON blob is still a person
        data.append("url_personal")
    if found or (not is_json(plain) and not _id_record(plain) and (len(plain) >= 24 or "\n" in plain)):
        data.append(f"{where}_encoded")


def _id_record(text: str) -> bool:
    """A serialised record of ids and flags (`3|1207|0|1|photo-page||||en|0|||||`, an image CDN's or
    an analytics tag's tracking parameter): one line, mostly separators and digits, few letters."""
    if len(text) > 256 or "\n" in text or "@" in text or " " in text:
        return False
    letters = sum(map(str.isalpha, text))
    separators = sum(1 for c in text if not c.isalnum())
    return letters * 5 < len(text) * 2 and separators * 10 >= len(text) * 3


def is_json(text: str) -> bool:
    """Whether `text` is a JSON object or array (a token's, a cursor's or a tool answer's JSON written out)."""
    if text.lstrip()[:1] not in ("{", "["):
        return False
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def _scan_secrets(text: str, secrets: set[str]) -> bool:
    """The secret scanner's kinds in decoded URL text (one scanner: gateway.stages.sanitizer.secrets)."""
    kinds = {f.kind for f in detect_secrets(text)} - _PUBLIC_KINDS
    secrets |= kinds
    return bool(kinds)


def _host_labels(host: str, data: list[str], secrets: set[str]) -> float:
    """Encoded data in the labels left of the registrable domain: one label that decodes to text
    (`host_hex`, `host_base32`, `host_base64`), a chain of labels that does once joined, or three
    or more random-looking labels (`host_chain`). Returns the highest label entropy (bits a char)."""
    labels = host.rstrip(".").split(".")
    keep = _registrable(labels)
    inner = [label for label in labels[:-keep] if label]
    entropy = max((_entropy(label) for label in inner if len(label) >= 8), default=0.0)
    for label in inner:
        decoded = decode_token(label) or (decode_token(label.replace("-", "")) if "-" in label else None)
        if decoded is not None:
            data.append(f"host_{decoded[0]}")
            _scan_secrets(decoded[1], secrets)
        elif _base32_shaped(label):
            data.append("host_base32")
        elif _base64_shaped(label):
            data.append("host_base64")
    if len(inner) >= 2 and not any(t.startswith("host_") for t in data):
        decoded = _label_run(inner[:MAX_LABELS])
        if decoded is not None or sum(1 for label in inner if _random_label(label)) >= 3:
            data.append("host_chain")
            if decoded is not None:
                _scan_secrets(decoded[1], secrets)
    return round(entropy, 2)


def _base32_shaped(label: str) -> bool:
    """A label that is base32 even though it does not decode to text (a key, a digest, compressed
    data): 16+ characters of the base32 alphabet with digits, written in capitals as encoders print
    it (host names are written in lower case), or 32+ such characters (20 bytes) of high entropy in
    lower case. Content ids (IPFS CIDv1: `b` + base32 of bytes starting 0x01) are names, not data."""
    if len(label) < MIN_TOKEN or not _B32.match(label) or sum(c in "234567" for c in label) < 2:
        return False
    if label.isupper():
        return True
    if len(label) < 32 or _entropy(label) < 3.5:
        return False
    body = label[1:].upper()
    try:
        cid = label[0] in "bB" and base64.b32decode(body + "=" * (-len(body) % 8))[:1] == b"\x01"
    except binascii.Error:
        cid = False
    return not cid


def _base64_shaped(label: str) -> bool:
    """A label that is base64 even though it does not decode to text (encrypted or compressed
    bytes): 16+ characters of the base64url alphabet with 4+ capitals, 4+ small letters and 2+
    digits, and high entropy. Host names are written in one case; words in CamelCase
    (`AcmeCorp2026Summit`) have too few capitals, or too little entropy."""
    if len(label) < MIN_TOKEN or not _B64.match(label):
        return False
    upper = sum(c.isupper() for c in label)
    lower = sum(c.islower() for c in label)
    digits = sum(c.isdigit() for c in label)
    return upper >= 4 and lower >= 4 and digits >= 2 and _entropy(label) >= 3.5


def _label_run(labels: list[str]) -> tuple[str, str] | None:
    """What the longest run of two or more consecutive labels decodes to once joined (dashes dropped),
    if any does: data cut into labels, with sequence numbers or a session id around it."""
    for start in range(len(labels) - 1):
        for end in range(len(labels), start + 1, -1):
            joined = "".join(label.replace("-", "") for label in labels[start:end])
            decoded = decode_token(joined) if len(joined) >= MIN_TOKEN else None
            if decoded is not None:
                return decoded
    return None


def _registrable(labels: list[str]) -> int:
    """How many labels at the end of a name the owner registered (2, or 3 under `co.uk`-like suffixes)."""
    return 3 if len(labels) >= 3 and labels[-2].lower() in _CC_SLD and len(labels[-1]) == 2 else 2


def _site(name: str, data: list[str], secrets: list[str]) -> str:
    """The host as messages may show it: when its labels carry data, only the registered domain
    (`*.collector.example`), so that a refusal never repeats what it refused to send."""
    labels = name.split(".")
    keep = _registrable(labels)
    if len(labels) <= keep or not (any(t.startswith("host_") for t in data) or (secrets and detect_secrets(name))):
        return name
    return "*." + ".".join(labels[-keep:])


def _random_label(label: str) -> bool:
    return (len(label) >= 10 and label.isalnum() and any(c.isdigit() for c in label)
            and any(c.isalpha() for c in label) and _entropy(label) >= 3.0)


def _entropy(text: str) -> float:
    counts = Counter(text.lower())
    return -sum(n / len(text) * math.log2(n / len(text)) for n in counts.values())


def decode_token(token: str, minimum: int = MIN_TOKEN) -> tuple[str, str] | None:
    """(how, text) when a whole token (a host label, a path segment, a query value) is hex (also
    with `:`/`-` between bytes), base32 or base64 of text; None otherwise. Whole tokens only, unlike
    `decode.decoded_layers`, which finds runs inside text: a short hex or base32 label is no run."""
    if len(token) < minimum or len(token) > MAX_SCAN:
        return None
    if _HEX.match(token):
        digits = re.sub(r"[:\-. ,]", "", token)
        if len(digits) % 2 == 0:
            text = _text(bytes.fromhex(digits))
            if text is not None:
                return "hex", text
    if _B32.match(token):
        body = token.rstrip("=").upper()
        if len(body) % 8 in (0, 2, 4, 5, 7):
            try:
                text = _text(base64.b32decode(body + "=" * (-len(body) % 8)))
            except binascii.Error:
                text = None
            if text is not None:
                return "base32", text
    if _B64.match(token):
        raw = decode_base64(token)
        text = _text(raw) if raw is not None else None
        if text is not None:
            return "base64", text
    text = spelled.base58_text(token, _text)  # the Bitcoin alphabet (round 7: es-base58-credential)
    return ("base58", text) if text is not None else None


def _text(data: bytes) -> str | None:
    """`data` as text when it is UTF-8 and nearly all printable (random bytes rarely are)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if len(text) < 4:
        return None
    printable = sum(1 for ch in text if ch.isprintable() or ch in "\n\r\t")
    return text if printable >= 0.95 * len(text) else None
