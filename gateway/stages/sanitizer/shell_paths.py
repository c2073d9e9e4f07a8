"""What a shell command does to the files it names: each path operand as read, write, delete,
execute or list, resolved the way the shell would see it.

`command_paths` knows the common commands' syntax (which options take a value, which operand
is a pattern or a program rather than a file, which operand a copy writes), `resolve` turns an
operand into a path (`~`, `$HOME`, `$PWD`, `..`, the working directory a `cd` left), and
`inline_paths` / `inline_commands` read the string literals of code given on the command line
(`python3 -c`, `node -e`…). Used by the shell analysis (`shell.py`), which expands the words
first (quotes, escapes, variables, substitutions, look-alike letters) and exposes the result
as `args_shell.paths` (docs/detection.md, "Shell analysis"). Pure functions, no I/O.
"""

from __future__ import annotations

import posixpath
import re
from typing import Final

__all__ = ["REMOTE", "SYSTEM_BIN", "command_paths", "find_targets", "fold_inline", "inline_commands", "inline_paths", "is_outside",
           "listing", "normpath", "resolve"]

#: Programs installed by the system: running one is not "executing a path" worth listing.
SYSTEM_BIN: Final = re.compile(r"^/(usr/)?(local/)?s?bin/")
#: `host:path` or `user@host:path` (scp, rsync): a remote operand, not a local path.
REMOTE: Final = re.compile(r"^([A-Za-z0-9_.-]+@)?[A-Za-z0-9_.-]+:[^/]?")

#: A path operand the caller resolves: (operation, word as the command got it, index in its
#: arguments, or -1 for a word built here such as `find`'s `dir/**`).
Use = tuple[str, str, int]

_READ: Final = frozenset({
    "cat", "tac", "less", "more", "most", "head", "tail", "nl", "od", "hexdump", "xxd", "strings", "base64",
    "base32", "basenc", "wc", "md5sum", "sha1sum", "sha224sum", "sha256sum", "sha384sum", "sha512sum", "b2sum",
    "cksum", "sum", "file", "bat", "batcat", "view", "vi", "vim", "nvim", "nano", "emacs", "pico", "fold", "fmt",
    "column", "rev", "iconv", "expand", "unexpand", "paste", "comm", "join", "diff", "cmp", "sdiff", "cut", "sort",
    "pr", "zcat", "bzcat", "xzcat", "zless", "zmore", "gpg", "gpg2", "look",
    "grep", "egrep", "fgrep", "rg", "ag", "ack", "zgrep", "awk", "gawk", "mawk", "nawk", "sed", "jq", "yq", "perl",
})  # fmt: skip
_DELETE: Final = frozenset({"rm", "rmdir", "unlink", "shred", "srm", "wipe", "trash", "trash-put", "truncate"})
_WRITE: Final = frozenset({"touch", "mkdir", "tee", "chmod", "chown", "chgrp", "chattr", "setfacl"})
_LIST: Final = frozenset({"ls", "dir", "tree", "du", "stat", "realpath", "readlink", "exa", "eza", "lsattr",
                          "getfacl", "namei", "find", "fd", "locate"})  # fmt: skip
_COPY: Final = frozenset({"cp", "mv", "install", "ln", "rsync", "scp"})
_SHELLISH: Final = frozenset({"sh", "bash", "zsh", "dash", "ksh", "ash", "mksh", "fish", "csh", "tcsh", "yash", "rbash"})

