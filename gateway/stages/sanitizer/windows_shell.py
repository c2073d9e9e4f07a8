"""PowerShell and cmd.exe command lines as the POSIX commands they amount to, for the shell analysis.

A command on a shell tool may hand its work to a Windows shell (`pwsh -Command …`, `powershell
-EncodedCommand …`, `cmd /c …`). Their grammars are not bash's, so the payload is not lexed as a
script: it is cut into statements (`;`, `|`, `&`, `&&`, `||`, new lines, outside quotes), each
statement into words (PowerShell's `'…'`/`"…"`, cmd's `^` escapes), and the cmdlets and built-ins
that delete, read, copy or write files are rewritten as the POSIX command with the same effect
(`Remove-Item -Recurse X` is `rm -r X`, `Get-Content X` is `cat X`, `rd /s X` is `rm -r X`), with
Windows paths made POSIX (`C:\\Users\\NAME\\x`, `$env:USERPROFILE\\x`, `%USERPROFILE%\\x` are
`~/x`; `D:\\data` is `/d/data`; `.\\bin` is `./bin`). A download run by `iex`/`Invoke-Expression`
becomes `curl URL | sh`. Other statements are left out: the rules see what these commands do
to files, not everything a Windows shell can do. Pure, no I/O.
"""

from __future__ import annotations

import base64
import binascii
import re
from typing import Final

__all__ = ["POWERSHELLS", "CMDS", "POWERSHELL_EXEC", "powershell_payload", "cmd_payload", "powershell_commands", "cmd_commands",
           "deobfuscate_powershell", "expand_cmd"]

POWERSHELLS: Final = frozenset({"pwsh", "powershell", "pwsh.exe", "powershell.exe"})
CMDS: Final = frozenset({"cmd", "cmd.exe"})

_DELETE: Final = frozenset({"remove-item", "ri", "rm", "del", "erase", "rd", "rmdir"})
_READ: Final = frozenset({"get-content", "gc", "cat", "type", "select-string", "sls", "more"})
_COPY: Final = frozenset({"copy-item", "cpi", "cp", "copy", "move-item", "mi", "mv", "move"})
_WRITE: Final = frozenset({"set-content", "sc", "add-content", "ac", "out-file", "clear-content", "clc"})
_PS_VALUE_PARAMS: Final = frozenset({
    "-erroraction", "-ea", "-include", "-exclude", "-filter", "-encoding", "-tail", "-totalcount", "-head",
    "-first", "-last", "-delimiter", "-readcount", "-stream", "-credential", "-pattern", "-value",
    "-warningaction", "-outvariable", "-inputobject",
})  # fmt: skip
_PS_PATH_PARAMS: Final = frozenset({"-path", "-literalpath", "-lp", "-pspath", "-filepath"})
_DOWNLOAD: Final = re.compile(
    r"downloadstring|downloadfile|downloaddata|invoke-webrequest|invoke-restmethod|\biwr\b|\birm\b|\bcurl\b|\bwget\b"
    r"|start-bitstransfer|net\.webclient|system\.net\.http",
    re.I,
)
#: An upload (round 5): Invoke-RestMethod/Invoke-WebRequest with a sending method, a body or an
#: input file, and WebClient's Upload* methods; read as `curl --data-binary @- URL`.
_UPLOAD: Final = re.compile(
    r"(?:invoke-restmethod|invoke-webrequest|\birm\b|\biwr\b)[^|;\n]{0,400}?(?:-method\s+['\"]?(?:post|put|patch)\b|-body\b|-infile\b)"
    r"|\.upload(?:string|file|data|values)(?:async)?\s*\(",
    re.I,
)
_IEX: Final = re.compile(r"\biex\b|invoke-expression|\[scriptblock\]::create|\.invoke\(\)", re.I)
_URL: Final = re.compile(r"https?://[^\s'\"()]+", re.I)
_FILE_CALL: Final = re.compile(
    r"\[(?:system\.)?io\.(?P<cls>file|directory)\]::(?P<fn>\w+)\(\s*(?P<q>['\"])(?P<p>[^'\"]+)(?P=q)", re.I
)
_HOME_VARS: Final = re.compile(r"(?:\$env:(?:userprofile|home)|\$home|%userprofile%|%homepath%|[a-z]:\\users\\[^\\/\s'\"]+)", re.I)
_APPDATA: Final = re.compile(r"\$env:(appdata|localappdata)|%(appdata|localappdata)%", re.I)
_DRIVE: Final = re.compile(r"^([a-z]):[\\/]", re.I)


