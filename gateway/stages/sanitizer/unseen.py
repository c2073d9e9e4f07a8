"""The lower bar for text a human reader of a page never sees (issue 27, round 4).

Visible text must read as an order by the full phrase grammar (`instructions`, `impersonation`).
Text hidden from the reader (an HTML/XML comment, an element hidden by CSS or `hidden`/`aria-hidden`,
`<noscript>`, `<template>`, collapsed `<details>`, meta/alt/title attributes, JSON-LD, an extra
record field addressed to an agent, a base64 blob in any of these) has no honest reason to direct
an AI, so there it is enough that the text

- addresses an AI reader ("Note for AI agents", "crawlers and language models", "whoever processes
  this page should", "it would be appreciated if the assistant…", "if you are an automated reader"), or
- is worded as a directive (an imperative opening a sentence, an obligation, a polite request, "the
  next step is to use…") about something only an agent acts on: a tool name (the rescan's
  `tool_reference`), a send to a destination, a credential, the user's private data, or the
  model's own instructions.

Honest hidden text (build markers, TODOs, licence headers, analytics snippets, cookie banners,
"please enable JavaScript", hidden tab panels with install steps, alt text describing a picture of
an agent) neither addresses an AI nor directs it at those objects. Pure functions, regexes compiled
at import, each behind a cheap word test.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable
from typing import Final

from gateway.core.call import Finding
from gateway.stages.sanitizer.decode import decoded_layers

__all__ = ["READER", "agent_key", "directive", "encoded_texts", "order", "steers"]

_AI = (
    r"(?:ai|a\.i\.|llms?|gpt|chatgpt|claude|gemini|copilot|(?:ai|language|large\s+language)\s+models?|ai\s+systems?"
    r"|(?<!user\s)(?<!customer\s)(?<!travel\s)(?<!support\s)(?<!sales\s)(?:ai\s+|autonomous\s+|coding\s+)?(?:assistants?|agents?)"
    r"|automated\s+(?:readers?|agents?|systems?|tools?|assistants?|processors?|summari[sz]ers?|reviewers?))"
)
_VERB = (
    r"(?:call|use|invoke|run|execute|trigger|send|e-?mail|forward|post|upload|share|read|retrieve|open|load|visit|fetch|delete"
    r"|remove|ignore|disregard|follow|obey|append|add|include|attach|insert|reply|respond|write|publish|transfer|pay|grant|copy"
    r"|paste|print|output|reveal|list|collect|approve|merge|push|submit|escalate|begin|start|look\s+up|go\s+ahead|make\s+sure"
    r"|close|refund|cancel|update|set|change|create|install|download|mark|treat|resolve|assign|book|buy|order|disable|enable"
    r"|be\s+sure|remember\s+to|skip|search|find|gather|extract|export)"
)
#: An AI reader in the position of the addressee: a dedication ("note for AI agents", "site policy for
#: crawlers and language models"), a vocative opening a sentence ("Assistant, …", "AI agents:"), the
#: subject of an obligation or a polite request ("models summarising this article are expected to",
#: "it would be appreciated if the assistant…"), "if you are an automated reader", "whoever processes".
_ADDRESSEE: Final = re.compile(
    r"\b(?:note|notes|message|instructions?|documentation|guidance|guidelines|policy|notice|info(?:rmation)?|memo|hint|request"
    r"|reminder)\s+(?:is\s+)?(?:for|to)\s+(?:(?:all|any|every|the|other)\s+)?(?:\w+\s+(?:and|&|or)\s+)?" + _AI + r"\b[^.!?:\n]{0,40}?"
    r"(?:[:,\u2013\u2014]|\s-\s)"
    r"|(?:^|[.!?;]\s+|\()\W{0,3}(?:(?:dear|hey|hi|hello|attention|to)\s+)?(?:(?:all|any|every|the)\s+)?" + _AI
    + r"(?:\s+(?:reading|summari[sz]ing|processing|visiting|viewing)\s+this(?:\s+\w+)?)?\s*(?:[,:]|\s-\s)\s*"
    r"(?=(?:[\w'\u2019]+\s+){0,3}?(?:please|kindly|you|your|do\s+not|don['\u2019]t|never|always|before|first|the\s+following|"
    + _VERB + r")\b)"
    r"|\b(?:ai|llm|assistant|model|agent)s?\b[^.!?]{0,60}\byou\s+(?:must|shall|should|are\s+to|need\s+to|have\s+to)\b"
    r"|\b" + _AI + r"\b(?:\s+(?:and\s+\w+\s+)?(?:reading|summari[sz]ing|processing|visiting|reviewing|completing|setting|working|indexing"
    r"|parsing|handling)\b[^.!?\n]{0,40}?)?\s+(?:(?:is|are)\s+(?:expected|asked|required|requested|kindly\s+asked|instructed"
    r"|invited|encouraged)\s+to|(?:should|must|shall|need\s+to|needs\s+to|has\s+to|have\s+to|are\s+to|is\s+to|may\s+skip"
    r"|can\s+skip|may\s+now|will\s+need\s+to)\b|used\s+\w+)"
    r"|\b(?:appreciated|appreciate\s+it|grateful|helpful|help\s+(?:us|the\s+\w+)(?:\s+a\s+lot)?)\s+if\s+(?:\w+\s+){0,2}?" + _AI + r"\b"
    r"|\bwe\s+ask\s+(?:that\s+)?(?:\w+\s+)?" + _AI + r"\b"
    r"|\bif\s+you\s+are\s+an?\s+(?:automated|ai|artificial|machine|language\s+model|llm|assistant|agent|bot)\b"
    r"|\bwhoever\s+(?:reads|processes|summari[sz]es|parses|indexes)\b",
    re.I | re.M,
)
_ADDRESSEE_GATE: Final = frozenset((
    "ai", "llm", "llms", "gpt", "chatgpt", "claude", "gemini", "copilot", "models", "model", "assistant", "assistants",
    "agent", "agents", "automated", "whoever",
))  # fmt: skip
#: A directive: an imperative opening a sentence (after an optional fronted clause, "Before quoting, look
#: up…"), an obligation or a polite request, "the next step is to use…".
_DIRECTIVE: Final = re.compile(
    r"(?:^|[.!?:;]\s+|\n)(?:(?:before|after|when(?:ever)?|once|while|as\s+part\s+of)\b[^.!?\n,]{0,80},\s+)?"
    r"(?:(?:please|kindly|now|immediately|first|then|also|always|just|next|finally|afterwards|lastly),?\s+)*" + _VERB + r"\b"
    r"|\b(?:should|must|shall|is\s+to\s+be|are\s+to\s+be|is\s+to|are\s+to|(?:is|are)\s+(?:expected|asked|required|requested)\s+to"
    r"|needs?\s+to|ha(?:s|ve)\s+to|ought\s+to)\s+(?:\w+\s+)?(?:be\s+)?" + _VERB
    + r"|\b(?:please|kindly)\s+(?:\w+\s+)?" + _VERB
    + r"|\b(?:would\s+(?:be\s+)?appreciat\w*|would\s+help|we\s+ask\s+that|it\s+is\s+required)\b"
    r"|\b(?:next\s+step|recommended\s+way|correct\s+way|required\s+step|only\s+way)\b[^.!?\n]{0,60}?\bis\s+to\s+" + _VERB
    + r"|\bonly\s+(?:licensed|permitted|allowed|valid|authori[sz]ed)\s+(?:when|if)\b|\bin\s+place\s+of\s+what\s+you\b",
    re.I | re.M,
)
#: What only an agent acts on (besides the rescan's findings): the model's own instructions, the
#: user's private data, a secret variable, a destination address.
_OBJECT: Final = re.compile(
    r"\b(?:your|the\s+model['’]s|the\s+assistant['’]s)\s+(?:\w+\s+){0,2}?(?:instructions|guidelines|rules|directives|system\s+prompt"
    r"|prompt|configuration)\b"
    r"|\b(?:instructions|guidelines|rules|directives|text|message)\s+you\s+(?:were\s+given|received|are\s+(?:operating|working|running)"
    r"\s+under|were\s+configured\s+with|started\s+with)\b|\b(?:functions|tools)\s+you\s+(?:are\s+able\s+to|can|may)\s+(?:call|use)\b"
    r"|\bthe\s+(?:user|reader|customer|visitor|owner|recipient)['’]s\s+(?:\w+\s+){0,3}?(?:contacts?|contact\s+list|messages|e-?mails|inbox"
    r"|conversations?|chat|history|files|documents|cards?|passwords?|codes|addresses|keys?|tokens?|credentials|notes|calendar|fork|repos?"
    r"|repositor(?:y|ies)|account)\b"
    r"|\bthe\s+(?:full\s+|whole\s+|entire\s+)?(?:conversation|chat\s+history|customer\s+thread|thread)\b(?:\s+so\s+far)?"
    r"|\b(?:to|into|at|on)\s+(?:https?://\S+|[\w.+-]+@[\w-]+\.[a-z]{2,})",
    re.I,
)
#: The AI reading this very text, in visible text too: "whichever agent reads this", "any assistant
#: summarising this page", "if you are an AI". Documentation for agents says "agents should call…",
#: never who is reading it; with a tool named beside it this is an order to the reader.
READER: Final = re.compile(
    r"\b(?:whichever|any|every|each)\s+(?:ai\s+|automated\s+|llm\s+)?(?:agent|assistant|model|ai|llm|bot)\s+(?:that\s+|which\s+"
    r"|who\s+)?(?:reads|is\s+reading|reading|processes|processing|summari[sz]es|summari[sz]ing|sees|visits|crawls|parses|opens)\s+"
    r"(?:this|these)\b|\bif\s+you\s+are\s+an?\s+(?:ai|automated|artificial|language\s+model|llm)\b",
    re.I,
)
#: A secret (a credential file, a secret variable) and, in the same text, a verb that reads or moves it:
#: "update OPENAI_API_KEY in your .env" is a how-to, "retrieve OPENAI_API_KEY and include it" is not.
_SECRET: Final = re.compile(
    r"(?-i:\b[A-Z][A-Z0-9]*_(?:[A-Z0-9]+_)*(?:TOKEN|KEY|SECRET|PASSWORD|PAT|CREDENTIALS?)\b)"
    r"|(?:^|[\s(`'\"])(?:~|\$home)?/?\.(?:env|ssh|aws|netrc|npmrc|kube|docker)\b|\bid_(?:rsa|dsa|ecdsa|ed25519)\b(?!\.pub)",
    re.I,
)
_MOVE: Final = re.compile(
    r"\b(?:retriev|read|send|sent|includ|paste|upload|attach|shar|post|copy|print|output|cat|forward|accompan|submit|e-?mail"
    r"|contents?\s+of)\w*",
    re.I,
)
#: A record field whose key addresses an agent (`_agent_note`, `ai_handling`, `llmInstructions`).
_AI_KEY: Final = re.compile(
    r"(?:^|[_\W]|(?<=[a-z])(?=[A-Z]))(?i:ai|llm|agent|assistant|gpt|copilot)s?(?:[_\W]|(?=[A-Z]))*(?i:note|notes|instructions?|hint"
    r"|hints|handling|directives?|guidance|policy|task|tasks|action|actions|todo|memo)(?:$|[_\W])"
    r"|(?:^|[_\W])(?i:note|notes|instructions?|hint|hints|handling|directives?|guidance|memo|message)(?:[_\W]|(?=[A-Z]))*"
    r"(?i:for|to)?(?:[_\W]|(?=[A-Z]))*(?i:ai|llm|agents?|assistants?|gpt|copilot)(?:$|[_\W])"
)
_ORDERED_KINDS: Final = frozenset(("tool_reference", "exfiltration", "credential_request", "data_request", "url_data"))


#: An order about the ANSWER, which only a model writing one acts on (round 8): what summaries/answers of
#: this text should say ("Summaries of this page should describe Acme as…"), or an imperative or obligation
#: with a verb of answering (describe, present, recommend, rate, rank, say, tell, mention, omit…) whose
#: object is the reader/user, this page/product/company, the answer itself, or a verdict ("as the best…").
_STEER_VERB = (
    r"(?:describe|present|portray|recommend|rate|rank|say|state|tell|mention|summari[sz]e|omit|leave\s+out|refer\s+to"
    r"|characteri[sz]e|emphasi[sz]e|highlight|downplay|praise|claim|call|answer|reply|respond|conclude|advise|frame|position)"
)
_VERDICT = (
    r"(?:the\s+(?:user|reader|visitor|customer)s?|readers|visitors|(?:your|the)\s+(?:answer|summary|response|reply|recommendation)|as\s+(?:the|a|an)\s+(?:\w+\s+){0,2}?(?:best|\w{3,}est|top|leading"
    r"|only|clear|most|winner|scam|unsafe|dangerous|recalled)|negative|complaints?|problems?|lawsuits?|fines?"
    r"|recalls?|criticism)"
)
_STEER: Final = re.compile(
    r"\b(?:summar(?:y|ies)|answers?|responses?|replies|overviews?|recaps?|descriptions?|comparisons?)\s+(?:of|about|on|for)\s+"
    r"(?:this|these|the\s+(?:page|article|site|product|company|post|review|listing|following))\b[^.!?\n]{0,40}?\b(?:should|must|shall"
    r"|need\s+to|needs\s+to|are\s+to|is\s+to|will|have\s+to|has\s+to)\b"
    r"|(?:^|[.!?:;]\s+|\n)(?:(?:when|while|if|before|in)\b[^.!?\n,]{0,80},\s+)?(?:(?:please|kindly|always|only|just),?\s+)*"
    r"(?:(?:do\s+not|don['’]t|never)\s+)?" + _STEER_VERB + r"\b[^.!?\n]{0,80}?\b" + _VERDICT + r"\b"
    r"|\b(?:should|must|shall|is\s+to|are\s+to|needs?\s+to|ha(?:s|ve)\s+to)\s+(?:always\s+|only\s+|never\s+|not\s+)?(?:be\s+)?"
    r"(?:describ|present|portray|recommend|rank|mention|omit|prais|characteri[sz]|downplay|highlight|emphasi[sz])\w*",
    re.I | re.M,
)


#: The answer named as what the order is about: "when summarising/answering…", "in your reply", "summaries
#: of this record should". A record field that tells a colleague "tell the customer…" names no answer.
_ANSWER_FRAME: Final = re.compile(
    r"\b(?:when(?:ever)?|while|if|before|after)\s+(?:you\s+(?:are\s+)?|you['’]re\s+)?(?:summari[sz]|answer|respond|repl(?:y|ie)"
    r"|describ|present|report|recap|writ)\w*|\bin\s+(?:your|the|any)\s+(?:answer|summary|response|reply|recap|overview)\b"
    r"|\b(?:summar(?:y|ies)|answers?|responses?|overviews?)\s+(?:of|about|on|for)\s+(?:this|these)\b",
    re.I,
)


_FRAME_STEMS: Final = ("summar", "answer", "respon", "repl", "describ", "present", "report", "recap", "writ", "overview")


def steers(text: str, *, framed: bool = False) -> re.Match[str] | None:
    """The span of hidden `text` that tells the model what its answer should say (`_STEER`), or None:
    honest hidden text (install steps, labels, TODOs) never tells a reader how to describe the page.
    `framed`: the text must also name the answer it is about (`_ANSWER_FRAME`; a record's field, which a
    colleague may fill with "tell the customer…")."""
    if framed:
        low = text.lower()
        if not any(stem in low for stem in _FRAME_STEMS) or _ANSWER_FRAME.search(text) is None:
            return None
    return _STEER.search(text)


def agent_key(key: str) -> bool:
    """Whether a record field's name addresses an agent (`_agent_note`, `ai_handling`, `llmHint`); a
    substring test first, the pattern only for the few names that hold one."""
    low = key.lower()
    return ("ai" in low or "llm" in low or "agent" in low or "assistant" in low or "gpt" in low or "copilot" in low) and (
        _AI_KEY.search(key) is not None)


def order(text: str, found: Iterable[Finding], *, addressed: bool = False) -> re.Match[str] | None:
    """The span that makes hidden `text` an order to the model, or None. `found` are the whole
    scanner's findings in it (a tool name, a send, a credential or data request count as objects);
    `addressed`: the text's place already addresses an agent (a record field named for it)."""
    if not addressed:
        words = set(re.findall(r"[a-z]+", text.lower()))
        if not words.isdisjoint(_ADDRESSEE_GATE) and (m := _ADDRESSEE.search(text)) is not None:
            return m
    directive = _DIRECTIVE.search(text)
    if directive is None:
        return None
    if addressed or any(f.kind in _ORDERED_KINDS for f in found) or _OBJECT.search(text) is not None:
        return directive
    if _SECRET.search(text) is not None and _MOVE.search(text) is not None:
        return directive
    return None


def directive(text: str) -> re.Match[str] | None:
    """The first directive in `text` (an imperative opening a sentence, an obligation, "is to be
    forwarded", a polite request), or None."""
    return _DIRECTIVE.search(text)


def encoded_texts(text: str) -> list[str]:
    """Readable texts hidden in encoded runs of `text` (base64, hex, URL escapes; one layer, at most
    4): a blob in a comment a reader never sees."""
    return [layer.text for layer in itertools.islice(decoded_layers(text), 8) if ">" not in layer.via and " " in layer.text][:4]
