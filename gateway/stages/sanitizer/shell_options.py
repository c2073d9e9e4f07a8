"""Options and arguments that make a command run another command (issue 24, round 4).

Many ordinary tools run a program named in one of their options: `tar --checkpoint-action=exec=`,
`git -c core.sshCommand=`, `ssh -o ProxyCommand=`, `rsync -e`, `zip -TT`, `sed`'s `e` command,
`vim -c '!…'`, `env -S`, `sort --compress-program`, `gcc -wrapper`, `watch`, `flock -c`,
`script -c`, `tmux new-session`, `git rebase --exec`... A writer who knows the analysis follows
`sh -c` hides the command there instead. `option_payloads` reads a command's arguments with a
table of (command, option) that executes its value and returns what would run: a command line
(a string, run by a shell) or an argv (a list). The caller analyses each one as a command in
its own right, so the rules judge what it does, not that an option was used: `rsync -e 'ssh -p
2222'` or `git rebase --exec 'make test'` stay allowed.

`COMMAND_VARIABLES` are the environment variables whose value a program runs as a command
(`GIT_SSH_COMMAND`, `PAGER`, `EDITOR`...): an assignment of one is analysed the same way.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Final

#: Environment variables a program runs as a command line.
COMMAND_VARIABLES: Final = frozenset({
    "GIT_SSH_COMMAND", "GIT_SSH", "GIT_PAGER", "GIT_EDITOR", "GIT_SEQUENCE_EDITOR", "GIT_EXTERNAL_DIFF", "GIT_ASKPASS",
    "GIT_PROXY_COMMAND", "SSH_ASKPASS", "SUDO_ASKPASS", "PAGER", "MANPAGER", "SYSTEMD_PAGER", "EDITOR", "VISUAL",
    "BROWSER", "PROMPT_COMMAND", "LESSOPEN", "LESSCLOSE", "RSYNC_RSH", "CVS_RSH", "FCEDIT",
})  # fmt: skip
#: Environment variables naming where an interpreter or the loader looks for code, or a file it runs
#: at start (round 8, os-env-injection): a planted directory or file there is code loaded unasked.
SEARCH_PATH_VARIABLES: Final = frozenset({
    "PYTHONPATH", "PYTHONSTARTUP", "PYTHONHOME", "PERL5LIB", "PERLLIB", "RUBYLIB", "NODE_PATH", "GCONV_PATH",
    "LD_LIBRARY_PATH", "DYLD_LIBRARY_PATH", "DYLD_FRAMEWORK_PATH", "LUA_PATH", "LUA_INIT", "GEM_PATH", "CLASSPATH",
})  # fmt: skip
#: Command variables run as a hook of something else (each prompt, each page shown, each diff):
#: one that sends data over the network is an exfiltration hidden in a setting (round 8).
HOOK_VARIABLES: Final = frozenset({
    "PROMPT_COMMAND", "PAGER", "MANPAGER", "GIT_PAGER", "SYSTEMD_PAGER", "EDITOR", "VISUAL", "GIT_EDITOR",
    "GIT_SEQUENCE_EDITOR", "GIT_EXTERNAL_DIFF", "LESSOPEN", "LESSCLOSE", "FCEDIT", "GIT_ASKPASS", "SSH_ASKPASS",
    "SUDO_ASKPASS",
})  # fmt: skip
#: Environment variables that make a program load code it was not asked to run (round 5,
#: os-env-injection): a preloaded library, a module/agent option, a startup script, git config.
LOADER_VARIABLES: Final = frozenset({
    "LD_PRELOAD", "LD_AUDIT", "DYLD_INSERT_LIBRARIES", "NODE_OPTIONS", "JAVA_TOOL_OPTIONS", "_JAVA_OPTIONS",
    "JDK_JAVA_OPTIONS", "RUBYOPT", "PERL5OPT", "PERL5DB", "BASH_ENV", "ENV", "PS4", "GIT_CONFIG_PARAMETERS",
    "PS0", "PS1", "PS2", *SEARCH_PATH_VARIABLES,
})  # fmt: skip
#: Prompt strings an interactive bash expands (command substitutions included) at every prompt:
#: what a substitution there runs is analysed, with no finding of its own (`$(__git_ps1)` is common).
_PROMPTS: Final = frozenset({"PS0", "PS1", "PS2"})
#: What bash puts in place of a process substitution `<(cmd)`.
_FD_PATH: Final = re.compile(r"^/(?:dev|proc/self)/fd/\d+$")
#: System library directories (a preload from there is an allocator or a profiler the admin installed).
_SYSTEM_LIBS: Final = re.compile(r"^/(?:usr/(?:local/)?)?lib(?:32|64)?/|^/opt/homebrew/|^/usr/local/opt/|^/nix/store/")
#: Where planted code lives: temporary and shared-memory directories, a hidden file or directory,
#: a download folder, a URL or a data: URI.
_PLANTED: Final = re.compile(r"^/(?:tmp|var/tmp|dev/shm|run/user/\d+)/|(?:^|/)\.[^./][^/]*|(?:^|/)Downloads/|^[a-z]+:", re.I)
_MODULE_OPTION: Final = re.compile(
    r"(?:^|\s)(?:--require|-r|--import|--loader|--experimental-loader|-javaagent:|-agentpath:|-r(?=\S)|-M|-m)[= ]?['\"]?([^\s'\"=]+)"
)
_SUBSTITUTION: Final = re.compile(r"\$\((.+)\)|`([^`]+)`", re.S)
#: A place code is planted rather than installed (round 8): shared memory and per-user runtime
#: directories, a hidden name inside a temporary directory, a download folder, a URL, or a file
#: whose own name is hidden. `/tmp/build/lib` or `~/.local/bin/difft` are not.
_PLANTED_PROGRAM: Final = re.compile(
    r"^/(?:dev/shm|run/user/\d+)/|^/(?:var/)?tmp/(?:[^/]+/)*\.[^./]|(?:^|/)Downloads/|^[a-z][a-z0-9+.-]*://|(?:^|/)\.[^./][^/]*$",
    re.I,
)


def planted_place(path: str) -> bool:
    """Whether `path` (a program, library, module directory or startup file) is a planted place."""
    return _PLANTED_PROGRAM.search(path.strip().strip("'\"")) is not None


def env_injection(name: str, value: str, env: dict[str, str]) -> tuple[str | None, str | None]:
    """(evidence, command line to analyse) for `NAME=value` when it makes programs load code:
    a library preloaded from outside the system library directories; a module or agent option
    (`NODE_OPTIONS=--require`, `-javaagent:`, `RUBYOPT=-r`, `PERL5OPT=-M`) loading from a planted
    place (`/tmp`, `/dev/shm`, a hidden path, Downloads, a URL); a command substitution in a
    variable the shell expands when it starts (`BASH_ENV`, `ENV`, `PS4`); Perl code after `;` in
    PERL5OPT or in PERL5DB. A git config key that runs a command (`GIT_CONFIG_PARAMETERS`,
    `GIT_CONFIG_KEY_n`/`GIT_CONFIG_VALUE_n`) gives only its command, analysed as `git -c` is. Ordinary settings (`NODE_OPTIONS=--max-old-space-size`,
    a jemalloc preload, an OpenTelemetry agent under /opt) give (None, None)."""
    if name.startswith("GIT_CONFIG_"):
        return _git_env(name, value.strip(), env)
    value = value.strip().strip("'\"")
    if not value:
        return None, None
    if name in ("LD_PRELOAD", "LD_AUDIT", "DYLD_INSERT_LIBRARIES"):
        for lib in re.split(r"[:\s]+", value):
            if "/" in lib and _SYSTEM_LIBS.match(lib) is None:
                return f"{name} loads {lib} into every program started", None
        return None, None
    if name in _PROMPTS:
        sub = _SUBSTITUTION.search(value)
        return None, (sub.group(1) or sub.group(2)) if sub is not None else None
    if name in ("BASH_ENV", "ENV") and _FD_PATH.match(value):
        return f"{name} sources the output of a command (a process substitution) in the shell it starts", None
    if name in ("BASH_ENV", "ENV", "PS4"):
        sub = _SUBSTITUTION.search(value)
        if sub is not None:
            return f"{name} holds a command the shell runs when it starts", sub.group(1) or sub.group(2)
        planted = name != "PS4" and _PLANTED.search(value) is not None
        return (f"{name} sources {value[:80]} in every non-interactive shell", None) if planted else (None, None)
    if name in SEARCH_PATH_VARIABLES:
        for part in re.split(r"[:;]", value):
            if part and planted_place(part):
                return f"{name} makes programs load code from {part[:80]}", None
        return None, None
    if name in ("PERL5DB",) or (name == "PERL5OPT" and ";" in value):
        return f"{name} carries Perl code run by every perl", None
    for m in _MODULE_OPTION.finditer(" " + value):
        if _PLANTED.search(m.group(1)) is not None:
            return f"{name} loads {m.group(1)[:80]} into every program started", None
    return None, None


def _git_env(name: str, value: str, env: dict[str, str]) -> tuple[str | None, str | None]:
    """(None, the command) for a git config key that runs a command, set through the environment."""
    if name == "GIT_CONFIG_PARAMETERS":
        for key, val in re.findall(r"'?([^'=\s]+)=([^']*)'?", value):
            if _GIT_KEYS.match(key):
                return None, val
        return None, None
    n = name.rsplit("_", 1)[-1]
    key = value if name.startswith("GIT_CONFIG_KEY_") else env.get(f"GIT_CONFIG_KEY_{n}", "")
    val = env.get(f"GIT_CONFIG_VALUE_{n}", "") if name.startswith("GIT_CONFIG_KEY_") else value
    if _GIT_KEYS.match(key.strip("'\"")) and val:
        return None, val
    return None, None


#: A client's own command that runs a shell command: `\! cmd`, `!cmd`, `shell cmd`, `system cmd`.
_CLIENT_BANG: Final = re.compile(r"(?:^|[;\n])\s*(?:\\!|!|shell\s|\\?system\s)\s*([^;\n]+)")
#: rpm macros that run a command: `%(cmd)`, Lua's `os.execute("cmd")` / `io.popen("cmd")`.
_RPM_RUNS: Final = re.compile(r"%\(([^)]+)\)|(?:os\.execute|io\.popen)\(\s*[\"']([^\"']+)")
#: `git -c KEY=VALUE` keys whose value git runs (a shell command line).
_GIT_KEYS: Final = re.compile(
    r"(?i)^(core\.(sshcommand|pager|editor|fsmonitor|askpass|gitproxy)|sequence\.editor|diff\.external|"
    r"pager\.[\w.-]+|gpg\.(program|\w+\.program)|credential(\.[^=]*)?\.helper|(diff|merge|filter)\.[^=]*\.(command|textconv|"
    r"clean|smudge|process|cmd|driver)|(difftool|mergetool)\.[^=]*\.cmd|uploadpack\.packobjectshook|"
    r"core\.hookspath|alias\.[\w.-]+|protocol\.ext\.allow)$"
)
#: ssh -o options that run a local command.
_SSH_KEYS: Final = re.compile(r"(?i)^(proxycommand|localcommand|knownhostscommand|permitlocalcommand)$")
#: sed's `e COMMAND` (run a command), after an optional address, at the start of a script command.
_SED_E: Final = re.compile(r"(?:^|[;\n{}])\s*(?:(?:\d+|\$|/[^/\n]*/)(?:\s*,\s*(?:\d+|\$|/[^/\n]*/))?)?\s*!?\s*e\s+([^;\n}]+)")
#: vim/ex commands that run a shell command: `:!cmd`, `:r !cmd`, `:w !cmd`, `:call system('cmd')`.
_VIM_BANG: Final = re.compile(r"^[:\s]*(?:\d*|%)\s*(?:r(?:ead)?|w(?:rite)?|silent!?|exe(?:cute)?)?\s*!(.+)$|system\(\s*['\"]([^'\"]+)")
_VIMS: Final = frozenset({"vi", "vim", "nvim", "ex", "view", "gvim", "rvim", "vimdiff"})
_TMUX_RUNS: Final = frozenset({"new", "new-session", "new-window", "neww", "split-window", "splitw", "respawn-pane",
                               "respawnp", "respawn-window", "respawnw", "run-shell", "run", "if-shell", "if"})  # fmt: skip


def option_payloads(name: str, args: list[str]) -> list[str | list[str]]:
    """What `name args…` runs because of its options: command lines (str) and argvs (list)."""
    handler = _HANDLERS.get(name)
    if handler is None:
        if name in _VIMS:
            return _vim(args)
        if name in ("gcc", "g++", "cc", "c++", "clang", "clang++"):
            return _gcc(args)
        return []
    return handler(args)[:16]


def _values(args: list[str], *names: str) -> list[str]:
    """The values of the options `names` (`--o=v`, `--o v`, `-o v`, `-ov` for a one-letter `-o`)."""
    out: list[str] = []
    i = 0
    while i < len(args):
        a = args[i]
        for n in names:
            if a == n and i + 1 < len(args):
                out.append(args[i + 1])
                i += 1
                break
            if n.startswith("--") and a.startswith(n + "="):
                out.append(a[len(n) + 1 :])
                break
            if len(n) == 2 and a.startswith(n) and len(a) > 2 and not a.startswith("--"):
                out.append(a[2:])
                break
            if len(n) == 2 and i + 1 < len(args) and re.fullmatch(r"-[A-Za-z]+", a) and a.endswith(n[1]):
                out.append(args[i + 1])  # a short cluster ending with the option (`script -qc CMD`)
                i += 1
                break
        i += 1
    return out


def _tar(args: list[str]) -> list[str | list[str]]:
    out: list[str | list[str]] = []
    for action in _values(args, "--checkpoint-action"):
        if action.startswith("exec="):
            out.append(action[5:])
    out.extend(_values(args, "--to-command", "--use-compress-program", "-I", "--rsh-command", "--info-script", "-F",
                       "--new-volume-script"))  # fmt: skip
    return out


def _git(args: list[str]) -> list[str | list[str]]:
    out: list[str | list[str]] = []
    for setting in _values(args, "-c"):
        key, _, value = setting.partition("=")
        if _GIT_KEYS.match(key) and value:
            out.append(value[1:] if value.startswith("!") else value)
    sub = next((a for i, a in enumerate(args) if not a.startswith("-") and (i == 0 or args[i - 1] not in ("-c", "-C"))), "")
    rest = args[args.index(sub) + 1 :] if sub else []
    if sub in ("rebase", "difftool"):
        out.extend(_values(rest, "--exec", "-x", "--extcmd"))
    elif sub == "submodule" and "foreach" in rest:
        tail = [a for a in rest[rest.index("foreach") + 1 :] if not a.startswith("--")]
        if tail:
            out.append(" ".join(tail))
    elif sub == "bisect" and rest[:1] == ["run"] and len(rest) > 1:
        out.append(rest[1:])
    elif sub == "filter-branch":
        out.extend(_values(rest, "--tree-filter", "--index-filter", "--msg-filter", "--env-filter", "--commit-filter",
                           "--parent-filter", "--tag-name-filter"))  # fmt: skip
    out.extend(_values(args, "--upload-pack", "--receive-pack", "--exec", "--open-files-in-pager", "-O", "-u"))
    for a in args:  # the ext:: remote helper runs its URL as a command (`%` escapes a space)
        if a.startswith("ext::"):
            out.append(a[5:].replace("% ", " ").replace("%%", "%"))
    return out


def _ssh(args: list[str]) -> list[str | list[str]]:
    out: list[str | list[str]] = []
    for option in _values(args, "-o"):
        parts = re.split(r"\s*=\s*|\s+", option.strip(), maxsplit=1)
        key, value = parts[0], parts[1] if len(parts) > 1 else ""
        if _SSH_KEYS.match(key) and value and value.lower() not in ("yes", "no", "none"):
            out.append(value)
    out.extend([p] for p in _values(args, "-S"))  # scp/sftp -S PROGRAM
    return out


def _rsync(args: list[str]) -> list[str | list[str]]:
    return list(_values(args, "-e", "--rsh", "--rsync-path"))


def _program(*options: str) -> Callable[[list[str]], list[str | list[str]]]:
    """A tool whose `options` name a program it runs (`tcpdump -z`, `aria2c --on-download-complete`,
    `wget --use-askpass`): each value, a command line."""
    return lambda args: list(_values(args, *options))


def _client_bang(*options: str) -> Callable[[list[str]], list[str | list[str]]]:
    """A client whose `options` hold its own commands, of which `\\!`, `!`, `shell` and `system` run a
    shell command (mysql -e, psql -c, gdb -ex, lftp -c, mail --exec): the rest of each such command."""
    def payloads(args: list[str]) -> list[str | list[str]]:
        return [m.group(1).strip() for v in _values(args, *options) for m in _CLIENT_BANG.finditer(v)]
    return payloads


def _make(args: list[str]) -> list[str | list[str]]:
    """`make --eval` text: its recipe lines (after a tab) are shell command lines."""
    return [line[1:] for text in _values(args, "--eval") for line in text.split("\n") if line.startswith("\t")]


def _rpm(args: list[str]) -> list[str | list[str]]:
    """`rpm --eval`/`-E` macros that run commands: `%(cmd)` and Lua's `os.execute("cmd")`/`io.popen`."""
    return [m.group(1) or m.group(2) for v in _values(args, "--eval", "-E") for m in _RPM_RUNS.finditer(v)]


