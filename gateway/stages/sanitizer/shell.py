"""Shell analysis: normalise a command bound for a shell-like tool into what the shell would run.

A small bash-like lexer and expander (no bashlex: it is GPL) that undoes the usual ways of
hiding a command from a text filter: backslash-escaped letters (`r\\m`), quotes splitting words
(`r''m`, `"r"m`), `$IFS` in place of spaces, brace expansion (`{rm,-rf,/}`), ANSI-C and
printf escapes (`$'\\x72m'`), backtick and `$( )` substitutions (analysed as commands of their
own, and replaced by their output when it is known: `$(echo rm)`, `$(printf '\\162m')`, `$(echo
cm0= | base64 -d)`), variables assigned then used (`a=rm; $a -rf /`), `bash -c`/`sh -c`/`eval`
payloads, here-strings, here-documents and decoded data piped into a shell (`echo … | base64 -d |
sh`), and Unicode look-alikes (NFKC plus a confusables map). Payloads are analysed recursively.

Everything is bounded (input size, words, commands, brace results, depth). Input over a bound,
or that does not lex (an unterminated quote or substitution), yields `unparsed=True` with the
reason, and the shipped rules refuse it: fail closed. Pure functions, no I/O.

`analyse_call` picks the command out of a call's arguments (`command`, `cmd`, `script`, as a
string or an argv list of strings, with `args`/`argv` lists appended) and returns a
`ShellAnalysis`; `ShellAnalysis.as_cel()` is the CEL variable `args_shell` (docs/detection.md).
"""

from __future__ import annotations

import base64
import binascii
import fnmatch
import functools
import re
import shlex
import unicodedata
from dataclasses import dataclass, field
from typing import Any, Final

from gateway.memo import Memo
from gateway.policy.names import name_matches
from gateway.sensitive_paths import sensitive_path
from gateway.stages.sanitizer.text import SHELL_SYNTAX, clean_shell_text
from gateway.stages.sanitizer.windows_shell import (
    CMDS,
    POWERSHELLS,
    cmd_commands,
    cmd_payload,
    deobfuscate_powershell,
    expand_cmd,
    powershell_commands,
    powershell_payload,
)
from gateway.stages.sanitizer.destinations import BULK_SQL, outside_location
from gateway.stages.sanitizer.shell_options import COMMAND_VARIABLES, LOADER_VARIABLES, env_injection, option_payloads, planted_place
from gateway.stages.sanitizer.shell_threats import classify_threats
from gateway.stages.sanitizer.shell_paths import (
    REMOTE as _REMOTE,
    SYSTEM_BIN as _SYSTEM_BIN,
    command_paths,
    find_targets,
    fold_inline,
    inline_commands,
    inline_paths,
    is_outside,
    listing,
    normpath,
    resolve,
)

__all__ = [
    "EMPTY_CEL",
    "SHELL_ARGUMENTS",
    "command_keys",
    "SHELL_TOOLS",
    "ShellAnalysis",
    "ShellCommand",
    "analyse",
    "analyse_call",
    "fold",
    "is_shell_tool",
    "shell_for",
]

#: Tool-name globs of shell-like tools (the same list as the `&shell_tools` anchor of
#: rules/shell.yaml; a test keeps the two equal).
SHELL_TOOLS: Final = (
    "run_command", "run_*command*", "run_shell*", "run_script", "run_terminal*", "execute_*", "exec",
    "exec_*", "*_exec", "shell*", "*_shell", "bash*", "sh", "terminal*", "Bash", "run_in_terminal", "start_process",
    "run_cmd", "execute", "run", "run_bash*", "run_sh",
)  # fmt: skip
#: Arguments that carry the command text (a string, or an argv list of strings).
SHELL_ARGUMENTS: Final = ("command", "cmd", "script")
#: The same names as servers spell them (`commandLine`, `command_line`, `shellCommand`, `cmdline`):
#: an argument name folded (lower case, `_`/`-` dropped) in this set carries the command (round 6).
_COMMAND_NAMES: Final = frozenset({"command", "cmd", "script", "commandline", "cmdline", "shellcommand",
                                   "commandtext", "commandstring", "shellcmd", "bashcommand"})
#: Arguments whose list of strings is appended to the command (the exec form `{command, args}`).
EXTRA_ARGV: Final = ("args", "argv")

MAX_INPUT: Final = 65_536  # characters analysed in all, payloads and decoded data included
MAX_WORDS: Final = 4_096
MAX_COMMANDS: Final = 1_024
MAX_BRACE: Final = 1_024  # words one brace expression may expand to
MAX_DEPTH: Final = 6  # nesting of substitutions and payloads
MAX_PATHS: Final = 512  # file operands recorded (args_shell.paths)

SHELLS: Final = frozenset({"sh", "bash", "zsh", "dash", "ksh", "ash", "mksh", "fish", "csh", "tcsh", "yash", "rbash"})
#: Interpreters and the flags that give them code on the command line.
SCRIPT_FLAGS: Final = {
    "perl": {"-e", "-E"}, "ruby": {"-e"}, "node": {"-e", "-p", "--eval", "--print"}, "nodejs": {"-e", "-p", "--eval"},
    "php": {"-r"}, "lua": {"-e"}, "pwsh": {"-c", "-command"}, "powershell": {"-c", "-command"}, "osascript": {"-e"},
    "tclsh": set(), "deno": {"eval"}, "bun": {"-e", "--eval"},
}  # fmt: skip
_PYTHON: Final = re.compile(r"^(python[0-9.]*|pypy[0-9.]*)$")
DOWNLOADERS: Final = frozenset({"curl", "wget", "fetch", "aria2c", "lwp-request", "http", "https", "xh"})
#: Commands that take their options then run the rest of the line as a command.
WRAPPERS: Final = {
    "sudo": {"-u", "-g", "-p", "-C", "-D", "-h", "-r", "-t", "-U", "-T", "--user", "--group", "--prompt"},
    "doas": {"-u", "-C"}, "pkexec": {"--user"}, "env": {"-u", "--unset", "-C", "--chdir", "-S"},
    "nice": {"-n", "--adjustment"}, "nohup": set(), "time": {"-f", "-o"}, "timeout": {"-s", "-k", "--signal", "--kill-after"},
    "stdbuf": {"-i", "-o", "-e"}, "ionice": {"-c", "-n", "-p"}, "command": set(), "builtin": set(), "exec": {"-a"},
    "busybox": set(), "xargs": {"-I", "-i", "-n", "-P", "-L", "-d", "-E", "-s", "-a", "--max-args", "--delimiter"},
    "setsid": set(), "unbuffer": set(), "chrt": set(), "taskset": set(), "caffeinate": set(),
    # round 4: tracers, sandboxes and session launchers that run the rest of the line
    "strace": {"-o", "-e", "-p", "-s", "-u", "-E", "-a", "-I", "-P", "-S", "-X", "-b", "-O"},
    "ltrace": {"-o", "-e", "-p", "-s", "-u", "-n", "-a", "-A", "-D", "-l", "-x", "-E"},
    "chroot": {"--userspec", "--groups"}, "unshare": set(), "nsenter": {"-t", "--target"}, "firejail": set(),
    "runuser": {"-u", "-g", "-G", "--user", "--group"}, "dbus-launch": set(), "dbus-run-session": set(),
    "xvfb-run": {"-n", "-s", "-f", "-e", "-p"}, "proxychains": {"-f"}, "proxychains4": {"-f"}, "torsocks": set(),
    "catchsegv": set(), "screen": {"-S", "-c", "-e", "-h", "-p", "-T", "-t"}, "sg": set(), "setpriv": set(),
}  # fmt: skip
#: Wrappers that take one positional argument before the command (a duration, a priority, a mask).
_WRAPPER_POSITIONAL: Final = frozenset({"timeout", "chrt", "taskset", "chroot", "sg"})
_KEYWORDS_SKIP_LINE: Final = frozenset({"for", "select"})
_RESERVED: Final = frozenset({"then", "do", "else", "elif", "if", "while", "until", "!", "time", "fi", "done"})
#: Variables that name the running shell, and variables whose value is an absolute path (their
#: first character is `/` whatever the machine): what `$SHELL -c` and `${HOME:0:1}` stand for.
_SHELL_VARIABLES: Final = frozenset({"SHELL", "BASH", "0"})
_ABSOLUTE_VARIABLES: Final = frozenset({"HOME", "PWD", "OLDPWD", "SHELL", "BASH", "PATH", "TMPDIR", "XDG_CONFIG_HOME",
                                        "XDG_DATA_HOME", "XDG_CACHE_HOME", "XDG_RUNTIME_DIR", "MAIL"})  # fmt: skip
#: A command word with glob characters, and the commands such a glob is resolved against (the
#: directories a system keeps them in, as bash would match it; the first match, as bash sorts).
_GLOB_NAME: Final = re.compile(r"[*?\[]")
_SYSTEM_COMMANDS: Final = tuple(sorted(
    f"{d}/{n}" for d in ("/bin", "/sbin", "/usr/bin", "/usr/sbin", "/usr/local/bin") for n in (
        "sh", "bash", "dash", "zsh", "ksh", "rm", "cat", "tac", "less", "more", "head", "tail", "cp", "mv", "dd", "chmod",
        "chown", "curl", "wget", "nc", "ncat", "socat", "python", "python3", "perl", "ruby", "php", "node", "base64",
        "xxd", "openssl", "tar", "zip", "find", "xargs", "env", "sed", "awk", "grep", "shred", "mkfs", "wipefs", "kill",
        "shutdown", "reboot", "sudo", "su", "crontab", "ssh", "scp", "rsync", "ls", "id", "whoami", "echo", "tee",
        "touch", "ln", "od", "strings", "vi", "vim", "telnet", "busybox", "truncate", "unlink", "rmdir", "eval",
    )
))
#: Scratch directories: an unknown command writing there is no finding.
_SCRATCH: Final = ("/tmp/", "/var/tmp/", "/dev/", "/private/tmp/")
#: The text of a substitution that decodes data (its output run as a command is decoded data run).
_DECODER_TEXT: Final = re.compile(r"\b(?:base64|base32|basenc|xxd|openssl|uudecode|gunzip|zcat|rev|tr|printf|od|iconv)\b")
_ASSIGN: Final = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)(\+?)=")
_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_URL: Final = re.compile(r"(?i)\b(?:https?|ftps?|sftp|scp|tftp|wss?|gopher|dict|ldaps?|smb|file)://[^\s'\"<>`]+")
_SECRETISH_VAR: Final = re.compile(
    r"(?i)\$\{?[A-Za-z0-9_]*(secret|token|passw|pwd|api_?key|private|credential|auth|session|cookie|aws_|gh_|github_)"
)
_ENVIRON_PATH: Final = re.compile(r"^/proc/[^/]+/environ$")
_RECON_FILES: Final = re.compile(r"^(/etc/(passwd|group|hosts|hostname|os-release|issue|resolv\.conf|crontab)|/proc/(version|cpuinfo|self/status|net/.*))$")
_ROOTISH_DIR: Final = re.compile(r"^(/+|~/?|\$HOME/?|/etc/?|/root/?|/home/?)$")
_READERS: Final = frozenset({
    "cat", "tac", "less", "more", "head", "tail", "cp", "scp", "rsync", "base64", "base32", "xxd", "od", "hexdump",
    "strings", "grep", "egrep", "fgrep", "rg", "awk", "gawk", "sed", "cut", "sort", "uniq", "nl", "tar", "zip", "gzip",
    "openssl", "gpg", "vi", "vim", "nano", "view", "bat", "jq", "source", ".", "curl", "wget", "nc", "ncat", "socat",
    "diff", "cmp", "md5sum", "sha256sum", "xclip", "pbcopy", "tee", "dd", "mail", "sendmail",
})  # fmt: skip
_RECON: Final = frozenset({
    "whoami", "id", "uname", "hostname", "ifconfig", "ipconfig", "ps", "netstat", "ss", "lsof", "w", "who", "last",
    "nmap", "masscan", "arp", "route", "getent", "groups", "users", "uptime", "lscpu", "lsblk", "dmesg", "systeminfo",
    "nbtscan", "enum4linux", "traceroute", "dig", "nslookup", "host", "zmap", "lsmod", "crontab", "hostnamectl",
})  # fmt: skip
_NET_TOOLS: Final = frozenset({"nc", "ncat", "netcat", "socat", "telnet", "ftp", "sftp", "tftp"})
_CURL_VALUE: Final = frozenset({
    "-o", "--output", "-H", "--header", "-d", "--data", "--data-binary", "--data-raw", "--data-ascii",
    "--data-urlencode", "-X", "--request", "-u", "--user", "-A", "--user-agent", "-e", "--referer", "-F", "--form",
    "--form-string", "-T", "--upload-file", "-x", "--proxy", "-b", "--cookie", "-c", "--cookie-jar", "-K", "--config",
    "-w", "--write-out", "-m", "--max-time", "--connect-timeout", "--url", "--json", "-r", "--range", "-E", "--cert",
    "--key", "--cacert", "--resolve", "--retry", "-C", "--continue-at", "-U", "--proxy-user", "--limit-rate", "-z",
    "--time-cond", "-Y", "-y", "--interface", "--dns-servers", "-Q", "--quote", "--output-dir",
})  # fmt: skip
_CURL_SEND: Final = frozenset({
    "-d", "--data", "--data-binary", "--data-raw", "--data-ascii", "--data-urlencode", "-F", "--form",
    "--form-string", "-T", "--upload-file", "--json",
})  # fmt: skip
_WGET_VALUE: Final = frozenset({
    "-O", "--output-document", "-o", "--output-file", "-a", "-P", "--directory-prefix", "-U", "--user-agent",
    "--header", "-e", "--execute", "-t", "--tries", "-T", "--timeout", "--post-data", "--post-file", "--body-data",
    "--body-file", "--method", "-i", "--input-file", "--user", "--password", "-Q", "--quota", "-w", "--wait",
})  # fmt: skip
_WGET_SEND: Final = frozenset({"--post-data", "--post-file", "--body-data", "--body-file"})
_DISCARD: Final = frozenset({"/dev/null", "/dev/stdout", "/dev/stderr", "/dev/tty"})

# Look-alike letters NFKC leaves alone: Cyrillic, Greek and Armenian homoglyphs of Latin
# letters, dashes, slashes and tildes. Private-use code points this module uses as markers are
# replaced too.
_CONFUSABLES: Final = {
    **dict(zip("аеорсухіјѕԁһӏԛԝкмнтвпгѵ", "aeopcyxijsdhlqwkmhtbnrv")),
    **dict(zip("АВЕКМНОРСТХІЈЅУԌԚԜ", "ABEKMHOPCTXIJSYGQW")),
    **dict(zip("οαινκρτυχεβγμ", "oaivkptuxebym")),
    **dict(zip("ΑΒΕΖΗΙΚΜΝΟΡΤΥΧ", "ABEZHIKMNOPTYX")),
    **dict(zip("ıɑɡօսոհ", "iagounh")),
    **dict(zip("ᴀʙᴄᴅᴇꜰɢʜɪᴊᴋʟᴍɴᴏᴘʀꜱᴛᴜᴠᴡʏᴢ", "abcdefghijklmnoprstuvwyz")),  # small capitals
    "‐": "-", "‑": "-", "‒": "-", "–": "-", "—": "-", "―": "-", "−": "-", "⁃": "-", "﹘": "-",
    "∕": "/", "⁄": "/", "⧸": "/", "˜": "~", "∼": "~",
}  # fmt: skip
_MARK_LO, _MARK_HI = 0xE000, 0xE00F
_CONFUSABLE_TABLE: Final = {ord(k): v for k, v in _CONFUSABLES.items()}
_ZERO_WIDTH: Final = re.compile("[\u200b-\u200f\u2060-\u2064\ufeff\u00ad\u180e\u034f]")

