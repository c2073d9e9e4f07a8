"""What a non-shell tool call does, in the shared class vocabulary the sequence rules read.

`classify_call(tool, annotations, arguments)` names the classes of one call (`credential_read`,
`env_read`, `network_send`, `download`, `write`, `execute`, `recon`, `destructive`, `records_read`:
records of people read from a database, CRM, FHIR/EHR, HR, billing or ticketing tool;
`personal_data`: a send whose content carries data about people, `personal.carries_personal`;
`bulk_read`: a whole collection read; `outside_send`: a send to a place outside any organisation;
`confidential_read`, earned only by an answer: a document marked confidential) and
the paths or URLs each touches. It looks at the tool's name (split into words: `read_text_file`,
`readTextFile`), the paths and URLs in its arguments and, to add classes only, the backend's
`openWorldHint` / `destructiveHint` annotations (a backend cannot classify its way out). Shell
commands are the shell analysis' job; its classes are unioned with these on `CallContext`.

Pure functions; regexes compiled at import; the word split of a tool name is cached, so a call
to a tool with no path-like or URL argument costs one dict walk. See docs/detection.md,
"Sequences within a session".
"""

from __future__ import annotations

import functools
import posixpath
import re
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import unquote_plus

from gateway.memo import Memo
from gateway.sensitive_paths import CREDENTIAL_FILE, sensitive_path
from gateway.stages.sanitizer.decode import decode_base64
from gateway.stages.sanitizer.destinations import BULK_SQL, outside_location
from gateway.stages.sanitizer.formats import credential_hits
from gateway.stages.sanitizer.personal import carries_personal, emails, personal_kinds

if TYPE_CHECKING:
    from gateway.core.call import CallContext

__all__ = [
    "CLASSES", "STATE_CHANGING_WORDS", "classify_call", "history_detail", "merge_classes", "normalise_path", "result_classes",
    "safe_location", "tool_words",
]  # fmt: skip

#: The class vocabulary (shared with the shell analysis).
CLASSES: Final = frozenset(
    {"credential_read", "env_read", "network_send", "download", "write", "execute", "recon", "destructive",
     "records_read", "personal_data", "confidential_read", "bulk_read", "outside_send"}
)

_MAX_PATHS: Final = 16  # per class: a call naming hundreds of files keeps the first few
_MAX_PATH_CHARS: Final = 512
_MAX_STRINGS: Final = 256  # argument strings looked at per call
_MAX_DEPTH: Final = 6

_WORD: Final = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")

# ---- tool-name vocabulary -----------------------------------------------------------------

_READ_WORDS: Final = frozenset(
    {"read", "cat", "view", "open", "load", "show", "head", "tail", "get", "print", "dump", "less", "more",
     "copy", "cp", "move", "mv", "rename", "download", "export", "contents", "content"}
)  # fmt: skip
_LIST_WORDS: Final = frozenset({"list", "ls", "tree", "search", "find", "glob", "directory", "dir", "stat", "info"})
_ENV_WORDS: Final = frozenset({"env", "environ", "environment", "getenv", "printenv", "dotenv"})
_SEND_WORDS: Final = frozenset(
    {"fetch", "http", "https", "request", "requests", "post", "put", "patch", "send", "upload", "email", "mail",
     "smtp", "webhook", "slack", "discord", "telegram", "teams", "curl", "wget", "notify", "publish", "tweet",
     "sms", "ftp", "sftp", "scp", "rsync", "navigate", "browse", "api", "graphql", "gist", "paste", "pastebin",
     "share", "transfer", "exfil", "push", "comment", "comments", "reply", "tweet", "toot", "forward", "deliver",
     "dispatch", "broadcast", "fax"}
)  # fmt: skip
#: A tool that opens an issue or a ticket publishes what it is given (`create_issue`, `open_ticket`).
_PUBLISH_THINGS: Final = frozenset({"issue", "issues", "ticket", "tickets"})
_PUBLISH_VERBS: Final = frozenset({"create", "open", "new", "file", "submit", "add", "raise"})
_DOWNLOAD_WORDS: Final = frozenset({"download", "fetch", "wget", "curl", "pull", "clone"})
_WRITE_WORDS: Final = frozenset({"write", "edit", "create", "save", "append", "overwrite", "replace", "insert", "store"})
_DEST_WORDS: Final = frozenset({"copy", "cp", "move", "mv", "rename", "download"})  # write their destination
_EXEC_WORDS: Final = frozenset(
    {"run", "exec", "execute", "eval", "source", "launch", "spawn", "python", "python3", "node", "bash", "sh",
     "zsh", "ruby", "perl", "php", "interpreter", "script", "invoke"}
)  # fmt: skip
_RECON_WORDS: Final = frozenset(
    {"whoami", "hostname", "uname", "sysinfo", "system", "processes", "ps", "netstat", "ifconfig", "ipconfig",
     "interfaces", "users", "groups", "ports", "portscan", "nmap", "scan", "os", "arp", "route", "mounts"}
)  # fmt: skip
_RECON_NEEDS_CONTEXT: Final = frozenset({"system", "users", "groups", "ports", "interfaces", "os", "processes", "scan"})
_DESTRUCTIVE_WORDS: Final = frozenset({"delete", "remove", "rm", "rmdir", "drop", "truncate", "wipe", "destroy", "purge", "kill", "erase", "format"})
#: Words of a tool name that say it changes or destroys state: what a tier that may run such a
#: tool can do (`policy.destructive`, the `approval.allow_elicitation` warning).
STATE_CHANGING_WORDS: Final = _DESTRUCTIVE_WORDS | _WRITE_WORDS | _DEST_WORDS - {"copy", "cp", "download"} | frozenset(
    {"run", "exec", "execute", "eval", "launch", "spawn", "invoke", "shell", "bash", "sh", "command", "cmd",
     "update", "modify", "patch", "put", "post", "set", "reset", "send", "upload", "install", "deploy", "transfer",
     "pay", "terminate", "restart", "stop", "move"}
)  # fmt: skip

