"""Instructions to the model in text that reaches it: tool definitions and tool results.

A tool's description, its parameters' descriptions and a tool's answer are all read by the model
as if they were trusted. This scanner finds what an attacker puts there ("tool poisoning",
"injected results") and reports it as `Finding`s; rules decide what to do (hide the tool,
withhold the answer). Kinds:

- `hidden_instruction`: an imperative aimed at the assistant, not a description of the tool
  ("before using this tool…", "ignore previous instructions", "do not tell the user",
  `<IMPORTANT>`, "SYSTEM NOTE:", "you must call…", "when the user asks to X, first…").
- `tool_reference`: another tool named (one of `other_tools`, or "call the X tool").
- `credential_request`: an instruction to read or hand over credentials (~/.ssh/id_rsa, .env,
  ~/.aws/credentials, "your API key", "pass its content as…").
- `exfiltration`: an instruction to send data somewhere, or a URL with a placeholder or a
  data-bearing query waiting to be filled in, or a known request-collector host.
- `url`: any http(s) URL (detail: its host).
- `invisible_text`: zero-width, bidi-control, tag or variation-selector characters in the raw
  text (before the sanitizer strips them); text hidden in tag characters is decoded and scanned.
- `hidden_markup`: an HTML comment or a markdown comment (`[//]: # (…)`) with text in it.

Benign look-alikes the scanner leaves alone: plain tool documentation ("Use this tool to read a
file. Returns the contents."), phrases quoted as examples (inside a fenced code block or an
inline code span, or introduced by "such as", "like", "e.g.", "detects"…), and notes such as
"requires the `path` argument". No I/O; every regex is compiled at import.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Iterator
from typing import Any, Final

from gateway.core.call import Finding
from gateway.stages.sanitizer.paths import child_path

__all__ = ["KINDS", "scan_definition", "scan_result", "scan_text"]

KINDS: Final = (
    "hidden_instruction", "tool_reference", "credential_request", "exfiltration", "url", "invisible_text",
    "hidden_markup",
)  # fmt: skip
EXCERPT: Final = 80
MAX_SCAN: Final = 262_144  # characters of one string scanned; the rest is ignored (and said so)
_MAX_FINDINGS: Final = 64

# ---- invisible text ------------------------------------------------------------------------

_INVISIBLE: Final = re.compile(
    "[\u200b\u200c\u200e\u200f\u2060-\u2064\ufeff\u202a-\u202e\u2066-\u2069\u061c"
    "\U000e0000-\U000e007f\U000e0100-\U000e01ef]"
)
_ZWJ: Final = "\u200d"
_TAGS: Final = re.compile("[\U000e0020-\U000e007e]+")

# ---- markup that hides text ----------------------------------------------------------------

_HTML_COMMENT: Final = re.compile(r"<!--(.*?)(?:-->|\Z)", re.S)
_MD_COMMENT: Final = re.compile(r"^\s*\[(?://|comment|_)\]:\s*#\s*[(\"'](.*?)[)\"']\s*$", re.M | re.I)
_FENCE: Final = re.compile(r"^[ \t]*(```|~~~)[^\n]*\n.*?(?:^[ \t]*\1[ \t]*$|\Z)", re.S | re.M)
_INLINE_CODE: Final = re.compile(r"`[^`\n]{1,200}`")

# ---- instructions to the model ---------------------------------------------------------------

_ASSISTANT = r"(?:ai|assistant|model|llm|agent|claude|chatgpt|gpt|copilot|bot)"
_INSTRUCTION_PATTERNS: Final = (
    r"<\s*/?\s*(?:important|system|instructions?|secret|hidden|admin)\s*>",
    r"\[\s*(?:system|admin|important)\s*(?:note|message|instruction)?\s*\]",
    r"\b(?:system|admin|developer)\s+(?:note|message|instruction|override|prompt)s?\s*:",
    r"\bnote\s+(?:to|for)\s+(?:the\s+)?" + _ASSISTANT + r"s?\b",
    r"\b(?:ignore|disregard|forget|override|bypass)\s+(?:all\s+|any\s+)?(?:of\s+)?(?:the\s+|your\s+|my\s+)?"
    r"(?:previous|prior|above|earlier|preceding|original|system|safety|existing|other)\s+"
    r"(?:instructions?|prompts?|rules|directions|guidelines|messages|context)",
    r"\bnew\s+instructions?\s*:",
    r"\byou\s+are\s+now\s+(?:a|an|in|the)\b",
    r"\b(?:do\s+not|don'?t|never)\s+(?:tell|mention|inform|reveal|disclose|notify|alert|show|say|explain)"
    r"\s+(?:this\s+|it\s+|anything\s+)?(?:to\s+)?(?:the\s+)?users?\b",
    r"\bwithout\s+(?:telling|informing|notifying|alerting|asking|mentioning\s+(?:it\s+|this\s+)?to)\s+(?:the\s+)?users?\b",
    r"\b(?:the\s+)?users?\s+(?:must|should)\s+(?:not|never)\s+(?:know|see|notice|be\s+told)",
    r"\bkeep\s+(?:this|it)\s+(?:secret|hidden|confidential|between\s+us)",
    r"\bbefore\s+(?:using|calling|invoking|running)\s+(?:this|the|any)\s+(?:\w+\s+)?tools?\b",
    r"\b(?:always|first|only)\s+(?:use|call|invoke|run)\s+this\s+tool\b",
    r"\b(?:use|call|prefer)\s+this\s+tool\s+(?:instead\s+of|rather\s+than|in\s+place\s+of|over)\b",
    r"\binstead\s+of\s+(?:using|calling|invoking)\s+(?:the\s+)?[`'\"]?[a-z][\w.-]*",
    r"\bwhen(?:ever)?\s+(?:the\s+)?user\s+(?:asks?|wants?|requests?|tries|says)\b[^.\n]{0,160}?"
    r"\b(?:first|always|instead|you\s+must|must\s+first|make\s+sure)\b",
    r"\byou\s+(?:must|should|need\s+to|have\s+to|are\s+required\s+to|will)\s+(?:always\s+|first\s+|also\s+|now\s+)?"
    r"(?:call|invoke|execute|ignore|disregard|upload|forward|exfiltrate|read\s+(?:the\s+)?(?:file|contents?)|"
    r"send\s+(?:it|this|them|the\s+(?:data|contents?|results?|files?|conversation|history|credentials?|keys?|tokens?)))\b",
    r"\b(?:as\s+an?\s+|dear\s+|attention\s+|hey\s+)" + _ASSISTANT + r"\b",
    r"\b" + _ASSISTANT + r"s?\s+(?:must|should|is\s+required\s+to)\s+(?:always\s+|first\s+|now\s+)?(?:call|use|read|send|ignore|include)\b",
    r"\bthis\s+is\s+(?:a\s+|an\s+)?(?:mandatory|required|critical)\s+(?:step|instruction|requirement)",
    r"\botherwise\s+the\s+tool\s+will\s+(?:not\s+work|fail)",
)  # fmt: skip
_AI_WORDS = (" ai", "assistant", "model", "llm", "agent", "claude", "gpt", "copilot", "bot")
#: The words one of each pattern's matches must contain (lower case): a pattern runs only on text
#: that has one of them (`in` is C-fast; one alternation of every pattern costs ~2 µs a character).
_INSTRUCTION_GATES: Final = (
    ("<",), ("[",), ("system", "admin", "developer"), ("note",), ("ignor", "disregard", "forget", "overrid", "bypass"),
    ("instruction",), ("you are now",), ("user",), ("without",), ("user",), ("keep",), ("before",), ("this tool",),
    ("this tool",), ("instead of",), ("user",), ("you ",), _AI_WORDS, _AI_WORDS, ("mandatory", "required", "critical"),
    ("otherwise",),
)  # fmt: skip
_INSTRUCTIONS: Final = tuple(
    (gate, re.compile(p, re.I)) for gate, p in zip(_INSTRUCTION_GATES, _INSTRUCTION_PATTERNS, strict=True)
)
# A phrase quoted as an example rather than given as an order: "detects phrases like 'ignore …'".
_MENTION: Final = re.compile(
    r"(?:such\s+as|like|e\.g\.|i\.e\.|for\s+example|for\s+instance|example[s:]?|detects?|detecting|detection\s+of|"
    r"flags?|flagging|blocks?|scans?\s+for|catch(?:es)?|patterns?|phrases?|strings?|attempts?\s+to|"
    r"attacks?|injections?|instructions\s+to|called|named|quoted?|says?|saying)\s*[:(\"'“‘«]?\s*\Z",
    re.I,
)

#: Up to {} characters within one sentence (a dot followed by a non-space, as in ".env", does not end it).
_SAME_SENTENCE: Final = r"(?:[^.\n]|\.(?=\S)){{0,{}}}?"

# ---- credentials -----------------------------------------------------------------------------

_CRED_PATH = (
    r"(?:~|\$home|/home/[\w.-]+|/root|/users/[\w.-]+)?/?\.ssh/[\w.-]*|\bid_(?:rsa|dsa|ecdsa|ed25519)\b(?:\.pub)?"
    r"|\.aws/(?:credentials|config)\b|(?<![\w.])\.env(?:\.[a-z]+)?\b|\.netrc\b|\.npmrc\b|\.pypirc\b|\.git-credentials\b"
    r"|\.docker/config\.json|\.kube/config\b|/etc/(?:passwd|shadow|sudoers)\b|\bcredentials\.json\b"
    r"|\b(?:claude_desktop_config|mcp)\.json\b|\.config/gcloud\b|\bwallet\.dat\b|\.gnupg\b|\bkeychain\b"
)
_CRED_THING = (
    r"(?:api[\s_-]?keys?|access[\s_-]?tokens?|auth(?:entication)?[\s_-]?tokens?|bearer[\s_-]?tokens?|session[\s_-]?tokens?"
    r"|refresh[\s_-]?tokens?|secret[\s_-]?keys?|private[\s_-]?keys?|ssh[\s_-]?keys?|passwords?|passphrases?|credentials"
    r"|seed[\s_-]?phrases?|recovery[\s_-]?phrases?|mnemonic|environment[\s_-]?variables|env[\s_-]?vars?|cookies?)"
)
_CRED_VERB = (
    r"(?:read|cat|open|include|pass|send|provide|copy|paste|attach|extract|collect|grab|fetch|upload|add|append|"
    r"put|dump|print|list|enumerate|output|insert|embed|share|give|forward|post|submit|load|get|access)"
)
_CREDENTIAL: Final = re.compile(
    r"(?<!\bis\s)(?<!\bare\s)(?<!\bbe\s)\b" + _CRED_VERB + r"\b" + _SAME_SENTENCE.format(60) + r"(?:" + _CRED_PATH + r")"
    r"|\b" + _CRED_VERB + r"\s+(?:the\s+|all\s+|any\s+)?(?:your|the\s+user'?s|user'?s|their|stored|saved|local|all)\s+"
    + _CRED_THING + r"\b"
    r"|\b(?:pass|put|include|send|insert|embed)\s+(?:its|their|the\s+file'?s?)\s+contents?\b"
    r"|\bcontents?\s+of\s+(?:" + _CRED_PATH + r")",
    re.I,
)

# ---- URLs and sending data -------------------------------------------------------------------

_URL: Final = re.compile(r"\b(?:https?|wss?|ftp)://[^\s<>\"'`)\]]*[^\s<>\"'`)\],.;:!?]", re.I)
_URL_PLACEHOLDER: Final = re.compile(r"\{[^}]*\}|%7b|<[^>]*>|%3c|\$\{?\w+|\[[a-z_ ]+\]|…|\.\.\.|xxx", re.I)
_DATA_PARAM: Final = re.compile(
    r"[?&#](?:data|d|q|c|content|contents|payload|body|text|msg|message|info|key|keys|token|secret|secrets|session|sess|sid"
    r"|creds?|credentials?|password|pwd|pass|env|cookie|file|files|history|conversation|chat|context|leak|exfil|x)=",
    re.I,
)
_COLLECTOR: Final = re.compile(
    r"(?:webhook\.site|requestbin|pipedream\.net|ngrok(?:-free)?\.(?:io|app)|burpcollaborator\.net|interact\.sh"
    r"|oast\.(?:fun|me|site|live|online|pro)|canarytokens\.com|hookbin\.com|beeceptor\.com|requestcatcher\.com)",
    re.I,
)
_SEND: Final = re.compile(
    r"\b(?:send|post|upload|forward|transmit|exfiltrate|leak|email|mail|report|copy|sync|beacon)\b" + _SAME_SENTENCE.format(80)
    + r"\bto\s+(?:(?:the\s+)?(?:following\s+|this\s+|our\s+|my\s+)?(?:url|endpoint|address|server|webhook|email|inbox)\b"
    r"|(?:https?|wss?|ftp)://|[\w.+-]+@[\w-]+\.[\w.]+)",
    re.I,
)

# ---- other tools -------------------------------------------------------------------------------

_CALL_TOOL: Final = re.compile(
    r"\b(?:call|use|invoke|run|trigger|execute)\s+(?:the\s+)?[`'\"]?([A-Za-z][\w.-]{2,63})[`'\"]?\s+(?:tool|function)\b"
    r"|\b(?:call|invoke)\s+[`'\"]?([A-Za-z][\w.-]*[_.-][\w.-]*|[a-z]+[A-Z]\w*)[`'\"]?",
)
_NOT_A_TOOL: Final = frozenset({"this", "that", "the", "a", "an", "another", "any", "each", "every", "same", "other", "your"})
_CREDENTIAL_GATE: Final = (
    ".ssh", "id_", ".aws", ".env", ".netrc", ".npmrc", ".pypirc", "credentials", ".docker", ".kube", "/etc/", "mcp.json",
    "claude_desktop", "gcloud", "wallet.dat", ".gnupg", "keychain", "key", "token", "password", "passphrase", "seed",
    "recovery", "mnemonic", "environment", "env", "cookie", "content",
)  # fmt: skip
_SEND_GATE: Final = ("://", "@", "url", "endpoint", "address", "server", "webhook", "email", "inbox")
_CALL_GATE: Final = ("call", "use", "invoke", "run", "trigger", "execute")


def _excerpt(text: str, start: int, end: int) -> str:
    """The matched span with a little context, on one line, at most EXCERPT characters."""
    span = " ".join(text[max(0, start - 10):end + 30].split())
    return span if len(span) <= EXCERPT else span[: EXCERPT - 1] + "…"


def _mentioned(text: str, start: int, code: list[tuple[int, int]]) -> bool:
    """True when the match at `start` is quoted (an inline code span) or introduced as an example."""
    if any(a <= start < b for a, b in code):
        return True
    before = text[max(0, start - 40):start]
    return _MENTION.search(before) is not None


def _blank(text: str, spans: Iterable[re.Match[str]]) -> str:
    """`text` with each span replaced by spaces of the same length (positions stay valid)."""
    out = text
    for m in spans:
        out = out[: m.start()] + " " * (m.end() - m.start()) + out[m.end():]
    return out


def _invisible(raw: str, where: str) -> Iterator[Finding]:
    hits = [m for m in _INVISIBLE.finditer(raw)]
    zwj = [i for i, ch in enumerate(raw) if ch == _ZWJ and not _between_symbols(raw, i)] if _ZWJ in raw else []
    if not hits and not zwj:
        return
    names = sorted({_char_kind(m.group()) for m in hits} | ({"zero-width"} if zwj else set()))
    hidden = "".join(chr(ord(ch) - 0xE0000) for run in _TAGS.findall(raw) for ch in run)
    excerpt = " ".join(hidden.split())[:EXCERPT] if hidden else ""
    yield Finding("invisible_text", where, f"{len(hits) + len(zwj)} invisible character(s): {', '.join(names)}", excerpt)


def _between_symbols(raw: str, i: int) -> bool:
    """A zero-width joiner inside an emoji sequence (between two non-ASCII symbols) is ordinary."""
    return 0 < i < len(raw) - 1 and not raw[i - 1].isascii() and not raw[i + 1].isascii()


def _char_kind(ch: str) -> str:
    code = ord(ch)
    if 0xE0000 <= code <= 0xE007F:
        return "tag characters"
    if 0xE0100 <= code <= 0xE01EF:
        return "variation selectors"
    if 0x202A <= code <= 0x202E or 0x2066 <= code <= 0x2069 or code == 0x061C:
        return "bidi controls"
    return "zero-width"


def scan_text(raw: str, where: str, other_tools: Iterable[str] = (), *, own_name: str = "") -> list[Finding]:
    """Every finding in one string that reaches the model (`where` names its place)."""
    if not raw or len(raw) < 4:
        return []
    raw = raw[:MAX_SCAN]
    findings: list[Finding] = list(_invisible(raw, where)) if not raw.isascii() else []
    text = raw
    if findings:
        hidden = findings[0].excerpt
        text = _INVISIBLE.sub("", raw) + ("\n" + hidden if hidden else "")
    if not text.isascii():
        text = unicodedata.normalize("NFKC", text)
    for m in _HTML_COMMENT.finditer(text):
        if m.group(1).strip():
            findings.append(Finding("hidden_markup", where, "HTML comment", _excerpt(text, m.start(), m.end())))
    for m in _MD_COMMENT.finditer(text):
        if m.group(1).strip():
            findings.append(Finding("hidden_markup", where, "markdown comment", _excerpt(text, m.start(), m.end())))
    findings.extend(_urls(text, where))
    prose = _blank(text, _FENCE.finditer(text)) if "```" in text or "~~~" in text else text
    low = prose.lower()
    code = [(m.start(), m.end()) for m in _INLINE_CODE.finditer(prose)] if "`" in prose else []
    for gate, rx in _INSTRUCTIONS:
        if any(word in low for word in gate) and _first(rx, prose, code, findings, "hidden_instruction", "an instruction to the model", where):
            break
    if any(word in low for word in _CREDENTIAL_GATE):
        _first(_CREDENTIAL, prose, code, findings, "credential_request", "asks for credentials", where)
    if any(word in low for word in _SEND_GATE):
        _first(_SEND, prose, code, findings, "exfiltration", "asks to send data", where)
    findings.extend(_tool_references(prose, low, where, other_tools, own_name, code))
    return findings[:_MAX_FINDINGS]


def _first(rx: re.Pattern[str], prose: str, code: list[tuple[int, int]], findings: list[Finding], kind: str, detail: str,
           where: str) -> bool:
    """Add the first match of `rx` in `prose` that is not a quoted example as a finding; True if one was."""
    for m in rx.finditer(prose):
        if not _mentioned(prose, m.start(), code):
            findings.append(Finding(kind, where, detail, _excerpt(prose, m.start(), m.end())))
            return True
    return False


def _urls(text: str, where: str) -> Iterator[Finding]:
    if "://" not in text:
        return
    for m in _URL.finditer(text):
        url = m.group()
        host = url.split("://", 1)[1].split("/", 1)[0].split("?", 1)[0].rsplit("@", 1)[-1]
        yield Finding("url", where, host, url[:EXCERPT])
        query = url[len(url.split("?", 1)[0]):] if "?" in url or "#" in url else ""
        if _COLLECTOR.search(host):
            yield Finding("exfiltration", where, f"request-collector host {host}", url[:EXCERPT])
        elif _URL_PLACEHOLDER.search(url.split("://", 1)[1]) or (query and _DATA_PARAM.search(query) and _placeholder_value(query)):
            yield Finding("exfiltration", where, f"URL waiting for data ({host})", url[:EXCERPT])


def _placeholder_value(query: str) -> bool:
    """A data-bearing query parameter whose value is empty or a stand-in for what to send."""
    for part in re.split(r"[?&#]", query):
        if "=" in part:
            value = part.split("=", 1)[1]
            if not value or _URL_PLACEHOLDER.search(value):
                return True
    return False


def _tool_references(prose: str, low: str, where: str, other_tools: Iterable[str], own_name: str,
                     code: list[tuple[int, int]]) -> Iterator[Finding]:
    seen: set[str] = set()
    for name in other_tools:
        if name == own_name or name in seen or len(name) < 3 or name.lower() not in low:
            continue
        plain = name.isalpha() and name.islower()  # "fetch", "search": only when named as a tool
        pattern = (rf"[`'\"]{re.escape(name)}[`'\"]|\b{re.escape(name)}\s+(?:tool|function)\b"
                   rf"|\b(?:call|invoke|use|run)\s+(?:the\s+)?{re.escape(name)}\b" if plain
                   else rf"(?<![\w-]){re.escape(name)}(?![\w-])")
        m = re.search(pattern, prose)
        if m is not None:
            seen.add(name)
            yield Finding("tool_reference", where, name, _excerpt(prose, m.start(), m.end()))
    if not any(word in low for word in _CALL_GATE):
        return
    for m in _CALL_TOOL.finditer(prose):
        name = m.group(1) or m.group(2)
        if name and name.lower() not in _NOT_A_TOOL and name != own_name and name not in seen and not _mentioned(prose, m.start(), []):
            seen.add(name)
            yield Finding("tool_reference", where, name, _excerpt(prose, m.start(), m.end()))


# ---- tool definitions and tool results -------------------------------------------------------


def _strings(value: Any, path: str, depth: int = 0) -> Iterator[tuple[str, str]]:
    """(path, string) for every string in a JSON value, skipping base64 payloads of media."""
    if depth > 32:
        return
    if isinstance(value, str):
        yield path, value
    elif isinstance(value, dict):
        media = value.get("type") in ("image", "audio")
        for key, item in value.items():
            if not isinstance(key, str) or (media and key == "data") or key == "blob":
                continue
            yield from _strings(item, child_path(path, key), depth + 1)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _strings(item, child_path(path, i), depth + 1)


_SCHEMA_SKIP: Final = frozenset({"type", "$schema", "$id", "$ref", "format", "pattern", "required", "additionalProperties"})


def _schema_strings(schema: Any, path: str, depth: int = 0) -> Iterator[tuple[str, str]]:
    """The texts of a JSON Schema the model reads: descriptions, titles, defaults, examples, enums,
    and property names (which can carry words too)."""
    if depth > 32 or not isinstance(schema, dict):
        return
    for key, item in schema.items():
        if not isinstance(key, str) or key in _SCHEMA_SKIP:
            continue
        where = child_path(path, key)
        if key in ("properties", "patternProperties", "$defs", "definitions") and isinstance(item, dict):
            for name, sub in item.items():
                if isinstance(name, str):
                    yield child_path(where, name) + "(name)", name.replace("_", " ")
                    yield from _schema_strings(sub, child_path(where, name), depth + 1)
        elif key in ("items", "additionalItems", "not", "if", "then", "else", "contains"):
            yield from _schema_strings(item, where, depth + 1)
        elif key in ("anyOf", "oneOf", "allOf", "prefixItems") and isinstance(item, list):
            for i, sub in enumerate(item):
                yield from _schema_strings(sub, child_path(where, i), depth + 1)
        else:
            yield from _strings(item, where, depth + 1)


def _bare(path: str) -> str:
    return path[2:] if path.startswith("$.") else path[1:]


def scan_definition(tool: dict[str, Any], other_tools: Iterable[str] = ()) -> tuple[Finding, ...]:
    """Findings in everything a model is shown about a tool: title, description, the input and
    output schemas' texts (descriptions, defaults, enums, property names) and the annotations.
    Paths are bare (`description`, `inputSchema.properties.path.description`)."""
    name = tool.get("name") if isinstance(tool.get("name"), str) else ""
    others = [n for n in other_tools if n != name]
    texts: list[tuple[str, str]] = []
    for key in ("title", "description"):
        if isinstance(tool.get(key), str):
            texts.append((key, tool[key]))
    for key in ("inputSchema", "outputSchema"):
        texts.extend((_bare(p), s) for p, s in _schema_strings(tool.get(key), f"$.{key}"))
    annotations = tool.get("annotations")
    if isinstance(annotations, dict):
        texts.extend((_bare(p), s) for p, s in _strings(annotations, "$.annotations"))
    findings: list[Finding] = []
    for where, text in texts:
        findings.extend(scan_text(text, where, others, own_name=name))
    return tuple(findings[:_MAX_FINDINGS])


def scan_result(result: Any, other_tools: Iterable[str] = ()) -> tuple[Finding, ...]:
    """Findings in every string of a tool's answer (MCP `content[].text`, `structuredContent`, or a
    plain JSON result), with `$`-paths like the secret findings'. `_meta` is not shown to the model."""
    others = list(other_tools)
    findings: list[Finding] = []
    for path, text in _strings(result, "$"):
        if path.startswith("$._meta"):
            continue
        findings.extend(scan_text(text, path, others))
        if len(findings) >= _MAX_FINDINGS:
            break
    return tuple(findings[:_MAX_FINDINGS])
