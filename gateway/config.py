"""Settings: defaults < dharma.yaml < DHARMA_* environment, validated once.

`load_settings()` is the only code that reads the environment; the CLI passes `os.environ`
in and tests pass a plain dict. A misspelled key anywhere is an error, not a silent default.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gateway.errors import ConfigError

ENV_PREFIX = "DHARMA_"
#: DHARMA_* variables that are not settings: read by the CLI (CONFIG) or the demo backend.
NOT_SETTINGS = frozenset({"DHARMA_CONFIG", "DHARMA_DEMO_SANDBOX"})
PACKAGE_ROOT = Path(__file__).resolve().parent.parent


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ToolConfig(Strict):
    name: str
    description: str = ""
    input_schema: dict[str, Any] | None = None
    output_schema: dict[str, Any] | None = None
    annotations: dict[str, Any] = Field(default_factory=dict)


class UpstreamConfig(Strict):
    """A backend: Python callables (`target: module:attr`) or a plain HTTP tool API (`url`)."""

    id: str
    type: Literal["python", "http"]
    target: str | None = None
    url: str | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    tools: list[ToolConfig] = Field(default_factory=list)


class LedgerSettings(Strict):
    path: Path | None = None
    synchronous: Literal["FULL", "NORMAL"] = "FULL"


class ServerSettings(Strict):
    host: str = "127.0.0.1"
    port: int = Field(default=8765, ge=0, le=65535)
    max_body_bytes: int = Field(default=2_097_152, gt=0)


class Settings(Strict):
    policy: Path = PACKAGE_ROOT / "policies" / "standard.yaml"
    rules: list[Path] = Field(default_factory=list)
    state_root: Path = Path("~/.dharma")
    engine: Literal["auto", "cel-python", "common-expression-language"] = "auto"
    ledger: LedgerSettings = LedgerSettings()
    server: ServerSettings = ServerSettings()
    upstreams: list[UpstreamConfig] = Field(default_factory=list)
    python_path: list[Path] = Field(default_factory=list, description="directories to import python upstreams from")
    log_level: Literal["debug", "info", "warning", "error"] = "info"

    @property
    def state_dir(self) -> Path:
        return self.state_root.expanduser()

    @property
    def ledger_path(self) -> Path:
        return (self.ledger.path or self.state_dir / "ledger.db").expanduser()

    @property
    def approvals_path(self) -> Path:
        return self.state_dir / "approvals.db"

    @property
    def cel_engine(self) -> str | None:
        return None if self.engine == "auto" else self.engine


def deep_merge(base: dict[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in top.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def env_layer(env: Mapping[str, str]) -> dict[str, Any]:
    """`DHARMA_LEDGER__PATH=/x` → {"ledger": {"path": "/x"}}; values may be YAML scalars or lists."""
    layer: dict[str, Any] = {}
    for name, raw in env.items():
        if not name.startswith(ENV_PREFIX) or name in NOT_SETTINGS:
            continue
        parts = name[len(ENV_PREFIX):].lower().split("__")
        if parts[0] not in Settings.model_fields:
            raise ConfigError(f"environment variable {name}: no setting {parts[0]!r} (known: {', '.join(Settings.model_fields)})")
        try:
            value = yaml.safe_load(raw) if raw.strip() else raw
        except yaml.YAMLError:
            value = raw
        if isinstance(value, (int, float, bool)) and parts[-1] in ("path", "policy", "state_root"):
            value = raw
        node = layer
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return layer


def _resolve_paths(data: dict[str, Any], base: Path) -> dict[str, Any]:
    """Paths in dharma.yaml are relative to the file that names them."""
    out = dict(data)
    for key in ("policy", "state_root"):
        if isinstance(out.get(key), str) and not out[key].startswith("~"):
            out[key] = str((base / out[key]).resolve())
    for key in ("rules", "python_path"):
        if isinstance(out.get(key), list):
            out[key] = [str((base / r).resolve()) if isinstance(r, str) else r for r in out[key]]
    if isinstance(out.get("ledger"), dict) and isinstance(out["ledger"].get("path"), str):
        ledger = dict(out["ledger"])
        if not ledger["path"].startswith("~"):
            ledger["path"] = str((base / ledger["path"]).resolve())
        out["ledger"] = ledger
    return out


def read_config_file(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: config is not UTF-8 text") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}" if mark else ""
        raise ConfigError(f"{path}{where}: malformed YAML: {getattr(exc, 'problem', exc)}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: config must be a YAML mapping")
    return _resolve_paths(data, path.parent)


def load_settings(
    file: Path | None = None, env: Mapping[str, str] | None = None, overrides: Mapping[str, Any] | None = None
) -> Settings:
    """Merge the layers and validate once; every bad key is reported with where it came from."""
    env = os.environ if env is None else env
    if file is None and env.get("DHARMA_CONFIG"):
        file = Path(env["DHARMA_CONFIG"])
    layers = (read_config_file(file) if file else {}, env_layer(env), dict(overrides or {}))
    merged = functools.reduce(deep_merge, layers, {})
    try:
        return Settings.model_validate(merged)
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            loc = ".".join(str(p) for p in error["loc"])
            what = "unknown key" if error["type"] == "extra_forbidden" else error["msg"]
            problems.append(f"{loc}: {what}")
        source = str(file) if file else "settings"
        raise ConfigError(f"{source}: invalid configuration: " + "; ".join(problems)) from None