# Markers inside expanded words: brace/comma characters that must not expand (quoted or from a
# variable), a field break (unquoted whitespace from an expansion), unknown-variable bounds.
_LB, _RB, _COMMA, _SPLIT, _UNK_OPEN, _UNK_CLOSE = (chr(_MARK_LO + i) for i in range(6))
_INERT: Final = str.maketrans({"{": _LB, "}": _RB, ",": _COMMA})
_RESTORE: Final = str.maketrans({_LB: "{", _RB: "}", _COMMA: ","})
_UNKNOWN: Final = re.compile(f"{_UNK_OPEN}[^{_UNK_CLOSE}]*{_UNK_CLOSE}")
_BRACE: Final = re.compile(r"\{([^{}]*)\}")
_SEQ: Final = re.compile(r"^(-?\d+|[A-Za-z])\.\.(-?\d+|[A-Za-z])(?:\.\.(-?\d+))?$")
_META: Final = frozenset(" \t\n;&|()<>")
_PLAIN_RUN: Final = re.compile("[^" + re.escape(" \t\n;&|()<>\\'\"`$" + _UNK_OPEN) + "]+")
"""A run of word characters that stand for themselves: `read_word` takes it in one step."""


def fold(text: str) -> str:
    """Unicode folded to ASCII look-alikes, character by character: NFKC, zero-width characters
    dropped, confusables mapped; a character whose fold would be shell syntax stays as it is.
    A word written in another script (it holds a letter with no Latin look-alike: `Документы`,
    `сборка`, `报告`, `σημειώσεις`) is text in that script, not a disguise, and stays as written."""
    if text.isascii():
        return text
    native = _native(text)
    return _NON_ASCII.sub(lambda m: m.group() if m.start() in native else _fold_char(m.group(), False), text)


_LETTERS: Final = re.compile(r"[^\W\d_]+")


def _native(text: str) -> frozenset[int]:
    """Positions of the non-ASCII letters of words that hold a letter no look-alike folds to ASCII."""
    out: set[int] = set()
    for m in _LETTERS.finditer(text):
        word = m.group()
        if not word.isascii() and any(not ch.isascii() and not _fold_char(ch, False).isascii() for ch in word):
            out.update(m.start() + i for i, ch in enumerate(word) if not ch.isascii())
    return frozenset(out)


def _fold_keep(text: str) -> str:
    """`fold` for text this module built: its own markers survive (input never carries them)."""
    if text.isascii():
        return text
    return _NON_ASCII.sub(lambda m: _fold_char(m.group(), True), text)


def fold_mapped(text: str) -> tuple[str, list[int] | None]:
    """`fold(text)` and, for non-ASCII text, where each of its characters came from in `text`
    (one more entry at the end: `len(text)`), so a word of the folded text can be shown as
    written. None for ASCII text (the two are the same)."""
    if text.isascii():
        return text, None
    out: list[str] = []
    origin: list[int] = []
    pos = 0
    native = _native(text)
    for m in _NON_ASCII.finditer(text):
        out.append(text[pos : m.start()])
        origin.extend(range(pos, m.start()))
        folded = m.group() if m.start() in native else _fold_char(m.group(), False)
        out.append(folded)
        origin.extend([m.start()] * len(folded))
        pos = m.end()
    out.append(text[pos:])
    origin.extend(range(pos, len(text) + 1))
    return "".join(out), origin


_NON_ASCII: Final = re.compile(r"[^\x00-\x7f]")


@functools.lru_cache(maxsize=4096)
def _fold_char(ch: str, keep_marks: bool) -> str:
    if _ZERO_WIDTH.match(ch):
        return ""
    if not keep_marks and _MARK_LO <= ord(ch) <= _MARK_HI:
        return "?"  # the analysis's own markers cannot be smuggled in
    folded = unicodedata.normalize("NFKC", ch).translate(_CONFUSABLE_TABLE)
    if folded != ch and any(c in SHELL_SYNTAX for c in folded):
        return ch  # bash takes `（`, `；` or `＇` as letters: folding never makes syntax bash would not see
    return folded


@functools.lru_cache(maxsize=4096)
def is_shell_tool(name: str) -> bool:
    """Whether a tool name matches the shell-like globs, on folded spellings as the rules' `tools`
    are (`runCommand`, `execute-command`); memoised: the set of names is small."""
    return any(name_matches(name, g) for g in SHELL_TOOLS)


class Unparsed(Exception):
    """The command does not lex, or is over a bound: the analysis fails closed."""


class Unlexed(Unparsed):
    """The command does not lex (a syntax error, as opposed to a bound)."""


# ---------------------------------------------------------------- the syntax tree


@dataclass(slots=True)
class Part:
    """One piece of a word: literal text, a variable, a substitution, ANSI-C text."""

    kind: str  # "lit" | "var" | "sub" | "procsub"
    text: str = ""
    quoted: bool = False
    body: list[Any] | None = None  # the parsed script of a substitution
    op: str = ""  # parameter-expansion operator (":-", "#", ...) and its argument in `arg`
    arg: list[Part] | None = None


@dataclass(slots=True)
class Redirect:
    op: str
    target: list[Part]
    heredoc: str | None = None
    strip_tabs: bool = False
    raw: str = ""  # the target as written in the input ("" inside a payload)


@dataclass(slots=True)
class Simple:
    words: list[list[Part]] = field(default_factory=list)
    redirects: list[Redirect] = field(default_factory=list)
    raws: list[str] = field(default_factory=list)  # each word as written in the input (empty inside a payload)


@dataclass(slots=True)
class Group:
    body: list[Any]  # a list of pipelines
    redirects: list[Redirect] = field(default_factory=list)
    subshell: bool = False  # `( … )`: a `cd` inside does not outlast it


@dataclass(slots=True)
class FuncDef:
    name: str
    body: Any


@dataclass(slots=True)
class LoopVar:
    """`for NAME in WORDS` (or `select`): the variable takes the words, all of them at once (a
    rule sees what any iteration would do)."""

    name: str
    words: list[list[Part]]


@dataclass(slots=True)
class Pipeline:
    elements: list[Any]
    background: bool = False


@dataclass(slots=True)
class _Pipes:
    """One list's pipelines as they are read: the finished ones, the current pipeline's elements
    and the command being read."""

    out: list[Pipeline] = field(default_factory=list)
    elements: list[Any] = field(default_factory=list)
    current: Simple | None = None
    expect_command: bool = True

    def end(self, background: bool = False) -> None:
        """The pipeline being read is complete (an empty command is dropped)."""
        if self.current is not None and (self.current.words or self.current.redirects):
            self.elements.append(self.current)
        if self.elements:
            self.out.append(Pipeline(self.elements, background))
        self.elements, self.current, self.expect_command = [], None, True

    def command(self) -> Simple:
        """The command being read, started if there is none."""
        if self.current is None:
            self.current = Simple()
        return self.current


class _Lexer:
    """A recursive-descent reader of the bash subset that matters for analysis."""

    def __init__(self, text: str, raw: str | None = None, origin: list[int] | None = None) -> None:
        self.s = text
        self.i = 0
        self.n = len(text)
        self.pending: list[Redirect] = []
        self.case_depth = 0
        self.raw = raw  # the input as given, when `text` is its fold (`origin` maps one to the other)
        self.origin = origin

    def span(self, start: int, end: int) -> str:
        """The input as given between two positions of the text read ("" inside a payload)."""
        if self.raw is None:
            return ""
        if self.origin is None:
            return self.raw[start:end]
        return self.raw[self.origin[start] : self.origin[end]]

    def error(self, what: str) -> Unparsed:
        return Unlexed(f"{what} at character {self.i}")

    def peek(self, k: int = 0) -> str:
        j = self.i + k
        return self.s[j] if j < self.n else ""

    def skip_blanks(self) -> None:
        s, n = self.s, self.n
        while self.i < n:
            c = s[self.i]
            if c in " \t\r":
                self.i += 1
            elif c == "\\" and self.i + 1 < n and s[self.i + 1] == "\n":
                self.i += 2
            else:
                return

    def read_heredocs(self) -> None:
        for redirect in self.pending:
            delim = "".join(p.text for p in redirect.target)
            lines: list[str] = []
            while self.i < self.n:
                end = self.s.find("\n", self.i)
                end = self.n if end < 0 else end
                line = self.s[self.i : end]
                self.i = min(end + 1, self.n)
                if (line.lstrip("\t") if redirect.strip_tabs else line) == delim:
                    break
                lines.append(line.lstrip("\t") if redirect.strip_tabs else line)
            redirect.heredoc = "\n".join(lines)
        self.pending.clear()

    def parse_list(self, stop: str | None) -> list[Pipeline]:
        """Pipelines up to `stop` (")" for a subshell or substitution, "}" for a group, None: end)."""
        st = _Pipes()
        while True:
            self.skip_blanks()
            if self.i >= self.n:
                if stop is not None:
                    raise self.error(f"missing {stop!r}")
                st.end()
                return st.out
            c = self.s[self.i]
            if c in "#\n;&|":
                self._separator(c, st)
            elif c == ")":
                if stop == ")":
                    self.i += 1
                    st.end()
                    return st.out
                if not self.case_depth:
                    raise self.error("unexpected ')'")
                self.i += 1
            elif c == "(":
                self._open_paren(st)
            elif (c in "<>" or c.isdigit()) and self._redirect(c, st):
                continue
            elif self._word(st, stop):
                return st.out

    def _separator(self, c: str, st: _Pipes) -> None:
        """A comment, newline, `;`, `&`, `&&`, `|`, `||` or `|&` at the reading position."""
        if c == "#":  # at a word's start (words are read whole): a comment to the end of the line
            nl = self.s.find("\n", self.i)
            self.i = self.n if nl < 0 else nl
        elif c == "\n":
            self.i += 1
            st.end()
            if self.pending:
                self.read_heredocs()
        elif c == ";":
            self.i += 2 if self.peek(1) in (";", "&") else 1
            st.end()
        elif c == "&":
            if self.peek(1) == "&":
                self.i += 2
                st.end()
            elif self.peek(1) == ">":
                self.read_redirect(st.command())
            else:
                self.i += 1
                st.end(background=True)
        elif self.peek(1) == "|":
            self.i += 2
            st.end()
        else:
            self.i += 2 if self.peek(1) == "&" else 1
            if st.current is not None:
                st.elements.append(st.current)
            st.current, st.expect_command = None, True

    def _open_paren(self, st: _Pipes) -> None:
        """`((` arithmetic, `name()` a function definition, or `(` a subshell."""
        if self.peek(1) == "(" and st.current is None:  # arithmetic command (( ... ))
            self.skip_arith(2)
            return
        self.i += 1
        current = st.current
        if current is not None and len(current.words) == 1 and not current.redirects:
            self.skip_blanks()
            if self.peek() != ")":
                raise self.error("unexpected '('")
            self.i += 1
            name = "".join(p.text for p in current.words[0])
            self.skip_blank_lines()
            st.elements.append(FuncDef(name, self.parse_compound()))
            st.current = None
            return
        if current is not None:
            raise self.error("unexpected '('")
        st.elements.append(Group(self.parse_list(")"), subshell=True))

    def _redirect(self, c: str, st: _Pipes) -> bool:
        """A redirection or a process substitution `<(…)`/`>(…)` at the reading position; False when
        a digit starts an ordinary word."""
        if c in "<>":
            if self.peek(1) == "(":
                start = self.i
                word = self.read_word()
                st.command().words.append(word)
                st.command().raws.append(self.span(start, self.i))
            else:
                self.read_redirect(st.command())
            return True
        j = self.i
        while j < self.n and self.s[j].isdigit():
            j += 1
        if j < self.n and self.s[j] in "<>" and (j + 1 >= self.n or self.s[j + 1] != "("):
            self.i = j
            self.read_redirect(st.command())
            return True
        return False

    def _word(self, st: _Pipes, stop: str | None) -> bool:
        """The next word: a reserved word in command position, or the command's next word. True when
        it is the `}` that ends the list being read."""
        start = self.i
        word = self.read_word()
        raw = self.s[start : self.i]
        if st.current is None or not st.current.words:
            if raw == stop == "}" and st.expect_command:
                st.end()
                return True
            if self._keyword(raw, st):
                return False
        st.command().words.append(word)
        st.command().raws.append(self.span(start, self.i))
        st.expect_command = False
        return False

    def _keyword(self, raw: str, st: _Pipes) -> bool:
        """Act on `raw` read in command position if it is a reserved word (or a case pattern's `)`);
        False when it is an ordinary command word."""
        if raw == "{" and st.expect_command:
            st.elements.append(Group(self.parse_list("}")))
            st.current = None
        elif raw in _RESERVED:
            pass
        elif raw == "esac":
            self.case_depth = max(0, self.case_depth - 1)
        elif raw in _KEYWORDS_SKIP_LINE or raw == "case":
            header = self.skip_header(raw)
            if raw in _KEYWORDS_SKIP_LINE and len(header) >= 2 and header[1][0] == "in":
                st.out.append(Pipeline([LoopVar(header[0][0], [w for _, w in header[2:]])]))
        elif raw == "function":
            self.skip_blanks()
            fname = "".join(p.text for p in self.read_word())
            self.skip_blanks()
            if self.peek() == "(" and self.peek(1) == ")":
                self.i += 2
            self.skip_blank_lines()
            st.elements.append(FuncDef(fname, self.parse_compound()))
        elif self.case_depth and self.peek() == ")" and st.current is None:
            self.i += 1  # a case pattern `pat)`
        else:
            return False
        return True

    def skip_blank_lines(self) -> None:
        """Blanks and newlines (between a function's header and its body)."""
        self.skip_blanks()
        while self.peek() == "\n":
            self.i += 1
            self.skip_blanks()

    def parse_compound(self) -> Any:
        if self.peek() == "{":
            self.i += 1
            return Group(self.parse_list("}"))
        if self.peek() == "(":
            self.i += 1
            return Group(self.parse_list(")"), subshell=True)
        raise self.error("expected a function body")

    def skip_header(self, keyword: str) -> list[tuple[str, list[Part]]]:
        """Read past `for x in …;`, `select …;` or `case WORD in` (their words are not commands);
        return the words read, each as written and lexed."""
        words: list[tuple[str, list[Part]]] = []
        while self.i < self.n:
            self.skip_blanks()
            c = self.peek()
            if c in ("\n", ";") and keyword != "case":
                self.i += 1
                return words
            if c == "":
                return words
            if c in "();&|<>" and keyword != "case":
                return words
            start = self.i
            if c in "();&|<>":
                self.i += 1
                continue
            words.append(("", self.read_word()))
            words[-1] = (self.s[start : self.i], words[-1][1])
            if keyword == "case" and words[-1][0] == "in":
                self.case_depth += 1
                return words
        return words

    def skip_arith(self, opened: int) -> None:
        depth = 0
        self.i += opened
        while self.i < self.n:
            c = self.s[self.i]
            if c == "(":
                depth += 1
            elif c == ")":
                if depth == 0:
                    self.i += 2 if self.peek(1) == ")" else 1
                    return
                depth -= 1
            self.i += 1
        raise self.error("missing '))'")

    def read_redirect(self, into: Simple) -> None:
        s = self.s
        j = self.i
        while j < self.n and s[j].isdigit():
            j += 1
        self.i = j
        for op in ("<<<", "<<-", "&>>", "<<", ">>", ">&", "<&", "&>", ">|", "<>", "<", ">"):
            if s.startswith(op, self.i):
                self.i += len(op)
                break
        self.skip_blanks()
        if self.i >= self.n or s[self.i] in "\n;&|()":
            if op in (">&", "<&"):
                raise self.error("missing redirection target")
            raise self.error(f"missing target after {op!r}")
        start = self.i
        target = self.read_word()
        redirect = Redirect(op, target, strip_tabs=op == "<<-", raw=self.span(start, self.i))
        if op in ("<<", "<<-"):
            self.pending.append(redirect)
        into.redirects.append(redirect)

    def read_word(self) -> list[Part]:
        parts: list[Part] = []
        s, n = self.s, self.n
        buf: list[str] = []

        def flush() -> None:
            if buf:
                parts.append(Part("lit", "".join(buf)))
                buf.clear()

        plain = _PLAIN_RUN.match
        while self.i < n:
            run = plain(s, self.i)
            if run is not None:
                buf.append(run.group())
                self.i = run.end()
                if self.i >= n:
                    break
            c = s[self.i]
            if c in _META:
                if c in "<>" and self.peek(1) == "(" and (not parts and not buf or _assignment_prefix(parts, buf)):
                    flush()
                    self.i += 2
                    parts.append(Part("procsub", c, body=self.parse_list(")")))
                    continue
                if c == "(" and self.case_depth == 0 and buf and buf[-1].endswith("="):
                    # an array assignment a=(x y): keep its text as a literal
                    end = s.find(")", self.i)
                    if end < 0:
                        raise self.error("missing ')'")
                    buf.append(s[self.i : end + 1])
                    self.i = end + 1
                    continue
                break
            if c == _UNK_OPEN:
                end = s.find(_UNK_CLOSE, self.i)
                end = n if end < 0 else end
                flush()
                parts.append(Part("lit", s[self.i + 1 : end], quoted=True))
                self.i = end + 1
                continue
            if c == "\\":
                if self.i + 1 >= n:
                    self.i += 1
                    continue
                nxt = s[self.i + 1]
                self.i += 2
                if nxt != "\n":
                    flush()
                    parts.append(Part("lit", nxt, quoted=True))
                continue
            if c == "'":
                end = s.find("'", self.i + 1)
                if end < 0:
                    raise self.error("unterminated single quote")
                flush()
                parts.append(Part("lit", s[self.i + 1 : end], quoted=True))
                self.i = end + 1
                continue
            if c == '"':
                flush()
                self.i += 1
                parts.extend(self.read_double())
                continue
            if c == "`":
                flush()
                parts.append(self.read_backtick(quoted=False))
                continue
            if c == "$":
                flush()
                part = self.read_dollar(quoted=False)
                if part is not None:
                    parts.append(part)
                continue
            buf.append(c)
            self.i += 1
        flush()
        return parts

    def read_double(self) -> list[Part]:
        parts: list[Part] = []
        buf: list[str] = []
        s, n = self.s, self.n
        while True:
            if self.i >= n:
                raise self.error("unterminated double quote")
            c = s[self.i]
            if c == '"':
                self.i += 1
                break
            if c == "\\" and self.i + 1 < n and s[self.i + 1] in '$`"\\\n':
                if s[self.i + 1] != "\n":
                    buf.append(s[self.i + 1])
                self.i += 2
                continue
            if c in "$`":
                if buf:
                    parts.append(Part("lit", "".join(buf), quoted=True))
                    buf = []
                part = self.read_backtick(quoted=True) if c == "`" else self.read_dollar(quoted=True)
                if part is not None:
                    parts.append(part)
                continue
            buf.append(c)
            self.i += 1
        if buf or not parts:
            parts.append(Part("lit", "".join(buf), quoted=True))
        return parts

    def read_backtick(self, quoted: bool) -> Part:
        s = self.s
        self.i += 1
        out: list[str] = []
        while True:
            if self.i >= self.n:
                raise self.error("unterminated backtick")
            c = s[self.i]
            if c == "`":
                self.i += 1
                break
            if c == "\\" and self.i + 1 < self.n and s[self.i + 1] in "`\\$":
                out.append(s[self.i + 1])
                self.i += 2
                continue
            out.append(c)
            self.i += 1
        inner = _Lexer("".join(out))
        return Part("sub", "`" + "".join(out) + "`", quoted=quoted, body=inner.parse_list(None))

    def read_dollar(self, quoted: bool) -> Part | None:
        s, n = self.s, self.n
        nxt = self.peek(1)
        if nxt == "(":
            if self.peek(2) == "(":
                start = self.i
                self.i += 1
                self.skip_arith(2)
                return Part("lit", s[start : self.i], quoted=True)
            start = self.i
            self.i += 2
            body = self.parse_list(")")
            return Part("sub", s[start : self.i], quoted=quoted, body=body)
        if nxt == "{":
            depth, j = 1, self.i + 2
            while j < n and depth:
                if s[j] == "{":
                    depth += 1
                elif s[j] == "}":
                    depth -= 1
                elif s[j] == "\\":
                    j += 1
                j += 1
            if depth:
                raise self.error("unterminated ${")
            inner = s[self.i + 2 : j - 1]
            self.i = j
            return _param(inner, quoted)
        if nxt == "'" and not quoted:
            j = self.i + 2
            while j < n and s[j] != "'":
                j += 2 if s[j] == "\\" else 1
            if j >= n:
                raise self.error("unterminated $'")
            text = fold(_ansi_c(s[self.i + 2 : j]))
            self.i = j + 1
            return Part("lit", text, quoted=True)
        if nxt == '"' and not quoted:
            self.i += 1
            return None  # $"..." is a double-quoted string; the next loop reads it
        if nxt and (nxt in "@*#?$!-0123456789"):
            self.i += 2
            return Part("var", nxt, quoted=quoted)
        match = _NAME.match(s, self.i + 1)
        if match:
            self.i = match.end()
            return Part("var", match.group(), quoted=quoted)
        self.i += 1
        return Part("lit", "$", quoted=quoted)