#: What holds records of people: a read of one of these is `records_read` (`search_contacts`,
#: `get_patient_record`, `fhir_search`, `list_sepa_mandates`, `get_employee`, `search_tickets`).
_RECORD_NOUNS: Final = frozenset(
    {"customer", "customers", "patient", "patients", "client", "clients", "contact", "contacts", "member", "members",
     "employee", "employees", "person", "persons", "people", "user", "users", "subscriber", "subscribers", "guest",
     "guests", "student", "students", "applicant", "applicants", "candidate", "candidates", "lead", "leads",
     "beneficiary", "beneficiaries", "policyholder", "cardholder", "mandate", "mandates", "sepa", "payee", "payees",
     "payroll", "hr", "crm", "fhir", "ehr", "emr", "encounter", "encounters", "observation", "observations",
     "prescription", "prescriptions", "appointment", "appointments", "claim", "claims", "ticket", "tickets",
     "record", "records", "profile", "profiles", "account", "accounts", "invoice", "invoices", "order", "orders",
     "hubspot", "salesforce", "zendesk", "intercom", "freshdesk", "stripe", "kunden", "patienten", "clientes",
     "staff", "personnel", "roster", "workforce", "tenant", "tenants", "resident", "residents", "donor", "donors",
     "volunteer", "volunteers", "attendee", "attendees", "registrant", "registrants", "participant", "participants",
     "voter", "voters", "citizen", "citizens", "prospect", "prospects", "audience", "audiences", "recruit", "recruits",
     "signups", "learner", "learners", "pupil", "pupils", "visitor", "visitors", "borrower", "borrowers",
     "mitarbeiter", "empleados", "salaries", "airtable", "pipedrive", "mailchimp", "klaviyo", "workday", "bamboohr"}
)  # fmt: skip
_RECORD_READS: Final = _READ_WORDS | _LIST_WORDS | frozenset({"query", "lookup", "retrieve", "fetch", "select", "export", "read"})
#: Tools that run SQL: one whose arguments hold a SELECT/COPY/WITH … FROM reads records.
_SQL_WORDS: Final = frozenset(
    {"sql", "query", "postgres", "postgresql", "pg", "mysql", "sqlite", "mssql", "database", "db", "bigquery",
     "snowflake", "redshift", "athena", "clickhouse", "duckdb", "oracle", "supabase"}
)  # fmt: skip
_SQL_READ: Final = re.compile(r"\b(?:select|copy|with|unload|export)\b[\s\S]{0,4000}?\bfrom\b|\\copy\b", re.I)
#: A tool that takes a whole collection out (`hubspot_export_contacts`, `gdrive_download_folder`,
#: `dump_table`, `backup_database`): one of these verbs with a collection or records noun.
_BULK_VERBS: Final = frozenset({"export", "dump", "backup", "archive", "download", "snapshot", "bulk", "extract"})
_COLLECTIONS: Final = frozenset(
    {"database", "databases", "db", "table", "tables", "folder", "folders", "directory", "drive", "repository", "repo",
     "repos", "bucket", "collection", "collections", "all", "workspace", "mailbox", "inbox", "vault", "site", "dataset",
     "datasets", "list", "lists", "sheet", "spreadsheet", "board", "project", "space", "channel", "history"}
)  # fmt: skip
#: What a bulk verb takes whole: a collection, or records in the plural (`export_orders`, not
#: `download_invoice`: one document for one customer).
_BULK_NOUNS: Final = _COLLECTIONS | {w for w in _RECORD_NOUNS if w.endswith("s")} | frozenset(
    {"crm", "hr", "payroll", "roster", "staff", "personnel", "workforce", "audience", "hubspot", "salesforce",
     "airtable", "mailchimp", "klaviyo", "pipedrive", "workday", "bamboohr", "zendesk", "intercom"}
)  # fmt: skip
#: Tools named for a public paste or gist publish to the world whatever the address.
_PUBLIC_WORDS: Final = frozenset({"gist", "gists", "paste", "pastebin"})
#: Where a message goes, not what it says: the recipient's own address is not data sent about them.
_RECIPIENT_KEYS: Final = frozenset({"to", "cc", "bcc", "recipient", "recipients", "from", "reply_to", "sender", "channel", "channel_id"})
_ADDRESSEE_KEYS: Final = frozenset({"to", "cc", "bcc", "recipient", "recipients"})  # who reads it
#: A send's value that is one base64 token (an attachment, a blob): its text is read too.
_BASE64_VALUE: Final = re.compile(r"[A-Za-z0-9+/_-]{32,}={0,2}")
_MAX_RESULT_TEXT: Final = 65_536

