"""What a command does, beyond its files (issue 24, round 3): a shell wired to a socket (a
reverse or bind shell), something installed to run later (persistence), and code whose
execution was hidden (a computed PowerShell/cmd command, a decoded file then run, a LOLBin
fetching script). Pure: reads a finished `ShellAnalysis`'s commands, redirects, paths and the
Windows scripts it saw, and returns `{kind: [evidence, …]}` for `args_shell.threats`.

Classification over the effective command (after the lexer, the expander, the decoders and the
Windows deobfuscation), not strings of the input: `b''a\\sh -i >& /d''ev/tcp/…` is a shell
whose output is a socket whatever its spelling.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Final

from gateway.stages.sanitizer.shell_options import HOOK_VARIABLES
from gateway.stages.sanitizer.windows_shell import POWERSHELL_EXEC

if TYPE_CHECKING:
    from gateway.stages.sanitizer.shell import ShellAnalysis, ShellCommand

__all__ = ["classify_threats"]

_SHELLS: Final = frozenset({"sh", "bash", "zsh", "dash", "ksh", "ash", "mksh", "fish", "csh", "tcsh", "yash", "rbash",
                            "cmd", "cmd.exe", "pwsh", "powershell", "pwsh.exe", "powershell.exe"})  # fmt: skip
#: Programs that carry a byte stream over the network (a shell's input or output through them is remote).
_RELAYS: Final = frozenset({"nc", "ncat", "netcat", "nc.traditional", "nc.openbsd", "telnet", "socat", "cryptcat",
                            "openssl", "sshpass", "pwncat", "rcat"})  # fmt: skip
_NC_EXEC: Final = frozenset({"-e", "-c", "--exec", "--sh-exec", "--lua-exec"})
_SOCAT_EXEC: Final = re.compile(r"^(exec|system)[:,]", re.I)
_SOCAT_NET: Final = re.compile(r"^(tcp|udp|sctp|openssl|ssl|tcp4|tcp6|udp4|udp6)[a-z46-]*[:,]", re.I)
_SOCKET_CODE: Final = re.compile(
    r"\bsocket\b|IO::Socket|TCPSocket|fsockopen|stream_socket_client|Net\.Sockets|TCPClient|net\.connect|"
    r"net\.Socket|createConnection|require\(\s*['\"]net['\"]\s*\)|/inet/tcp/|/inet/udp/|\bztcp\b|Socket\.tcp|socket\.connect|/dev/tcp/",
    re.I,
)
_SHELL_CODE: Final = re.compile(
    r"/bin/(?:ba|z|da|k)?sh\b|\b(?:ba|z)?sh\s+-i\b|cmd\.exe|pty\.spawn|\bdup2\b|fdopen|\bspawn\b|subprocess|"
    r"\bexec\b|\bsystem\b|\bpopen\b|proc_open|shell_exec|passthru|\biex\b|invoke-expression|child_process|"
    r"\|&|io\.popen|os\.execute",
    re.I,
)
_DEVICE_SOCKET: Final = ("/dev/tcp/", "/dev/udp/")

#: Where a file written runs later by itself: shell startup files, SSH's authorized keys, cron,
#: systemd/launchd/init/autostart units, the dynamic loader's preload, git hooks and templates.
_PERSIST_PATH: Final = re.compile(
    r"^(?:~|/root|/home/[^/]+|/Users/[^/]+)/(?:\.(?:bashrc|bash_profile|bash_login|bash_logout|profile|zshrc|zprofile|"
    r"zshenv|zlogin|zlogout|kshrc|cshrc|tcshrc|xprofile|xinitrc|xsessionrc|pam_environment|inputrc)$|"
    r"\.config/fish/(?:config\.fish|conf\.d/)|\.ssh/(?:authorized_keys2?|rc|environment)$|\.config/autostart/|"
    r"\.config/systemd/|\.local/share/systemd/|Library/LaunchAgents/|\.config/git/(?:config|hooks/)|\.gitconfig$|"
    r"\.git-templates/|\.config/upstart/|AppData/Roaming/Microsoft/Windows/Start Menu/Programs/Startup/)"
    r"|^/(?:etc/(?:cron|anacrontab|crontab|rc\.local|rc\d?\.d/|init\.d/|init/|systemd/|profile|bash\.bashrc|zsh/|"
    r"environment$|ld\.so\.preload|ld\.so\.conf|update-motd\.d/|udev/rules\.d/|xdg/autostart/|sudoers|pam\.d/|"
    r"network/if-up\.d/|apt/apt\.conf\.d/|gitconfig)|var/spool/cron|var/spool/at|(?:usr/)?lib/systemd/|"
    r"Library/(?:LaunchAgents|LaunchDaemons|StartupItems)/|System/Library/LaunchDaemons/)"
)
_GIT_HOOK: Final = re.compile(r"(?:^|/)\.git/hooks/")
_RUN_KEY: Final = re.compile(
    r"currentversion[\\/]*(?:run|runonce|runservices|policies[\\/]*explorer[\\/]*run|winlogon|"
    r"image ?file ?execution ?options)|userinit|register-scheduledtask|new-scheduledtask|schtasks[^|&;]*/create|"
    r"new-service|\bsc(?:\.exe)?\s+create|start ?menu[\\/]*programs[\\/]*startup|__eventfilter|wmi.*eventconsumer",
    re.I,
)
_GIT_EXEC_KEYS: Final = re.compile(r"^(core\.(hookspath|fsmonitor|sshcommand|pager|editor|askpass)|"
                                   r"alias\..+|include\.path|includeif\..+|credential\.helper|init\.templatedir)$", re.I)  # fmt: skip
_SYSTEMD_LATER: Final = re.compile(r"^--on-(calendar|boot|startup|unit-active|unit-inactive|active)\b")

#: Windows programs that run scripts from a URL or decode files (living off the land).
_LOLBIN_URL: Final = re.compile(r"https?:|\\\\|javascript:|vbscript:|scrobj|/i:", re.I)
_DECODERS: Final = frozenset({"base64", "base32", "basenc", "xxd", "openssl", "gunzip", "gzip", "zcat", "bzip2",
                              "bunzip2", "xz", "unxz", "zstd", "unzstd", "uudecode", "rev", "tr", "certutil"})  # fmt: skip


#: Programs that resolve the name they are given (a lookup tells the name's DNS servers every label).
_RESOLVERS: Final = frozenset({"dig", "nslookup", "host", "drill", "kdig", "delv", "ping", "ping6", "traceroute",
                               "resolvectl", "getent", "dog", "doggo", "tracepath", "arping"})  # fmt: skip
_SUBST_TEXT: Final = re.compile(r"\$\(([^()]*(?:\([^()]*\)[^()]*)*)\)|`([^`]*)`")
_VAR_REF: Final = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)")
#: A substitution that gives only this machine's own name (published in DNS anyway).
_OWN_NAME: Final = re.compile(r"^\s*(?:hostname(?:\s+-[sfA])?|uname\s+-n)\s*$")
#: Name suffixes that stay inside the organisation's own resolvers.
_INTERNAL_SUFFIX: Final = re.compile(r"(?:^|\.)(?:local|internal|lan|corp|home\.arpa|localhost|svc|in-addr\.arpa|ip6\.arpa)\.?$", re.I)


def classify_threats(result: ShellAnalysis) -> dict[str, list[str]]:
    """`{kind: evidence}` for `reverse_shell`, `persistence`, `obfuscated_exec` and `dns_exfil`."""
    out: dict[str, list[str]] = {}

    def add(kind: str, evidence: str) -> None:
        items = out.setdefault(kind, [])
        if evidence not in items and len(items) < 8:
            items.append(evidence[:200])

    _reverse_shell(result, add)
    _dns_exfil(result, add)
    _persistence(result, add)
    _obfuscated(result, add)
    return out


def _reverse_shell(result: ShellAnalysis, add: Any) -> None:
    """A shell (or code running commands) whose input or output is a network connection."""
    sockets = [r for r in result.redirects if r["target"].startswith(_DEVICE_SOCKET)]
    shells = {c.name for c in result.commands if c.name in _SHELLS and c.runs_stdin}
    for r in sockets:
        if r["command"] in _SHELLS or (r["command"] == "exec" and (shells or _fd_shell(result))):
            add("reverse_shell", f"{r['command'] or 'a shell'} {r['op']} {r['target']}")
    for c in result.commands:
        name = c.name
        if name in _RELAYS and any(u in _SHELLS for u in c.upstream):
            add("reverse_shell", f"a shell piped into {name}")
        if name in _SHELLS and c.runs_stdin and any(u in _RELAYS for u in c.upstream):
            add("reverse_shell", f"{'/'.join(u for u in c.upstream if u in _RELAYS)} piped into {name}")
        if name in ("nc", "ncat", "netcat", "nc.traditional", "cryptcat", "pwncat") and _NC_EXEC & set(c.flags + c.args):
            add("reverse_shell", f"{name} -e")
        if name == "socat" and any(_SOCAT_EXEC.match(a) for a in c.args) and any(_SOCAT_NET.match(a) for a in c.args):
            add("reverse_shell", "socat exec: to a socket")
        code = _code(c)
        if code and _SOCKET_CODE.search(code) and _SHELL_CODE.search(code):
            add("reverse_shell", f"{name} code: a socket and a shell")
        if name == "ztcp" and c.operands and any(s in _SHELLS for s in (x.name for x in result.commands)):
            add("reverse_shell", "zsh ztcp with a shell on its descriptor")
    if any(r["command"] == "read" and r["op"] == "<" and r["target"].startswith(_DEVICE_SOCKET) for r in result.redirects) and any(
        c.name in ("eval", "source", ".") or c.name in _SHELLS or c.name.startswith("$") for c in result.commands
    ):
        add("reverse_shell", "commands read from a socket and run")


def _fd_shell(result: ShellAnalysis) -> bool:
    """A command reading or writing a numbered descriptor and running what it reads."""
    return any(r["op"] in ("<&", ">&") and r["target"].isdigit() and int(r["target"]) > 2 for r in result.redirects) and any(
        c.name.startswith("$") or c.name in ("eval", "source", ".") for c in result.commands
    ) or any(r["command"] in _SHELLS and r["target"].isdigit() and int(r["target"]) > 2 for r in result.redirects)


def _persistence(result: ShellAnalysis, add: Any) -> None:
    """A write to where code runs later by itself, or a scheduler told to run something."""
    for p in result.paths:
        if p.op == "write" and (_PERSIST_PATH.search(p.path) or (p.outside and _GIT_HOOK.search(p.path))):
            add("persistence", p.path)
    for c in result.commands:
        name, args = c.name.removesuffix(".exe"), c.args
        if name == "crontab" and not set(c.flags) & {"-l", "-r", "-e"} and (args or c.upstream):
            add("persistence", "crontab " + " ".join(args))
        elif name in ("at", "batch") and not set(c.flags) & {"-l", "-r", "-d", "-c"}:
            add("persistence", name + " " + " ".join(args))
        elif name == "systemd-run" and any(_SYSTEMD_LATER.match(a) for a in args):
            add("persistence", "systemd-run " + " ".join(args[:3]))
        elif name == "systemctl" and any(a in ("enable", "link", "preset", "reenable") for a in args) and any(
            "/" in a for a in args
        ):
            add("persistence", "systemctl enable a unit file")
        elif name == "launchctl" and args[:1] and args[0] in ("load", "bootstrap", "submit", "enable"):
            add("persistence", "launchctl " + " ".join(args))
        elif name in ("update-rc.d", "chkconfig", "rc-update") and len(args) >= 2:
            add("persistence", name + " " + " ".join(args))
        elif name == "git" and "config" in args and {"--global", "--system"} & set(args):
            key = next((a for a in args[args.index("config") + 1 :] if not a.startswith("-")), "")
            if _GIT_EXEC_KEYS.match(key):
                add("persistence", "git config " + key)
        elif name in ("reg", "schtasks", "sc", "wmic", "new-itemproperty", "set-itemproperty") and _RUN_KEY.search(
            name + " " + " ".join(args)
        ) and not {"query", "/query"} & {a.lower() for a in args[:1]}:
            add("persistence", name + " " + " ".join(args[:3]))
    for _name, _text, clear in result.scripts:
        if _RUN_KEY.search(clear) and not re.search(r"\b(reg\s+query|schtasks\s+/query|get-scheduledtask)\b", clear, re.I):
            add("persistence", _RUN_KEY.search(clear).group())  # type: ignore[union-attr]


def _obfuscated(result: ShellAnalysis, add: Any) -> None:
    """Execution hidden by encoding: a Windows script whose running or fetching of code is only
    visible once deobfuscated, a command name computed from variables or written with carets,
    a file decoded then run, and LOLBins that run remote scripts."""
    for name, text, clear in result.scripts:
        if name == "cmd-built":
            add("obfuscated_exec", "a cmd command name built from variables: " + clear[:80])
        elif _squash(text) != _squash(clear) and POWERSHELL_EXEC.search(clear):
            add("obfuscated_exec", f"{name} code that runs or fetches code, once deobfuscated: {clear[:80]}")
    for _, evidence in result.hidden:
        add("obfuscated_exec", evidence)
    _hook_sends(result, add)
    decoded: set[str] = set()
    for c in result.commands:
        name = c.name.removesuffix(".exe")
        if "^" in c.name:
            add("obfuscated_exec", f"a command name written with carets: {c.name}")
        if name == "mshta" or (name in ("rundll32", "regsvr32", "msiexec", "cscript", "wscript", "bitsadmin")
                               and any(_LOLBIN_URL.search(a) for a in c.args)):  # fmt: skip
            add("obfuscated_exec", f"{name} running a remote or inline script")
        if name == "certutil" and {a.lower().lstrip("-/") for a in c.args} & {"decode", "decodehex", "urlcache", "verifyctl"}:
            operands = [a for a in c.args if not a.startswith(("-", "/"))]
            decoded.update(_norm(o) for o in operands[1:2] or operands[-1:])
            if "urlcache" in {a.lower().lstrip("-/") for a in c.args}:
                add("obfuscated_exec", "certutil fetching a file")
    for r in result.redirects:
        if r["op"] in (">", ">>", ">|") and (r["command"] in _DECODERS or any(
            c.name == r["command"] and set(c.upstream) & _DECODERS for c in result.commands
        )):  # fmt: skip
            decoded.add(_norm(r["target"]))
    if decoded:
        ran = {_norm(p.path) for p in result.paths if p.op == "execute"} | {_norm(c.path) for c in result.commands} | {
            _norm(a) for c in result.commands if c.name == "chmod" for a in c.args
        } | {_norm(c.args[0]) for c in result.commands if c.args and (c.name in _SHELLS or c.name in ("python3", "python", "perl", "node"))}
        for f in decoded & ran:
            add("obfuscated_exec", f"decoded into {f}, then run")


def _hook_sends(result: ShellAnalysis, add: Any) -> None:
    """A command set as a hook (`PROMPT_COMMAND`, `PAGER`, `GIT_EXTERNAL_DIFF`…) that sends data over
    the network: an exfiltration that runs at every prompt, page or diff (round 8, os-env-injection)."""
    hooks: dict[str, list[ShellCommand]] = {}
    for c in result.commands:
        if c.via == "exec" and c.parent in HOOK_VARIABLES:
            hooks.setdefault(c.parent, []).append(c)
    if not hooks:
        return
    from gateway.stages.sanitizer.shell import ShellAnalysis, classify_commands  # noqa: PLC0415  (cycle)

    for name, commands in hooks.items():
        if "network_send" in classify_commands(ShellAnalysis(commands=commands)).classes:
            add("obfuscated_exec", f"{name} sends data over the network each time it runs")


def _dns_exfil(result: ShellAnalysis, add: Any) -> None:
    """A name looked up that carries data to an outside domain's DNS servers (round 8,
    os-dns-exfiltration): a label built from a command's output (`$(whoami)`, `$(base32 file)`, a
    `read` variable fed by `xxd`) left of a literal domain that is not internal, or a literal label
    that looks encoded (hex, a 30+ character run). The whole name from a substitution
    (`dig $(hostname -f)`), a variable suffix (`_acme-challenge.$DOMAIN`), `*.svc.cluster.local`
    and this machine's own host name in a label are lookups, not a channel."""
    from gateway.stages.sanitizer.shell import dns_label_encoded  # noqa: PLC0415  (cycle)

    read_vars = {a for c in result.commands if c.name == "read" for a in c.args if not a.startswith("-")}
    for c in result.commands:
        if c.name not in _RESOLVERS:
            continue
        for name in (a.strip("'\"") for a in c.args if not a.startswith(("-", "@", "+"))):
            subs, refs = list(_SUBST_TEXT.finditer(name)), list(_VAR_REF.finditer(name))
            data = any(not _OWN_NAME.match(m.group(1) or m.group(2) or "") for m in subs) or any(
                m.group(1) in read_vars for m in refs)  # fmt: skip
            if data:
                suffix = name[max(m.end() for m in subs + refs) :].strip(".")
                if "$" not in suffix and "." in suffix and not _INTERNAL_SUFFIX.search(suffix):
                    add("dns_exfil", f"{c.name} {name[:80]}: a command's output in a name of {suffix[:60]}")
            elif "$" not in name and "`" not in name and dns_label_encoded(name):
                add("dns_exfil", f"{c.name} {name[:80]}: an encoded label")


def _code(c: ShellCommand) -> str | None:
    from gateway.stages.sanitizer.shell import inline_source  # noqa: PLC0415  (cycle: shell imports this module)

    return inline_source(c)


def _norm(path: str) -> str:
    return path.removeprefix("./").replace("\\", "/").lower()


def _squash(text: str) -> str:
    return re.sub(r"\s+", "", text).lower()