def _zip(args: list[str]) -> list[str | list[str]]:
    return list(_values(args, "-TT", "--unzip-command"))


def _env(args: list[str]) -> list[str | list[str]]:
    return list(_values(args, "-S", "--split-string"))


def _sort(args: list[str]) -> list[str | list[str]]:
    return [[p] for p in _values(args, "--compress-program")]


def _sed(args: list[str]) -> list[str | list[str]]:
    scripts = _values(args, "-e", "--expression")
    if not scripts:
        operands = [a for a in args if not a.startswith("-")]
        scripts = operands[:1]
    return [m.group(1).strip() for s in scripts for m in _SED_E.finditer(s)]


def _vim(args: list[str]) -> list[str | list[str]]:
    out: list[str | list[str]] = []
    commands = _values(args, "-c", "--cmd") + [a[1:] for a in args if a.startswith("+") and len(a) > 1]
    for command in commands:
        m = _VIM_BANG.search(command)
        if m:
            out.append((m.group(1) or m.group(2)).strip())
    return out


def _gcc(args: list[str]) -> list[str | list[str]]:
    return [w.split(",") for w in _values(args, "-wrapper")]


def _man(args: list[str]) -> list[str | list[str]]:
    return list(_values(args, "-P", "--pager", "-H", "--html"))


