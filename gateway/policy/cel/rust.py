"""The Rust engine (module ``cel``, common-expression-language) behind `gateway.policy.cel`.

Private: only `gateway.policy.cel` calls it. Compiles (with `matches` routed to the shared RE2 helper),
finds references by a scope-aware token scan, and builds contexts whose functions are the helpers
of the one registry (`gateway.policy.cel.helpers.HELPERS`). ``cel`` is imported on first use.
"""

from __future__ import annotations

import functools
import importlib.machinery
import importlib.util
import logging
import re
import sys
from pathlib import Path
from typing import Any

from gateway.policy.cel.helpers import (
    HELPERS,
    MACROS,
    TOKEN,
    TYPE_NAMES,
    CelSyntaxError,
    bad_macro,
    Compiled,
    Funcs,
    Pos,
    Refs,
    shorten,
)

_NOT_NAMES = frozenset({"true", "false", "null", "in"}) | TYPE_NAMES

# The engine also logs a helper's exception as a warning on the "cel" logger (Python's last-resort
# handler prints it to stderr); the same error reaches the caller as the evaluation's error, so the
# log line is only a second, unstructured copy of it.
logging.getLogger("cel").addHandler(logging.NullHandler())
logging.getLogger("cel").propagate = False


def _scan(source: str) -> tuple[Refs, Funcs]:
    """Find free top-level names and called functions by a scope-aware token scan.

    Only used after the Rust parser accepted ``source``, so the token stream is valid CEL.
    """
    toks: list[tuple[str, str, int]] = [
        (m.lastgroup or "op", m.group(), m.start())
        for m in TOKEN.finditer(source)
        if m.lastgroup != "ws"
    ]

    def pos(i: int) -> Pos:
        at = toks[i][2]
        return source.count("\n", 0, at) + 1, at - (source.rfind("\n", 0, at) + 1) + 1

    closing: dict[int, int] = {}
    stack: list[int] = []
    for i, (_, text, _) in enumerate(toks):
        if text in "([{":
            stack.append(i)
        elif text in ")]}" and stack:
            closing[stack.pop()] = i
    funcs: Funcs = []
    binders: set[int] = set()
    scopes: list[tuple[str, int, int]] = []
    for i, (kind, text, _) in enumerate(toks):
        if kind != "id" or i + 1 >= len(toks) or toks[i + 1][1] != "(":
            continue
        funcs.append((text, pos(i)))
        if text not in MACROS or i == 0 or toks[i - 1][1] != ".":
            continue
        start, end = i + 2, closing.get(i + 1, len(toks))
        commas, depth = [], 0
        for j in range(start, end):
            t = toks[j][1]
            depth += t in "([{"
            depth -= t in ")]}"
            if t == "," and depth == 0:
                commas.append(j)
        if len(commas) != 1 or commas[0] != start + 1 or toks[start][0] != "id":
            raise bad_macro(text, pos(i))
        binders.add(start)
        scopes.append((toks[start][1], commas[0], end))
    refs: Refs = {}
    for i, (kind, text, _) in enumerate(toks):
        if kind != "id" or text in _NOT_NAMES or i in binders:
            continue
        if i + 1 < len(toks) and toks[i + 1][1] == "(":
            continue  # function or macro call
        if i >= 2 and toks[i - 1][1] == "." and (
            toks[i - 2][0] in ("id", "num", "str") or toks[i - 2][1] in ")]}"
        ):
            continue  # field selection
        if any(name == text and lo < i < hi for name, lo, hi in scopes):
            continue  # comprehension variable
        refs.setdefault(text, pos(i))
    return refs, funcs


@functools.cache
def _rust() -> Any:
    """The engine's compiled module (`compile`, `Context`).

    Loaded on its own when `cel` is not imported yet: the package's `__init__` also imports its
    interactive CLI (typer, prompt_toolkit, pygments, rich), a large share of `dharma stdio`'s
    start-up that the gateway never uses. It is registered as `cel.cel`, so a later `import cel`
    reuses it instead of initialising the extension twice. Anything unexpected: `import cel`.
    """
    loaded = sys.modules.get("cel.cel")
    if loaded is not None:
        return loaded
    if "cel" not in sys.modules:
        module = _load_extension_alone()
        if module is not None:
            return module
    import cel

    return cel


def _load_extension_alone() -> Any:
    """The `cel.cel` extension module loaded without its package's `__init__`, or None."""
    try:
        spec = importlib.util.find_spec("cel")
        if spec is None or spec.origin is None:
            return None
        folder = Path(spec.origin).parent
        path = next((folder / f"cel{suffix}" for suffix in importlib.machinery.EXTENSION_SUFFIXES
                     if (folder / f"cel{suffix}").is_file()), None)
        if path is None:
            return None
        loader = importlib.machinery.ExtensionFileLoader("cel.cel", str(path))
        module_spec = importlib.util.spec_from_file_location("cel.cel", path, loader=loader)
        if module_spec is None:
            return None
        module = importlib.util.module_from_spec(module_spec)
    except (ImportError, OSError, ValueError):
        return None
    sys.modules["cel.cel"] = module
    try:
        loader.exec_module(module)
    except Exception:
        sys.modules.pop("cel.cel", None)
        return None
    if not (hasattr(module, "compile") and hasattr(module, "Context")):
        return None  # not the module this adapter was written for: import the package instead
    return module


_RUST_POS = re.compile(r"<input>:(\d+):(\d+): (.*)")


#: Prefix under which a helper that overrides a Rust built-in (`matches`) is registered.
_OVERRIDE_PREFIX = "_dharma_"


def _rewrite_overrides(source: str) -> str:
    """Route calls (method or function form) of built-ins a helper overrides to that helper."""
    overridden = {name for name, helper in HELPERS.items() if helper.overrides_builtin}
    out, last = [], 0
    for m in TOKEN.finditer(source):
        if m.lastgroup == "id" and m.group() in overridden and source[m.end():].lstrip().startswith("("):
            out.append(source[last:m.start()])
            out.append(_OVERRIDE_PREFIX + m.group())
            last = m.end()
    out.append(source[last:])
    return "".join(out)


def rust_compile(source: str) -> Compiled:
    try:
        program = _rust().compile(_rewrite_overrides(source))
    except Exception as exc:
        m = _RUST_POS.search(str(exc))
        if m is None:
            raise CelSyntaxError(shorten(f"syntax error: {exc}")) from None
        raise CelSyntaxError(
            shorten(m.group(3)), line=int(m.group(1)), column=int(m.group(2))
        ) from None
    refs, funcs = _scan(source)
    engine_vars = {v.lstrip(".") for v in program.variables()}
    refs = {n: p for n, p in refs.items() if n in engine_vars}
    return program.execute, refs, funcs


def rust_context(plain: dict[str, Any]) -> Any:
    functions = {
        (_OVERRIDE_PREFIX + name if helper.overrides_builtin else name): helper for name, helper in HELPERS.items()
    }
    return _rust().Context(plain, functions=functions)