#: What a secret store is (Vault, AWS Secrets Manager and SSM, cloud KMS, 1Password, Bitwarden,
#: keychains, Kubernetes Secrets): a read of a value from one is `credential_read`, whatever
#: route the value then takes. Listing names or describing metadata is not (`_SECRET_META`).
_SECRET_STORES: Final = frozenset(
    {"secret", "secrets", "vault", "keychain", "keyring", "secretsmanager", "kms", "1password", "onepassword",
     "bitwarden", "lastpass", "keepass", "keepassxc", "passbolt", "doppler", "infisical", "sops", "password",
     "passwords", "credential", "credentials", "creds", "kubeconfig"}
)  # fmt: skip
_SECRET_READS: Final = frozenset(
    {"get", "read", "reveal", "retrieve", "fetch", "show", "view", "decrypt", "export", "access", "dump", "print",
     "load", "lookup", "find", "unseal", "copy", "cat", "value", "open", "unwrap"}
)  # fmt: skip
_SECRET_META: Final = frozenset(
    {"list", "describe", "metadata", "rotate", "rotation", "policy", "policies", "create", "put", "set", "delete",
     "update", "tags", "versions", "exists", "generate", "reset", "strength", "check", "note", "notes", "file",
     "files", "page", "markdown", "md"}
)  # fmt: skip
#: Arguments that name the object a read tool reads: a Kubernetes kind, a config key, a parameter.
_KIND_KEYS: Final = frozenset({"kind", "resource", "resource_type", "resourcetype", "type", "object", "object_type"})
_NAME_KEYS: Final = frozenset(
    {"key", "name", "id", "secret_id", "secretid", "secret_name", "secretname", "parameter", "parameter_name",
     "item", "field", "setting", "variable", "var", "config_key", "option", "entry"}
)  # fmt: skip
_SECRET_NAME: Final = re.compile(
    r"(?i)secret|passw(?:or)?d|passwd|token|api[_.-]?key|private[_.-]?key|credential|access[_.-]?key|extraheader|authorization"
)

#: A browser session's keys (round 7, ec-browser-session-out): a tool that reads cookies or web
#: storage (`browser_get_cookies`, `export_cookies`, `get_local_storage`, `browser_storage_state`) is
#: a `credential_read`; one that sets, clears or consents to them is not (`accept_cookies`).
_SESSION_NOUNS: Final = frozenset({"cookie", "cookies", "storage", "localstorage", "sessionstorage"})
_SESSION_WRITES: Final = frozenset(
    {"set", "add", "clear", "delete", "remove", "accept", "reject", "consent", "banner", "dismiss", "block", "allow", "policy"}
)  # fmt: skip
#: Page script that reads the session: `document.cookie` (not an assignment to it), web storage
#: other than its writes, IndexedDB, Playwright's `cookies()`/`storageState()`, the extension API.
_SESSION_CODE: Final = re.compile(
    r"document\.cookie\b(?!\s*=[^=])|\b(?:local|session)Storage\b(?!\s*\.\s*(?:setItem|removeItem|clear)\b)"
    r"|\bindexedDB\.open\b|\.cookies\(|\bstorageState\(|\bchrome\.cookies\.get"
)