def _assignment_prefix(parts: list[Part], buf: list[str]) -> bool:
    """Whether a word so far is `NAME=` (bash substitutes `NAME=<(cmd)` with /dev/fd/N: round 6,
    `BASH_ENV=<(curl …) bash -c …` sources what the substitution prints)."""
    return not parts and _ASSIGN.fullmatch("".join(buf)) is not None


def _param(inner: str, quoted: bool) -> Part:
    """`${…}`: a name with an optional operator (`:-`, `-`, `:=`, `#`, `%`, `:off:len`, `^^`, `,,`)."""
    if inner.startswith("#") and _NAME.fullmatch(inner[1:]):
        return Part("var", inner[1:], quoted=quoted, op="len")
    if inner.startswith("!"):
        name = inner[1:]
        return Part("var", name if _NAME.fullmatch(name) else "?indirect", quoted=quoted, op="indirect")
    match = _NAME.match(inner) or re.match(r"[@*#?$!0-9]", inner)
    if not match:
        return Part("lit", "${" + inner + "}", quoted=quoted)
    name, rest = match.group(), inner[match.end() :]
    subscript = re.match(r"\[([^\]]*)\]", rest) if match.re is _NAME else None
    if subscript:  # ${a[0]}, ${a[@]}, ${m[key]}: the element (arrays are kept as NAME[i] variables)
        name, rest = f"{name}[{subscript.group(1).strip(chr(34) + chr(39))}]", rest[subscript.end() :]
    for op in (":-", ":=", ":+", ":?", "-", "=", "+", "?", "##", "#", "%%", "%", "^^", ",,", "^", ",", "//", "/", ":"):
        if rest.startswith(op):
            arg = _Lexer(rest[len(op) :]).read_word() if op in (":-", ":=", "-", "=") else [Part("lit", rest[len(op) :])]
            return Part("var", name, quoted=quoted, op=op, arg=arg)
    return Part("var", name, quoted=quoted)


_ANSI: Final = re.compile(r"\\(x[0-9A-Fa-f]{1,2}|u[0-9A-Fa-f]{1,4}|U[0-9A-Fa-f]{1,8}|[0-7]{1,3}|c.|.)", re.S)
_SIMPLE_ESC: Final = {"n": "\n", "t": "\t", "r": "\r", "a": "\a", "b": "\b", "e": "\x1b", "E": "\x1b", "f": "\f", "v": "\v"}


def _unescape(match: re.Match[str]) -> str:
    seq = match.group(1)
    head = seq[0]
    try:
        if head == "x":
            return chr(int(seq[1:], 16))
        if head in "uU":
            return chr(int(seq[1:], 16))
        if head in "01234567":
            return chr(int(seq, 8) & 0xFF)
    except (ValueError, OverflowError):
        return ""
    if head == "c" and len(seq) == 2:
        return chr(ord(seq[1]) & 0x1F)
    return _SIMPLE_ESC.get(head, seq)


def _ansi_c(text: str) -> str:
    """The text of `$'…'` (and of `echo -e`, `printf` formats) with its escapes decoded."""
    return _fold_keep(_ANSI.sub(_unescape, text)) if "\\" in text else text


def _printf(fmt: str, args: list[str]) -> str:
    """What `printf FMT ARGS…` prints, for the common conversions (%s %b %c %d …); the format is
    reused while arguments remain, as printf does."""
    fmt = _ansi_c(fmt)
    values = list(args)
    out: list[str] = []
    for _ in range(64):
        pos = 0
        used = False
        for conv in _PRINTF_CONV.finditer(fmt):
            out.append(fmt[pos : conv.start()])
            pos = conv.end()
            kind = conv.group(1)
            if kind == "%":
                out.append("%")
                continue
            used = True
            value = values.pop(0) if values else ""
            out.append(_ansi_c(value) if kind == "b" else value[:1] if kind == "c" else value)
        out.append(fmt[pos:])
        if not values or not used:
            break
    return "".join(out)


_PRINTF_CONV: Final = re.compile(r"%[-+ #0]*\d*(?:\.\d+)?([sbdciouxXc%])")


# ---------------------------------------------------------------- the analysis


@dataclass(slots=True)
class ShellCommand:
    """One simple command as the shell would run it, after expansion."""

    name: str  # basename of the command word, lower-cased, after wrappers
    path: str  # the command word as written (expanded)
    args: list[str]
    wrappers: list[str]
    via: str  # "" top level; "subst", "procsub", "payload", "stdin", "heredoc", "decoded", "exec"
    parent: str  # the command that runs it (the one with the substitution or the payload)
    upstream: list[str]  # names of the commands earlier in its pipeline
    depth: int
    function: str = ""
    runs_stdin: bool = False

    @property
    def flags(self) -> list[str]:
        """Options, with short clusters split (`-rf` → `-r`, `-f`) and `--long=v` cut at the `=`."""
        out: list[str] = []
        for a in self.args:
            if a == "--":
                break
            if a.startswith("--") and len(a) > 2:
                out.append(a.split("=", 1)[0])
            elif a.startswith("-") and len(a) > 1 and not a[1].isdigit():
                out.extend("-" + ch for ch in a[1:])
        return out

    @property
    def operands(self) -> list[str]:
        ended = False
        out = []
        for a in self.args:
            if not ended and a == "--":
                ended = True
            elif ended or not (a.startswith("-") and len(a) > 1):
                out.append(a)
        return out

    def as_cel(self) -> dict[str, Any]:
        # Only what rules need, once: the Rust engine converts each value of the activation at
        # ~1.5 µs (strings, lists, map entries alike), so no field repeats another. `operands`
        # is not here (every word of it is in `args`).
        return {
            "name": self.name, "args": self.args, "flags": self.flags, "wrappers": self.wrappers,
            "via": self.via, "parent": self.parent, "upstream": self.upstream, "runs_stdin": self.runs_stdin,
        }  # fmt: skip


@dataclass(frozen=True, slots=True)
class PathUse:
    """A file a command touches: what it does to it (`read`, `write`, `delete`, `execute`,
    `list`), the path resolved (`~` for the home, relative to the workspace, look-alike letters
    folded), the word as written (`raw`), the command, whether the path lies `outside` the
    workspace (absolute, in a home, or climbing out with `..`) and whether it is `sensitive`
    (`gateway.sensitive_paths`: credentials and system secrets)."""

    op: str
    path: str
    raw: str
    command: str
    outside: bool
    sensitive: bool

    def as_cel(self) -> dict[str, Any]:
        return {"op": self.op, "path": self.path, "raw": self.raw, "command": self.command,
                "outside": self.outside, "sensitive": self.sensitive}  # fmt: skip


@dataclass(slots=True)
class ShellAnalysis:
    """What a shell would run, for the rules (`args_shell`) and the sequence classes."""

    present: bool = False
    unparsed: bool = False
    reason: str = ""
    source: str = ""
    commands: list[ShellCommand] = field(default_factory=list)
    redirects: list[dict[str, str]] = field(default_factory=list)
    functions: list[dict[str, Any]] = field(default_factory=list)
    urls: list[str] = field(default_factory=list)
    classes: set[str] = field(default_factory=set)
    class_paths: dict[str, list[str]] = field(default_factory=dict)
    paths: list[PathUse] = field(default_factory=list)
    threats: dict[str, list[str]] = field(default_factory=dict)
    #: Windows scripts seen (shell name, as written, deobfuscated), for `shell_threats`; not in CEL.
    scripts: list[tuple[str, str, str]] = field(default_factory=list)
    #: Command names the analysis could not resolve (a variable it cannot know, a glob), with
    #: what makes running it a finding (a path outside the workspace, decoded data): not in CEL.
    hidden: list[tuple[str, str]] = field(default_factory=list)

    def as_cel(self) -> dict[str, Any]:
        """The CEL variable `args_shell`. No field repeats another (see `ShellCommand.as_cel`):
        every word is in `commands[].args`, `names` is the one deliberate copy (the rules' cheap
        `"rm" in args_shell.names` gate), `paths` the resolved form of the words that are files,
        and `urls` stays on the Python side."""
        return {
            "present": self.present, "unparsed": self.unparsed, "reason": self.reason, "source": self.source,
            "names": [c.name for c in self.commands], "commands": [c.as_cel() for c in self.commands],
            "redirects": self.redirects, "functions": self.functions, "classes": sorted(self.classes),
            "class_paths": {k: list(v) for k, v in sorted(self.class_paths.items())},
            "paths": [p.as_cel() for p in self.paths], "threats": {k: list(v) for k, v in self.threats.items()},
        }  # fmt: skip

    def add_class(self, cls: str, path: str = "") -> None:
        self.classes.add(cls)
        if path:
            paths = self.class_paths.setdefault(cls, [])
            if path not in paths and len(paths) < 64:
                paths.append(path)

    def add_path(self, op: str, path: str, outside: bool, raw: str, command: str) -> None:
        """Record that `command` does `op` to the file at `path` (resolved: `shell_paths.resolve`);
        pseudo-devices are left out and repeats kept once."""
        if path in _PSEUDO_FILES or path.startswith(_PSEUDO_DIRS):
            return
        use = PathUse(op, path, raw, command, outside, sensitive_path(path))
        if use not in self.paths:
            if len(self.paths) >= MAX_PATHS:
                raise Unparsed(f"more than {MAX_PATHS} file operands")
            self.paths.append(use)