def powershell_payload(args: list[str]) -> str | None:
    """The script a `pwsh`/`powershell` command line runs: `-EncodedCommand`'s decoded text,
    `-Command`'s words, or (PowerShell's default) the words after its options; None for a
    `-File` script or nothing."""
    i = 0
    while i < len(args):
        a = args[i].lower()
        a = "-" + a[1:] if a.startswith("/") and len(a) > 1 else a  # powershell.exe takes /enc as -enc
        if (a in ("-e", "-ec") or (len(a) >= 3 and "-encodedcommand".startswith(a))) and i + 1 < len(args):
            return _decode_utf16(args[i + 1])  # any prefix of -EncodedCommand
        if len(a) >= 2 and "-command".startswith(a):
            return " ".join(args[i + 1 :]) or None
        if a in ("-file", "-f"):
            return None
        if a in ("-executionpolicy", "-ep", "-windowstyle", "-w", "-workingdirectory", "-wd", "-version", "-v",
                 "-configurationname", "-psconsolefile", "-inputformat", "-outputformat", "-of", "-if"):  # fmt: skip
            i += 2
            continue
        if a.startswith("-"):
            i += 1
            continue
        return " ".join(args[i:])
    return None


def cmd_payload(args: list[str]) -> str | None:
    """The command line `cmd /c X` or `cmd /k X` runs."""
    for i, a in enumerate(args):
        if a.lower() in ("/c", "/k", "/r"):
            return " ".join(args[i + 1 :]) or None
    return None


def _decode_utf16(data: str) -> str | None:
    try:
        raw = base64.b64decode(data + "=" * (-len(data) % 4), validate=True)
    except (binascii.Error, ValueError):
        return None
    return raw.decode("utf-16-le", errors="replace")


def posix_path(word: str) -> str:
    """A Windows path as the analysis writes paths: the home as `~`, drives as `/c/…`, `/` separators."""
    word = _HOME_VARS.sub("~", word, count=1)
    word = _APPDATA.sub(lambda m: "~/AppData/" + ("Local" if "local" in m.group().lower() else "Roaming"), word)
    word = word.replace("\\", "/")
    m = _DRIVE.match(word)
    if m:
        word = "/" + m.group(1).lower() + "/" + word[m.end() :]
    return word


def _statements(text: str, caret: bool) -> list[list[str]]:
    """Statements split on `;`, `|`, `&`, new lines (outside quotes), each as its words."""
    out: list[list[str]] = []
    words: list[str] = []
    word: list[str] = []
    quote = ""
    i = 0
    while i < len(text):
        ch = text[i]
        if caret and ch == "^" and not quote and i + 1 < len(text):
            word.append(text[i + 1])
            i += 2
            continue
        if quote:
            if ch == quote:
                quote = ""
            else:
                word.append(ch)
        elif ch in "'\"":
            quote = ch
        elif ch in " \t,(){}" or ch in ";|&\n\r":
            if word:
                words.append("".join(word))
                word = []
            if ch in ";|&\n\r" and words:
                out.append(words)
                words = []
        else:
            word.append(ch)
        i += 1
    if word:
        words.append("".join(word))
    if words:
        out.append(words)
    return out


