"""The one list of files that hold credentials or system secrets, and the tests on it.

Three parts, each a regular expression over a lower-case POSIX path:
- `CREDENTIAL_FILE`: credential files wherever they are (`.env`, `.netrc`, `id_rsa`, cloud
  credentials, browser login stores, wallets, private keys). The call classification
  (`gateway/stages/classify.py`) calls a read of one a `credential_read`.
- credential stores: directories that hold credentials (`~/.ssh`, `~/.aws`, `~/.gnupg`,
  `~/.kube`, `~/.config/gcloud`, keychains, browser profiles…), the directory itself and
  everything below it except public keys (`*.pub`);
- system secrets: `/etc/shadow`, `/etc/passwd`, `/etc/sudoers`, SSH host keys,
  `/proc/*/environ`, mounted service-account secrets, shell histories. Files under `/etc`
  count when the path is absolute or climbs out of the working directory (`../../etc/passwd`),
  so a project's own `fixtures/etc/passwd` does not.

`sensitive_path(p)` is any of the three: the CEL helper of the same name, used by the
filesystem rules for file tools and by the shell rules for the paths a command touches
(docs/detection.md). A path with glob characters (`/e??/p?ss??`, `~/.a*/cred*`) is sensitive
when the glob matches one of `EXEMPLARS`, a sample of every kind of path above. Pure, no I/O
and no project imports.
"""

from __future__ import annotations

import functools
import posixpath
import re
from typing import Final

__all__ = ["CREDENTIAL_FILE", "EXEMPLARS", "glob_pattern", "normalise", "sensitive_path"]

CREDENTIAL_FILE: Final = re.compile(
    r"""(?:^|/)(?:
        \.ssh/(?!.*\.pub$)(?!known_hosts)(?!authorized_keys)[^/]+
      | id_(?:rsa|dsa|ecdsa|ed25519)(?:_sk)?
      | \.aws/(?:credentials|config) | \.azure/[^/]+ | \.config/gcloud/[^/]*(?:credentials|token)[^/]*
      | \.env(?!\.(?:example|sample|template|dist|defaults)$)(?:\.[\w.-]+)?
      | _?\.?netrc | \.pgpass | \.my\.cnf | \.git-credentials | \.npmrc | \.pypirc | \.vault-token | \.boto
      | \.docker/config\.json | \.kube/config | \.terraform\.d/credentials\.tfrc\.json | \.config/gh/hosts\.yml
      | \.cargo/credentials(?:\.toml)? | \.gem/credentials | \.m2/settings(?:-security)?\.xml | \.gradle/gradle\.properties
      | (?:\.composer|\.config/composer)/auth\.json | \.terraformrc | \.databrickscfg | \.oci/config | \.s3cfg
      | \.config/rclone/rclone\.conf | \.config/hub | \.config/github-copilot/(?:hosts|apps)\.json | \.dockercfg
      | \.config/doctl/config\.yaml | \.kaggle/kaggle\.json | (?:\.cache/)?huggingface/token | \.htpasswd
      | \.config/git/credentials
      | etc/(?:shadow|gshadow|sudoers|master\.passwd)- ? | etc/ssh/ssh_host_[^/]*_key
      | \.gnupg/[^/]+ | \.password-store/.+ | \.local/share/keyrings/[^/]+ | library/keychains/.+
      | [^/]*\.keychain(?:-db)? | kwallet[^/]*
      | (?:google-chrome|chromium|bravesoftware/brave-browser|microsoft/edge|chrome)/.*/(?:cookies|login\ data|web\ data)
      | \.mozilla/firefox/.*/(?:cookies\.sqlite|logins\.json|key[34]\.db) | cookies\.sqlite
      | wallet\.dat | \.bitcoin/.+ | \.ethereum/keystore/.* | electrum/wallets/.+ | solana/id\.json
      | credentials(?:\.json)? | [^/]*\.(?:key|p12|pfx|jks|keystore|kdbx)
      | (?![^/]*(?:cert|chain|bundle|pub))(?!ca(?:[-_.][^/]*)?\.pem$)[^/]*\.pem
    )$""",
    re.X,
)
"""Credential files (a read of one is a `credential_read` for the sequence rules). A `.pem` whose
name says it is a certificate (`cert`, `chain`, `bundle`, `pub`, `ca`) is not one."""