#: Options that take a value (so the value is not an operand), per command.
_VALUES: Final[dict[str, frozenset[str]]] = {
    "head": frozenset({"-n", "-c", "--lines", "--bytes"}), "tail": frozenset({"-n", "-c", "-s", "--lines", "--bytes", "--pid"}),
    "cut": frozenset({"-d", "-f", "-c", "-b", "--delimiter", "--fields"}), "sort": frozenset({"-k", "-t", "-T", "-S", "-o", "--output"}),
    "grep": frozenset({"-e", "-f", "-m", "-A", "-B", "-C", "-d", "-D", "--regexp", "--file"}),
    "rg": frozenset({"-e", "-f", "-g", "-t", "-T", "-m", "-A", "-B", "-C", "-j", "-M", "-r", "--glob", "--type", "--regexp", "--file"}),
    "awk": frozenset({"-F", "-v", "-f"}), "sed": frozenset({"-e", "-f", "-l", "--expression", "--file"}),
    "jq": frozenset({"-f", "--from-file", "--indent", "--arg", "--argjson", "--slurpfile", "--rawfile"}),
    "xxd": frozenset({"-c", "-g", "-l", "-s", "-o"}), "od": frozenset({"-t", "-N", "-j", "-A", "-w"}),
    "base64": frozenset({"-w", "--wrap"}), "iconv": frozenset({"-f", "-t", "-o"}), "column": frozenset({"-s", "-t", "-c"}),
    "gpg": frozenset({"-o", "--output", "-r", "--recipient", "-u", "--local-user", "--passphrase"}),
    "sqlite3": frozenset({"-cmd", "-separator", "-newline", "-nullvalue"}), "diff": frozenset({"-U", "-C", "--label"}),
    "touch": frozenset({"-d", "-t", "-r", "--date", "--reference"}), "mkdir": frozenset({"-m", "--mode"}),
    "truncate": frozenset({"-s", "-r", "--size", "--reference"}), "shred": frozenset({"-n", "-s", "--iterations", "--size"}),
    "ls": frozenset({"-I", "-w", "--ignore", "--hide"}), "tree": frozenset({"-L", "-P", "-I", "-o"}),
    "du": frozenset({"-d", "-B", "--max-depth", "--exclude"}), "stat": frozenset({"-c", "--format", "--printf"}),
    "cp": frozenset({"-t", "-S", "--target-directory", "--suffix"}), "mv": frozenset({"-t", "-S", "--target-directory", "--suffix"}),
    "install": frozenset({"-m", "-o", "-g", "-t", "-S", "--mode", "--owner", "--group", "--target-directory"}),
    "ln": frozenset({"-t", "-S", "--target-directory", "--suffix"}),
    "rsync": frozenset({"-e", "--rsh", "--exclude", "--include", "-f", "--filter", "--port", "--exclude-from", "--include-from",
                        "--files-from", "--password-file", "-T", "--temp-dir", "--bwlimit", "--chmod", "--chown", "--log-file", "-M"}),
    "scp": frozenset({"-i", "-P", "-o", "-F", "-c", "-l", "-S", "-J"}),
    "curl": frozenset({"-o", "--output", "-H", "--header", "-d", "--data", "--data-binary", "--data-raw", "--data-ascii",
                       "--data-urlencode", "-X", "--request", "-u", "--user", "-A", "--user-agent", "-e", "--referer", "-F",
                       "--form", "--form-string", "-T", "--upload-file", "-x", "--proxy", "-b", "--cookie", "-c", "--cookie-jar",
                       "-K", "--config", "-w", "--write-out", "-m", "--max-time", "--connect-timeout", "--url", "--json", "-r",
                       "--range", "-E", "--cert", "--key", "--cacert", "--resolve", "--retry", "-D", "--dump-header",
                       "--output-dir", "-z", "--time-cond"}),
    "wget": frozenset({"-O", "--output-document", "-o", "--output-file", "-a", "--append-output", "-P", "--directory-prefix",
                       "-U", "--user-agent", "--header", "-e", "--execute", "-t", "--tries", "-T", "--timeout", "--post-data",
                       "--post-file", "--body-data", "--body-file", "--method", "-i", "--input-file", "--user", "--password"}),
    "tar": frozenset({"-f", "--file", "-C", "--directory", "-T", "--files-from", "-X", "--exclude-from", "-b", "-H", "--format",
                      "-I", "--use-compress-program", "--exclude", "-g", "--listed-incremental"}),
    "zip": frozenset({"-b", "-n", "-t", "-tt", "-P", "-O", "--password"}), "unzip": frozenset({"-d", "-P"}),
    "openssl": frozenset(), "git": frozenset({"-C", "-c", "--git-dir", "--work-tree", "--namespace"}),
    "find": frozenset(), "chmod": frozenset({"--reference"}), "chown": frozenset({"--reference"}), "chgrp": frozenset({"--reference"}),
    "perl": frozenset({"-e", "-E"}),
}  # fmt: skip
_ALIASES: Final = {"egrep": "grep", "fgrep": "grep", "zgrep": "grep", "ag": "rg", "ack": "rg", "gawk": "awk", "mawk": "awk",
                   "nawk": "awk", "yq": "jq", "gpg2": "gpg", "batcat": "bat"}  # fmt: skip
#: Commands whose first operand is a pattern or a program, unless one of these options gave it.
_LEADING: Final[dict[str, frozenset[str]]] = {
    "grep": frozenset({"-e", "-f", "--regexp", "--file"}), "rg": frozenset({"-e", "-f", "--regexp", "--file"}),
    "awk": frozenset({"-f"}), "sed": frozenset({"-e", "-f", "--expression", "--file"}), "jq": frozenset({"-f", "--from-file"}),
    "chmod": frozenset({"--reference"}), "chown": frozenset({"--reference"}), "chgrp": frozenset({"--reference"}),
    "setfacl": frozenset(), "look": frozenset(), "perl": frozenset({"-e", "-E"}),
}  # fmt: skip
#: Options whose value is a file, and what the command does to it.
_PATH_OPTIONS: Final[dict[str, dict[str, str]]] = {
    "sort": {"-o": "write", "--output": "write"}, "iconv": {"-o": "write"}, "gpg": {"-o": "write", "--output": "write"},
    "grep": {"-f": "read", "--file": "read"}, "rg": {"-f": "read", "--file": "read"}, "awk": {"-f": "read"},
    "sed": {"-f": "read", "--file": "read"}, "jq": {"-f": "read", "--from-file": "read", "--slurpfile": "read", "--rawfile": "read"},
    "touch": {"-r": "read", "--reference": "read"}, "truncate": {"-r": "read", "--reference": "read"}, "tree": {"-o": "write"},
    "cp": {"-t": "write", "--target-directory": "write"}, "mv": {"-t": "write", "--target-directory": "write"},
    "install": {"-t": "write", "--target-directory": "write"}, "ln": {"-t": "write", "--target-directory": "write"},
    "rsync": {"--exclude-from": "read", "--include-from": "read", "--files-from": "read", "--password-file": "read",
              "--log-file": "write"},
    "curl": {"-o": "write", "--output": "write", "-T": "read", "--upload-file": "read", "-K": "read", "--config": "read",
             "-c": "write", "--cookie-jar": "write", "-D": "write", "--dump-header": "write", "--output-dir": "write"},
    "wget": {"-O": "write", "--output-document": "write", "-o": "write", "--output-file": "write", "-a": "write",
             "--append-output": "write", "-P": "write", "--directory-prefix": "write", "--post-file": "read",
             "--body-file": "read", "-i": "read", "--input-file": "read"},
    "tar": {"-T": "read", "--files-from": "read", "-X": "read", "--exclude-from": "read"},
    "unzip": {"-d": "write"}, "chmod": {"--reference": "read"}, "chown": {"--reference": "read"}, "chgrp": {"--reference": "read"},
}  # fmt: skip
_RECURSIVE_FLAGS: Final = frozenset({"-r", "-R", "-a", "--recursive", "--archive"})
_CURL_DATA: Final = frozenset({"-d", "--data", "--data-binary", "--data-ascii", "--data-urlencode", "--json", "-F", "--form"})
#: Directories whose whole tree a recursive read takes in: `D/**` then stands for the tree.
_HOME_OR_ABOVE: Final = re.compile(r"^(/|~[^/]*|/(home|users|root)(/[^/]+)?|/etc|/var|/run|/proc)/?$", re.I)