# ---- argument vocabulary ------------------------------------------------------------------

_PATH_KEYS: Final = frozenset(
    {"path", "paths", "file", "files", "filepath", "file_path", "filename", "file_name", "source", "src",
     "sources", "destination", "dest", "target", "script", "script_path", "scriptpath", "directory", "dir",
     "folder", "uri", "uris", "location", "input", "output", "output_path", "outfile", "infile", "cwd_file"}
)  # fmt: skip
#: Arguments naming a git object as `<revision>:<path>` (`HEAD~3:.env`): the part after `:` is a path read.
_REV_KEYS: Final = frozenset({"revision", "rev", "ref", "object", "treeish", "tree_ish", "spec", "blob"})
_REV_PATH: Final = re.compile(r"^[\w./~^@{}-]*:(?!//)([^\s:]+)$")
_DEST_KEYS: Final = frozenset({"destination", "dest", "target", "output", "output_path", "outfile", "to", "new_path", "newpath"})
#: Tools that run code: the URLs in their code are called (`browser_evaluate`, `run_script`).
_CODE_WORDS: Final = frozenset({"evaluate", "eval", "javascript", "js", "script", "code"})
_BODY_KEYS: Final = frozenset({"body", "data", "json", "payload", "form", "content", "contents", "message", "text", "attachment", "attachments", "file", "files", "params", "fields"})
_URL: Final = re.compile(r"\b(?:https?|ftp|wss?)://[^\s\"'<>`]+", re.I)

_ENV_PATH: Final = re.compile(r"^/proc/(?:self|\d+|thread-self)/environ$")
_RECON_PATH: Final = re.compile(
    r"""(?:^|/)(?:
        etc/(?:passwd|group|hosts|hostname|os-release|issue|resolv\.conf|crontab|fstab|lsb-release)
      | proc/(?:version|cpuinfo|meminfo|mounts|net/.+|self/(?:status|cmdline|maps)|\d+/cmdline)
      | \.bash_history | \.zsh_history | \.ssh/known_hosts | \.ssh/authorized_keys | \.ssh | \.aws | \.kube
    )/?$""",
    re.X,
)


@functools.lru_cache(maxsize=4096)
def tool_words(name: str) -> frozenset[str]:
    """The lower-case words of a tool name (`read_text_file`, `readTextFile`, `fs.read-file`)."""
    return frozenset(w.lower() for w in _WORD.findall(name))


def normalise_path(path: str) -> str:
    """A path as sequence rules compare it: `file://` dropped, `//`, `.` and `..` resolved lexically."""
    text = path.strip()
    if text[:7].lower() == "file://":
        text = text[7:]
    text = text[:_MAX_PATH_CHARS]
    return posixpath.normpath(text) if text else text


def safe_location(location: str) -> str:
    """A path or URL fit to keep in the session history: a URL loses its user, query and fragment
    (where exfiltrated data and tokens ride), so the history never stores what was sent."""
    if "://" not in location:
        return location[:_MAX_PATH_CHARS]
    scheme, _, rest = location.partition("://")
    rest = re.split(r"[?#]", rest, maxsplit=1)[0]
    host, slash, tail = rest.partition("/")
    return f"{scheme.lower()}://{host.rpartition('@')[2]}{slash}{tail}"[:_MAX_PATH_CHARS]


def _strings(value: Any, key: str, depth: int = 0) -> Iterator[tuple[str, str]]:
    """(nearest key, string) for every string in the arguments, bounded in depth."""
    if isinstance(value, str):
        yield key, value
    elif depth < _MAX_DEPTH and isinstance(value, Mapping):
        for k, v in value.items():
            yield from _strings(v, str(k).lower(), depth + 1)
    elif depth < _MAX_DEPTH and isinstance(value, list):
        for v in value:
            yield from _strings(v, key, depth + 1)


def _path_key(key: str) -> bool:
    """An argument that names a file: a known name, or one ending in path/file(s)/filename (`config_path`, `key_file`)."""
    if key in _PATH_KEYS:
        return True
    bare = key.replace("_", "").replace("-", "")
    return bare.endswith(("path", "paths", "file", "files", "filename", "filepath")) and bare not in ("profile", "profiles")


def _dest_key(key: str) -> bool:
    """An argument that names where something is written (`destination`, `output_path`, `save_file`)."""
    return key in _DEST_KEYS or (key != "to" and key.startswith(("dest", "target", "output", "out_", "save", "new_")))