_PSEUDO_FILES: Final = frozenset({"/dev/null", "/dev/zero", "/dev/random", "/dev/urandom", "/dev/stdin", "/dev/stdout",
                                  "/dev/stderr", "/dev/tty", "/dev/full"})  # fmt: skip
_PSEUDO_DIRS: Final = ("/dev/fd/", "/proc/self/fd/", "/dev/tcp/", "/dev/udp/")


EMPTY_CEL: Final = ShellAnalysis().as_cel()


class _Walker:
    """Expands the syntax tree in order (so assignments reach later words) into ShellCommands."""

    def __init__(self, result: ShellAnalysis) -> None:
        self.result = result
        self.env: dict[str, str] = {}
        self.budget = MAX_INPUT
        self.words = 0
        self.cwd = ""  # the working directory (shell_paths.resolve): "" is the workspace
        self.dirs: list[str] = []  # pushd's stack
        self.links: dict[str, str] = {}  # symlinks this command made: link path -> target path
        self.bodies: dict[str, Any] = {}  # functions defined so far, by name
        self.calling: set[str] = set()  # functions being walked for a call (no recursion)
        self.aliases: dict[str, str] = {}  # aliases defined so far: name -> replacement text
        self.raw_args: list[str] = []  # the current command's arguments as written in the input

    def charge(self, text: str) -> None:
        self.budget -= len(text)
        if self.budget < 0:
            raise Unparsed(f"more than {MAX_INPUT} characters to analyse (payloads included)")

    def script(self, text: str, depth: int, via: str, parent: str, *, outside: bool = False) -> None:
        """Analyse a script: the input (`outside`: folded strictly) or a payload this walk built."""
        if depth > MAX_DEPTH:
            raise Unparsed(f"nested deeper than {MAX_DEPTH} levels of substitutions and payloads")
        self.charge(text)
        if outside:
            folded, origin = fold_mapped(text)
            lexer = _Lexer(folded, raw=text, origin=origin)
        else:
            lexer = _Lexer(text)
        cwd = self.cwd  # a payload runs in a shell of its own: its `cd` does not last
        self.pipelines(lexer.parse_list(None), depth, via, parent, "")
        self.cwd = cwd

    def pipelines(self, items: list[Pipeline], depth: int, via: str, parent: str, function: str) -> str | None:
        """Walk the pipelines; return what they print together, when every part of it is known."""
        printed: list[str] | None = []
        for pipeline in items:
            upstream: list[str] = []
            output: str | None = None
            decoded = False
            for element in pipeline.elements:
                output, decoded = self.element(element, depth, via, parent, function, upstream, output, decoded)
            if output is None or pipeline.background:
                printed = None
            elif printed is not None:
                printed.append(output)
        return None if printed is None else "".join(printed)

    def element(
        self, element: Any, depth: int, via: str, parent: str, function: str, upstream: list[str],
        stdin: str | None, decoded: bool,
    ) -> tuple[str | None, bool]:  # fmt: skip
        if isinstance(element, Simple):
            return self.simple(element, depth, via, parent, function, upstream, stdin, decoded)
        if isinstance(element, LoopVar):
            fields = [f for w in element.words for f in self.expand(w, depth, [])]
            self.env[element.name] = _SPLIT.join(_strip_unknown(f, keep=True) for f in fields)
            return None, False
        if isinstance(element, FuncDef):
            start = len(self.result.commands)
            self.pipelines(element.body.body, depth, via, parent, element.name)
            calls = [c.name for c in self.result.commands[start:]]
            self.result.functions.append({"name": element.name.lower(), "calls": calls})
            self.bodies[element.name.lower()] = element.body  # after its own walk: a call runs it again
            return None, False
        start, cwd = len(self.result.commands), self.cwd
        self.pipelines(element.body, depth, via, parent, function)
        if element.subshell:
            self.cwd = cwd
        upstream.extend(c.name for c in self.result.commands[start:])
        for redirect in element.redirects:
            self.redirect(redirect, "", depth)
        return None, False

    # ---- words

    def expand(self, word: list[Part], depth: int, subs: list[ShellCommand], keep_unknown: bool = True) -> list[str]:
        """One word → the fields the shell would make of it (brace expansion, splitting)."""
        self.words += 1
        if self.words > MAX_WORDS:
            raise Unparsed(f"more than {MAX_WORDS} words")
        pieces: list[str] = []
        quoted = False
        for part in word:
            quoted = quoted or part.quoted
            pieces.append(self.part(part, depth, subs))
        text = "".join(pieces)
        fields = _brace(text) if "{" in text else [text]
        out: list[str] = []
        for f in fields:
            chunks = f.split(_SPLIT) if _SPLIT in f else [f]
            for chunk in chunks:
                chunk = chunk.translate(_RESTORE)
                if chunk or (quoted and len(chunks) == 1):
                    out.append(chunk)
        return out

    def part(self, part: Part, depth: int, subs: list[ShellCommand]) -> str:
        if part.kind == "lit":
            return part.text.translate(_INERT) if part.quoted else part.text
        if part.kind in ("sub", "procsub"):
            start = len(self.result.commands)
            assert part.body is not None
            if depth + 1 > MAX_DEPTH:
                raise Unparsed(f"nested deeper than {MAX_DEPTH} levels of substitutions and payloads")
            cwd = self.cwd
            value = self.pipelines(part.body, depth + 1, "subst" if part.kind == "sub" else "procsub", "", "")
            self.cwd = cwd
            subs.extend(self.result.commands[start:])
            if part.kind == "procsub":
                return "/dev/fd/63"
            if value is None:
                return _UNK_OPEN + part.text.translate(_INERT) + _UNK_CLOSE
            value = value.rstrip("\n").translate(_INERT)
            return value if part.quoted else _split_marks(value)
        return self.variable(part, depth, subs)

    def variable(self, part: Part, depth: int, subs: list[ShellCommand]) -> str:
        name = part.text
        value = self.env.get(name)
        if name == "IFS" and value is None:
            value = " "
        if name in ("@", "*") and value is None:
            value = ""
        if part.op == "indirect":  # ${!name}: the variable whose name `name` holds
            value = self.env.get(value) if value and _NAME.fullmatch(value) else None
        elif part.op in (":-", "-", ":=", "="):
            if not value:
                value = "".join(self.expand(part.arg or [], depth, subs)) if part.arg else ""
                if part.op in (":=", "="):
                    self.env[name] = value
        elif value is not None and part.op:
            value = _param_op(value, part.op, part.arg[0].text if part.arg else "")
        if value is None and name in _SHELL_VARIABLES and not part.op:
            value = "/bin/bash"  # $SHELL, $BASH, $0: the shell running the command
        elif value is None and name in _ABSOLUTE_VARIABLES and part.op == ":" and part.arg and part.arg[0].text.strip() in ("0:1", "0 :1", "0: 1", ":1"):
            value = "/"  # ${HOME:0:1}: every one of these starts with the root
        if value is None:
            return _UNK_OPEN + "$" + name + _UNK_CLOSE
        value = value.translate(_INERT)
        return value if part.quoted else _split_marks(value, self.env.get("IFS", "").translate(_INERT))

    # ---- commands

    def simple(
        self, cmd: Simple, depth: int, via: str, parent: str, function: str, upstream: list[str],
        stdin: str | None, decoded: bool,
    ) -> tuple[str | None, bool]:  # fmt: skip
        subs: list[ShellCommand] = []
        argv, raws = self.command_words(cmd, depth, subs)
        heredoc: str | None = None
        for redirect in cmd.redirects:
            if redirect.op == "<<<":
                heredoc = "".join(self.expand(redirect.target, depth, subs)) + "\n"
            elif redirect.op in ("<<", "<<-"):
                heredoc = redirect.heredoc or ""
        if not argv:
            for redirect in cmd.redirects:
                self.redirect(redirect, "", depth)
            self.adopt(subs, "")
            return "", False
        marked = argv
        argv = [_strip_unknown_name(argv[0])] + [_strip_unknown(a, keep=True) for a in argv[1:]]
        wrappers, rest = _unwrap(argv)
        offset = len(argv) - len(rest)
        payload_args, raws = marked[offset + 1 :], raws[offset:]
        if "env" in wrappers and depth < MAX_DEPTH:  # env GIT_SSH_COMMAND=… git fetch
            for word in argv[:offset]:
                match = _ASSIGN.match(word)
                if match:
                    self.assigned(match.group(1), word[match.end() :], depth)
        feed = stdin if heredoc is None else heredoc  # `xargs rm <<< LIST` reads the here-string
        if "xargs" in wrappers and feed is not None:
            rest, raws, payload_args = _xargs(argv[:offset], feed, rest, raws, payload_args)
        path = rest[0]
        hidden = self.hidden_name(marked[offset], raws[0] if raws else "", path, rest[1:])
        if hidden is not None:
            path = rest[0] = hidden
        name = path.rsplit("/", 1)[-1].lower() or path.lower()
        command = ShellCommand(
            name=name, path=path, args=rest[1:], wrappers=wrappers, via=via, parent=parent,
            upstream=list(upstream), depth=depth, function=function,
        )  # fmt: skip
        command.runs_stdin = _runs_stdin(command)
        self.add(command)
        self.adopt(subs, name)
        self.files(command, raws, payload_args)
        for redirect in cmd.redirects:
            self.redirect(redirect, name, depth)
        upstream.append(name)
        self.assigns(command, stdin if heredoc is None else heredoc, depth)
        self.raw_args = raws[1:]  # as written: a Windows shell's payload is read from these (its `\` are no escapes)
        self.payloads(command, payload_args, depth, stdin if heredoc is None else heredoc, decoded, heredoc is not None)
        if name in self.bodies and name not in self.calling:
            self.call(name, command.args, depth)
        if name == "alias":
            self.aliases.update(a.split("=", 1) for a in command.args if "=" in a and not a.startswith("-"))
        elif path in self.aliases and path not in self.calling:
            self.calling.add(path)  # an alias is its text, then the words after it (not recursive)
            self.script(" ".join([self.aliases[path], *(shlex.quote(a) for a in command.args)]), depth + 1, "payload", "alias")
            self.calling.discard(path)
        output = _command_output(command, stdin if heredoc is None else heredoc)
        return output, decoded or (output is not None and name not in ("echo", "printf", "cat", "find", "fd", "ls"))

    def command_words(self, cmd: Simple, depth: int, subs: list[ShellCommand]) -> tuple[list[str], list[str]]:
        """The command's words after expansion (assignments taken into `env`), and each one as
        written in the input (the expanded word where the input does not show it)."""
        argv: list[str] = []
        raws: list[str] = []
        assigning = True
        for i, word in enumerate(cmd.words):
            if assigning and word and word[0].kind == "lit" and not word[0].quoted:
                match = _ASSIGN.match(word[0].text)
                if match:
                    rest = [Part("lit", word[0].text[match.end() :]), *word[1:]]
                    value = _strip_unknown(" ".join(self.expand(rest, depth, subs)), keep=True)  # not field-split
                    prior = self.env.get(match.group(1), "") if match.group(2) else ""
                    self.env[match.group(1)] = prior + value
                    if value.startswith("(") and value.endswith(")"):
                        self.array(match.group(1), value[1:-1])
                    self.assigned(match.group(1), value, depth)  # GIT_SSH_COMMAND=… runs later
                    continue
            assigning = False
            fields = self.expand(word, depth, subs)
            raw = cmd.raws[i] if i < len(cmd.raws) else ""
            argv.extend(fields)
            raws.extend(raw or _strip_unknown(f, keep=True) for f in fields)
        return argv, raws

    def files(self, c: ShellCommand, raws: list[str], marked: list[str]) -> None:
        """Record the files the command touches (`ShellAnalysis.paths`), then follow a `cd` or a
        symlink it makes. `marked` are its arguments with unknown expansions still marked: one
        inside the letters of a path (`/etc/pa${x}sswd`) is empty, as the shell makes it."""
        name = c.name
        if name in SHELLS and _dash_c(c.args) is not None:
            uses = command_paths(name, c.path, [], frozenset())  # the payload is analysed as a script
        else:
            uses = command_paths(name, c.path, c.args, _inline_flags(name))
        for op, path, raw in _credential_stores(c):
            self.add_path(op, path, raw, name)
        for op, word, index in uses:
            raw = raws[index + 1] if 0 <= index < len(raws) - 1 else raws[0] if index < 0 and word == c.path else word
            if 0 <= index < len(marked) and word == c.args[index]:
                word = _strip_unknown_inner(marked[index])
            self.add_path(op, word, raw, name)
        if name in ("cd", "pushd", "chdir"):
            if name == "pushd":
                self.dirs.append(self.cwd)
            self.cwd = self.directory(next((a for a in c.args if a == "-" or not a.startswith("-")), None))
        elif name == "popd":
            self.cwd = self.dirs.pop() if self.dirs else "$OLDPWD"
        elif name == "ln":
            self.link(uses)

    def resolve(self, word: str) -> tuple[str, bool] | None:
        """`shell_paths.resolve` from the working directory, through the symlinks made so far."""
        resolved = resolve(word, self.cwd)
        if resolved is None or not self.links:
            return resolved
        path = resolved[0]
        for link, target in self.links.items():
            if path == link or path.startswith(link + "/"):
                path = normpath(target + path[len(link) :])
                return path, is_outside(path)
        return resolved

    def add_path(self, op: str, word: str, raw: str, command: str) -> None:
        resolved = self.resolve(word)
        if resolved is not None:
            self.result.add_path(op, resolved[0], resolved[1], raw or word, command)

    def directory(self, target: str | None) -> str:
        """The working directory after `cd TARGET` (`cd` alone: the home; `cd -`: unknown)."""
        if target is None or target == "":
            return "~"
        if target == "-":
            return "$OLDPWD"
        resolved = self.resolve(target)
        if resolved is None:
            return self.cwd
        return "" if resolved[0] == "." else resolved[0]

    def link(self, uses: list[tuple[str, str, int]]) -> None:
        """`ln -s TARGET LINK`: later paths under LINK lead to TARGET (a link into a directory is
        named after its target)."""
        targets = [w for op, w, _ in uses if op == "read"]
        links = [w for op, w, _ in uses if op == "write"]
        if len(targets) != 1 or len(links) != 1:
            return
        target, link = self.resolve(targets[0]), self.resolve(links[0])
        if target is None or link is None or len(self.links) >= 64:
            return
        where = link[0]
        if links[0].endswith("/") or links[0] in (".", ".."):
            where = normpath(where + "/" + target[0].rstrip("/").rsplit("/", 1)[-1])
        self.links[where] = target[0]

    def hidden_name(self, word: str, raw: str, path: str, args: list[str]) -> str | None:
        """A command word the shell resolves at run time: a glob (`/???/r?`, `/usr/bin/b[a]sh`)
        is matched against the well-known system commands (`_SYSTEM_COMMANDS`) and returned as
        the command it stands for; a word that is nothing but unknown expansions (`$TOOL`,
        `$(…)` of unknown output) is unresolvable. Either is recorded in `hidden` when it runs
        on a path outside the workspace or on decoded data (`shell_threats`); None keeps `path`."""
        evidence = ""
        found = None
        if _GLOB_NAME.search(path) and _UNK_OPEN not in word:
            found = _glob_command(path)
            evidence = f"a glob standing for a command name: {path}" + (f" ({found})" if found else "")
        elif (_UNK_OPEN in word and not _UNKNOWN.sub("", word).strip()) or _opaque_value(raw, self.env):
            if _DECODER_TEXT.search(word if _UNK_OPEN in word else self.env.get(_VAR_WORD.fullmatch(raw).group(1), "")):  # type: ignore[union-attr]
                evidence = f"decoded data run as a command: {_strip_unknown(word, keep=True)[:80]}"
            else:
                for a in args:
                    resolved = self.resolve(a) if not a.startswith("-") else None
                    if resolved is not None and resolved[1] and not resolved[0].startswith(_SCRATCH):
                        evidence = f"a command whose name cannot be known ({_strip_unknown(word, keep=True)[:40]}) on {resolved[0]}"
                        break
        if evidence and len(self.result.hidden) < 16:
            self.result.hidden.append((path, evidence))
        return found

    def array(self, name: str, body: str) -> None:
        """`a=(x y z)` / `declare -A m=([k]=v)`: each element as the variable `a[i]`, `a` as
        `a[0]`, and `a[@]` as the whole list (split into words even when quoted, as `"$@"`)."""
        try:
            items = shlex.split(body)
        except ValueError:
            return
        values: list[str] = []
        for i, item in enumerate(items[:256]):
            keyed = re.match(r"^\[([^\]]*)\]=(.*)$", item, re.S)
            key, value = (keyed.group(1).strip("\"'"), keyed.group(2)) if keyed else (str(i), item)
            self.env[f"{name}[{key}]"] = value
            values.append(value)
        self.env[name] = values[0] if values else ""
        self.env[f"{name}[@]"] = _SPLIT.join(values)
        self.env[f"{name}[*]"] = " ".join(values)

    def assigns(self, c: ShellCommand, stdin: str | None, depth: int) -> None:
        """Variables set by builtins: `export/declare/local/typeset/readonly NAME=VALUE`, `printf
        -v NAME FORMAT ARGS`, `read NAME… <<< WORD` (or from known input)."""
        name, args = c.name, c.args
        if name in ("export", "declare", "local", "typeset", "readonly"):
            for a in args:
                match = _ASSIGN.match(a)
                if match:
                    prior = self.env.get(match.group(1), "") if match.group(2) else ""
                    self.env[match.group(1)] = prior + a[match.end() :]
                    if a[match.end() :].startswith("(") and a.endswith(")"):
                        self.array(match.group(1), a[match.end() + 1 : -1])
                    self.assigned(match.group(1), a[match.end() :], depth)
        elif name == "set" and args and (args[0] == "--" or not args[0].startswith(("-", "+"))):
            params = args[1:] if args[0] == "--" else args  # set -- a b c: the positional parameters
            for i, key in enumerate(_POSITIONAL):
                self.env[key] = params[i] if i < len(params) else ""
            self.env["@"], self.env["*"], self.env["#"] = _SPLIT.join(params), " ".join(params), str(len(params))
        elif name == "printf" and len(args) >= 3 and args[0] == "-v" and _NAME.fullmatch(args[1]):
            self.env[args[1]] = _printf(args[2], args[3:])
        elif name == "read" and stdin is not None:
            names = [a for a in _read_names(args) if _NAME.fullmatch(a)]
            if names:
                line = stdin.split("\n", 1)[0]
                ifs = self.env.get("IFS", " \t")
                fields = re.split("[" + re.escape(ifs) + "]+", line.strip(ifs), maxsplit=len(names) - 1) if ifs else [line]
                for var, value in zip(names, fields + [""] * len(names)):
                    self.env[var] = value

    def call(self, name: str, args: list[str], depth: int) -> None:
        """A function this command defined, called: its body again, with `$1…`, `$@`, `$#` set."""
        if depth + 1 > MAX_DEPTH:
            raise Unparsed(f"nested deeper than {MAX_DEPTH} levels of substitutions and payloads")
        saved = {k: self.env.get(k) for k in (*_POSITIONAL, "@", "*", "#")}
        for i, key in enumerate(_POSITIONAL):
            self.env[key] = args[i] if i < len(args) else ""
        self.env["@"], self.env["*"], self.env["#"] = _SPLIT.join(args), " ".join(args), str(len(args))
        self.calling.add(name)
        try:
            self.pipelines(self.bodies[name].body, depth + 1, "call", name, name)
        finally:
            self.calling.discard(name)
            for k, v in saved.items():
                if v is None:
                    self.env.pop(k, None)
                else:
                    self.env[k] = v

    def add(self, command: ShellCommand) -> None:
        if len(self.result.commands) >= MAX_COMMANDS:
            raise Unparsed(f"more than {MAX_COMMANDS} commands")
        self.result.commands.append(command)

    def adopt(self, subs: list[ShellCommand], parent: str) -> None:
        for sub in subs:
            if not sub.parent:
                sub.parent = parent

    def redirect(self, redirect: Redirect, name: str, depth: int) -> None:
        if redirect.op in ("<<", "<<-"):
            target = "<<heredoc"
        else:
            subs: list[ShellCommand] = []
            target = _strip_unknown(" ".join(self.expand(redirect.target, depth, subs)), keep=True)
            self.adopt(subs, name)
            op = _REDIRECT_OPS.get(redirect.op)
            if op is not None and not (redirect.op in (">&", "<&") and (target.isdigit() or target == "-")):
                self.add_path(op, target, redirect.raw, name)
        self.result.redirects.append({"op": redirect.op, "target": target, "command": name})

    def payloads(
        self, c: ShellCommand, args: list[str], depth: int, stdin: str | None, decoded: bool, heredoc: bool
    ) -> None:
        """Run what the command runs: `sh -c X`, `eval X`, `su -c X`, `find -exec`, a shell's stdin.

        `args` are the command's arguments with unknown expansions still marked (kept opaque); a
        payload that is nothing but unknown expansions has nothing to analyse.
        """
        name = c.name
        text = _dash_c(args, anywhere=name == "su") if name in SHELLS or name == "su" else None
        if name == "eval" and args:
            text = " ".join(args)
        if text is not None:
            if _UNKNOWN.sub("", text).strip():
                self.script(text, depth + 1, "payload", name)
            return
        if name in POWERSHELLS or name in CMDS:
            self.windows(c, depth)
            return
        if name in ("find", "fd") and ("-exec" in c.args or "-execdir" in c.args or "-ok" in c.args or "-x" in c.args):
            targets = find_targets(c.args)  # what `{}` stands for
            for sub_argv in _find_exec(c.args):
                self.synthetic([x for a in sub_argv for x in _find_subst(a, targets)], depth + 1, "exec", name)
        for run in option_payloads(name, c.args) if depth < MAX_DEPTH else ():
            self.run_text(run, depth, "exec", name)
        code = _inline_code(c) if _PYTHON.match(name) or name in SCRIPT_FLAGS or name in _AWKS else None
        if code is not None:
            self.inline(code, name, depth)
        if c.runs_stdin and stdin is not None and (name in SHELLS or name in ("source", ".")):
            self.script(stdin, depth + 1, "heredoc" if heredoc else ("decoded" if decoded else "stdin"), name)
        elif c.runs_stdin and stdin is not None and depth < MAX_DEPTH:
            if code is None:  # `python3 - <<'PY'`, `node <<JS`: the program is the input
                self.inline(stdin, name, depth)
            else:  # `python3 -c 'os.system(sys.stdin.read())'`: the input is run as a command line
                self.run_text(stdin, depth, "decoded" if decoded else "stdin", name)

    def inline(self, code: str, name: str, depth: int) -> None:
        """Code on an interpreter's command line: the files its string literals name, and the
        shell commands it hands to `os.system`, `subprocess`, `execSync`, `system`… (a command
        line that does not lex would not run either, and is left out)."""
        language = _language(name)
        folded = fold_inline(code, language)
        if folded != code:  # paths built from the home and literals, written out
            code = code + "\n" + folded
        if depth < MAX_DEPTH:
            runs = _INLINE_RUNS.search(code) is not None
            for decoded in _inline_decoded(code):
                self.inline(decoded, name, depth + 1)
                if runs:  # handed to a shell or eval: it may be a command line
                    try:
                        self.script(fold(decoded), depth + 1, "decoded", name)
                    except (Unlexed, Unparsed):
                        pass
        for op, literal in inline_paths(code, language):
            self.add_path(op, literal, literal, name)
        for command in inline_commands(code, language):
            if isinstance(command, list):
                self.synthetic([fold(w) for w in command], depth + 1, "payload", name)
                continue
            try:
                self.script(fold(command), depth + 1, "payload", name)
            except Unlexed:
                continue

    def assigned(self, name: str, value: str, depth: int) -> None:
        """An environment variable set for what runs next: a command it names is analysed (`PAGER`,
        `GIT_SSH_COMMAND`), and one that makes programs load code is a hidden execution."""
        if depth >= MAX_DEPTH or not value.strip():
            return
        if name in COMMAND_VARIABLES:
            self.run_text(value, depth, "exec", name)
        elif name in LOADER_VARIABLES or name.startswith("GIT_CONFIG_"):
            evidence, run = env_injection(name, value, self.env)
            if evidence is not None:
                self.result.hidden.append((name, evidence))
            if run:
                self.run_text(run, depth, "exec", name)

    def run_text(self, run: str | list[str], depth: int, via: str, parent: str) -> None:
        """A command line (a string) or an argv (a list) that a command runs, analysed as a
        command of its own; a string that does not lex would not run either and is left out."""
        program = (run[0] if run else "") if isinstance(run, list) else (run.split() or [""])[0]
        if via == "exec" and planted_place(program):
            self.result.hidden.append((parent, f"{parent} runs {program[:80]}, a planted program"))
        if isinstance(run, list):
            self.synthetic([fold(w) for w in run if w], depth + 1, via, parent)
            return
        try:
            self.script(fold(run), depth + 1, via, parent)
        except Unlexed:
            pass

    def windows(self, c: ShellCommand, depth: int) -> None:
        """A PowerShell or cmd.exe payload, as the POSIX commands it amounts to (windows_shell)."""
        args = c.args
        if len(self.raw_args) == len(args):  # bash would eat the backslashes of C:\Users\x; Windows does not
            args = [r[1:-1] if len(r) > 1 and r[0] == r[-1] and r[0] in "'\"" else r for r in self.raw_args]
        if c.name in POWERSHELLS:
            text = powershell_payload(args)
            clear = deobfuscate_powershell(text) if text else ""
            commands = powershell_commands(fold(clear)) if text else []
        else:
            text = cmd_payload(args)
            clear, built = expand_cmd(text) if text else ("", False)
            commands = cmd_commands(fold(clear)) if text else []
            if built:
                self.result.scripts.append(("cmd-built", text or "", clear))
            for inner in re.findall(r"(?:^|&&?|\|\|?)\s*(?:call\s+)?((?:pwsh|powershell)(?:\.exe)?\s[^&|]*)", clear, re.I):
                try:
                    self.script(inner, depth + 1, "payload", c.name)  # a shell the expansion revealed
                except Unlexed:  # PowerShell syntax (`iex(iwr …)`): `cmd_commands` hands it over as an argv
                    pass
        if text and len(self.result.scripts) < 16:
            self.result.scripts.append((c.name, text, clear))
        for command in commands:
            if isinstance(command, list):
                self.synthetic(command, depth + 1, "payload", c.name)
            else:
                self.script(command, depth + 1, "payload", c.name)

    def synthetic(self, argv: list[str], depth: int, via: str, parent: str) -> None:
        if not argv:
            return
        wrappers, rest = _unwrap(argv)
        command = ShellCommand(
            name=rest[0].rsplit("/", 1)[-1].lower(), path=rest[0], args=rest[1:], wrappers=wrappers, via=via,
            parent=parent, upstream=[], depth=depth,
        )  # fmt: skip
        command.runs_stdin = _runs_stdin(command)
        self.add(command)
        self.files(command, [rest[0], *command.args], command.args)
        self.raw_args = []
        self.payloads(command, command.args, depth, None, False, False)