def _scan(args: list[str], values: frozenset[str]) -> tuple[list[tuple[str, str, int]], list[tuple[str, int]]]:
    """Split arguments into options `(key, value, index of the value)` and operands `(word, index)`:
    `--o=v`, `--o v`, `-ov`, `-o v`, short clusters (`-xzf file`); `--` ends the options."""
    opts: list[tuple[str, str, int]] = []
    operands: list[tuple[str, int]] = []
    i = 0
    while i < len(args):
        a = args[i]
        i += 1
        if a == "--":
            operands.extend((w, j) for j, w in enumerate(args[i:], i))
            break
        if a.startswith("--") and len(a) > 2:
            key, eq, value = a.partition("=")
            at = i - 1
            if not eq and key in values and i < len(args):
                value, at, i = args[i], i, i + 1
            opts.append((key, value, at))
        elif a.startswith("-") and len(a) > 1:
            if a[1].isdigit():  # `head -5`, `tail -20`: a count, never a file
                continue
            if a in values:  # a multi-letter single-dash option (`-cmd`, `-in`)
                opts.append((a, args[i] if i < len(args) else "", i))
                i += 1
                continue
            for j, ch in enumerate(a[1:], 1):
                key = "-" + ch
                if key in values:
                    value, at = a[j + 1 :], i - 1
                    if not value and i < len(args):
                        value, at, i = args[i], i, i + 1
                    opts.append((key, value, at))
                    break
                opts.append((key, "", i - 1))
        else:
            operands.append((a, i - 1))
    return opts, operands