def _add(classes: set[str], paths: dict[str, list[str]], cls: str, location: str | None = None) -> None:
    classes.add(cls)
    bucket = paths.setdefault(cls, [])
    if location and location not in bucket and len(bucket) < _MAX_PATHS:
        bucket.append(location)


#: `classify_call` answers for flat arguments (a dict of strings, numbers, booleans and nulls,
#: short in all), keyed on exactly what it reads: the tool name, the two annotations it heeds and
#: the arguments' items in order. Agents repeat calls (the same file read, the same search);
#: bounded, emptied when full; callers get copies.
_CLASSIFIED: Memo[tuple[Any, ...], tuple[frozenset[str], tuple[tuple[str, tuple[str, ...]], ...]]] = Memo(2048)
_CLASSIFIED_LONGEST: Final = 1024
_FLAT: Final = frozenset({str, int, float, bool, type(None)})


def classify_call(
    tool: str, annotations: Mapping[str, Any], arguments: Any, *, remember: bool = True
) -> tuple[set[str], dict[str, list[str]]]:
    """The classes of one call and the paths/URLs each touches (see the module docstring).

    `remember=False` keeps these arguments out of the memo (the sanitizer passes it for arguments
    with findings: a secret is not kept around longer than its call)."""
    key = _flat_key(tool, annotations, arguments) if remember else None
    if key is None:
        return _classify(tool, annotations, arguments)
    done = _CLASSIFIED.get(key)
    if done is None:
        classes, paths = _classify(tool, annotations, arguments)
        _CLASSIFIED.remember(key, (frozenset(classes), tuple((c, tuple(p)) for c, p in paths.items())))
        return classes, paths
    return set(done[0]), {c: list(p) for c, p in done[1]}


def _flat_key(tool: str, annotations: Mapping[str, Any], arguments: Any) -> tuple[Any, ...] | None:
    """The memo key of a call with flat, short arguments; None for any other."""
    if type(arguments) is not dict:
        return None
    size = len(tool)
    for k, v in arguments.items():
        kind = type(v)
        if type(k) is not str or kind not in _FLAT:
            return None
        size += len(k) + (len(v) if kind is str else 8)
    if size > _CLASSIFIED_LONGEST:
        return None
    # Types are part of the key: 1, 1.0 and True are equal as keys but not the same argument.
    items = tuple((k, type(v), v) for k, v in arguments.items())
    return tool, annotations.get("destructiveHint") is True, annotations.get("openWorldHint") is True, items