_REDIRECT_OPS: Final = {">": "write", ">>": "write", ">|": "write", "&>": "write", "&>>": "write", "<>": "write",
                         ">&": "write", "<": "read", "<&": "read"}  # fmt: skip


def inline_source(c: ShellCommand) -> str | None:
    """The code an interpreter runs from its command line (PowerShell's deobfuscated), for
    `shell_threats`; None for any other command."""
    if c.name in POWERSHELLS:
        text = powershell_payload(c.args)
        return deobfuscate_powershell(text) if text else None
    if _PYTHON.match(c.name) or c.name in SCRIPT_FLAGS or c.name in _AWKS:
        return _inline_code(c)
    return None


def _inline_flags(name: str) -> frozenset[str] | None:
    """The flags that give an interpreter its code on the command line; None for a command that
    is not an interpreter (`source` and `.` run their first operand: no flags)."""
    if name in SHELLS or _PYTHON.match(name):
        return frozenset({"-c"})
    if name in SCRIPT_FLAGS:
        return frozenset(SCRIPT_FLAGS[name])
    return None


def _inline_code(c: ShellCommand) -> str | None:
    """The code given on an interpreter's command line (`python3 -c CODE`, `node -e CODE`, an
    awk program)."""
    if c.name in _AWKS:
        args, i = c.args, 0
        while i < len(args) and args[i].startswith("-") and args[i] != "--":
            if args[i] == "-f":
                return None
            i += 2 if args[i] in ("-F", "-v") else 1
        return args[i] if i < len(args) else None
    flags = {"-c"} if _PYTHON.match(c.name) else SCRIPT_FLAGS[c.name]
    for i, a in enumerate(c.args):
        if a in flags or (c.name in ("perl", "ruby") and re.fullmatch(r"-[a-zA-Z]*[eE]", a)):  # `perl -ne CODE`
            return c.args[i + 1] if i + 1 < len(c.args) else None
        short = next((f for f in flags if len(f) == 2 and a.startswith(f) and len(a) > 2), None)
        if short is not None and c.name not in _POWERSHELL_NAMES:  # `ruby -e'CODE'`, `python3 -cCODE`
            return a[2:]
    return None