def _watch(args: list[str]) -> list[str | list[str]]:
    i = 0
    while i < len(args) and args[i].startswith("-"):
        i += 2 if args[i] in ("-n", "--interval", "-q", "--equexit") else 1
    return [" ".join(args[i:])] if i < len(args) else []


def _dash_c_value(args: list[str]) -> list[str | list[str]]:
    """`flock -c CMD`, `script -c CMD`, `npx -c CMD`, `npm exec -c CMD`, `expect -c`-less forms."""
    return list(_values(args, "-c", "--command", "--call"))


def _tmux(args: list[str]) -> list[str | list[str]]:
    for i, a in enumerate(args):
        if a in _TMUX_RUNS:
            rest = args[i + 1 :]
            j = 0
            while j < len(rest) and rest[j].startswith("-"):
                j += 2 if rest[j] in ("-t", "-s", "-n", "-c", "-x", "-y", "-e", "-F", "-l") else 1
            return [" ".join(rest[j:])] if j < len(rest) else []
    return []


def _sqlite(args: list[str]) -> list[str | list[str]]:
    """sqlite3's `.shell CMD` / `.system CMD` dot-commands (an operand or a `-cmd` value)."""
    out: list[str | list[str]] = []
    for a in args:
        for line in a.split("\n"):
            m = re.match(r"\s*\.(?:shell|system)\s+(.+)", line)
            if m:
                out.append(m.group(1))
    return out


