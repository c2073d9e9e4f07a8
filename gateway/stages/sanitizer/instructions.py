"""Instructions to the model in text that reaches it: tool definitions and tool results.

A tool's description, its parameters' descriptions and a tool's answer are all read by the model
as if they were trusted. This scanner finds what an attacker puts there ("tool poisoning",
"injected results") and reports it as `Finding`s; rules decide what to do (hide the tool,
withhold the answer). Kinds:

- `hidden_instruction`: an imperative aimed at the assistant, not a description of the tool
  ("before using this tool…", "ignore previous instructions", "do not tell the user",
  `<IMPORTANT>`, "SYSTEM NOTE:", "you must call…", "when the user asks to X, first…").
- `tool_reference`: another tool named (one of `other_tools`, "call the X tool", a snake_case name
  after run/with/using, a tool call written out as JSON).
- `data_request`: an ask for the user's private data (the conversation history, "the user's
  contacts", "all of their private repos").
- `credential_request`: an instruction to read or hand over credentials (~/.ssh/id_rsa, .env,
  ~/.aws/credentials, "your API key", "pass its content as…").
- `exfiltration`: an instruction to send data somewhere, or a URL with a placeholder or a
  data-bearing query waiting to be filled in, or a known request-collector host.
- `url`: any http(s) URL (detail: its host).
- `invisible_text`: zero-width, bidi-control, tag or variation-selector characters in the raw
  text (before the sanitizer strips them); text hidden in tag characters is decoded and scanned.
- `hidden_markup`: an HTML comment or a markdown comment (`[//]: # (…)`) with text in it, or ANSI
  "conceal" (SGR 8).
`hidden_instruction` also covers an order addressed to the assistant by name, a forged end of the
tool output, forged consent and the strongest orders in es/pt/fr/it/de; a text that gives an order
or says "decode"/"base64" has its encoded runs decoded (one layer) and scanned (`via` says how).

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
from gateway.memo import MemoSet
from gateway.stages.sanitizer.decode import decoded_layers
from gateway.stages.sanitizer.paths import child_path

__all__ = ["KINDS", "scan_definition", "scan_result", "scan_text"]

KINDS: Final = (
    "hidden_instruction", "tool_reference", "credential_request", "data_request", "exfiltration", "url",
    "invisible_text", "hidden_markup",
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
#: Terminal escape sequences (CSI and OSC): stripped before scanning; SGR 8 ("conceal") hides text.
_ANSI: Final = re.compile(r"\x1b(?:\[[0-9;?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[@-Z\\-_])")
_ANSI_CONCEAL: Final = re.compile(r"\x1b\[(?:[0-9;]*;)?8(?:;[0-9;]*)?m")

# ---- markup that hides text ----------------------------------------------------------------

_HTML_COMMENT: Final = re.compile(r"<!--(.*?)(?:-->|\Z)", re.S)
_MD_COMMENT: Final = re.compile(r"^\s*\[(?://|comment|_)\]:\s*#\s*[(\"'](.*?)[)\"']\s*$", re.M | re.I)
_FENCE: Final = re.compile(r"^[ \t]*(```|~~~)[^\n]*\n.*?(?:^[ \t]*\1[ \t]*$|\Z)", re.S | re.M)
_INLINE_CODE: Final = re.compile(r"`[^`\n]{1,200}`")

# ---- instructions to the model ---------------------------------------------------------------

_ASSISTANT = r"(?:ai|assistant|model|llm|agent|claude|chatgpt|gpt|copilot|bot)"
_AI_WORDS = ("ai", "assistant", "assistants", "model", "models", "llm", "agent", "agents", "claude", "gpt", "chatgpt",
             "copilot", "bot", "gemini")
_USER = ("user", "users")
#: (gate, pattern): a pattern runs only on text that holds one of its gate's words (lower case,
#: split at spaces and punctuation) or, for a gate entry that is not a word ("<", "</"), that
#: substring: one alternation of every pattern would cost ~2 µs a character, and one `in` per
#: gate word ~0.5 µs per 2 KB each, where splitting the text into a set of words once is ~20 µs.
_INSTRUCTION_TABLE: Final = (
    (("<",), r"<\s*/?\s*(?:important[e]?|wichtig|importantissimo|system|instructions?|secret|hidden|admin)\s*>"),
    # a forged end of the tool's output or a chat-template turn marker: what follows poses as the user
    (("</", "<|", "[inst]", "[/inst]", "_of_turn>"),
     r"<\s*/\s*(?:tool_(?:result|output|response|call|use)s?|function_(?:results?|calls?|output))\s*>"
     r"|<\|(?:im_start|im_end|endoftext|eot_id|start_header_id|end_header_id)\|>|\[/?INST\]|<(?:start|end)_of_turn>"),
    (("[",), r"\[\s*(?:system|admin|important)\s*(?:note|message|instruction)?\s*\]"
             r"|\[\s*(?:ai\s+)?(?:assistant|agent|model|llm|ai)s?\s+(?:note|message|instructions?|directives?|commands?)\s*\]"),
    (("system", "admin", "developer"),
     r"\b(?:system|admin|developer)\s+(?:note|message|instruction|override|prompt|directive)s?\s*:"
     r"|\b(?:important|critical|mandatory|urgent)\s+system\s+(?:requirement|instruction|directive|rule|notice|update)s?\s*:"),
    (("note",), r"\bnote\s+(?:to|for)\s+(?:the\s+|all\s+|any\s+)?(?:[a-z]+\s+){0,2}?" + _ASSISTANT + r"s?\b"),
    (("instruction", "instructions", "directive", "directives"),
     r"\b(?:ai|assistant|llm)s?\s+(?:instructions?|directives?|notes?)\s*[:\]]"
     r"|\b(?:ai\s+)?(?:agent|model)s?\s+(?:instructions?|directives?)\s*[:\]]"
     r"|\binstructions?\s+(?:to|for)\s+(?:the\s+|all\s+|any\s+)?(?:[a-z]+\s+){0,2}?" + _ASSISTANT + r"s?\s*:"),
    (("ignore", "ignoring", "disregard", "forget", "override", "bypass"),
     r"\b(?:ignore|disregard|forget|override|bypass)\s+(?:all\s+|any\s+)?(?:of\s+)?(?:the\s+|your\s+|my\s+)?"
     r"(?:previous|prior|above|earlier|preceding|original|system|safety|existing|other)\s+"
     r"(?:instructions?|prompts?|rules|directions|guidelines|messages|context)"
     r"|\b(?:ignore|disregard)\s+(?:the\s+|this\s+)?user'?s\s+(?:request|question|instructions?|message|prompt)"),
    (("instruction", "instructions"), r"\bnew\s+instructions?\s*:"),
    (("now",), r"\byou\s+are\s+now\s+(?:a|an|in|the)\b"),
    (_USER, r"\b(?:do\s+not|don'?t|never)\s+(?:tell|mention|inform|reveal|disclose|notify|alert|show|say|explain)"
            r"\s+(?:this\s+|it\s+|anything\s+)?(?:to\s+)?(?:the\s+)?users?\b"),
    (("mention", "reveal", "disclose"),
     r"\b(?:do\s+not|don'?t|never)\s+(?:mention|reveal|disclose)\s+(?:this|that|these)"
     r"(?:\s+(?:step|instructions?|note|message|request|action|part|link|url|call))?\s*(?:[.!]|\Z|to\s+anyone)"),
    (("without",), r"\bwithout\s+(?:telling|informing|notifying|alerting|asking|mentioning\s+(?:it\s+|this\s+)?to)\s+(?:the\s+)?users?\b"
                   r"|\bwithout\s+asking\b(?!\s+for\s+(?:a\s+|the\s+)?(?:password|passphrase|pin)\b)"),
    (_USER, r"\b(?:the\s+)?users?\s+(?:must|should)\s+(?:not|never)\s+(?:know|see|notice|be\s+told)"),
    # forged consent: the checks are said to be done already, or not to matter
    (("ask", "approved", "authorized", "authorised", "preapproved", "preauthorized", "preauthorised", "care"),
     r"\b(?:do\s+not|don'?t|never|no\s+need\s+to)\s+(?:ask|confirm\s+with|check\s+with|consult)\s+(?:the\s+)?(?:user|owner|human)s?\b"
     r"|\b(?:is|was|has\s+been|are)\s+(?:already\s+)?pre-?(?:approved|authori[sz]ed)\b"
     r"|\b(?:owner|user|admin|administrator|manager|maintainer)s?\s+(?:has\s+|have\s+)?already\s+(?:approved|authori[sz]ed|agreed|consented)"
     r"|\bthis\s+is\s+(?:an?\s+)?(?:pre-?)?authori[sz]ed\s+(?:\w+\s+)?(?:action|request|operation|step)"
     r"|\b(?:does\s+not|doesn'?t|do\s+not|don'?t)\s+care\s+about\s+(?:their\s+|his\s+|her\s+)?(?:privacy|security|confidentiality)"),
    (("keep",), r"\bkeep\s+(?:this|it)\s+(?:secret|hidden|confidential|between\s+us)"),
    (("before",), r"\bbefore\s+(?:using|calling|invoking|running)\s+(?:this|the|any)\s+(?:\w+\s+)?tools?\b"),
    (("tool",), r"\b(?:always|first|only)\s+(?:use|call|invoke|run)\s+this\s+tool\b"),
    (("tool",), r"\b(?:use|call|prefer)\s+this\s+tool\s+(?:instead\s+of|rather\s+than|in\s+place\s+of|over)\b"),
    (("instead",), r"\binstead\s+of\s+(?:using|calling|invoking)\s+(?:the\s+)?[`'\"]?[a-z][\w.-]*"),
    (_USER, r"\bwhen(?:ever)?\s+(?:the\s+)?user\s+(?:asks?|wants?|requests?|tries|says|writes|types|mentions)\b[^.\n]{0,160}?"
            r"\b(?:first|always|instead|immediately|you\s+must|must\s+first|make\s+sure|(?:call|use|invoke)\s+this\s+tool)\b"),
    (("you",), r"\byou\s+(?:must|should|need\s+to|have\s+to|are\s+required\s+to|will)\s+(?:always\s+|first\s+|also\s+|now\s+)?"
                r"(?:call|invoke|execute|ignore|disregard|upload|forward|exfiltrate|prepend|prefix|read\s+(?:the\s+)?(?:file|contents?)|"
                r"send\s+(?:it|this|them|the\s+(?:data|contents?|results?|files?|conversation|history|credentials?|keys?|tokens?)))\b"),
    (_AI_WORDS, r"\b(?:as\s+an?\s+|dear\s+|attention\s+|hey\s+)" + _ASSISTANT + r"\b"),
    (_AI_WORDS, r"\b" + _ASSISTANT + r"s?\s+(?:must|should|is\s+required\s+to)\s+(?:always\s+|first\s+|now\s+)?"
                r"(?:call|use|read|send|ignore|include|execute|run|perform|follow|obey|complete)\b"),
    (("mandatory", "required", "critical"), r"\bthis\s+is\s+(?:a\s+|an\s+)?(?:mandatory|required|critical)\s+(?:step|instruction|requirement)"),
    (("otherwise",), r"\botherwise\s+the\s+tool\s+will\s+(?:not\s+work|fail)"),
    (("after", "once"),
     r"\b(?:after|once)\s+(?:you\s+(?:have\s+)?)?(?:read(?:ing)?|receiv(?:e|ed|ing)|gett?(?:ing)?|got|call(?:ed|ing)?|us(?:e|ed|ing))\s+"
     r"(?:it|this|them|the\s+(?:result|output|response|answer|value|price)s?)\s*,\s*(?:always\s+|also\s+|immediately\s+)?"
     r"(?:call|send|email|forward|post|upload|invoke|run)\b"),
    # the same orders in the languages attackers switch to (es, pt, fr, it, de)
    (("herramienta", "ferramenta", "outil", "strumento", "werkzeug", "dieses", "usuario", "usuário", "utilisateur",
      "utente", "benutzer", "nutzer", "instrucciones", "instruções", "précédentes", "precedentes", "istruzioni", "anweisungen"),
     r"\bantes\s+de\s+(?:usar|utilizar|llamar|chamar)\s+(?:esta|la|a)\s+(?:herramienta|ferramenta)"
     r"|\bavant\s+d['’](?:utiliser|appeler)\s+cet\s+outil|\bprima\s+di\s+(?:usare|utilizzare|chiamare)\s+questo\s+strumento"
     r"|\bbevor\s+(?:du|sie)\s+(?:dieses|das)\s+(?:tool|werkzeug)"
     r"|\bno\s+(?:se\s+)?(?:lo\s+|le\s+|la\s+)?(?:digas|menciones|cuentes|informes|reveles)\s+al\s+usuario"
     r"|\bn[ãa]o\s+(?:conte|diga|mencione|revele)\s+(?:isso\s+|nada\s+)?ao\s+usu[áa]rio"
     r"|\bne\s+(?:le\s+|l['’])?(?:dis|dites|mentionne[sz]?|r[ée]v[èe]le[sz]?)\s+(?:rien\s+)?pas\s+(?:à|a)\s+l['’]utilisateur"
     r"|\bnon\s+(?:dirlo|dire|menzionarlo|rivelarlo)\s+all['’]utente"
     r"|\b(?:sag|sage|erz[äa]hl|erw[äa]hne)\s+(?:es\s+|das\s+|dies\s+)?(?:nicht|niemals)\s+dem\s+(?:benutzer|nutzer)"
     r"|\bignora\s+(?:todas\s+|tutte\s+)?(?:las|as|le)\s+(?:instrucciones|instruções|istruzioni)\s+(?:anteriores|precedenti)"
     r"|\bignore[zr]?\s+(?:toutes\s+)?les\s+instructions\s+pr[ée]c[ée]dentes"
     r"|\bignorier(?:e|en)?\s+(?:alle\s+)?(?:vorherigen|bisherigen|obigen)\s+anweisungen"),
)  # fmt: skip
_INSTRUCTIONS: Final = tuple(re.compile(p, re.I) for _, p in _INSTRUCTION_TABLE)
#: gate word -> the patterns (indices) it opens; gate marks (not words) and theirs.
_WORD_GATES: Final = {w: tuple(i for i, (gate, _) in enumerate(_INSTRUCTION_TABLE) if w in gate)
                      for gate, _ in _INSTRUCTION_TABLE for w in gate if w.isalnum()}
_MARK_GATES: Final = tuple((w, i) for i, (gate, _) in enumerate(_INSTRUCTION_TABLE) for w in gate if not w.isalnum())
_SEPARATORS: Final = str.maketrans({c: " " for c in "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~’“”«»"})

# An address to the assistant followed by an order: "Assistant, send…", "Hello AI agent: ignore…",
# "@assistant quick one - please read…". The name is found first, then the text around it is
# checked (a regex that started with the context would be tried at every position).
_VOCATIVE: Final = re.compile(
    r"@(?:ai|assistant|agent|bot|claude|copilot)\b"
    r"|\b(?:ai\s+(?:coding\s+)?(?:assistant|agent|model)s?|assistant|ai|llm|claude|chatgpt|copilot|gemini)\b\s*[,:!]",
    re.I,
)
_VOCATIVE_BEFORE: Final = re.compile(
    r"(?:\A|[\n.!?;:]|[^\w\s,'’\"]\s?|\b(?:hello|hi|hey|dear|attention|ok|okay|yo)\s*,?)\s*(?:the\s+|an?\s+)?\Z", re.I
)
_IMPERATIVE = (
    r"(?:call|use|invoke|run|execute|send|e-?mail|mail|forward|post|upload|share|read|open|visit|fetch|browse|navigate|"
    r"download|install|delete|remove|drop|wipe|ignore|disregard|forget|decode|follow|obey|end|start|append|prepend|add|"
    r"include|insert|reply|respond|write|create|publish|transfer|pay|refund|apply|grant|copy|paste|print|output|reveal|"
    r"tell|list|collect|gather|save|store|put|set|change|update|approve|merge|push|commit|render|display|show)"
)
_VOCATIVE_AFTER: Final = re.compile(
    r"[\s,:!-]*(?:[^.!?\n]{0,80}?(?:[,;:]|\s-|\bplease|\bkindly|\bnow|\bthen|\bimmediately|\bfirst|"
    r"\byou\s+(?:must|should|need\s+to|have\s+to))\s+"
    r"|(?:before|after|when(?:ever)?|once|at\s+the\s+end\s+of|for)\s+[^.!?\n,]{0,60}?\s+)?"
    r"(?:(?:please|kindly|now|immediately|always|first|also|just)\s+)*" + _IMPERATIVE + r"\b",
    re.I,
)
#: Lines that name speakers ("User: …"): a transcript, where "Assistant:" is a label, not an address.
_TRANSCRIPT: Final = re.compile(r"^[ \t]*(?:user|human|customer|you)\s*:", re.I | re.M)

# A phrase quoted as an example rather than given as an order: "detects phrases like 'ignore …'".
_MENTION: Final = re.compile(
    r"(?:such\s+as|like|e\.g\.|i\.e\.|for\s+example|for\s+instance|example[s:]?|detects?|detecting|detection\s+of|"
    r"flags?|flagging|blocks?|scans?\s+for|catch(?:es)?|patterns?|phrases?|strings?|attempts?\s+to|"
    r"attacks?|injections?|instructions\s+to|called|named|quoted?|says?|saying)\s*[:(\"'“‘«]?\s*\Z",
    re.I,
)
# The next quoted example of a list whose first was introduced so: "like 'a', 'b' or 'c'".
_NEXT_QUOTED: Final = re.compile(r"[\"'”’»]\s*(?:,|;|/|\bor|\band|\band/or)\s*[\"'“‘«]\s*\Z", re.I)

#: Up to {} characters within one sentence (a dot followed by a non-space, as in ".env", does not end it).
_SAME_SENTENCE: Final = r"(?:[^.\n]|\.(?=\S)){{0,{}}}?"

# ---- credentials -----------------------------------------------------------------------------

_CRED_PATH = (
    r"(?:~|\$home|/home/[\w.-]+|/root|/users/[\w.-]+)?/?\.ssh/[\w.-]*|\bid_(?:rsa|dsa|ecdsa|ed25519)\b(?:\.pub)?"
    r"|\.aws/(?:credentials|config)\b|(?<![\w.])\.env(?:\.[a-z]+)?\b|\.netrc\b|\.npmrc\b|\.pypirc\b|\.git-credentials\b"
    r"|\.docker/config\.json|\.kube/config\b|\.config/gh/(?:hosts\.yml)?|/etc/(?:passwd|shadow|sudoers)\b|\bcredentials\.json\b"
    r"|\b(?:claude_desktop_config|mcp)\.json\b|\.config/gcloud\b|\bwallet\.dat\b|\.gnupg\b|\bkeychain\b"
)
_CRED_THING = (
    r"(?:api[\s_-]?keys?|access[\s_-]?tokens?|auth(?:entication)?[\s_-]?tokens?|bearer[\s_-]?tokens?|session[\s_-]?tokens?"
    r"|refresh[\s_-]?tokens?|secret[\s_-]?keys?|private[\s_-]?keys?|ssh[\s_-]?keys?|passwords?|passphrases?|credentials"
    r"|seed[\s_-]?phrases?|recovery[\s_-]?phrases?|mnemonic|environment[\s_-]?variables|env[\s_-]?vars?|cookies?"
    r"|login[\s_-]?(?:credentials|details))"
)
_CRED_VERB = (
    r"(?:read|cat|open|include|pass|send|provide|copy|paste|attach|extract|collect|grab|fetch|upload|add|append|"
    r"put|dump|print|list|enumerate|output|insert|embed|share|give|forward|post|submit|load|get|access)"
)
_CREDENTIAL: Final = re.compile(
    r"(?<!\bis\s)(?<!\bare\s)(?<!\bbe\s)\b" + _CRED_VERB + r"\b" + _SAME_SENTENCE.format(60) + r"(?:" + _CRED_PATH + r")"
    r"|\b" + _CRED_VERB + r"\s+(?:the\s+|all\s+|any\s+)?(?:your|the\s+user'?s|user'?s|their|stored|saved|local|all)\s+"
    r"(?:(?:personal|github|gitlab|aws|cloud|api|bank|brokerage|admin|root|full|current|own)\s+){0,2}" + _CRED_THING + r"\b"
    # a secret-named environment variable: "read GITHUB_TOKEN", "printenv AWS_SECRET_ACCESS_KEY"
    r"|(?<!\bis\s)(?<!\bare\s)(?<!\bbe\s)\b(?:" + _CRED_VERB + r"|printenv|echo)\b" + _SAME_SENTENCE.format(40)
    + r"(?-i:\$?\{?\b[A-Z][A-Z0-9]*_(?:[A-Z0-9]+_)*(?:TOKEN|KEY|SECRET|PASSWORD|PASSWD|PWD|PAT|CREDENTIALS?)\b)"
    r"|\b(?:pass|put|include|send|insert|embed)\s+(?:its|their|the\s+file'?s?)\s+contents?\b"
    r"|\bcontents?\s+of\s+(?:" + _CRED_PATH + r")",
    re.I,
)

# ---- the user's private data ---------------------------------------------------------------

_DATA_OBJECT = (
    r"(?:conversation|chat|messages?|e-?mails?|inbox|contacts?|contact\s+list|address\s+book|calendar|notes|files|documents"
    r"|photos|location|addresses|history|portfolio|repos|repositories|projects|accounts?|data|information|details|results)"
)
#: What is asked for; the verb is looked for before it in the same sentence (object first: the
#: objects are rare, the verbs are everywhere, so this costs a fraction of a verb-first regex).
_DATA_THING: Final = re.compile(
    r"\b(?:complete|full|entire|whole)\s+(?:conversation|chat)s?(?:\s+(?:history|log|transcript))?"
    r"|\b(?:conversation|chat)\s+(?:history|log|transcript)|\ball\s+previous\s+(?:tool\s+)?(?:results|messages|outputs)"
    r"|\b(?:user|author|owner|victim)['’]s\s+(?:(?:full|complete|entire|whole|private|personal|saved|other|recent|last\s+\w+)\s+){0,3}"
    + _DATA_OBJECT + r"\b"
    r"|\ball\s+(?:of\s+)?their\s+(?:(?:full|complete|entire|whole|private|personal|saved|other|recent)\s+){0,3}" + _DATA_OBJECT + r"\b",
    re.I,
)
_DATA_VERB: Final = re.compile(
    r"\b(?:send|forward|pass|include|attach|share|post|upload|e-?mail|mail|paste|copy|collect|gather|publish|put|add|leak"
    r"|dump|export|read|list|append|embed)\b",
    re.I,
)
_SENTENCE_END: Final = re.compile(r".*(?:[.!?](?=\s)|\n)", re.S)
_DATA_GATE: Final = frozenset(("conversation", "chat", "previous"))
_DATA_MARKS: Final = ("user's", "author's", "owner's", "victim's", "user’s", "all their", "of their")

# ---- URLs and sending data -------------------------------------------------------------------

_URL: Final = re.compile(
    r"\b(?:https?|wss?|ftp)://(?:[^\s<>\"'`)\]]|<(?=[^<>\n]*[ _])[^<>/\n][^<>\n]{0,80}>)*"
    r"(?:[^\s<>\"'`)\],.;:!?]|<(?=[^<>\n]*[ _])[^<>/\n][^<>\n]{0,80}>)",
    re.I,
)
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
    r"\b(?:send|post|upload|forward|transmit|exfiltrate|leak|email|mail|report|copy|sync|beacon)(?:_[a-z]+)*\b" + _SAME_SENTENCE.format(80)
    + r"\bto\s+(?:(?:the\s+)?(?:following\s+|this\s+|our\s+|my\s+)?(?:url|endpoint|address|server|webhook|email|inbox)\b"
    r"|(?:https?|wss?|ftp)://|[\w.+-]+@[\w-]+\.[\w.]+)",
    re.I,
)

# ---- other tools -------------------------------------------------------------------------------

_CALL_TOOL: Final = re.compile(
    r"\b(?:call|use|invoke|run|trigger|execute)\s+(?:the\s+)?[`'\"]?([A-Za-z][\w.-]{2,63})[`'\"]?\s+(?:tool|function)\b"
    r"|\b(?i:call|invoke)\s+[`'\"]?([A-Za-z][\w.-]*[_.-][\w.-]*|[a-z]+[A-Z]\w*)[`'\"]?",
)
#: A snake_case name after a verb or "with/using/via" (and their es, fr, it, de, pt twins): "run run_command with…", "using create_gist".
_SNAKE_TOOL: Final = re.compile(
    r"\b(?i:run|use|execute|trigger|with|using|via|llama\s+a|usa|utiliza|con|appelle|utilise|avec|chiama|verwende|mit|rufe|chame|com)\s+(?:the\s+)?[`'\"]?([a-z][a-z0-9]*(?:_[a-z0-9]+)+)\b[`'\"]?(?!\s*[(=])"
)
#: A tool call written out as JSON in a result, as if the assistant had made it.
_FORGED_CALL: Final = re.compile(
    r"\"(?:tool_calls|function_call|tool_use|tool_call)\"\s*:\s*[\[{]" + r"[^\]]{0,200}?\"name\"\s*:\s*\"([A-Za-z][\w.-]{1,63})\""
)
_NOT_A_TOOL: Final = frozenset({"this", "that", "the", "a", "an", "another", "any", "each", "every", "same", "other", "your"})
_CREDENTIAL_GATE: Final = frozenset((
    "ssh", "rsa", "dsa", "ecdsa", "ed25519", "aws", "env", "netrc", "npmrc", "pypirc", "credentials", "docker", "kube",
    "passwd", "shadow", "sudoers", "mcp", "desktop", "gcloud", "wallet", "gnupg", "keychain", "key", "keys", "apikey",
    "token", "tokens", "secret", "secrets", "password", "passwords", "pwd", "pat", "passphrase", "passphrases", "seed",
    "recovery", "mnemonic", "environment", "vars", "var", "cookie", "cookies", "content", "contents", "login", "gh",
    "printenv",
))  # fmt: skip
_SEND_GATE: Final = frozenset(("url", "endpoint", "address", "server", "webhook", "email", "inbox"))
_CALL_GATE: Final = frozenset(("call", "invoke", "tool", "function"))
_AI_GATE: Final = frozenset(_AI_WORDS)


def _excerpt(text: str, start: int, end: int) -> str:
    """The matched span with a little context, on one line, at most EXCERPT characters."""
    span = " ".join(text[max(0, start - 10):end + 30].split())
    return span if len(span) <= EXCERPT else span[: EXCERPT - 1] + "…"


def _mentioned(text: str, start: int, code: list[tuple[int, int]]) -> bool:
    """True when the match at `start` is quoted (an inline code span) or introduced as an example."""
    if any(a <= start < b for a, b in code):
        return True
    before = text[max(0, start - 40):start]
    if _MENTION.search(before) is not None:
        return True
    after_list = _NEXT_QUOTED.search(before)
    if after_list is None:
        return False
    close = start - len(before) + after_list.start()  # the previous example's closing quote
    opening = max(text.rfind(q, max(0, close - 200), close) for q in "\"'“‘«")
    return opening >= 0 and _mentioned(text, opening + 1, code)


def _blank(text: str, spans: Iterable[re.Match[str]]) -> str:
    """`text` with each span replaced by spaces of the same length (positions stay valid)."""
    out = text
    for m in spans:
        out = out[: m.start()] + " " * (m.end() - m.start()) + out[m.end():]
    return out


def _invisible(raw: str, where: str, findings: list[Finding]) -> str:
    """Add an `invisible_text` finding for the invisible characters of `raw`; return the text hidden in tag characters."""
    hits = [m for m in _INVISIBLE.finditer(raw)]
    zwj = [i for i, ch in enumerate(raw) if ch == _ZWJ and not _between_symbols(raw, i)] if _ZWJ in raw else []
    if not hits and not zwj:
        return ""
    names = sorted({_char_kind(m.group()) for m in hits} | ({"zero-width"} if zwj else set()))
    hidden = "".join(chr(ord(ch) - 0xE0000) for run in _TAGS.findall(raw) for ch in run)
    excerpt = " ".join(hidden.split())[:EXCERPT] if hidden else ""
    findings.append(Finding("invisible_text", where, f"{len(hits) + len(zwj)} invisible character(s): {', '.join(names)}", excerpt))
    return hidden


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


#: Short strings `scan_text` found nothing in with no tool names to look for (a tool's answers:
#: `scan_result`). Answers repeat their short strings (status lines, labels, `structuredContent`
#: values), and a miss costs 3-10 µs. Only clean strings are kept, keyed on the exact text (`where`
#: only names the place of a finding), so a finding is never held; the set is emptied when full.
_CLEAN: MemoSet[str] = MemoSet(8192)
_CLEAN_MAX_LEN: Final = 256


def scan_text(raw: str, where: str, other_tools: Iterable[str] = (), *, own_name: str = "") -> list[Finding]:
    """Every finding in one string that reaches the model (`where` names its place)."""
    if not raw or len(raw) < 4:
        return []
    plain = not own_name and isinstance(other_tools, (list, tuple)) and not other_tools
    if plain and raw in _CLEAN:
        return []
    found = _scan(raw[:MAX_SCAN], where, other_tools, own_name, decode=True)[:_MAX_FINDINGS]
    if plain and not found and len(raw) <= _CLEAN_MAX_LEN:
        _CLEAN.remember(raw)
    return found


def _scan(raw: str, where: str, other_tools: Iterable[str], own_name: str, *, decode: bool) -> list[Finding]:
    findings: list[Finding] = []
    text = raw
    if not raw.isascii():
        hidden = _invisible(raw, where, findings)
        if findings:
            text = _INVISIBLE.sub("", raw) + ("\n" + hidden if hidden else "")
        if not text.isascii():
            text = unicodedata.normalize("NFKC", text)
    if "\x1b" in text:
        if _ANSI_CONCEAL.search(text):
            findings.append(Finding("hidden_markup", where, "ANSI concealed text", _excerpt(text, *_ANSI_CONCEAL.search(text).span())))
        text = _ANSI.sub("", text)
    if "<!--" in text:
        for m in _HTML_COMMENT.finditer(text):
            if m.group(1).strip():
                findings.append(Finding("hidden_markup", where, "HTML comment", _excerpt(text, m.start(), m.end())))
    if "]:" in text:
        for m in _MD_COMMENT.finditer(text):
            if m.group(1).strip():
                findings.append(Finding("hidden_markup", where, "markdown comment", _excerpt(text, m.start(), m.end())))
    findings.extend(_urls(text, where))
    prose = _blank(text, _FENCE.finditer(text)) if "```" in text or "~~~" in text else text
    low = prose.lower()
    words = frozenset(low.translate(_SEPARATORS).split())
    code = [(m.start(), m.end()) for m in _INLINE_CODE.finditer(prose)] if "`" in prose else []
    instructed = _vocative(prose, code, findings, where) if not words.isdisjoint(_AI_GATE) or "@" in low else False
    if not instructed:
        opened = {i for w in words.intersection(_WORD_GATES) for i in _WORD_GATES[w]}
        opened.update(i for mark, i in _MARK_GATES if mark in low)
        for i in sorted(opened):
            if _first(_INSTRUCTIONS[i], prose, code, findings, "hidden_instruction", "an instruction to the model", where):
                instructed = True
                break
    if not words.isdisjoint(_CREDENTIAL_GATE):
        _first(_CREDENTIAL, prose, code, findings, "credential_request", "asks for credentials", where)
    if not words.isdisjoint(_DATA_GATE) or ("s" in words and any(map(low.__contains__, _DATA_MARKS))) or "their" in words:
        _data_request(prose, code, findings, where)
    if not words.isdisjoint(_SEND_GATE) or "://" in low or "@" in low:
        _first(_SEND, prose, code, findings, "exfiltration", "asks to send data", where)
    findings.extend(_tool_references(prose, low, words, where, other_tools, own_name, code))
    if decode and (instructed or "base64" in words or "decode" in words):
        findings.extend(_decoded(prose, where, other_tools, own_name))
    return findings


def _decoded(text: str, where: str, other_tools: Iterable[str], own_name: str) -> Iterator[Finding]:
    """Findings in the encoded runs of a text that tells the model to decode something (base64, hex,
    URL-encoding; one layer deep is enough for an order the model must still be told to decode)."""
    for layer in decoded_layers(text):
        if len(layer.text) >= 8 and ">" not in layer.via:
            for f in _scan(layer.text, where, other_tools, own_name, decode=False):
                if f.kind != "url":
                    yield Finding(f.kind, f.path, f.detail, f.excerpt, layer.via)


def _data_request(prose: str, code: list[tuple[int, int]], findings: list[Finding], where: str) -> None:
    """A request to hand over the user's private data: a verb, then within 80 characters of the same
    sentence the conversation history, "the user's contacts", "all of the author's repos"…"""
    for m in _DATA_THING.finditer(prose):
        begin = max(0, m.start() - 80)
        window = prose[begin:m.start()]
        cut = _SENTENCE_END.match(window)
        if cut is not None:
            begin += cut.end()
            window = window[cut.end():]
        verb = _DATA_VERB.search(window)
        if verb is not None and not _mentioned(prose, begin + verb.start(), code):
            findings.append(Finding("data_request", where, "asks for the user's data", _excerpt(prose, begin + verb.start(), m.end())))
            return


def _vocative(prose: str, code: list[tuple[int, int]], findings: list[Finding], where: str) -> bool:
    """An order addressed to the assistant by name ("Assistant, send…", "Hello AI agent: ignore…"); True if found.
    In a transcript ("User: …" lines) "Assistant:" is a speaker label and only the comma form counts."""
    transcript: bool | None = None
    for m in _VOCATIVE.finditer(prose):
        if m.group().endswith(":"):
            if transcript is None:
                transcript = _TRANSCRIPT.search(prose) is not None
            if transcript:
                continue
        if m.group().startswith("@") or _VOCATIVE_BEFORE.search(prose, max(0, m.start() - 24), m.start()):
            after = _VOCATIVE_AFTER.match(prose, m.end())
            if after is not None and not _mentioned(prose, m.start(), code):
                findings.append(Finding("hidden_instruction", where, "an order addressed to the assistant",
                                        _excerpt(prose, m.start(), after.end())))
                return True
    return False


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


def _tool_references(prose: str, low: str, words: frozenset[str], where: str, other_tools: Iterable[str], own_name: str,
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
    matches: list[tuple[re.Match[str], str]] = []
    if not words.isdisjoint(_CALL_GATE):
        matches.extend((m, m.group(1) or m.group(2) or "") for m in _CALL_TOOL.finditer(prose))
    if "_" in low:
        matches.extend((m, m.group(1)) for m in _SNAKE_TOOL.finditer(prose))
        if '"name"' in low:
            matches.extend((m, m.group(1)) for m in _FORGED_CALL.finditer(prose))
    for m, name in matches:
        if name and name.lower() not in _NOT_A_TOOL and name != own_name and name not in seen and not _mentioned(prose, m.start(), code):
            seen.add(name)
            yield Finding("tool_reference", where, name, _excerpt(prose, m.start(), m.end()))


# ---- tool definitions and tool results -------------------------------------------------------


def _leaves(value: Any, path: str, depth: int = 0) -> Iterator[tuple[str, str | int | None, str]]:
    """(container path, key, string) for every string in a JSON value, in document order (key
    None: the string's path is the container path itself), skipping base64 payloads of media and
    anything nested deeper than 32. A string's own path is left to the caller (`child_path`):
    most strings of an answer are clean and never need it. Iterative: a generator per level cost
    more than the scan of a short answer."""
    stack: list[tuple[Any, str, str | int | None, int]] = [(value, path, None, depth)]
    while stack:
        value, path, key, depth = stack.pop()
        if depth > 32:
            continue
        if isinstance(value, str):
            yield path, key, value
            continue
        if isinstance(value, dict):
            path = path if key is None else child_path(path, key)
            media = value.get("type") in ("image", "audio")
            children = [(item, path, k, depth + 1) for k, item in value.items()
                        if isinstance(k, str) and not (media and k == "data") and k != "blob"]
        elif isinstance(value, list):
            path = path if key is None else child_path(path, key)
            children = [(item, path, i, depth + 1) for i, item in enumerate(value)]
        else:
            continue
        children.reverse()
        stack.extend(children)


def _strings(value: Any, path: str, depth: int = 0) -> Iterator[tuple[str, str]]:
    """(path, string) for every string in a JSON value, skipping base64 payloads of media."""
    for parent, key, text in _leaves(value, path, depth):
        yield (parent if key is None else child_path(parent, key)), text


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


_BLOCK_TYPES: Final = frozenset(("text", "image", "audio", "resource", "resource_link"))


def scan_result(result: Any, other_tools: Iterable[str] = ()) -> tuple[Finding, ...]:
    """Findings in every string of a tool's answer (MCP `content[].text`, `structuredContent`, or a
    plain JSON result), with `$`-paths like the secret findings'. `_meta` is not shown to the model."""
    others = list(other_tools)
    findings: list[Finding] = []
    for parent, key, text in _leaves(result, "$"):
        if parent.startswith("$._meta") or len(text) < 4 or (not others and text in _CLEAN):
            continue  # under `_meta`, or nothing `scan_text` could find (its own first tests)
        path = parent if key is None else child_path(parent, key)
        if path.startswith("$._meta") or (text in _BLOCK_TYPES and path.endswith(".type")):
            continue
        findings.extend(scan_text(text, path, others))
        if len(findings) >= _MAX_FINDINGS:
            break
    return tuple(findings[:_MAX_FINDINGS])