def powershell_commands(text: str) -> list[list[str] | str]:
    """POSIX argv lists (and, for a download run as code, a `curl … | sh` line) a PowerShell script amounts to."""
    out: list[list[str] | str] = []
    if _IEX.search(text) and _DOWNLOAD.search(text):
        url = _URL.search(text)
        out.append(f"curl -s '{url.group() if url else 'https://unknown.invalid/'}' | sh")
    for m in _UPLOAD.finditer(text):  # a send: what the script read may leave with it
        url = _URL.search(text, m.start())
        out.append(["curl", "-s", "--data-binary", "@-", url.group() if url else "https://unknown.invalid/"])
    for m in _FILE_CALL.finditer(text):
        path, fn = posix_path(m.group("p")), m.group("fn").lower()
        if fn.startswith("read") or fn.startswith("copy") or fn.startswith("open"):
            out.append(["cat", path])
        elif fn == "delete":
            out.append(["rm", "-r", "-f", path] if m.group("cls").lower() == "directory" else ["rm", "-f", path])
        elif fn.startswith(("write", "append")):
            out.append(["tee", path])
    for words in _statements(text, caret=False):
        argv = _powershell_statement(words)
        if argv:
            out.append(argv)
    return out[:64]


def _powershell_statement(words: list[str]) -> list[str] | None:
    name = words[0].lower()
    flags: list[str] = []
    operands: list[str] = []
    i = 1
    while i < len(words):
        w, low = words[i], words[i].lower()
        if low in _PS_PATH_PARAMS or low in ("-destination", "-dest") and i + 1 < len(words):
            if i + 1 < len(words):
                operands.append(posix_path(words[i + 1]))
            i += 2
            continue
        if low in _PS_VALUE_PARAMS:
            i += 2
            continue
        if low.startswith("-"):
            if "-recurse".startswith(low) and len(low) > 1 or low == "-r":
                flags.append("-r")
            elif "-force".startswith(low) and len(low) > 2:
                flags.append("-f")
        else:
            operands.append(posix_path(w))
        i += 1
    if not operands:
        return None
    if name in _DELETE:
        return ["rm", *flags, *operands]
    if name in _READ:
        return ["cat", *operands[1:]] if name in ("select-string", "sls") else ["cat", *operands]
    if name in _COPY:
        return ["mv" if name in ("move-item", "mi", "mv", "move") else "cp", "-r", *operands]
    if name in _WRITE:
        return ["truncate", "-s", "0", *operands] if name in ("clear-content", "clc") else ["tee", *operands]
    return None


def cmd_commands(text: str) -> list[list[str] | str]:
    """POSIX argv lists a cmd.exe command line amounts to (`^` escapes dropped, `%USERPROFILE%` the home)."""
    out: list[list[str] | str] = []
    for words in _statements(text, caret=True):
        while len(words) > 2 and words[0].lower() == "if":  # if [not] exist X COMMAND
            words = words[3:] if words[1].lower() != "not" else words[4:]
        while words and words[0].lower() in ("call", "@call"):  # `call type …` runs `type …`
            words = words[1:]
        if not words:
            continue
        name = words[0].lower().lstrip("@").removesuffix(".exe")
        switches = {w.lower() for w in words[1:] if w.startswith("/")}
        operands = [posix_path(w) for w in words[1:] if not w.startswith("/")]
        if name in POWERSHELLS | CMDS:
            out.append([name, *words[1:]])
        elif not operands:
            continue
        elif name in ("rd", "rmdir", "del", "erase"):
            out.append(["rm", *(["-r"] if "/s" in switches else []), *(["-f"] if switches & {"/q", "/f"} else []), *operands])
        elif name in ("type", "more"):
            out.append(["cat", *operands])
        elif name in ("copy", "xcopy", "robocopy", "move"):
            out.append(["mv" if name == "move" else "cp", "-r", *operands])
        elif name in _CMD_PASSED:
            out.append([name, *(posix_path(w) if "\\" in w or "%" in w else w for w in words[1:])])
    return out[:64]


#: Programs a cmd.exe line runs that read the same on Windows (curl.exe ships with Windows 10):
#: analysed as POSIX commands, so `type KEY | curl -d @- URL` is the send it is (round 6).
_CMD_PASSED: Final = frozenset({"curl", "wget", "nc", "ncat", "scp", "sftp", "ssh", "tar", "git", "python", "python3",
                                "py", "node", "perl", "ruby", "php"})  # fmt: skip


# ---------------------------------------------------------------- obfuscation undone (issue 24, round 3)