def _classify(
    tool: str, annotations: Mapping[str, Any], arguments: Any
) -> tuple[set[str], dict[str, list[str]]]:
    """`classify_call` without the memo."""
    words = tool_words(tool)
    classes: set[str] = set()
    paths: dict[str, list[str]] = {}
    file_paths: list[tuple[str, str]] = []  # (key, normalised path)
    urls: list[str] = []
    keys: set[str] = set()
    said: list[str] = []  # `key: value` of what a send carries (personal data)
    publishes = bool(words & _PUBLISH_THINGS and words & _PUBLISH_VERBS)
    runs_code = bool(words & _CODE_WORDS)
    sends = bool(words & _SEND_WORDS) or publishes
    addressees: list[str] = []  # who a send goes to (`to`, `cc`, `recipient`)
    named: list[tuple[str, str]] = []  # (key, identifier) of what a read tool names: a kind, a key
    for seen, (key, text) in enumerate(_strings(arguments, "")):
        if seen >= _MAX_STRINGS:
            break
        keys.add(key)
        if len(named) < _MAX_PATHS and (key in _KIND_KEYS or key in _NAME_KEYS or key == "path") and len(text) <= 128 and " " not in text:
            named.append((key, text))
        if (sends or words & _SQL_WORDS) and key not in _RECIPIENT_KEYS:
            said.append(f"{key}: {_plain(text)}")
        elif sends and key in _ADDRESSEE_KEYS:
            addressees.append(text)
        if "://" in text and text[:7].lower() != "file://":
            whole = _URL.fullmatch(text.strip())
            if whole is not None:
                urls.append(whole.group(0))  # an address the call goes to
            elif sends or runs_code:  # a message's links, or the URLs a script calls
                urls.extend(m.group(0) for m in _URL.finditer(text, 0, 65_536))
        elif _path_key(key) and text and "\n" not in text and len(text) <= 4096:
            file_paths.append((key, normalise_path(text)))
        elif key in _REV_KEYS and ":" in text and (rev := _REV_PATH.match(text)) is not None:
            file_paths.append((key, normalise_path(rev.group(1))))
    reads = bool(words & _READ_WORDS) or bool(words & _EXEC_WORDS) or sends  # running or sending a file reads it
    lists = bool(words & _LIST_WORDS)
    for key, path in file_paths:
        low = path.lower()
        if reads and not _dest_key(key):
            if _ENV_PATH.match(low):
                _add(classes, paths, "env_read", path)
            elif CREDENTIAL_FILE.search(low) or (not _RECON_PATH.search(low) and sensitive_path(path)):
                _add(classes, paths, "credential_read", path)  # also stores and system secrets: keytabs, mounted tokens
        if (reads or lists) and _RECON_PATH.search(low):
            _add(classes, paths, "recon", path)
        if words & _WRITE_WORDS and not words & _DEST_WORDS:
            _add(classes, paths, "write", path)
        elif words & _DEST_WORDS and (_dest_key(key) or "download" in words):  # a download's path is where it lands
            _add(classes, paths, "write", path)
        if words & _EXEC_WORDS and not _dest_key(key):
            _add(classes, paths, "execute", path)
        if words & _DESTRUCTIVE_WORDS:
            _add(classes, paths, "destructive", path)
    if words & _ENV_WORDS:
        _add(classes, paths, "env_read")
    if not sends and (where := _secret_read(tool, words, named)) is not None:
        _add(classes, paths, "credential_read", where)
    if _session_read(words, runs_code, arguments):
        _add(classes, paths, "credential_read", tool)
    if words & _EXEC_WORDS and "execute" not in classes and not file_paths and words & {"script", "file", "python", "node", "eval"}:
        _add(classes, paths, "execute")
    recon = words & _RECON_WORDS
    if recon and (recon - _RECON_NEEDS_CONTEXT or words & {"list", "get", "info", "show", "scan", "enumerate"}):
        _add(classes, paths, "recon")
    if words & _DESTRUCTIVE_WORDS or annotations.get("destructiveHint") is True:
        _add(classes, paths, "destructive")
    open_world = annotations.get("openWorldHint") is True
    sender = sends or (bool(urls) and open_world)
    if open_world and not urls and keys & _BODY_KEYS and "network_send" not in classes:
        _add(classes, paths, "network_send")  # text typed into a page, a form filled: carried to the outside world
    for url in urls:
        carries = bool(url.split("#", 1)[0].partition("?")[2]) or bool(keys & _BODY_KEYS)
        if sender or carries:
            _add(classes, paths, "network_send", safe_location(url))
        if words & _DOWNLOAD_WORDS:
            _add(classes, paths, "download", safe_location(url))
    if sender and (words & _SEND_WORDS - {"navigate", "browse", "api"} or publishes) and "network_send" not in classes:
        _add(classes, paths, "network_send")
    _records(words, sends, said, addressees, classes, paths)
    _bulk_and_outside(words, sends, said, addressees, classes, paths)
    return classes, paths


def _bulk_and_outside(
    words: frozenset[str], sends: bool, said: list[str], addressees: list[str], classes: set[str], paths: dict[str, list[str]]
) -> None:
    """`bulk_read` for a read of a whole collection (an export/dump/backup/download tool of a
    collection or of records, a SQL read of every row) and `outside_send` for a send to a place
    outside any organisation (`destinations.outside_location`: a public drop, a bare IP, a consumer
    mailbox; a gist or paste tool). Round 8: docs/detection.md, "Bulk reads leaving"."""
    if not sends and words & _BULK_VERBS and words & _BULK_NOUNS:
        _add(classes, paths, "bulk_read")
    elif not sends and words & _SQL_WORDS and any(BULK_SQL.search(t) for t in said):
        _add(classes, paths, "bulk_read")
    if "network_send" not in classes:
        return
    for where in paths.get("network_send", ()):
        if outside_location(where):
            _add(classes, paths, "outside_send", where)
    for who in addressees:
        for address in re.split(r"[,;\s]+", who)[:16]:
            if outside_location(address) == "mailbox":
                _add(classes, paths, "outside_send", "mailbox:" + address.rpartition("@")[2].lower())
    if words & _PUBLIC_WORDS:
        _add(classes, paths, "outside_send")


def _plain(text: str) -> str:
    """A send's value as its reader gets it: percent-decoded, and a base64 token decoded too."""
    if "%" in text:
        text = unquote_plus(text)
    if len(text) >= 32 and _BASE64_VALUE.fullmatch(text):
        raw = decode_base64(text)
        if raw is not None:
            return text + "\n" + raw.decode("utf-8", "replace")
    return text


