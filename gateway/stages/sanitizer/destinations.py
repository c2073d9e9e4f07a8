"""Where a send goes: places outside any organisation's control (issue 24, round 8).

An exfiltration chain ends in a send "to the outside"; which addresses are the operator's own cannot
be known here (an internal domain, a partner's, the company's bucket), but some destinations are
outside every organisation by what they are:

- **public drops**: anonymous file hosts and paste sites (transfer.sh, 0x0.st, file.io, catbox,
  pastebin, termbin…), request-capture and tunnel services (webhook.site, requestbin, pipedream,
  ngrok, trycloudflare, interactsh/OAST), public gists, chat webhooks that post into someone else's
  server (Discord webhooks, the Telegram bot API);
- **a bare IP address** that is not private, loopback or link-local (a server with no name);
- **consumer mailboxes** (gmail.com, outlook.com, proton.me, gmx, yandex, qq…) as a recipient:
  a person's private box, not an organisation's.

`outside_location(location)` reads a URL, a `host port` pair (nc, scp) or an e-mail address and
answers which of these it is, or "". `BULK_SQL` is the other end of such a chain in SQL: a read of
every row of a table, a table copied or unloaded out, a dump (classify and the shell analysis
both use it). Pure; the tables are built at import; answers are memoised.
"""

from __future__ import annotations

import re
from typing import Final

from gateway.memo import Memo
from gateway.stages.sanitizer.hosts import host_facts

__all__ = ["BULK_SQL", "outside_location"]

#: A read of a whole collection (round 8, ec-bulk-confidential-out): every row of a table (`SELECT *
#: FROM t` with no condition or limit), a table copied or unloaded out, a dump.
BULK_SQL: Final = re.compile(
    r"\bselect\s+(?:distinct\s+)?(?:[\w\"`\[\]]+\.)?\*\s+from\s+[\w.\"`\[\]]+\s*(?:order\s+by\s+[\w.,\s\"]+?)?;?\s*$"
    r"|\bcopy\s+(?:[\w.\"]+(?:\s*\([^)]*\))?|\(.*\))\s+to\b|\\copy\b|\bunload\s*\(|\bexport\s+data\b|\binto\s+outfile\b|\bmysqldump\b|\bpg_dump",
    re.I,
)

#: Public drops, by registered domain (a subdomain counts: `abc.ngrok-free.app`).
_DROPS: Final = frozenset({
    "transfer.sh", "0x0.st", "file.io", "tmpfiles.org", "catbox.moe", "litterbox.catbox.moe", "gofile.io",
    "anonfiles.com", "bashupload.com", "oshi.at", "temp.sh", "filebin.net", "pixeldrain.com", "wetransfer.com",
    "sendspace.com", "mega.nz", "pastebin.com", "paste.ee", "hastebin.com", "dpaste.org", "dpaste.com",
    "ghostbin.co", "termbin.com", "ix.io", "sprunge.us", "paste.rs", "rentry.co", "privatebin.net", "controlc.com",
    "webhook.site", "requestbin.com", "requestbin.net", "pipedream.net", "m.pipedream.net", "beeceptor.com",
    "hookbin.com", "requestcatcher.com", "mockbin.org", "postb.in", "ngrok.io", "ngrok-free.app", "ngrok.app",
    "trycloudflare.com", "loca.lt", "localtunnel.me", "serveo.net", "localhost.run", "lhr.life", "pinggy.io",
    "interact.sh", "oast.fun", "oast.live", "oast.me", "oast.pro", "oast.site", "oast.online",
    "burpcollaborator.net", "oastify.com", "canarytokens.com", "dnslog.cn", "ceye.io", "gist.github.com",
    "gist.githubusercontent.com", "api.telegram.org",
})  # fmt: skip
#: Paths of a shared host that post into someone else's space.
_DROP_PATHS: Final = re.compile(r"^(?:discord(?:app)?\.com/api/webhooks/|api\.github\.com/gists\b)", re.I)
#: Consumer mailbox domains (a person's private box).
_MAILBOXES: Final = frozenset({
    "gmail.com", "googlemail.com", "outlook.com", "hotmail.com", "live.com", "msn.com", "yahoo.com", "ymail.com",
    "icloud.com", "me.com", "mac.com", "aol.com", "proton.me", "protonmail.com", "pm.me", "tutanota.com", "tuta.io",
    "gmx.com", "gmx.net", "gmx.de", "web.de", "mail.ru", "inbox.ru", "bk.ru", "yandex.ru", "yandex.com", "qq.com",
    "163.com", "126.com", "naver.com", "hanmail.net", "zoho.com", "fastmail.com", "mail.com", "libero.it",
    "orange.fr", "laposte.net", "free.fr", "t-online.de", "seznam.cz", "wp.pl", "o2.pl", "rediffmail.com",
    "hotmail.co.uk", "hotmail.fr", "yahoo.co.uk", "yahoo.fr", "yahoo.co.jp", "outlook.de", "cock.li", "guerrillamail.com",
})  # fmt: skip
_NEAR: Final = frozenset({"loopback", "private", "link_local", "unspecified", "metadata", "internal_name", "multicast"})
_HOST: Final = re.compile(r"^(?:[a-z][a-z0-9+.-]*://)?(?:[^@/\s]*@)?(\[[^\]]+\]|[^/:?#\s]+)", re.I)
_EMAIL: Final = re.compile(r"^[^@\s<>]+@([a-z0-9.-]+\.[a-z]{2,})$", re.I)
_MEMO: Final[Memo[str, str]] = Memo(2048)


def outside_location(location: str) -> str:
    """"drop", "ip" or "mailbox" when `location` (a URL, `host port`, `user@host:path` or an e-mail
    address) is a place outside any organisation's control; "" otherwise."""
    location = location.strip().strip("<>").lower()
    if not location:
        return ""
    found = _MEMO.get(location)
    if found is None:
        found = _judge(location)
        _MEMO.remember(location, found)
    return found


def _judge(location: str) -> str:
    mail = _EMAIL.match(location)
    if mail is not None and "://" not in location:
        return "mailbox" if mail.group(1) in _MAILBOXES else ""
    m = _HOST.match(location.split()[0])
    if m is None:
        return ""
    host = m.group(1).strip("[]").rstrip(".")
    rest = location.split("://", 1)[-1]
    if _DROP_PATHS.match(rest.split("@", 1)[-1]):
        return "drop"
    labels = host.split(".")
    if any(".".join(labels[i:]) in _DROPS for i in range(len(labels) - 1)):
        return "drop"
    facts = host_facts(host)
    if facts.ip and not facts.invalid and not facts.classes & _NEAR:
        return "ip"
    return ""