def _less(args: list[str]) -> list[str | list[str]]:
    """`less +'!cmd'` / `more +'!cmd'`: an initial command that runs a shell command (GTFOBins)."""
    return [a[2:].strip() for a in args if a.startswith("+!") and a[2:].strip()]


def _wmic(args: list[str]) -> list[str | list[str]]:
    """`wmic [/node:…] process call create "cmd"` (LOLBAS): the command line it starts, read as
    cmd.exe would (a Windows command line: the POSIX lexer would refuse `iex(iwr …)`)."""
    low = [a.lower() for a in args]
    for i in range(len(low) - 2):
        if low[i] == "process" and low[i + 1] == "call" and low[i + 2] == "create" and i + 3 < len(args):
            return [["cmd", "/c", " ".join(args[i + 3 :])]]
    return []


def _forfiles(args: list[str]) -> list[str | list[str]]:
    """`forfiles … /c "cmd /c …"` (LOLBAS): the command it runs for each file found."""
    return [["cmd", "/c", args[i + 1]] for i, a in enumerate(args[:-1]) if a.lower() in ("/c", "-c")]


def _parallel(args: list[str]) -> list[str | list[str]]:
    if ":::" not in args:
        return []
    i = args.index(":::")
    command = [a for a in args[:i] if not a.startswith("-")]
    inputs = [a for a in args[i + 1 :] if a not in (":::", "::::")]
    if not command:
        return []
    if any("{}" in a for a in command):
        return [[a.replace("{}", x) for a in command] for x in inputs[:8]]
    return [[*command, x] for x in inputs[:8]]