def _secret_read(tool: str, words: frozenset[str], named: list[tuple[str, str]]) -> str | None:
    """Where a call reads a value from a secret store, or None: a store's read tool (`vault_read`,
    `get_secret_value`, `op_item_get`, `kms_decrypt`, `keychain_find_password`, an SSM parameter
    read), or a read tool asked for a Kubernetes Secret or a config key that names a secret
    (`git_config_get http.…extraheader`). Listing names and describing metadata are not reads."""
    if words & _SECRET_META or not words & (_SECRET_READS | _READ_WORDS):
        return None
    store = bool(words & _SECRET_STORES) or {"ssm", "parameter"} <= words or {"op", "item"} <= words
    ident = next((text for key, text in named if key in _NAME_KEYS), "")
    if not store:
        kinds = {text.lower() for key, text in named if key in _KIND_KEYS}
        if not kinds & {"secret", "secrets", "v1/secret"} and not (ident and _SECRET_NAME.search(ident)):
            return None
    ident = ident or next((text for key, text in named if key == "path"), "")
    return f"{tool}:{ident}" if ident else tool


def _session_read(words: frozenset[str], runs_code: bool, arguments: Any) -> bool:
    """Whether a call reads a browser session: a cookie or web-storage read tool (`storage` with
    `local`, `session` or `state`), or page script whose code reads `document.cookie` or storage."""
    nouns = words & _SESSION_NOUNS
    if nouns and not words & _SESSION_WRITES:
        if nouns != {"storage"} or words & {"local", "session", "state"}:
            return bool(words & (_READ_WORDS | _SECRET_READS | _LIST_WORDS | {"state", "save"}))
    if not runs_code:
        return False
    return any(("ookie" in text or "torage" in text or "indexedDB" in text) and _SESSION_CODE.search(text, 0, 65_536)
               for _, text in _strings(arguments, ""))


def _records(
    words: frozenset[str], sends: bool, said: list[str], addressees: list[str], classes: set[str], paths: dict[str, list[str]]
) -> None:
    """`records_read` for a tool that reads records of people (its name, or a SQL read) and
    `personal_data` for a send that carries data about people (docs/detection.md, "Personal data
    leaving"), unless it is one person's record sent to that person (`_own_record`)."""
    if not sends and (words & _RECORD_NOUNS and words & _RECORD_READS or words & _SQL_WORDS and any(_SQL_READ.search(t) for t in said)):
        _add(classes, paths, "records_read")
    if "network_send" in classes and said:
        text = "\n".join(said)
        kinds = personal_kinds(text)
        if carries_personal(kinds) and not _own_record(text, kinds, addressees):
            _add(classes, paths, "personal_data")


def _own_record(text: str, kinds: dict[str, int], addressees: list[str]) -> bool:
    """One person's record sent to that person (a GDPR access request, a confirmation of the
    details on file): one value of each kind, and the one email in it is an addressee's."""
    if not addressees or any(count > 1 for kind, count in kinds.items() if kind != "name"):
        return False
    found = emails(text)
    return len(found) == 1 and found <= emails("\n".join(addressees))


def result_classes(result: Any) -> set[str]:
    """Classes a call earns by what it answered, whatever the tool is called: `records_read` when its
    text holds the records of several people (two or more emails, phone numbers, IBANs, national
    ids, birth dates, addresses or salaries with other personal data: a report, an export, a
    database page, a table);
    `credential_read` when it holds a private key or a vendor-format credential (a settings tool
    answering with a deploy key, a state file full of access keys: redacted before the model saw
    it, but the agent reached the secrets); `confidential_read` when a classification marking heads
    or ends it (`_marked`). Character counts and `in` tests gate each look."""
    text = _result_text(result)
    if not text:
        return set()
    found: set[str] = set()
    if any(h[0] in ("private_key", "api_key") for h in credential_hits(text)):
        found.add("credential_read")
    if _marked(text):
        found.add("confidential_read")
    if text.count("@") >= 2 or text.count("+") >= 2:
        kinds = personal_kinds(text)
    elif text.count("\n", 0, _ROWS_SPAN) >= 2:  # rows without contacts: birth dates, addresses
        kinds = personal_kinds(text[:_ROWS_SPAN])
    else:
        return found
    if carries_personal(kinds) and any(kinds.get(k, 0) >= 2 for k in ("email", "phone", "iban", "national_id", "birthdate", "address", "pay")):
        found |= {"records_read", "bulk_read"}  # the records of several people: a list taken out
    return found


_ROWS_SPAN: Final = 16_384  # characters of an answer without emails or phone numbers read for rows of people