_TICK: Final = re.compile(r"`(?=[A-Za-z0-9\-.\[\]():])")
_LIT_CONCAT: Final = re.compile(r"""(['"])([^'"\n]*)\1\s*\+\s*(['"])([^'"\n]*)\3""")
_CHAR_ARRAY: Final = re.compile(r"\[char\[\]\]\s*\(\s*((?:\d{1,3}\s*,\s*)*\d{1,3})\s*\)", re.I)
_CHAR_ONE: Final = re.compile(r"\[char\]\s*\(?\s*(\d{1,3})\s*\)?", re.I)
_FORMAT: Final = re.compile(r"""(['"])((?:[^'"\n{}]|\{\d\})*)\1\s*-f\s*((?:(['"])[^'"\n]*\4\s*,\s*)*(['"])[^'"\n]*\5)""", re.I)
_REVERSED: Final = re.compile(r"""(['"])([^'"\n]+)\1\s*\[\s*-1\s*\.\.\s*-[\w.()$]+\s*\]""")
_JOIN_OP: Final = re.compile(r"-join\s*(?=['\"(])|(?<=['\"])\s*-join\s*(['\"])\1", re.I)
#: What makes a PowerShell script run or fetch code: obfuscating these is hiding execution.
POWERSHELL_EXEC: Final = re.compile(
    r"\biex\b|invoke-expression|invoke-command|\[scriptblock\]|downloadstring|downloadfile|downloaddata|net\.webclient|"
    r"invoke-webrequest|\biwr\b|\birm\b|invoke-restmethod|start-process|frombase64string|reflection\.assembly|add-type|"
    r"&\s*\(|\.\s*\(|&\s*\$",
    re.I,
)


def deobfuscate_powershell(text: str) -> str:
    """PowerShell with its obfuscation undone, as far as it is literal: backticks inside words
    (`I`E`X`), concatenated literals (`'I'+'EX'`), `[char]` codes and `[char[]](…)` arrays,
    the `-f` format operator over literals, reversed-string indexing (`'…'[-1..-N]`) and
    `-join` of the result. Run-time values (variables) stay as written."""
    out = _TICK.sub("", text)
    out = _FROM_BASE64.sub(_base64_literal, out)
    out = _ENV_IN_CONCAT.sub(lambda m: "'" + (m.group(1) or m.group(2)) + "'", out)
    out = _CHAR_ARRAY.sub(lambda m: "'" + "".join(chr(int(n)) for n in re.findall(r"\d+", m.group(1))) + "'", out)
    out = _CHAR_ONE.sub(lambda m: "'" + chr(int(m.group(1))) + "'", out)
    for _ in range(16):
        joined = _LIT_CONCAT.sub(lambda m: "'" + m.group(2) + m.group(4) + "'", out)
        joined = _FORMAT.sub(_format, joined)
        joined = _REVERSED.sub(lambda m: "'" + m.group(2)[::-1] + "'", joined)
        if joined == out:
            break
        out = joined
    out = _JOIN_OP.sub("", out)
    alias = _ALIAS.search(out)
    if alias is not None:  # Set-Alias x Invoke-Expression; x '…': the uses after it, as the command
        use = re.compile(r"(?<![\w$-])" + re.escape(alias.group(1)) + r"(?![\w-])")
        out = out[: alias.end()] + use.sub(lambda _: alias.group(2), out[alias.end() :])
    return _RUN_LITERAL.sub(lambda m: "iex\n" + m.group(2) + "\n", out)