def command_paths(name: str, path: str, args: list[str], inline: frozenset[str] | None) -> list[Use]:
    """The path operands of one command and what it does to each. `path` is the command word as
    written (`./build.sh` is executed); `inline` the flags that give an interpreter its code on
    the command line (`-c`, `-e`), None for a command that is not an interpreter."""
    uses: list[Use] = []
    if "/" in path and not SYSTEM_BIN.match(path) and not path.startswith("$"):
        uses.append(("execute", path, -1))
    key = _ALIASES.get(name, name)
    if inline is not None and key != "perl" or name in ("source", "."):
        return uses + _interpreter(name, args, inline or frozenset())
    special = _SPECIAL.get(key)
    if special is not None:
        return uses + special(key, args)
    op = "read" if name in _READ else "delete" if name in _DELETE else "write" if name in _WRITE else \
        "list" if name in _LIST else None  # fmt: skip
    if op is None:
        return uses
    opts, operands = _scan(args, _VALUES.get(key, frozenset()))
    uses.extend(_option_paths(key, opts))
    keys = {k for k, _, _ in opts}
    if key in _LEADING and not keys & _LEADING[key] and operands:
        operands = operands[1:]
    if key == "perl" and not keys & _LEADING["perl"]:
        return uses + _interpreter(name, args, _LEADING["perl"])
    if key == "sed" and "-i" in keys or key == "perl" and "-i" in keys:
        op = "write"
    if key == "awk":
        operands = [(w, i) for w, i in operands if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", w)]
    recursive = op == "read" and (key == "rg" or bool(keys & _RECURSIVE_FLAGS))
    return uses + [(op, _tree(w) if recursive else w, i) for w, i in operands]


def _tree(word: str) -> str:
    """A directory read with everything below it: `D/**` when D is a home or above, where the
    tree holds credential stores (a recursive read inside the workspace stays `D`)."""
    return word.rstrip("/") + "/**" if _HOME_OR_ABOVE.match(word) or word.startswith("$HOME") else word


def _option_paths(key: str, opts: list[tuple[str, str, int]]) -> list[Use]:
    table = _PATH_OPTIONS.get(key, {})
    return [(table[k], v, i) for k, v, i in opts if k in table and v and v != "-"]


def _copy(key: str, args: list[str]) -> list[Use]:
    """cp/mv/install/ln/rsync/scp: sources are read (mv: deleted; ln: the link's target), the
    last operand (or `-t DIR`) is written; remote `host:path` operands are not local paths."""
    opts, operands = _scan(args, _VALUES.get(key, frozenset()))
    keys = {k for k, _, _ in opts}
    uses = _option_paths(key, opts)
    target = [(w, i) for k, w, i in opts if k in ("-t", "--target-directory")]
    if not target and len(operands) >= 2:
        target, operands = operands[-1:], operands[:-1]
    recursive = bool(keys & _RECURSIVE_FLAGS) or key == "mv"
    source_op = "delete" if key == "mv" else "read"
    for word, i in operands:
        if key in ("scp", "rsync") and REMOTE.match(word):
            continue
        uses.append((source_op, _tree(word) if recursive and source_op == "read" else word, i))
    for word, i in target:
        if key in ("scp", "rsync") and REMOTE.match(word):
            continue
        uses.append(("write", word, i))
        if key == "rsync" and any(k.startswith("--delete") or k == "--remove-source-files" for k in keys):
            uses.append(("delete", word, i))
    return uses


def _tar(key: str, args: list[str]) -> list[Use]:
    """tar: create (`c`, `r`, `u`) reads its operands and writes the archive; extract (`x`)
    reads the archive and writes into `-C DIR`; list (`t`) reads the archive."""
    if args and not args[0].startswith("-") and re.fullmatch(r"[A-Za-z]+", args[0]):
        args = ["-" + args[0], *args[1:]]  # old style: `tar czf out.tgz dir`
    opts, operands = _scan(args, _VALUES["tar"])
    keys = {k for k, _, _ in opts}
    create = bool(keys & {"-c", "-r", "-u", "--create", "--append", "--update"})
    extract = bool(keys & {"-x", "--extract", "--get"})
    uses = _option_paths("tar", opts)
    base = next((v for k, v, _ in opts if k in ("-C", "--directory")), "")
    for k, v, i in opts:
        if k in ("-f", "--file") and v and v != "-":
            uses.append(("write" if create else "read", v, i))
        elif k in ("-C", "--directory") and v and extract:
            uses.append(("write", v, i))
    if create:
        for word, i in operands:
            joined = word if not base or word.startswith(("/", "~")) else base.rstrip("/") + "/" + word
            uses.append(("read", _tree(joined), i if joined == word else -1))
            if "--remove-files" in keys:  # the inputs are deleted once archived
                uses.append(("delete", joined, i if joined == word else -1))
    return uses


def _find(key: str, args: list[str]) -> list[Use]:
    """find/fd: the start directories are listed; `-delete` deletes what it matches, `dir/**`
    (or `dir/**/NAME` with `-name NAME`)."""
    starts = []
    for i, a in enumerate(args):
        if a.startswith(("-", "(", "!", ")")) or a == ",":
            break
        starts.append((a, i))
    starts = starts or [(".", -1)]
    uses: list[Use] = [("list", w, i) for w, i in starts]
    if "-delete" in args:
        uses.extend(("delete", word, -1) for word in find_targets(args))
    return uses


def find_targets(args: list[str]) -> list[str]:
    """What `find` hands to `-exec`/`-delete`: each start directory's tree (`dir/**`, or
    `dir/**/NAME` when `-name`/`-iname` gives the name)."""
    starts = []
    for a in args:
        if a.startswith(("-", "(", "!", ")")) or a == ",":
            break
        starts.append(a)
    name = next((args[i + 1] for i, a in enumerate(args[:-1]) if a in ("-name", "-iname")), "")
    return [(s.rstrip("/") or "/") + ("/**/" + name if name else "/**") for s in starts or ["."]]


def listing(name: str, args: list[str]) -> str:
    """What `find`/`fd`/`ls` print, as globs of the paths they list (`find ~ -name x` prints
    `~/**/x`; `ls DIR` prints `DIR/*`): so `rm $(find ~ -name x)` and `find ~ | xargs rm` name
    the files they delete."""
    if name in ("find", "fd"):
        return "\n".join(find_targets(args)) + "\n"
    _, operands = _scan(args, _VALUES["ls"])
    dirs_only = any(a.startswith("-") and not a.startswith("--") and "d" in a for a in args)
    words = [w for w, _ in operands] or ["."]
    out = [w if dirs_only or _GLOB_CHARS.search(w) else (w.rstrip("/") or "/") + "/*" for w in words]
    return "\n".join(o[2:] if o.startswith("./") else o for o in out) + "\n"


_GLOB_CHARS: Final = re.compile(r"[*?\[]")


def file_url_path(url: str) -> str:
    """The local path of a `file://` URL (`file:///etc/x`, `file://localhost/etc/x`), else ""."""
    if url[:7].lower() != "file://":
        return ""
    rest = url[7:]
    host, slash, path = rest.partition("/")
    return "/" + path if slash and host.lower() in ("", "localhost", "127.0.0.1") else ""


def _dd(key: str, args: list[str]) -> list[Use]:
    return [("read" if a.startswith("if=") else "write", a[3:], i) for i, a in enumerate(args)
            if a.startswith(("if=", "of=")) and len(a) > 3]


def _curl(key: str, args: list[str]) -> list[Use]:
    """curl/wget: the files they write (`-o`), upload (`-T`, `-d @file`, `-F x=@file`) and read
    through a `file://` URL."""
    opts, operands = _scan(args, _VALUES[key])
    uses = _option_paths(key, opts)
    for url, i in [*operands, *((v, i) for k, v, i in opts if k == "--url")]:
        local = file_url_path(url)
        if local:
            uses.append(("read", local, i))
    for k, v, i in opts:
        if key == "curl" and k in _CURL_DATA:
            for m in re.finditer(r"(?:^|=)[@<]([^;,\s]+)", v):
                if m.group(1) != "-":
                    uses.append(("read", m.group(1), i))
    return uses


def _zip(key: str, args: list[str]) -> list[Use]:
    """zip writes its first operand from the rest; unzip reads its first (`-d DIR` is written)."""
    cut = next((i for i, a in enumerate(args) if a in ("-x", "-i", "--exclude", "--include")), len(args))
    opts, operands = _scan(args[:cut], _VALUES[key])
    uses = _option_paths(key, opts)
    if not operands:
        return uses
    if key == "unzip":
        return [*uses, ("read", operands[0][0], operands[0][1])]
    recursive = any(k in ("-r", "-R", "--recurse-paths") for k, _, _ in opts)
    uses.append(("write", operands[0][0], operands[0][1]))
    return uses + [("read", _tree(w) if recursive else w, i) for w, i in operands[1:]]


def _sevenzip(key: str, args: list[str]) -> list[Use]:
    """7z a ARCHIVE FILES… writes the archive from the files; 7z x ARCHIVE -oDIR writes DIR."""
    operands = [(w, i) for i, w in enumerate(args) if not w.startswith("-")]
    if len(operands) < 2:
        return []
    (mode, _), (archive, at), files = operands[0], operands[1], operands[2:]
    if mode in ("a", "u"):
        return [("write", archive, at)] + [("read", _tree(w), i) for w, i in files]
    if mode in ("x", "e"):
        out = [("write", a[2:], i) for i, a in enumerate(args) if a.startswith("-o") and len(a) > 2]
        return [("read", archive, at), *out]
    return [("read", archive, at)]


def _uniq(key: str, args: list[str]) -> list[Use]:
    _, operands = _scan(args, frozenset({"-f", "-s", "-w"}))
    return [("read" if n == 0 else "write", w, i) for n, (w, i) in enumerate(operands[:2])]


def _first(key: str, args: list[str]) -> list[Use]:
    """sqlite3 reads its database, the first operand (the rest is SQL)."""
    _, operands = _scan(args, frozenset({"-cmd", "-separator", "-newline", "-nullvalue"}))
    return [("read", operands[0][0], operands[0][1])] if operands else []


def _compress(key: str, args: list[str]) -> list[Use]:
    """gzip/gunzip/bzip2/xz replace their operands (a write), unless they only print, test or
    list them (`-c`, `-t`, `-l`: a read)."""
    opts, operands = _scan(args, frozenset({"-S", "--suffix"}))
    keys = {k for k, _, _ in opts}
    op = "read" if keys & {"-c", "--stdout", "-t", "--test", "-l", "--list", "-k", "--keep"} else "write"
    return [(op, w, i) for w, i in operands]


def _openssl(key: str, args: list[str]) -> list[Use]:
    table = {"-in": "read", "-out": "write", "-keyout": "write"}
    return [(table[a], args[i + 1], i + 1) for i, a in enumerate(args[:-1]) if a in table]


def _git(key: str, args: list[str]) -> list[Use]:
    """git clone writes its directory; git rm deletes its operands; git mv moves; `clean`,
    `reset --hard`, `checkout`/`restore` in another tree (`-C DIR`, `--work-tree=DIR`) delete
    there."""
    opts, operands = _scan(args, _VALUES["git"])
    if not operands:
        return []
    sub, rest = operands[0][0], operands[1:]
    tree = [(v, i) for k, v, i in opts if k in ("-C", "--work-tree") and v]
    words = {w for w, _ in rest}
    if tree and (sub == "clean" or (sub == "reset" and "--hard" in args) or (sub in ("checkout", "restore") and "." in words)):
        return [("delete", w, i) for w, i in tree]
    if sub == "clone" and len(rest) >= 2:
        return [("write", rest[-1][0], rest[-1][1])]
    if sub == "rm":
        return [("delete", w, i) for w, i in rest if not w.startswith("-")]
    if sub == "mv" and len(rest) >= 2:
        return [("delete", w, i) for w, i in rest[:-1]] + [("write", rest[-1][0], rest[-1][1])]
    return []


_SPECIAL: Final = {
    "cp": _copy, "mv": _copy, "install": _copy, "ln": _copy, "rsync": _copy, "scp": _copy, "tar": _tar,
    "find": _find, "fd": _find, "dd": _dd, "curl": _curl, "wget": _curl, "zip": _zip, "unzip": _zip, "uniq": _uniq,
    "openssl": _openssl, "git": _git, "sqlite3": _first, "gzip": _compress, "gunzip": _compress, "bzip2": _compress,
    "bunzip2": _compress, "xz": _compress, "unxz": _compress, "7z": _sevenzip, "7za": _sevenzip, "7zz": _sevenzip,
}  # fmt: skip


_INTERPRETER_VALUES: Final = frozenset({"-W", "-X", "-r", "--require", "--import", "--loader", "-I", "--eval-file"})


def _interpreter(name: str, args: list[str], inline: frozenset[str]) -> list[Use]:
    """An interpreter runs its first operand as a script, unless code comes on the command line
    (`-c`, `-e`) or a module (`python -m`); `source FILE` runs FILE."""
    operands = []
    skip = False
    for i, a in enumerate(args):
        if skip:
            skip = False
            continue
        if a in inline or (name.startswith(("python", "pypy")) and a == "-m") or (
            len(a) > 2 and a[0] == "-" and a[1] != "-" and "-" + a[-1] in inline | {"-m"}
        ):
            return []
        if a.startswith("-") and len(a) > 1:
            skip = a in _INTERPRETER_VALUES
            continue
        operands.append((a, i))
        break
    if operands and operands[0][0] != "-":
        return [("execute", operands[0][0], operands[0][1])]
    return []


# ---------------------------------------------------------------- code on the command line

_LITERAL: Final = re.compile(r"""(?P<q>['"`])(?P<s>(?:\\.|(?!(?P=q))[^\\\n])*)(?P=q)""")
#: The calls a literal sits in, innermost last (`shutil.rmtree(os.path.expanduser('~/x'))`).
_CALLS_BEFORE: Final = re.compile(r"((?:[A-Za-z_][\w.:]*(?:\s*\(\s*|\s+))+)(?:[rRbBuUfF]{0,2})?$")
_CALL_NAME: Final = re.compile(r"([A-Za-z_][\w.:]*)(?=\s*\(|\s)")
#: A literal right after `>`/`>>` (awk `print > "f"`, perl `open(F, ">", "f")`) is written.
_WRITE_BEFORE: Final = re.compile(r""">>?\s*$|['"][+]?>>?['"]\s*,\s*$""")
_DELETE_CALLS: Final = re.compile(
    r"(?:^|\.|\s)(rmtree|remove|removedirs|unlink|rmdir|rmSync|rmdirSync|unlinkSync|rm|rm_rf|rm_r|remove_dir|"
    r"remove_file|rimraf|delete|deleteSync|remove_tree|removeSync|rename|renames|renameSync|move|moveSync|mv)(?=\s|$)"
)
_WRITE_CALLS: Final = re.compile(
    r"(?:^|\.|\s)(writeFile|writeFileSync|appendFile|appendFileSync|write_text|write_bytes|file_put_contents|"
    r"mkdir|mkdirSync|makedirs|copyfile|copy|copy2|copytree|copyFileSync|symlink|symlinkSync|chmod|chmodSync)(?=\s|$)"
)
#: Calls that list a tree (`os.walk`, `glob`, `readdirSync`, `Dir.glob`, `find`): a literal they
#: list is deleted when the code also deletes through a variable (what the listing yielded).
_LISTING_CALLS: Final = re.compile(r"(?:^|\.|\s)(walk|glob|iglob|rglob|listdir|scandir|iterdir|readdirSync|readdir|"
                                   r"children|entries|find|opendir|each_child|Find|finddepth)(?=\s|$)")
_VARIABLE_DELETE: Final = re.compile(
    r"(?:\b(?:rmtree|remove|unlink|rmdir|rmSync|rmdirSync|unlinkSync|rm_rf|rm_r|rm|remove_tree|removedirs|"
    r"""delete|rename|move)\s*\(\s*(?!['"\s)])|\bunlink\s+(?!['"(])\$?\w)"""
)
_OPEN_MODE: Final = re.compile(r"""\s*,\s*(?:mode\s*=\s*)?['"][rb]*[wax+]""")
_METHOD_AFTER: Final = re.compile(r"\s*\)\s*(?:\.\s*expanduser\s*\(\s*\)\s*)?\.\s*(\w+)\s*\(")
#: Per language, the calls that hand a string to a shell (`os.system`, `subprocess.run(...,
#: shell=True)`, `child_process.execSync`, `system`) or an argv list to a program.
_SHELL_CALLS: Final = {
    "python": re.compile(r"(?:\b(?:os\.system|os\.popen|subprocess\.\w+|commands\.getoutput|getoutput|getstatusoutput|"
                         r"pty\.spawn|os\.exec\w+|os\.spawn\w+)|(?:\b\w+|\))\.(?:system|popen|call|run|Popen|check_output|"
                         r"check_call|getoutput|getstatusoutput|spawn))\s*\(\s*(\[)?"),
    "perl": re.compile(r"\b(?:system|exec|readpipe|qx)(?:\s*\(\s*|\s+)(\[)?"),
    "ruby": re.compile(r"\b(?:system|exec|spawn|IO\.popen|Open3\.\w+)(?:\s*\(\s*|\s+)(\[)?"),
    "awk": re.compile(r"\bsystem\s*\(?\s*(\[)?"),
    "php": re.compile(r"\b(?:system|exec|shell_exec|passthru|popen|proc_open)\s*\(\s*(\[)?"),
    "lua": re.compile(r"\b(?:os\.execute|io\.popen)\s*\(?\s*(\[)?"),
    "osascript": re.compile(r"\bdo\s+shell\s+script\s+(\[)?"),
    "node": re.compile(r"\b(?:execSync|exec|spawnSync|spawn|execFileSync|execFile|Deno\.run|Bun\.spawn)\s*\(\s*(\[)?"),
}  # fmt: skip
#: Expressions for the home directory in inline code, read as the literal "~" (`fold_inline`).
_HOME_EXPR: Final = re.compile(
    r"""os\.path\.expanduser\(\s*['"]~['"]\s*\)|os\.environ\s*\[\s*['"]HOME['"]\s*\]|os\.environ\.get\(\s*['"]HOME['"]\s*\)|"""
    r"""(?:os\.)?getenv\(\s*['"]HOME['"]\s*\)|(?:pathlib\.)?Path\.home\(\s*\)|(?:require\(\s*['"]os['"]\s*\)|\bos)\.homedir\(\s*\)|"""
    r"""process\.env\.HOME\b|\bENVIRON\s*\[\s*['"]HOME['"]\s*\]|process\.env\[\s*['"]HOME['"]\s*\]|Deno\.env\.get\(\s*['"]HOME['"]\s*\)|Deno\.homeDir\(\s*\)|"""
    r"""\bDir\.home\b|ENV\s*\[\s*['"]HOME['"]\s*\]|\$ENV\s*\{\s*['"]?HOME['"]?\s*\}|\$_SERVER\s*\[\s*['"]HOME['"]\s*\]"""
)
#: Two literals joined by `+`, `..` (lua), `.` (perl, php) or `/` (pathlib), and a join call of literals only.
_LIT_JOIN: Final = re.compile(r"""(['"])([^'"\n\\]*)\1\s*(\+|\.\.|\.|/)\s*(['"])([^'"\n\\]*)\4""")
_JOIN_CALL: Final = re.compile(r"""\b(?:os\.path|path|posixpath|File|\w+)\.join\(\s*((?:(['"])[^'"\n]*\2\s*,\s*)+(['"])[^'"\n]*\3)\s*\)""")
#: Languages where a backtick string runs a shell command.
_BACKTICK_SHELL: Final = frozenset({"perl", "ruby", "php"})


#: A home expression interpolated in a string: perl `"$ENV{HOME}/x"`, ruby `"#{Dir.home}/x"`,
#: python `f"{os.environ['HOME']}/x"`, JavaScript `` `${os.homedir()}/x` ``, php `"{$_SERVER['HOME']}"`.
_HOME_IN_STRING: Final = re.compile(
    r"""(?:#\{|\$\{|\{)\s*(?:""" + _HOME_EXPR.pattern + r""")\s*\}|(?<=["'])\$ENV\{\s*['"]?HOME['"]?\s*\}"""
)
#: Character codes that spell a string (python, perl, php, ruby, JavaScript, PowerShell).
_CHAR_CODES: Final = re.compile(
    r"""(?:(['"])\1\s*\.\s*join\(\s*)?map\(\s*chr\s*,\s*[\[(]\s*((?:\d{1,3}\s*,\s*)+\d{1,3})\s*,?\s*[\])]\s*\)(?(1)\s*\))"""
    r"""|String\.fromCharCode\(\s*((?:\d{1,3}\s*,\s*)+\d{1,3})\s*\)"""
    r"""|bytes\(\s*\[\s*((?:\d{1,3}\s*,\s*)+\d{1,3})\s*\]\s*\)(?:\.decode\(\s*\))?"""
    r"""|\b(?:chr|char|Chr)\(\s*(\d{1,3})\s*\)|\[char\]\s*(\d{1,3})"""
)
#: awk concatenates strings written side by side.
_AWK_CONCAT: Final = re.compile(r'"([^"\n\\]*)"[ \t]+"([^"\n\\]*)"')


def _char_literal(m: re.Match[str]) -> str:
    codes = next(g for g in m.groups()[1:] if g is not None)
    try:
        text = "".join(chr(int(x)) for x in re.findall(r"\d+", codes))
    except ValueError:
        return m.group()
    quote = '"' if '"' not in text else "'" if "'" not in text else ""
    return quote + text.replace("\\", "\\\\") + quote if quote and text.isprintable() else m.group()


def _unquote(text: str) -> str:
    return re.sub(r"\\(.)", lambda m: {"n": "\n", "t": "\t"}.get(m.group(1), m.group(1)), text)


#: Perl's and Ruby's quote-like operators (`q{…}`, `qq(…)`, `%q[…]`), written as plain literals.
_QUOTE_OP: Final = re.compile(r"(?<![\w$@%])%?[qQ][qQ]?\s*(?:\{([^{}\n]*)\}|\(([^()\n]*)\)|\[([^\[\]\n]*)\]|<([^<>\n]*)>)")


def _requote(m: re.Match[str]) -> str:
    body = next(g for g in m.groups() if g is not None)
    quote = "'" if "'" not in body else '"' if '"' not in body else ""
    return quote + body + quote if quote else m.group()


def fold_inline(code: str, language: str = "") -> str:
    """Inline code with the paths it builds at run time written out, as far as they are literal:
    the home (`os.environ['HOME']`, `Path.home()`, `os.homedir()`, `Dir.home`, `getenv("HOME")`)
    as `"~"` (inside a string, `"$ENV{HOME}/x"`, `"#{Dir.home}/x"`, `f"{Path.home()}/x"`, as `~`),
    character codes (`chr(114)`, `map(chr, […])`, `String.fromCharCode(…)`, `bytes([…])`) as the
    literal they spell, then literals joined by `+`/`..`/`.`/`/` (awk: side by side) and
    `os.path.join`/`File.join`/`path.join` of literals as one literal (`"~/.ssh/id_rsa"`).
    Variables stay unknown."""
    out = _HOME_IN_STRING.sub("~", code[:65_536])
    out = _QUOTE_OP.sub(_requote, _HOME_EXPR.sub('"~"', out))
    out = _CHAR_CODES.sub(_char_literal, out)
    for _ in range(16):
        joined = _JOIN_CALL.sub(lambda m: '"' + "/".join(x.group(2) for x in re.finditer(r"""(['"])([^'"\n]*)\1""", m.group(1))) + '"', out)
        joined = _LIT_JOIN.sub(lambda m: '"' + m.group(2) + ("/" if m.group(3) == "/" and not m.group(2).endswith("/") else "") + m.group(5) + '"', joined)
        if language == "awk":
            joined = _AWK_CONCAT.sub(lambda m: '"' + m.group(1) + m.group(2) + '"', joined)
        if joined == out:
            break
        out = joined
    return out


def inline_paths(code: str, language: str) -> list[tuple[str, str]]:
    """(operation, literal) for each string literal of inline code that looks like a path (it
    starts with `/`, `~`, `.` or holds a `/`): deleted when it is the argument of a delete call
    (`shutil.rmtree`, `os.remove`, `fs.rmSync`, `Path(…).unlink()`…), written for a write call
    or `open(…, 'w')`, read otherwise. Paths built at run time (concatenation, variables,
    `os.path.join` of variables) are not seen."""
    out: list[tuple[str, str]] = []
    for m in _LITERAL.finditer(code[:65_536]):
        text = _unquote(m.group("s"))
        text = file_url_path(text) or text
        if not text or "://" in text or "\n" in text or len(text) > 1024 or (m.group("q") == "`" and language in _BACKTICK_SHELL):
            continue
        if not (text.startswith(("/", "~", ".")) or ("/" in text and not any(ch.isspace() for ch in text))):
            continue
        before = _CALLS_BEFORE.search(code, max(0, m.start() - 160), m.start())
        func = " ".join(_CALL_NAME.findall(before.group(1))) if before else ""
        after = _METHOD_AFTER.match(code, m.end())
        method = after.group(1) if after else ""
        if _DELETE_CALLS.search(func) or _DELETE_CALLS.search("." + method) or (
            _LISTING_CALLS.search(func) and _VARIABLE_DELETE.search(code) is not None
        ):
            op = "delete"
        elif _WRITE_CALLS.search(func) or _WRITE_CALLS.search("." + method) or _WRITE_BEFORE.search(
            code, max(0, m.start() - 12), m.start()
        ) or (re.search(r"(?:^|\.|\s)open$", func) and _OPEN_MODE.match(code, m.end())):
            op = "write"
        else:
            op = "read"
        out.append((op, text))
    return out


def inline_commands(code: str, language: str) -> list[str | list[str]]:
    """Shell commands that inline code runs: the string given to `os.system`, `subprocess.run`,
    `execSync`, `system`… (a command line), or the list of strings given to `subprocess.run([…])`,
    `spawnSync(…, […])` (an argv)."""
    out: list[str | list[str]] = []
    calls = _SHELL_CALLS.get(language)
    if language in _BACKTICK_SHELL:
        out.extend(_unquote(m.group("s")) for m in _LITERAL.finditer(code[:65_536]) if m.group("q") == "`")
    for m in calls.finditer(code[:65_536]) if calls is not None else ():
        if m.group(1):  # an argv list: the literals up to the closing bracket
            end = code.find("]", m.end())
            items = [_unquote(x.group("s")) for x in _LITERAL.finditer(code, m.end(), end if end >= 0 else len(code))]
            if items:
                out.append(items)
            continue
        first = _LITERAL.match(code, m.end())
        if first is None:
            bound = _bound_literal(code, m.end())
            if bound is not None:
                out.append(bound)
            continue
        argv = re.match(r"\s*,\s*\[", code[first.end() :])
        if argv:  # spawn('rm', ['-rf', 'x'])
            end = code.find("]", first.end())
            rest = [_unquote(x.group("s")) for x in _LITERAL.finditer(code, first.end(), end if end >= 0 else len(code))]
            out.append([_unquote(first.group("s")), *rest])
        elif re.match(r"""\s*,\s*['"]""", code[first.end() :]):  # exec "sh", "-c", "…" (an argv as a list of literals)
            items, pos = [_unquote(first.group("s"))], first.end()
            while (x := _LIST_ITEM.match(code, pos)) is not None and len(items) < 64:
                items.append(_unquote(x.group("s")))
                pos = x.end()
            out.append(_argv0(items))
        else:
            out.append(_unquote(first.group("s")))
    if language == "awk":
        out.extend(_awk_pipes(code[:65_536]))
    return out[:32]


_LIST_ITEM: Final = re.compile(r"""\s*,\s*(?P<q>['"])(?P<s>(?:\\.|(?!(?P=q))[^\\\n])*)(?P=q)""")
#: awk's `"cmd" | getline` and `print … | "cmd"` run a command line.
_AWK_GETLINE: Final = re.compile(r'"([^"\n]+)"\s*\|\s*getline')
_AWK_PRINT_PIPE: Final = re.compile(r'\bprintf?\s*\(?\s*((?:"[^"\n]*"\s*)+)\)?\s*\|\s*"([^"\n]+)"')
_SHELL_WORDS: Final = frozenset({"sh", "bash", "zsh", "dash", "ksh", "/bin/sh", "/bin/bash", "/usr/bin/sh", "/usr/bin/bash"})


def _awk_pipes(code: str) -> list[str | list[str]]:
    """awk commands: `"cmd" | getline`, `print … | "cmd"` (and, piped into a shell, what it prints)."""
    out: list[str | list[str]] = [m.group(1) for m in _AWK_GETLINE.finditer(code)]
    for m in _AWK_PRINT_PIPE.finditer(code):
        out.append(m.group(2))
        if m.group(2).strip().split(" ")[0] in _SHELL_WORDS:
            out.append("".join(re.findall(r'"([^"\n]*)"', m.group(1))))
    return out


def _argv0(items: list[str]) -> list[str]:
    """An argv given as a list of literals; `execl(path, name, …)` repeats the program as argv[0]."""
    if len(items) > 1 and items[1].rsplit("/", 1)[-1] == items[0].rsplit("/", 1)[-1]:
        return [items[0], *items[2:]]
    return items


def _bound_literal(code: str, at: int) -> str | None:
    """The literal last assigned to the variable a call is given (`c = "rm -rf ~"; system(c)`)."""
    var = re.match(r"\s*(\$?[A-Za-z_]\w*)\s*[),;]", code[at:])
    if var is None:
        return None
    name = re.escape(var.group(1))
    found = None
    for m in re.finditer(r"(?:^|[\s;({,])(?:my\s+|local\s+|const\s+|let\s+|var\s+)?" + name + r"""\s*=\s*(?P<q>['"])(?P<s>(?:\\.|(?!(?P=q))[^\\\n])*)(?P=q)""", code[:at]):
        found = _unquote(m.group("s"))
    return found


# ---------------------------------------------------------------- resolution

#: Variables whose value the analysis cannot know but whose meaning it does: the home and the
#: directories the XDG spec puts under it, the working directory, the temporary directory.
_PROC_SELF: Final = re.compile(r"^/+proc/+(?:self|thread-self|\d+)/+(root|cwd)(?=/|$)")
_KNOWN_PREFIX: Final = re.compile(r"^\$(HOME|USERPROFILE|XDG_CONFIG_HOME|XDG_DATA_HOME|XDG_CACHE_HOME|XDG_STATE_HOME|PWD|TMPDIR)(?=/|$)")
_PREFIX_VALUE: Final = {"HOME": "~", "USERPROFILE": "~", "XDG_CONFIG_HOME": "~/.config", "XDG_DATA_HOME": "~/.local/share",
                        "XDG_CACHE_HOME": "~/.cache", "XDG_STATE_HOME": "~/.local/state", "TMPDIR": "/tmp"}  # fmt: skip


def resolve(word: str, cwd: str) -> tuple[str, bool] | None:
    """(the path `word` names from working directory `cwd`, whether it lies outside the
    workspace), or None when the word is not a path (empty, `-`, a URL, a line of text).

    `cwd` is "" for the workspace itself, a relative directory inside it (or climbing out of
    it: `..`), an absolute or `~` directory, or one starting with an unknown `$VAR`. `~`, `~user`
    and `$HOME` stay `~` (the home is not known here); `$PWD` and `~+` are `cwd`; `..` is
    resolved lexically. Outside means absolute, in a home, or climbing out with `..`; a path
    under an unknown variable (`$DIR/x`) is neither inside nor outside."""
    if not word or word == "-" or "://" in word or "\n" in word or len(word) > 4096:
        return None
    m = _KNOWN_PREFIX.match(word)
    if m:
        value = cwd or "." if m.group(1) == "PWD" else _PREFIX_VALUE[m.group(1)]
        word = value + word[m.end() :]
    elif word.startswith("~+") and (len(word) == 2 or word[2] == "/"):
        word = (cwd or ".") + word[2:]
    proc = _PROC_SELF.match(word)
    if proc:  # /proc/self/root is /, /proc/self/cwd the working directory
        rest = word[proc.end() :].lstrip("/")
        word = ("/" + rest) if proc.group(1) == "root" else ((cwd.rstrip("/") + "/" if cwd else "") + (rest or "."))
    if not word.startswith(("/", "~", "$")) and cwd:
        word = cwd.rstrip("/") + "/" + word
    path = normpath(word)
    return path, is_outside(path)


def is_outside(path: str) -> bool:
    """Whether a resolved path lies outside the workspace: absolute, in a home, or climbing out."""
    return path.startswith(("/", "~")) or path == ".." or path.startswith("../")


def normpath(path: str) -> str:
    """Lexical normalisation: `//`, `.` and `..` resolved; a leading `~`/`~user` kept (with any
    `..` above it), a leading `$VAR` left as it is (its value is unknown)."""
    if path.startswith("$"):
        return re.sub(r"/{2,}", "/", path)
    if path.startswith("~"):
        head, _, rest = path.partition("/")
        rest = posixpath.normpath(rest) if rest else "."
        return head if rest == "." else head + "/" + rest
    return posixpath.normpath(re.sub(r"/{2,}", "/", path)) if path.startswith("/") else posixpath.normpath(path)