_STORE: Final = re.compile(
    r"""(?:^|/)(?:
        \.ssh | \.aws | \.azure | \.gnupg | \.kube | \.password-store | \.config/gcloud | \.config/gh
      | \.local/share/keyrings | library/keychains | \.mozilla/firefox | library/application\ support/firefox
      | \.config/(?:google-chrome|chromium|bravesoftware/brave-browser|microsoft-edge)
      | library/application\ support/(?:google/chrome|chromium|bravesoftware/brave-browser|microsoft\ edge)
      | appdata/(?:local|roaming)/(?:google/chrome|microsoft/edge|bravesoftware/brave-browser|mozilla/firefox)
      | \.bitcoin | \.ethereum/keystore | \.electrum | \.config/solana | \.config/op | \.config/bitwarden\ cli | \.lpass
    )(?:/(?!.*\.pub$).*)?$""",
    re.X,
)
"""Credential stores: the directory and everything below it, public keys aside."""

_SYSTEM: Final = re.compile(
    r"""(?:
        ^(?:/|(?:~[^/]*/)?(?:\.\./)+)etc/(?:
            passwd-?|shadow-?|gshadow-?|master\.passwd|sudoers|sudoers\.d(?:/.*)?|security/opasswd
          | ssh/ssh_host_[^/]*_key|krb5\.keytab|kubernetes/(?:admin\.conf|pki(?:/.*)?)|rancher/k3s/k3s\.yaml
          | ssl/private(?:/.*)?|networkmanager/system-connections(?:/.*)?|wpa_supplicant/[^/]*\.conf|mysql/debian\.cnf)
      | ^/proc/[^/]+/environ | ^(?:/var)?/run/secrets(?:/.*)?
      | (?:^|/)\.(?:bash|zsh|sh|psql|mysql|python|node_repl|sqlite)_history
    )$""",
    re.X,
)
"""System secrets: account and password databases, host keys, process environments, mounted
secrets (absolute or climbing paths), and shell histories (wherever they are)."""

EXEMPLARS: Final = (
    "~/.ssh/id_rsa", "~/.ssh/id_ed25519", "~/.ssh/config", "~/.aws/credentials", "~/.aws/config",
    "~/.azure/accesstokens.json", "~/.gnupg/secring.gpg", "~/.kube/config", "~/.docker/config.json",
    "~/.config/gcloud/credentials.db", "~/.config/gcloud/application_default_credentials.json",
    "~/.config/gh/hosts.yml", "~/.netrc", "~/.pgpass", "~/.my.cnf", "~/.git-credentials", "~/.npmrc",
    "~/.pypirc", "~/.vault-token", "~/.bash_history", "~/.zsh_history", "~/.password-store/x.gpg",
    "~/library/keychains/login.keychain-db", "~/.local/share/keyrings/login.keyring",
    "~/.config/google-chrome/default/login data", "~/.config/google-chrome/default/cookies",
    "~/library/application support/google/chrome/default/login data",
    "~/.mozilla/firefox/x.default/logins.json", "~/.mozilla/firefox/x.default/key4.db",
    "~/.bitcoin/wallet.dat", "~/.ethereum/keystore/x", "~/.config/solana/id.json",
    ".env", ".env.local", ".env.production", "/etc/passwd", "/etc/shadow", "/etc/gshadow", "/etc/sudoers",
    "/etc/master.passwd", "/etc/ssh/ssh_host_rsa_key", "/etc/ssh/ssh_host_ed25519_key", "/proc/self/environ",
    "/proc/1/environ", "/var/run/secrets/kubernetes.io/serviceaccount/token", "/run/secrets/db_password",
    "~/.cargo/credentials.toml", "~/.m2/settings.xml", "~/.config/op/config", "/etc/ssl/private/server.key",
    "/etc/networkmanager/system-connections/home.nmconnection",
)  # fmt: skip
"""A sample of every kind of sensitive path, in the home's `~` form where it lives in a home: a
glob is sensitive when it matches one (a test checks each one is `sensitive_path`)."""