_HANDLERS: Final = {
    "tar": _tar, "bsdtar": _tar, "gtar": _tar, "git": _git, "ssh": _ssh, "scp": _ssh, "sftp": _ssh,
    "rsync": _rsync, "zip": _zip, "env": _env, "sort": _sort, "sed": _sed, "gsed": _sed, "man": _man,
    "watch": _watch, "flock": _dash_c_value, "script": _dash_c_value, "npx": _dash_c_value, "npm": _dash_c_value,
    "pnpm": _dash_c_value, "tmux": _tmux, "parallel": _parallel, "sqlite3": _sqlite,
    "tcpdump": _program("-z"), "aria2c": _program("--on-download-complete", "--on-download-start", "--on-download-error",
                                                  "--on-download-stop", "--on-download-pause", "--on-bt-download-complete"),
    "wget": _program("--use-askpass"), "cpio": _program("--rsh-command"), "make": _make, "gmake": _make, "rpm": _rpm,
    "mysql": _client_bang("-e", "--execute"), "mariadb": _client_bang("-e", "--execute"), "psql": _client_bang("-c", "--command"),
    "gdb": _client_bang("-ex", "--ex", "-eval-command", "--eval-command"), "lftp": _client_bang("-c", "-e"),
    "mail": _client_bang("--exec", "-E"), "mailx": _client_bang("--exec", "-E"),
    "less": _less, "more": _less, "wmic": _wmic, "wmic.exe": _wmic, "forfiles": _forfiles, "forfiles.exe": _forfiles,
}  # fmt: skip