#: `[Text.Encoding]::UTF8.GetString([Convert]::FromBase64String('…'))` (and a bare FromBase64String): the text it decodes.
_FROM_BASE64: Final = re.compile(
    r"(?:\[(?:system\.)?text\.encoding\]::\w+\.getstring\(\s*)?\[(?:system\.)?convert\]::frombase64string\(\s*"
    r"""(['"])([A-Za-z0-9+/=\s]{8,})\1\s*\)(?:\s*\))?""",
    re.I,
)
#: An environment variable between concatenated literals (`'rm ' + $env:USERPROFILE + '\x'`): its name, as text.
_ENV_IN_CONCAT: Final = re.compile(r"(?:(?<=\+)|(?<=\())\s*(\$env:\w+)\s*(?=\+)|(?<=\+)\s*(\$env:\w+)\s*(?=\))", re.I)
#: `Set-Alias NAME VALUE` / `sal`/`New-Alias`/`nal` (with or without -Name/-Value).
_ALIAS: Final = re.compile(r"""(?:set-alias|new-alias|\bsal\b|\bnal\b)\s+(?:-name\s+)?['"]?([\w-]+)['"]?\s+(?:-value\s+)?['"]?([\w-]+)['"]?""", re.I)
#: A literal script run: `iex 'X'`, `& ([scriptblock]::Create('X'))`, `[scriptblock]::Create('X').Invoke()`.
_RUN_LITERAL: Final = re.compile(
    r"""(?:\biex\b|invoke-expression|&|\[scriptblock\]::create)\s*\(*\s*(?:\[scriptblock\]::create\(\s*)?(['"])([^'"\n]{4,})\1\s*\)*(?:\.invoke\(\s*\))?""",
    re.I,
)


def _base64_literal(m: re.Match[str]) -> str:
    """The text a FromBase64String literal decodes to (UTF-16LE when it looks so, else UTF-8), as a literal."""
    try:
        raw = base64.b64decode(re.sub(r"\s", "", m.group(2)) + "=" * (-len(re.sub(r"\s", "", m.group(2))) % 4), validate=True)
    except (binascii.Error, ValueError):
        return m.group()
    text = raw.decode("utf-16-le", errors="replace") if raw[1:2] == b"\x00" else raw.decode("utf-8", errors="replace")
    return "'" + text.replace("'", "''") + "'"


def _format(m: re.Match[str]) -> str:
    values = [v.group(2) for v in re.finditer(r"""(['"])([^'"\n]*)\1""", m.group(3))]
    try:
        return "'" + re.sub(r"\{(\d)\}", lambda x: values[int(x.group(1))], m.group(2)) + "'"
    except IndexError:
        return m.group()


_CMD_SET: Final = re.compile(r"(?:^|&&?|\|\|?|\n)\s*set\s+\"?([A-Za-z_][\w]*)=([^&|\n\"]*)\"?", re.I)
#: `%X%`, `%X:~a,b%`, and with delayed expansion (`cmd /v:on`) `!X!`, `!X:~a,b!`.
_CMD_VAR: Final = re.compile(r"%([A-Za-z_][\w]*)(?::~(-?\d+)(?:,(-?\d+))?)?%|!([A-Za-z_][\w]*)(?::~(-?\d+)(?:,(-?\d+))?)?!")
#: cmd.exe's own variables an obfuscator slices letters out of (`%COMSPEC:~-7,1%`).
_CMD_ENV: Final = {"comspec": r"C:\Windows\system32\cmd.exe", "programfiles": r"C:\Program Files",
                   "public": r"C:\Users\Public", "windir": r"C:\Windows", "systemroot": r"C:\Windows"}  # fmt: skip


def expand_cmd(text: str) -> tuple[str, bool]:
    """A cmd.exe line with `^` escapes dropped and the variables it `set` (and cmd's own
    `%COMSPEC%`…) expanded, substrings `%X:~a,b%` included; and whether a statement's command
    name came out of a variable (`call %a%%b%`, `%COMSPEC:~-7,1%…`): a name nobody writes so."""
    text = text.replace("^", "")
    env = dict(_CMD_ENV)
    for m in _CMD_SET.finditer(text):
        env[m.group(1).lower()] = m.group(2).rstrip()

    def var(m: re.Match[str]) -> str:
        key, first, length = m.group(1, 2, 3) if m.group(1) else m.group(4, 5, 6)
        value = env.get(key.lower())
        if value is None:
            return m.group()
        if first is None:
            return value
        start = int(first)
        part = value[start:] if start else value
        return part[: int(length)] if length is not None else part

    built = any(re.match(r"\s*(?:@|call\s+)*(?:%(?!~)|![A-Za-z_])", s, re.I) for s in re.split(r"&&?|\|\|?|\n", text))
    return _CMD_VAR.sub(var, text), built