_AWKS: Final = frozenset({"awk", "gawk", "mawk", "nawk"})
_POWERSHELL_NAMES: Final = frozenset({"pwsh", "powershell"})


def _language(name: str) -> str:
    """The language family of an interpreter, for `shell_paths.inline_commands`."""
    if _PYTHON.match(name):
        return "python"
    if name in _AWKS:
        return "awk"
    return {"nodejs": "node", "deno": "node", "bun": "node"}.get(name, name)


_B64_CALL: Final = re.compile(
    r"(?:b64decode|decodebytes|decode64|decode_base64|atob|frombase64string)\(\s*b?(['\"])([A-Za-z0-9+/=\s]{8,})\1"
    r"|buffer\.from\(\s*(['\"])([A-Za-z0-9+/=]{8,})\3\s*,\s*['\"]base64['\"]",
    re.I,
)
#: Hex that inline code decodes: perl `pack("H*", …)`, `bytes.fromhex`, `unhexlify`, `Buffer.from(…, 'hex')`.
_HEX_CALL: Final = re.compile(
    r"(?:pack\s*\(?\s*['\"][Hh]\*?['\"]\s*,\s*|fromhex\(\s*|unhexlify\(\s*b?|a2b_hex\(\s*b?)(['\"])((?:[0-9a-fA-F]{2}){4,})\1"
    r"|buffer\.from\(\s*(['\"])((?:[0-9a-fA-F]{2}){4,})\3\s*,\s*['\"]hex['\"]",
    re.I,
)
#: Inline code that hands text to a shell or evaluates it (decoded text there may be a command line).
_INLINE_RUNS: Final = re.compile(
    r"\b(?:os\.system|os\.popen|subprocess|exec|execSync|spawn|system|eval|popen|passthru|shell_exec|proc_open|"
    r"os\.execute|io\.popen|child_process)\b|`"
)


def _inline_decoded(code: str) -> list[str]:
    """The base64 literals inline code decodes (`base64.b64decode('…')`, `Buffer.from('…',
    'base64')`, `decode_base64`, `atob`), as text: code it is about to run or write, analysed as more code."""
    out: list[str] = []
    for m in _B64_CALL.finditer(code[:65_536]):
        data = re.sub(r"\s", "", m.group(2) or m.group(4) or "")
        try:
            text = base64.b64decode(data + "=" * (-len(data) % 4), validate=True).decode("utf-8")
        except (binascii.Error, ValueError, UnicodeDecodeError):
            continue
        out.append(text)
    for m in _HEX_CALL.finditer(code[:65_536]):
        try:
            out.append(bytes.fromhex(m.group(2) or m.group(4) or "").decode("utf-8"))
        except (ValueError, UnicodeDecodeError):
            continue
    return out[:8]


def _split_marks(value: str, ifs: str | None = None) -> str:
    """Unquoted expansion: whitespace (or the characters of a custom `IFS`) becomes a field break."""
    if ifs and ifs.strip(" \t\n"):
        value = re.sub("[" + re.escape(ifs) + "]+", " ", value)
    return re.sub(r"[ \t\n]+", _SPLIT, value) if any(ch in value for ch in " \t\n") else value


def _strip_unknown(text: str, keep: bool) -> str:
    """Unknown variables: kept as `$NAME` (keep) or dropped (the shell would expand an unset one to nothing)."""
    if _UNK_OPEN not in text:
        return text
    if keep:
        return text.replace(_UNK_OPEN, "").replace(_UNK_CLOSE, "")
    return _UNKNOWN.sub("", text)


_INNER_UNKNOWN: Final = re.compile(f"(?<=[^/\\s{_UNK_CLOSE}]){_UNK_OPEN}[^{_UNK_CLOSE}]*{_UNK_CLOSE}(?=[^/\\s{_UNK_OPEN}])")
_POSITIONAL: Final = tuple(str(i) for i in range(1, 10))


def _strip_unknown_inner(word: str) -> str:
    """A path word like `/etc/pa${x}sswd`: an unknown variable between other letters of one
    segment counts as empty (the shell expands an unset one to nothing); one that is a whole
    segment or starts the word (`$DIR/x`, `/home/$USER`) stays `$NAME`."""
    if _UNK_OPEN not in word:
        return word
    return _strip_unknown(_INNER_UNKNOWN.sub("", word), keep=True)


def _xargs(options: list[str], stdin: str, *argvs: list[str]) -> tuple[list[str], ...]:
    """The command xargs runs on known input: the input's words appended, or with `-I R` (`-i`,
    `--replace`) each R in the arguments replaced by the first line (every line runs alike)."""
    replace = None
    for i, a in enumerate(options):
        if a == "-I" and i + 1 < len(options):
            replace = options[i + 1]
        elif a.startswith("-I") and len(a) > 2:
            replace = a[2:]
        elif a in ("-i", "--replace"):
            replace = "{}"
        elif a.startswith(("--replace=", "-i")):
            replace = a.split("=", 1)[1] if a.startswith("--") else a[2:]
    if not replace:
        extra = stdin.split()[:256]
        return tuple(list(v) + extra for v in argvs)
    line = next((x.strip() for x in stdin.split("\n") if x.strip()), "")
    return tuple([w.replace(replace, line) for w in v] for v in argvs)


def _read_names(args: list[str]) -> list[str]:
    """The variable names of `read [-r] [-p PROMPT] [-d DELIM] … NAME…`."""
    names, skip = [], False
    for a in args:
        if skip:
            skip = False
        elif a in ("-p", "-d", "-n", "-N", "-t", "-u", "-a", "-i"):
            skip = True
        elif not a.startswith("-"):
            names.append(a)
    return names


def _strip_unknown_name(word: str) -> str:
    """A command word like `r${x}m`: unknown variables inside other letters count as empty."""
    if _UNK_OPEN not in word:
        return word
    dropped = _UNKNOWN.sub("", word)
    return dropped if dropped else _strip_unknown(word, keep=True)


def _param_op(value: str, op: str, arg: str) -> str:
    if op == "len":
        return str(len(value))
    if op in ("^^", "^"):
        return value.upper() if op == "^^" else value[:1].upper() + value[1:]
    if op in (",,", ","):
        return value.lower() if op == ",," else value[:1].lower() + value[1:]
    if op in ("#", "##"):
        return value[len(arg) :] if arg and value.startswith(arg) else value
    if op in ("%", "%%"):
        return value[: -len(arg)] if arg and value.endswith(arg) else value
    if op in ("/", "//"):
        pattern, _, repl = arg.partition("/")
        return value.replace(pattern, repl, -1 if op == "//" else 1) if pattern else value
    if op == ":":
        bits = arg.split(":")
        try:
            start = int(bits[0].strip() or 0)
            if len(bits) > 1:
                return value[start : start + int(bits[1].strip())]
            return value[start:]
        except ValueError:
            return value
    return value


def _brace(text: str) -> list[str]:
    """Bash brace expansion (`{a,b}`, `{1..3}`, `{a..e}`), innermost first, bounded."""
    results = [text]
    for _ in range(64):
        changed = False
        nxt: list[str] = []
        for item in results:
            match = _find_brace(item)
            if match is None:
                nxt.append(item)
                continue
            start, end, options = match
            changed = True
            nxt.extend(item[:start] + option + item[end:] for option in options)
            if len(nxt) > MAX_BRACE:
                raise Unparsed(f"brace expansion makes more than {MAX_BRACE} words")
        results = nxt
        if not changed:
            return results
    raise Unparsed("brace expansion nested too deeply")


def _find_brace(text: str) -> tuple[int, int, list[str]] | None:
    for match in _BRACE.finditer(text):
        body = match.group(1)
        if "," in body:
            return match.start(), match.end(), body.split(",")
        seq = _SEQ.match(body)
        if seq:
            a, b, step = seq.group(1), seq.group(2), int(seq.group(3) or 1) or 1
            if a.lstrip("-").isdigit() and b.lstrip("-").isdigit():
                lo, hi = int(a), int(b)
                if abs(hi - lo) // abs(step) > MAX_BRACE:
                    raise Unparsed(f"brace expansion makes more than {MAX_BRACE} words")
                rng = range(lo, hi + (1 if hi >= lo else -1), abs(step) if hi >= lo else -abs(step))
                return match.start(), match.end(), [str(x) for x in rng]
            if a.isalpha() and b.isalpha():
                lo_c, hi_c = ord(a), ord(b)
                rng = range(lo_c, hi_c + (1 if hi_c >= lo_c else -1), 1 if hi_c >= lo_c else -1)
                return match.start(), match.end(), [chr(x) for x in rng]
    return None


def _unwrap(argv: list[str]) -> tuple[list[str], list[str]]:
    """Strip wrappers (`sudo -u x`, `env A=b`, `timeout 5`, `xargs -0`, `command`, …) off the front.

    A wrapper with nothing after it is the command itself (`sudo -l`, `env`); `command -v X`
    looks a name up and runs nothing.
    """
    wrappers: list[str] = []
    i = last = 0
    while i < len(argv):
        base = argv[i].rsplit("/", 1)[-1].lower()
        options = WRAPPERS.get(base)
        if options is None or (base == "command" and any(a in ("-v", "-V") for a in argv[i + 1 : i + 2])):
            break
        wrappers.append(base)
        last = i
        i += 1
        positional = base in _WRAPPER_POSITIONAL
        while i < len(argv):
            a = argv[i]
            if a == "--":
                i += 1
                break
            if base == "env" and _ASSIGN.match(a):
                i += 1
                continue
            if a.startswith("-") and len(a) > 1:
                i += 2 if a in options else 1
                continue
            if positional:
                positional = False
                i += 1
                continue
            break
    if i >= len(argv) and wrappers:
        return wrappers[:-1], argv[last:]
    return wrappers, argv[i:]


#: A word that is one variable (`$c`, `"${c}"`).
_VAR_WORD: Final = re.compile(r'"?\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?"?')


def _opaque_value(raw: str, env: dict[str, str]) -> bool:
    """Whether a command word written as one variable holds the text of a substitution the
    analysis could not run (`c=$(base64 -d < f); $c`): its value is only known at run time."""
    m = _VAR_WORD.fullmatch(raw)
    value = env.get(m.group(1), "") if m else ""
    return value.startswith(("$(", "`"))


@functools.lru_cache(maxsize=256)
def _glob_command(pattern: str) -> str | None:
    """The well-known system command a glob in command position matches (segment by segment, as
    bash matches paths), or None."""
    parts = pattern.split("/")
    for candidate in _SYSTEM_COMMANDS if pattern.startswith("/") else ():
        segments = candidate.split("/")
        if len(segments) == len(parts) and all(fnmatch.fnmatchcase(s, p) for s, p in zip(segments, parts)):
            return candidate
    return None


def _dash_c(args: list[str], anywhere: bool = False) -> str | None:
    """The command string of `sh -c STRING` / `bash -lc STRING` (options first) or, with
    `anywhere`, of `su USER -c STRING`."""
    for i, a in enumerate(args):
        if a == "--":
            return None
        if a.startswith("--command="):
            return a.split("=", 1)[1]
        if a in ("-c", "--command") or (a.startswith("-") and not a.startswith("--") and "c" in a[1:]):
            # the payload is the first operand after the options
            for b in args[i + 1 :]:
                if not (b.startswith("-") or b.startswith("+")) or b == "-":
                    return b
            return None
        if not anywhere and not (a.startswith("-") or a.startswith("+")):
            return None
    return None


def _runs_stdin(c: ShellCommand) -> bool:
    """Whether the command runs code read from its standard input (`| sh`, `| python3 -`)."""
    name, args = c.name, c.args
    if name in SHELLS:
        if _dash_c(args) is not None:
            return False
        operands = [a for a in args if not (a.startswith("-") or a.startswith("+"))]
        return not operands or operands[0] == "-" or "-s" in args
    if (_PYTHON.match(name) or name in SCRIPT_FLAGS) and (code := _inline_code(c)) is not None:
        return _CODE_RUNS_STDIN.search(code) is not None and _INLINE_RUNS.search(code) is not None
    if _PYTHON.match(name):
        if any(a in ("-c", "-m") or (a.startswith("-") and not a.startswith("--") and a[-1] in "cm") for a in args):
            return False
        operands = [a for a in args if not a.startswith("-") or a == "-"]
        return not operands or operands[0] == "-"
    flags = SCRIPT_FLAGS.get(name)
    if flags is not None:
        if any(a in flags for a in args):
            return False
        operands = [a for a in args if not a.startswith("-") or a == "-"]
        return not operands or operands[0] == "-"
    if name in ("source", "."):
        return bool(args) and args[0] in ("/dev/stdin", "/dev/fd/0", "-")
    return False


#: Inline code that reads its standard input whole (what it then runs, with `_INLINE_RUNS`).
_CODE_RUNS_STDIN: Final = re.compile(
    r"sys\.stdin|\binput\(\s*\)|<STDIN>|\bSTDIN\b|\$stdin|process\.stdin|readFileSync\(\s*(?:0|['\"]/dev/stdin['\"])|"
    r"php://stdin|io\.read|\bARGF\b|\bgets\b"
)


def _find_exec(args: list[str]) -> list[list[str]]:
    out: list[list[str]] = []
    i = 0
    while i < len(args):
        if args[i] in ("-exec", "-execdir", "-ok", "-okdir", "-x"):
            j = i + 1
            cmd: list[str] = []
            while j < len(args) and args[j] not in (";", "+", "\\;"):
                cmd.append(args[j])
                j += 1
            out.append(cmd)
            i = j
        i += 1
    return out


def _find_subst(word: str, targets: list[str]) -> list[str]:
    """One `-exec` word with `{}` replaced by each of find's targets: GNU find replaces it
    anywhere in a word (`-F f=@{}`, `--post-file={}`), not only as a word of its own (round 6)."""
    if "{}" not in word:
        return [word]
    return [word.replace("{}", t) for t in targets]