_HOMES: Final = ("~", "/root", "/home/user", "/users/user")
_HOME_DIR: Final = re.compile(r"^/(home|users)/[^/]+(?=/|$)")
_GLOB: Final = re.compile(r"\*\*/?|[*?]|\[!?\]?[^\]]*\]")


def normalise(path: str) -> str:
    """A path as the list compares it: lower case, `/` separators, `file://` dropped, `//`, `.`
    and `..` resolved lexically (a leading `~`/`~user` and leading `..` are kept)."""
    text = path.strip().replace("\\", "/").lower()
    if text.startswith("file://"):
        text = text[7:]
    if not text:
        return text
    if text.startswith("~"):
        head, _, rest = text.partition("/")
        return head + ("/" + posixpath.normpath(rest) if rest and posixpath.normpath(rest) != "." else "")
    return posixpath.normpath(re.sub(r"/{2,}", "/", text))


@functools.lru_cache(maxsize=4096)
def sensitive_path(path: str) -> bool:
    """Whether `path` is a credential file, lies in a credential store, or is a system secret;
    for a glob, whether it matches one of `EXEMPLARS`. Raises TypeError for a non-string."""
    if not isinstance(path, str):
        raise TypeError(f"sensitive_path() expects a string, got {type(path).__name__}")
    p = normalise(path)
    if CREDENTIAL_FILE.search(p) or _STORE.search(p) or _SYSTEM.search(p):
        return True
    if not _GLOB.search(p):
        return False
    pattern = glob_pattern(_HOME_DIR.sub("/home/user", p))
    return any(pattern.fullmatch(e) for e in _exemplars_for(p))


def _exemplars_for(glob: str) -> list[str]:
    """The exemplars a glob could name: absolute ones (and home ones under /root, /home/user,
    /Users/user) for an absolute glob, home ones for a `~` glob, relative ones for a relative
    glob unless it is a bare tree (`**`, `src/**`: everything find lists under a workspace
    directory, not a request for `.env`; a named pattern such as `**/.env*` is)."""
    homes = [e for e in EXEMPLARS if e.startswith("~")]
    if glob.startswith("/"):
        return [e for e in EXEMPLARS if e.startswith("/")] + [h + e[1:] for e in homes for h in _HOMES[1:]]
    if glob.startswith("~"):
        return homes
    if glob == "**" or glob.endswith("/**"):
        return []
    return [e for e in EXEMPLARS if not e.startswith(("/", "~"))]


@functools.lru_cache(maxsize=1024)
def glob_pattern(glob: str) -> re.Pattern[str]:
    """A shell glob as a regular expression: `*` and `?` stay within one path segment, `**`
    crosses segments (`**/` also none), `[…]`/`[!…]` are character classes; everything else is
    literal."""
    out: list[str] = []
    pos = 0
    for m in _GLOB.finditer(glob):
        out.append(re.escape(glob[pos : m.start()]))
        token = m.group()
        if token == "**/":
            out.append("(?:.*/)?")  # any depth, none included
        elif token == "**":
            out.append(".*")
        elif token in ("*", "?") or token.startswith("["):
            if m.start() == 0 or glob[m.start() - 1] == "/":
                out.append("(?!\\.)")  # as in bash, a glob does not match a segment's leading dot
            out.append("[^/]*" if token == "*" else "[^/]" if token == "?" else _bracket(token))
        pos = m.end()
    out.append(re.escape(glob[pos:]))
    return re.compile("".join(out), re.S)


def _bracket(token: str) -> str:
    """A glob's `[…]` / `[!…]` as a regular expression character class."""
    body = token[1:-1]
    negate = body.startswith("!")
    body = body[1:] if negate else body
    if not body:  # `[]` / `[!]` is no class to bash either: the brackets are literal
        return re.escape(token)
    return "[" + ("^" if negate else "") + body.replace("\\", "\\\\").replace("[", "\\[") + "]"