#: A classification marking: an optional label (`Classification:`, `Einstufung:`), then the level.
_MARKING: Final = re.compile(
    r"""(?:(?P<label>classification|classified|sensitivity|security\ label|einstufung|klassifizierung|clasificaci[oó]n|
          classification\ de\ s[ée]curit[ée]|niveau|data\ class(?:ification)?)\s*[:=\-–—]\s*)?
        (?P<mark>(?:strictly\ |highly\ |company\ |business\ |commercially\ |streng\ |strictement\ |estrictamente\ )?
          (?:confidential|internal\ (?:use\ )?only|for\ internal\ use\ only|restricted|top\ secret|secret|
             privileged(?:\ (?:&|and)\ confidential)?|proprietary(?:\ (?:&|and)\ confidential)?|attorney[-\ ]client\ privileged|
             vertraulich|geheim|nur\ f[üu]r\ den\ internen\ gebrauch|confidentiel(?:le)?|diffusion\ restreinte|
             confidencial|reservado|riservato|confidenziale|vertrouwelijk|poufne|sekretess|fortrolig|
             機密|社外秘|极密|机密|绝密|대외비))(?![a-z])""",
    re.I | re.X,
)
_WEAK_MARKS: Final = frozenset({"secret", "restricted", "geheim", "reservado", "top secret"})  # also headings: capitals or a label only
_DECORATION: Final = " \t*#=_~|[](){}<>:-–—•"
_MARKING_SPAN: Final = 2_048  # characters read at each end of a document


def _marked(text: str) -> bool:
    """Whether a classification marking stands at the start of a line in the head or the tail of a
    document: with a label (`Classification: Internal only`), written in capitals (`STRICTLY
    CONFIDENTIAL`), or as a short line of its own (`Confidential – draft`). Prose that says data is
    kept confidential, mid-sentence or in a long line, is no marking."""
    ends = text if len(text) <= 2 * _MARKING_SPAN else text[:_MARKING_SPAN] + "\n" + text[-_MARKING_SPAN:]
    for line in ends.splitlines():
        bare = line.strip(_DECORATION)
        m = _MARKING.match(bare)
        if m is None:
            continue
        mark = m.group("mark")
        short = len(bare.split()) <= 6 and mark.lower() not in _WEAK_MARKS
        if m.group("label") or (mark.isupper() if mark.isascii() else True) or short:
            return True
    return False


def _result_text(result: Any) -> str:
    """The text blocks of an MCP tool result, joined, bounded."""
    content = result.get("content") if isinstance(result, Mapping) else None
    if not isinstance(content, list):
        return ""
    parts: list[str] = []
    size = 0
    for block in content[:64]:
        text = block.get("text") if isinstance(block, Mapping) else None
        if isinstance(text, str):
            parts.append(text[: _MAX_RESULT_TEXT - size])
            size += len(parts[-1])
            if size >= _MAX_RESULT_TEXT:
                break
    return "\n".join(parts)


def merge_classes(classes: set[str], class_paths: dict[str, list[str]], more: set[str], more_paths: dict[str, list[str]]) -> None:
    """Union one classification into another (the tool's and its shell command's both count)."""
    classes |= more
    for cls, found in more_paths.items():
        bucket = class_paths.setdefault(cls, [])
        bucket.extend(p for p in found if p not in bucket)


def history_detail(ctx: CallContext, *, ran: bool) -> dict[str, Any]:
    """What the session history keeps of a call for later sequence rules: its classes, the paths
    each touched (normalised; URLs without user, query or fragment), the kinds of its argument
    findings, whether it reached its backend, and its time in epoch seconds. A call that ran also
    keeps the classes its answer earns (`result_classes`: records of people, credentials, a
    confidential document, whatever the tool is called), each with "the answer of <tool>" as its path."""
    classes = set(ctx.classes)
    earned: set[str] = set()
    # A send's answer echoes what was sent; a "fetch" of a document by id (no URL) is a read.
    if ran and ctx.answer is not None and not ctx.answer.is_error and not ctx.class_paths.get("network_send"):
        earned = result_classes(ctx.answer.result) - classes
        classes |= earned
    return {
        "at": ctx.clock,
        "ran": ran,
        "classes": sorted(classes),
        "paths": {
            cls: [f"the answer of {ctx.call.tool[:128]}"] if cls in earned else
            [safe_location(p) if "://" in p else normalise_path(p) for p in ctx.class_paths.get(cls, ())[:_MAX_PATHS]]
            for cls in sorted(classes)
        },
        "findings": sorted({f.kind for f in ctx.findings}),
    }