def _command_output(c: ShellCommand, stdin: str | None) -> str | None:
    """What the command prints, when it is a known producer or filter of known input."""
    name, args = c.name, c.args
    if name == "echo":
        flags = set()
        words = list(args)
        while words and re.fullmatch(r"-[neE]+", words[0]):
            flags |= set(words.pop(0)[1:])
        text = " ".join(words)
        if "e" in flags:
            text = _ansi_c(text)
        return text if "n" in flags else text + "\n"
    if name == "printf" and args:
        if args[0] == "-v":
            return ""  # printf -v assigns a variable and prints nothing
        return _printf(args[0], args[1:])
    if name in ("find", "fd", "ls"):
        return listing(name, args)
    if name == "dirname" and c.operands:  # `dirname "$PWD"`: the directory above the workspace
        word = c.operands[0].rstrip("/")
        return (word.rsplit("/", 1)[0] if "/" in word.lstrip("/") else (".." if word in ("$PWD", ".", "") else ".")) + "\n"
    if (name == "which" or (name == "command" and args[:1] in (["-v"], ["-V"])) or (name == "type" and "-P" in args)) and c.operands:
        return "/usr/bin/" + c.operands[-1].rsplit("/", 1)[-1] + "\n"  # where a well-known command lives
    if stdin is None:
        return None
    if name == "cat" and not c.operands:
        return stdin
    if name in ("base64", "base32") and any(f in c.flags for f in ("-d", "-D", "--decode")):
        return _decode(stdin, name)
    if name == "basenc" and any(f in c.flags for f in ("-d", "--decode")):
        kind = "base32" if "--base32" in args else "hex" if "--base16" in args else "base64"
        return _decode(stdin, kind)
    if name == "openssl" and ("base64" in args or "-base64" in args or "-a" in args) and "-d" in args:
        return _decode(stdin, "base64")
    if name == "xxd" and "-r" in c.flags and "-p" in c.flags:
        return _decode(stdin, "hex")
    if name == "rev":
        return "\n".join(line[::-1] for line in stdin.rstrip("\n").split("\n")) + "\n"
    if name == "tr" and len(c.operands) == 2 and not c.flags:
        source, target = (_tr_set(x) for x in c.operands)
        if source and target:
            target = target + target[-1] * max(0, len(source) - len(target))
            return stdin.translate(str.maketrans(source, target[: len(source)]))
    return None


def _tr_set(spec: str) -> str:
    spec = _ansi_c(spec)
    out: list[str] = []
    i = 0
    while i < len(spec):
        if i + 2 < len(spec) and spec[i + 1] == "-":
            lo, hi = ord(spec[i]), ord(spec[i + 2])
            if hi - lo > 256:
                return ""
            out.extend(chr(x) for x in range(lo, hi + 1))
            i += 3
        else:
            out.append(spec[i])
            i += 1
    return "".join(out)


def _decode(data: str, kind: str) -> str | None:
    text = "".join(data.split())
    try:
        if kind == "base64":
            raw = base64.b64decode(text + "=" * (-len(text) % 4), validate=False)
        elif kind == "base32":
            raw = base64.b32decode(text + "=" * (-len(text) % 8))
        else:
            raw = binascii.unhexlify(text)
    except (binascii.Error, ValueError):
        return None
    return fold(raw.decode("utf-8", errors="replace"))


# ---------------------------------------------------------------- classes


def classify_commands(result: ShellAnalysis) -> ShellAnalysis:
    """`result` with its classes filled from its commands (for a part of a walk: `shell_threats`)."""
    _classify(result)
    return result


def _classify(result: ShellAnalysis) -> None:
    """Fill the call classes (credential_read, env_read, network_send, download, write, execute,
    recon, destructive) and the paths each touches."""
    add = result.add_class
    for redirect in result.redirects:
        op, target = redirect["op"], redirect["target"]
        if op in (">", ">>", ">|", "&>", "&>>", "<>") and target not in _DISCARD and not target.startswith("&"):
            if target.startswith("/dev/tcp/") or target.startswith("/dev/udp/"):
                add("network_send", target)
            else:
                add("write", _plain_path(target))
        if op == "<" and sensitive_path(target):
            add("credential_read", target)
        if op == "<" and target.startswith("/dev/tcp/"):
            add("network_send", target)
    for c in result.commands:
        name, args, operands, flags = c.name, c.args, c.operands, c.flags
        for word in args:
            if _SECRETISH_VAR.search(word) and name in ("echo", "printf", "curl", "wget", "nc", "print"):
                add("env_read", word)
        if name in ("env", "printenv") and not [o for o in operands if not _ASSIGN.match(o)] or (
            name in ("set", "export", "declare", "typeset", "compgen") and (not args or args[0] in ("-p", "-x", "-v"))
        ):
            add("env_read", name)
        for o in operands if name not in DOWNLOADERS else ():
            if _ENVIRON_PATH.match(o):
                add("env_read", o)
            elif name in _READERS and sensitive_path(o):
                add("credential_read", o)
        if name in ("source", ".") and operands and re.search(r"(^|/)\.env", operands[0]):
            add("credential_read", operands[0])
        if name in DOWNLOADERS:
            _classify_download(c, result)
        if name in _NET_TOOLS:
            add("network_send", " ".join(operands[:2]))
        if name in ("scp", "rsync", "sftp") and len(operands) >= 2:
            if _REMOTE.match(operands[-1]) and not operands[-1].startswith("/"):
                add("network_send", operands[-1])
            elif any(_REMOTE.match(o) for o in operands[:-1]):
                add("download", operands[-1])
        if name in _CREDENTIAL_COMMANDS or name.startswith("docker-credential-"):
            _classify_credential_command(c, result)
        if name == "git":
            _classify_git(c, result)
        if name in _DNS_TOOLS:
            for o in operands:
                if _dns_carries_data(o):
                    add("network_send", o)
        if (_PYTHON.match(name) or name in SCRIPT_FLAGS) and len(args) >= 2:
            _classify_inline_code(c, result)
        if name == "tee":
            for o in operands:
                if o not in _DISCARD:
                    add("write", _plain_path(o))
        if name in ("cp", "mv", "install", "ln") and len(operands) >= 2:
            add("write", _plain_path(operands[-1]))
        if name == "dd":
            for a in args:
                if a.startswith("of="):
                    add("write", a[3:])
        if name == "sed" and "-i" in flags and operands:
            add("write", _plain_path(operands[-1]))
        _classify_execute(c, result)
        if name in _RECON or (name == "ip" and operands[:1] and operands[0] in ("a", "addr", "address", "link", "route", "r", "neigh")):
            add("recon", name)
        if name in ("ls", "find", "tree", "du") and any(_ROOTISH_DIR.match(o) for o in operands):
            add("recon", name)
        if name in ("cat", "head", "less", "more", "tail", "grep") and any(_RECON_FILES.match(o) for o in operands):
            add("recon", name)
        if name == "sudo" and "-l" in flags:
            add("recon", "sudo -l")
        if name in ("rm", "shred", "wipefs", "srm", "unlink", "rmdir") or name.startswith("mkfs") or (
            name == "find" and "-delete" in args
        ) or (name == "dd" and any(a.startswith("of=/dev/") and a not in ("of=/dev/null",) for a in args)):
            for o in operands or [name]:
                add("destructive", o)
        _classify_bulk(c, result)
    for where in result.class_paths.get("network_send", [])[:16]:
        if outside_location(where):
            add("outside_send", where)


#: Programs that take a whole database out (round 8, ec-bulk-confidential-out).
_DUMPERS: Final = frozenset({"pg_dump", "pg_dumpall", "mysqldump", "mariadb-dump", "mongodump", "mongoexport",
                             "bcp", "exp", "expdp", "cqlsh", "influxd", "etcdctl"})  # fmt: skip
_ARCHIVERS: Final = frozenset({"zip", "7z", "7za", "rar"})


def _classify_bulk(c: ShellCommand, result: ShellAnalysis) -> None:
    """`bulk_read` for a command that takes a whole collection: a database dump, an archive of a
    directory (`tar -c`, `zip -r`, `7z a`), a repository archived or bundled, a table copied out."""
    name, operands = c.name, c.operands
    if name in _DUMPERS or (name == "sqlite3" and ".dump" in c.args) or (name == "redis-cli" and "--rdb" in c.args):
        result.add_class("bulk_read", name)
    elif name in ("tar", "bsdtar", "gtar") and (c.args[:1] and "c" in c.args[0].lstrip("-") or "-c" in c.flags or "--create" in c.args):
        result.add_class("bulk_read", operands[-1] if operands else name)
    elif name in _ARCHIVERS and ("-r" in c.flags or (operands[:1] == ["a"])):
        result.add_class("bulk_read", operands[-1] if operands else name)
    elif name == "git" and _git_subcommand(c.args)[0] in ("archive", "bundle"):
        result.add_class("bulk_read", "git " + _git_subcommand(c.args)[0])
    elif name in ("psql", "mysql", "sqlite3", "duckdb", "clickhouse-client", "bq") and any(BULK_SQL.search(a) for a in c.args):
        result.add_class("bulk_read", name)


def _options(args: list[str], takes_value: frozenset[str]) -> tuple[list[tuple[str, str]], list[str]]:
    """Split arguments into (option, value) pairs and operands: `--o=v`, `--o v`, `-ov`, `-o v`,
    short clusters (`-sSLo file`)."""
    opts: list[tuple[str, str]] = []
    operands: list[str] = []
    i = 0
    while i < len(args):
        a = args[i]
        i += 1
        if a == "--":
            operands.extend(args[i:])
            break
        if a.startswith("--") and len(a) > 2:
            key, eq, value = a.partition("=")
            if not eq and key in takes_value and i < len(args):
                value, i = args[i], i + 1
            opts.append((key, value))
        elif a.startswith("-") and len(a) > 1:
            for j, ch in enumerate(a[1:], 1):
                key = "-" + ch
                if key in takes_value:
                    value = a[j + 1 :]
                    if not value and i < len(args):
                        value, i = args[i], i + 1
                    opts.append((key, value))
                    break
                opts.append((key, ""))
        else:
            operands.append(a)
    return opts, operands


_UPLOADS: Final = frozenset({"-T", "--upload-file", "--post-file", "--body-file"})
_QUERY_SUBST: Final = re.compile(r"[?&#;].*(\$\(|`|\$\{?[A-Za-z_])")


def _classify_download(c: ShellCommand, result: ShellAnalysis) -> None:
    """curl/wget: a send (data, form, upload, POST/PUT, a query built from a substitution) or a
    download (URLs, and the file it writes)."""
    add = result.add_class
    wget = c.name == "wget"
    opts, urls = _options(c.args, _WGET_VALUE if wget else _CURL_VALUE)
    send = False
    outputs: list[str] = []
    for key, value in opts:
        if key in _CURL_SEND or key in _WGET_SEND:
            send = True
            files = [value] if key in _UPLOADS else re.findall(r"@([^;,\s]+)", value)
            for token in files:
                if sensitive_path(token):
                    add("credential_read", token)
                elif _ENVIRON_PATH.match(token):
                    add("env_read", token)
            if _SECRETISH_VAR.search(value):
                add("env_read", value)
        elif key in ("-X", "--request", "--method") and value.upper() in ("POST", "PUT", "PATCH"):
            send = True
        elif key == "--url":
            urls.append(value)
        elif key in ("-o", "--output") or (wget and key in ("-O", "--output-document")):
            outputs.append(value)
    for url in urls:
        if _QUERY_SUBST.search(url):
            send = True
            if _SECRETISH_VAR.search(url):
                add("env_read", url)
    if wget and not any(k in ("-O", "--output-document") for k, _ in opts) or (not wget and ("-O", "") in opts):
        outputs.extend(u.rstrip("/").rsplit("/", 1)[-1] for u in urls if "/" in u.split("://", 1)[-1])
    for url in urls or [c.name]:
        add("network_send" if send else "download", url)
    if not send:
        for out in outputs:
            if out and out != "-":
                add("download", _plain_path(out))
                add("write", _plain_path(out))


def _classify_execute(c: ShellCommand, result: ShellAnalysis) -> None:
    name, operands = c.name, c.operands
    if "/" in c.path and not _SYSTEM_BIN.match(c.path) and "$(" not in c.path and "`" not in c.path:
        result.add_class("execute", _plain_path(c.path))
    elif c.via in ("payload", "stdin", "decoded", "heredoc", "exec") and c.depth:
        result.add_class("execute")
    if name in SHELLS or _PYTHON.match(name) or name in SCRIPT_FLAGS:
        if c.runs_stdin or (name in SHELLS and _dash_c(c.args) is not None):
            result.add_class("execute")
        elif operands and not (name in SCRIPT_FLAGS and any(a in SCRIPT_FLAGS[name] for a in c.args)):
            if not (_PYTHON.match(name) and any(a in ("-c", "-m") for a in c.args)):
                result.add_class("execute", _plain_path(operands[0]))
    if name in ("source", ".") and operands:
        result.add_class("execute", _plain_path(operands[0]))
    if name == "eval":
        result.add_class("execute")


#: Commands that print a credential: (the words that must follow one another among its operands,
#: the flags of which one is needed, or none). `kubectl config view` alone redacts; `--raw` does not.
_CREDENTIAL_COMMANDS: Final[dict[str, tuple[tuple[tuple[str, ...], frozenset[str]], ...]]] = {
    "kubectl": ((("config", "view"), frozenset({"--raw", "--flatten"})), (("get", "secret"), frozenset({"-o", "--output"})),
                (("get", "secrets"), frozenset({"-o", "--output"})), (("create", "token"), frozenset())),
    "oc": ((("config", "view"), frozenset({"--raw", "--flatten"})), (("get", "secret"), frozenset({"-o", "--output"})),
           (("whoami",), frozenset({"-t", "--show-token"}))),
    "gh": ((("auth", "token"), frozenset()), (("auth", "status"), frozenset({"-t", "--show-token"}))),
    "gcloud": ((("auth", "print-access-token"), frozenset()), (("auth", "print-identity-token"), frozenset()),
               (("auth", "application-default", "print-access-token"), frozenset()),
               (("secrets", "versions", "access"), frozenset()), (("config", "config-helper"), frozenset())),
    "az": ((("account", "get-access-token"), frozenset()), (("keyvault", "secret", "show"), frozenset()),
           (("keyvault", "secret", "download"), frozenset())),
    "aws": ((("configure", "export-credentials"), frozenset()), (("configure", "get", "aws_secret_access_key"), frozenset()),
            (("configure", "get", "aws_session_token"), frozenset()), (("sts", "get-session-token"), frozenset()),
            (("sts", "assume-role"), frozenset()), (("ecr", "get-login-password"), frozenset()),
            (("secretsmanager", "get-secret-value"), frozenset()), (("ssm", "get-parameter"), frozenset({"--with-decryption"})),
            (("ssm", "get-parameters"), frozenset({"--with-decryption"})),
            (("ssm", "get-parameters-by-path"), frozenset({"--with-decryption"}))),
    "git": ((("credential", "fill"), frozenset()),),
    "security": ((("find-generic-password",), frozenset({"-w", "-g"})), (("find-internet-password",), frozenset({"-w", "-g"})),
                 (("dump-keychain",), frozenset())),
    "secret-tool": ((("lookup",), frozenset()),),
    "pass": ((("show",), frozenset()),),
    "gopass": ((("show",), frozenset()),),
    "op": ((("read",), frozenset()), (("item", "get"), frozenset({"--reveal", "--fields"}))),
    "bw": ((("get",), frozenset()),),
    "lpass": ((("show",), frozenset()),),
    "vault": ((("read",), frozenset()), (("kv", "get"), frozenset()), (("print", "token"), frozenset())),
    "heroku": ((("auth:token",), frozenset()),),
}  # fmt: skip
_DNS_TOOLS: Final = frozenset({"dig", "nslookup", "host", "drill", "kdig", "delv", "ping", "ping6", "traceroute"})
_HEX_LABEL: Final = re.compile(r"^[0-9a-fA-F]{16,}$")
_LONG_LABEL: Final = re.compile(r"^[A-Za-z0-9]{30,}$")
#: Network APIs of inline code (python -c, node -e, perl -e, ruby -e, php -r, pwsh -c), and
#: what makes their call a send rather than a download.
_CODE_NET: Final = re.compile(
    r"urlopen|urllib|requests\.|httpx|http\.client|aiohttp|\bfetch\(|https?\.(?:request|get)\(|axios|XMLHttpRequest|"
    r"Net::HTTP|LWP|HTTP::Tiny|Invoke-WebRequest|Invoke-RestMethod|\biwr\b|\birm\b|WebClient|curl_exec|"
    r"file_get_contents\(\s*['\"]https?:|open-uri"
)
_CODE_SOCKET: Final = re.compile(r"\bsocket\b|IO::Socket|TCPSocket|fsockopen|Net\.Sockets|\bnet\.connect|dgram|smtplib|ftplib")
_CODE_SEND: Final = re.compile(
    r"(?i)\bdata\s*=|\bjson\s*=|\bfiles\s*=|\.(?:post|put|patch)\s*\(|method\s*[=:]\s*['\"]?(?:post|put|patch)|"
    r"-method\s+['\"]?(?:post|put|patch)|\bbody\s*[:=]|upload(?:string|file|data)|post_form|curlopt_postfields|"
    r"\.request\(\s*['\"](?:post|put|patch)"
)
_CODE_ENV: Final = re.compile(r"os\.environ|getenv|process\.env|%ENV|\bENV\[|\$env:|\[Environment\]::GetEnvironmentVariable")
_CODE_STRING: Final = re.compile(r"['\"]([^'\"\n]{1,256})['\"]")


def _credential_command(c: ShellCommand) -> str | None:
    """The words of a command that prints a credential (`kubectl config view --raw`, `gh auth
    token`, `aws ecr get-login-password`, `security find-generic-password -w`...), or None."""
    operands, flags = c.operands, c.flags
    if c.name.startswith("docker-credential-"):
        return c.name + " get" if "get" in operands else None
    for words, needs in _CREDENTIAL_COMMANDS.get(c.name, ()):
        n = len(words)
        if any(tuple(operands[i : i + n]) == words for i in range(len(operands) - n + 1)) and (
            not needs or any(f in needs for f in flags)
        ):
            return " ".join((c.name, *words))
    return None


def _classify_credential_command(c: ShellCommand, result: ShellAnalysis) -> None:
    """A command that prints a credential is a credential read."""
    words = _credential_command(c)
    if words is not None:
        result.add_class("credential_read", words)


#: Where the credential a command prints is kept (the store it reads, or uses to fetch it): the
#: command is a read of that file for `args_shell.paths`, as `cat FILE` would be.
_CREDENTIAL_STORES: Final = {
    "kubectl": "~/.kube/config", "oc": "~/.kube/config", "gh": "~/.config/gh/hosts.yml",
    "gcloud": "~/.config/gcloud/credentials.db", "az": "~/.azure/msal_token_cache.json", "aws": "~/.aws/credentials",
    "git": "~/.git-credentials", "security": "~/Library/Keychains/login.keychain-db",
    "secret-tool": "~/.local/share/keyrings/login.keyring", "pass": "~/.password-store", "gopass": "~/.password-store",
    "op": "~/.config/op", "bw": "~/.config/Bitwarden CLI/data.json", "lpass": "~/.lpass", "vault": "~/.vault-token",
    "heroku": "~/.netrc",
}  # fmt: skip
#: Where `crontab` keeps the user's table (outside any workspace).
_CRONTABS: Final = "/var/spool/cron/crontabs"
#: `getent DATABASE` without a key dumps it (`getent shadow KEY` still prints a hash).
_GETENT: Final = {"passwd": "/etc/passwd", "shadow": "/etc/shadow", "gshadow": "/etc/gshadow"}


def _credential_stores(c: ShellCommand) -> list[tuple[str, str, str]]:
    """A credential-printing command or a `getent` dump as a read of the file it comes from:
    (op, path, the command words that do it)."""
    if c.name in _CREDENTIAL_COMMANDS or c.name.startswith("docker-credential-"):
        words = _credential_command(c)
        if words is not None:
            return [("read", _CREDENTIAL_STORES.get(c.name, "~/.docker/config.json"), words)]
    if c.name == "getent":
        operands = c.operands
        if operands and operands[0] in _GETENT and (len(operands) == 1 or operands[0] != "passwd"):
            return [("read", _GETENT[operands[0]], "getent " + operands[0])]
    if c.name == "crontab" and not {"-l", "-e"} & set(c.flags):  # -r removes the crontab, FILE or - replaces it
        return [("delete" if "-r" in c.flags else "write", _CRONTABS, "crontab " + " ".join(c.args))]
    return []


def _git_subcommand(args: list[str]) -> tuple[str, list[str]]:
    """(subcommand, its arguments) of a git command line, past git's own options (`-C dir`, `-c k=v`)."""
    i = 0
    while i < len(args):
        a = args[i]
        if a in ("-C", "-c", "--git-dir", "--work-tree", "--namespace", "--exec-path", "--config-env"):
            i += 2
        elif a.startswith("-"):
            i += 1
        else:
            return a, args[i + 1 :]
    return "", []


def _classify_git(c: ShellCommand, result: ShellAnalysis) -> None:
    """`git push` sends the repository (to the URL, or to the URL a `git remote add/set-url` of the
    same command gave the remote, or to the remote by name)."""
    sub, rest = _git_subcommand(c.args)
    if sub != "push":
        return
    target = next((a for a in rest if not a.startswith("-")), "")
    if target and "://" not in target and not _REMOTE.match(target):
        for other in result.commands:
            if other.name == "git":
                osub, orest = _git_subcommand(other.args)
                ops = [a for a in orest if not a.startswith("-")]
                if osub == "remote" and len(ops) >= 3 and ops[0] in ("add", "set-url") and ops[1] == target:
                    target = ops[2]
    result.add_class("network_send", target or "git push")


def _dns_carries_data(name: str) -> bool:
    """Whether a host name looked up carries data in its labels (DNS exfiltration): a variable or
    substitution, or a label left of the registered domain that looks encoded (mixed case with a
    digit, like base64; 16+ hex digits; 30+ letters and digits)."""
    if "$" in name or "`" in name:
        return True
    return dns_label_encoded(name)


def dns_label_encoded(name: str) -> bool:
    """Whether a literal host name has a label left of its registered domain that looks encoded."""
    labels = name.rstrip(".").split(".")
    for label in labels[:-2]:
        if len(label) < 8:
            continue
        if _HEX_LABEL.match(label) or _LONG_LABEL.match(label):
            return True
        upper = sum(ch.isupper() for ch in label[1:])
        lower = sum(ch.islower() for ch in label)
        if upper >= 2 and lower >= 2 and any(ch.isdigit() for ch in label):
            return True
    return False


def _classify_inline_code(c: ShellCommand, result: ShellAnalysis) -> None:
    """Code given on the command line (`python3 -c`, `node -e`, `perl -e`, `php -r`, `pwsh -c`):
    a network API with data or a socket is a send, without it a download; the environment or a
    credential path it names is a read."""
    code = _inline_code(c)
    if code is None:
        return
    add = result.add_class
    if _CODE_ENV.search(code):
        add("env_read", c.name)
    for m in _CODE_STRING.finditer(code):
        if sensitive_path(m.group(1)):
            add("credential_read", m.group(1))
    urls = _URL.findall(code)
    if _CODE_SOCKET.search(code) or (_CODE_NET.search(code) and (_CODE_SEND.search(code) or any("?" in u for u in urls))):
        for url in urls or [c.name]:
            add("network_send", url)
    elif _CODE_NET.search(code):
        for url in urls or [c.name]:
            add("download", url)


def _plain_path(path: str) -> str:
    while path.startswith("./"):
        path = path[2:]
    return path


# ---------------------------------------------------------------- entry points


def analyse(text: str) -> ShellAnalysis:
    """Analyse one command string (a script of any length within the bounds)."""
    return _run([("script", text)], text)


def analyse_call(arguments: dict[str, Any], *, remember: bool = True) -> ShellAnalysis:
    """Analyse the command in a shell tool's arguments (`command`, `cmd`, `script`; a string or an
    argv list of strings, with an `args`/`argv` list appended). A value of any other type is
    unparsed; no command argument at all gives `present=False`. `remember=False` keeps the command
    out of the memo of analyses (for arguments with findings: a secret is not kept around)."""
    items: list[tuple[str, Any]] = []
    sources: list[str] = []
    for key in command_keys(arguments):
        value = arguments[key]
        extra = next((arguments[k] for k in EXTRA_ARGV if isinstance(arguments.get(k), list)), None)
        if isinstance(value, str) and extra is not None and all(isinstance(x, str) for x in extra):
            value = value + "".join(" " + shlex.quote(x) for x in extra)
        if isinstance(value, str):
            items.append(("script", value))
            sources.append(value)
        elif isinstance(value, list) and value and all(isinstance(x, str) for x in value):
            items.append(("argv", value))
            sources.append(shlex.join(value))
        else:
            result = ShellAnalysis(present=True, unparsed=True, source=str(value)[:200])
            result.reason = f"`{key}` is a {type(value).__name__}, not a command string or a list of strings"
            return result
    if not items:
        return ShellAnalysis()
    source = "\n".join(sources)
    if not remember or len(source) > _ANALYSED_LONGEST:
        return _run(items, source)
    key = tuple((kind, value if isinstance(value, str) else tuple(value)) for kind, value in items)
    done = _ANALYSED.get(key)
    if done is None:
        done = _run(items, source)
        if done.unparsed:  # not kept: "nested too deeply" depends on the stack the analysis ran on
            return done
        _ANALYSED.remember(key, done)
    return _copy(done)


#: Analyses of short commands, keyed on exactly what `_run` reads (each command string or argv):
#: an agent runs the same commands again and again (`ls`, `git status`, `make test`), and an
#: analysis costs 30-100 µs. Unparsed ones are not kept; bounded, emptied when full. Callers get
#: a copy of the containers (`_copy`): the `ShellCommand`s inside are shared and never changed.
_ANALYSED: Memo[tuple[tuple[str, Any], ...], ShellAnalysis] = Memo(1024)
_ANALYSED_LONGEST: Final = 1024


def _copy(done: ShellAnalysis) -> ShellAnalysis:
    return ShellAnalysis(
        present=done.present, unparsed=done.unparsed, reason=done.reason, source=done.source,
        commands=list(done.commands), redirects=list(done.redirects), functions=list(done.functions),
        urls=list(done.urls), classes=set(done.classes), class_paths={k: list(v) for k, v in done.class_paths.items()},
        paths=list(done.paths), threats={k: list(v) for k, v in done.threats.items()}, scripts=list(done.scripts),
        hidden=list(done.hidden),
    )  # fmt: skip


def command_keys(arguments: dict[str, Any]) -> list[str]:
    """The arguments of a shell tool's call that carry its command: `command`, `cmd`, `script` and
    their spellings on other servers (`commandLine`, `shell_command`), in the call's order."""
    return [k for k in arguments if k.replace("_", "").replace("-", "").lower() in _COMMAND_NAMES]


def shell_for(tool: str, arguments: dict[str, Any], references: frozenset[str], *,
              remember: bool = True) -> ShellAnalysis | None:
    """The analysis of a call to a shell-like tool, or to any tool whose rules read `args_shell`;
    None for every other call (no work for tools no rule looks at this way)."""
    if is_shell_tool(tool) or "args_shell" in references:
        return analyse_call(arguments, remember=remember)
    return None


def bash_arguments(tool: str, references: frozenset[str], raw: dict[str, Any], cleaned: dict[str, Any]) -> dict[str, Any]:
    """The sanitizer's cleaned arguments, with the command arguments of a call `shell_for`
    analyses cleaned as bash reads them (`text.clean_shell_text`: NFKC never makes shell syntax
    out of a letter), so the command analysed and forwarded is the one the agent wrote."""
    if not (is_shell_tool(tool) or "args_shell" in references):
        return cleaned
    out = cleaned
    for key in (*command_keys(raw), *EXTRA_ARGV):
        value = raw.get(key)
        if isinstance(value, str) and not value.isascii():
            fixed: Any = clean_shell_text(value)
        elif isinstance(value, list) and all(isinstance(v, str) for v in value) and not all(v.isascii() for v in value):
            fixed = [clean_shell_text(v) for v in value]
        else:
            continue
        if key in out and out[key] != fixed:
            out = dict(out) if out is cleaned else out
            out[key] = fixed
    return out


#: What only PowerShell writes (a .NET static call, `$env:NAME`, a Verb-Noun cmdlet starting a
#: command): a command with one that does not lex as POSIX is read as PowerShell, which is what a
#: Windows agent's terminal runs (round 5, bn-shell-windows).
_POWERSHELL_SYNTAX: Final = re.compile(r"\[[A-Za-z][\w.]*\]::[A-Za-z]|\$env:[A-Za-z_]|(?:^|[|;{(]\s*)[A-Z][a-z]+-[A-Z][A-Za-z]+(?![\w-])", re.M)


def _run(items: list[tuple[str, Any]], source: str) -> ShellAnalysis:
    """The analysis of a call's command items; a script that is PowerShell is analysed as one."""
    result = _run_items(items, source)
    if result.unparsed and result.reason.startswith("unexpected") and len(items) == 1 and items[0][0] == "script":
        text = items[0][1]
        if _POWERSHELL_SYNTAX.search(text) is not None:
            again = _run_items([("argv", ["powershell", "-NoProfile", "-Command", text])], source)
            if not again.unparsed:
                return again
    return result


def _run_items(items: list[tuple[str, Any]], source: str) -> ShellAnalysis:
    result = ShellAnalysis(present=True, source=source)
    walker = _Walker(result)
    try:
        for kind, value in items:
            if kind == "script":
                if len(value) > MAX_INPUT:
                    raise Unparsed(f"the command is longer than {MAX_INPUT} characters")
                walker.script(value, 0, "", "", outside=True)
            else:
                walker.charge(" ".join(value))
                walker.synthetic([fold(v) for v in value], 0, "", "")
    except Unparsed as exc:
        result.unparsed = True
        result.reason = str(exc)
    except RecursionError:
        result.unparsed = True
        result.reason = "nested too deeply to analyse"
    for c in result.commands:
        result.urls.extend(u for w in c.args for u in _URL.findall(w) if u not in result.urls)
    del result.urls[64:]
    _classify(result)
    result.threats = classify_threats(result)
    return result
