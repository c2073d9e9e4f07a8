"""Settings: defaults < dharma.yaml < DHARMA_* environment, validated once.

`load_settings()` is the only code that reads the environment; the CLI passes `os.environ`
in and tests pass a plain dict. A misspelled key anywhere is an error, not a silent default.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, get_args

from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator, model_validator

from gateway.core.errors import ConfigError
from gateway.policy.load import YamlProblem, compose_yaml, construct_yaml, find_scalar, line_of, node_lines
from gateway.policy.names import fold_name
from gateway.stores.base import SessionLimits

ENV_PREFIX = "DHARMA_"
#: DHARMA_* variables that are not settings: read by the CLI (CONFIG, API_KEY), the demo backend or the tests.
NOT_SETTINGS = frozenset({"DHARMA_CONFIG", "DHARMA_API_KEY", "DHARMA_DEMO_SANDBOX", "DHARMA_TEST_CACHE", "DHARMA_TEST_ARTIFACTS", "DHARMA_CONFORMANCE_CACHE",
                          "DHARMA_CONFORMANCE_NODE", "DHARMA_CONFORMANCE_DIR", "DHARMA_SKIP_CONFORMANCE"})
PACKAGE_ROOT = Path(__file__).resolve().parent.parent


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ToolConfig(Strict):
    name: str
    description: str = ""
    input_schema: dict[str, Any] | None = None
    output_schema: dict[str, Any] | None = None
    annotations: dict[str, Any] = Field(default_factory=dict)


MCP_UPSTREAM_TYPES = ("mcp_http", "mcp_stdio")


class UpstreamConfig(Strict):
    """A backend: Python callables (`target: module:attr`), a plain HTTP tool API (`url`), or an
    MCP server reached over Streamable HTTP (`mcp_http`: `url`) or launched over stdio
    (`mcp_stdio`: `command`, `args`, `env`). MCP upstreams are served at `/mcp`; `prefix` is put
    in front of their tool names (`prefix: fs_` → the client sees `fs_read_file`)."""

    id: str
    type: Literal["python", "http", "mcp_http", "mcp_stdio"]
    target: str | None = None
    url: str | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    tools: list[ToolConfig] = Field(default_factory=list)
    command: str | None = None
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    prefix: str = ""
    forward_host: bool = Field(default=False, description="mcp_http: send the client's Host header upstream")

    @property
    def is_mcp(self) -> bool:
        return self.type in MCP_UPSTREAM_TYPES


#: A group's name: one URL path segment (`/mcp/{name}`, `/v1/groups/{name}/...`), lower case.
GROUP_NAME = r"[a-z0-9][a-z0-9_-]{0,62}"


class GroupConfig(Strict):
    """A named tool group (a virtual server): the tools of the one catalog whose served names match
    one of `tools` (globs, fnmatch, case-sensitive, over the names clients see: an MCP upstream's
    `prefix` included), served at `/mcp/{name}` and `/v1/groups/{name}/...`. A group only narrows:
    the caller still sees no tool the compiled policy hides. With `principals` and/or `roles`, only
    those principals (or holders of one of the roles) may use the group; anyone else gets the answer
    of an unknown group (404)."""

    name: str = Field(pattern=f"^{GROUP_NAME}$", description="URL-safe: lower-case letters, digits, '-' and '_' (at most 63)")
    description: str = ""
    tools: list[str] = Field(min_length=1, description="globs over the catalog's tool names as served")
    principals: list[str] = Field(default_factory=list, description="principal ids allowed (empty: no restriction by id)")
    roles: list[str] = Field(default_factory=list, description="roles allowed (empty: no restriction by role)")

    @field_validator("tools")
    @classmethod
    def _globs(cls, value: list[str]) -> list[str]:
        for glob in value:
            if not glob.strip() or glob != glob.strip():
                raise ValueError(f"tool glob {glob!r} must be a non-empty name or pattern without surrounding spaces")
        return value


LEDGER_URL_SCHEMES = ("postgresql", "postgres")


def is_ledger_url(text: str) -> bool:
    """True when `text` names a PostgreSQL ledger (postgresql://… or postgres://…), not a file."""
    scheme, sep, _ = text.partition("://")
    return bool(sep) and scheme.lower() in LEDGER_URL_SCHEMES


class LedgerSettings(Strict):
    """Where the karma ledger lives: a SQLite file (`path`, the default) or PostgreSQL (`url`)."""

    path: Path | None = None
    url: str | None = None
    synchronous: Literal["FULL", "NORMAL"] = "FULL"
    inline_max_ms: float = Field(
        default=2.0, ge=0, le=1000,
        description="SQLite: a lone append on an idle ledger is committed in the caller's thread while recent"
                    " commits took under this many ms (no hand-off to the writer thread); 0: never",
    )

    @field_validator("url")
    @classmethod
    def _postgres_url(cls, value: str | None) -> str | None:
        if value is not None and not is_ledger_url(value):
            raise ValueError(f"must be a postgresql:// URL, not {value.split('://')[0]!r}")
        return value

    @model_validator(mode="after")
    def _one_place(self) -> LedgerSettings:
        if self.path is not None and self.url is not None:
            raise ValueError("give either path (SQLite) or url (PostgreSQL), not both")
        return self


def display_url(url: str) -> str:
    """`url` fit for logs and messages: any password in it replaced by `***` (secrets never in logs)."""
    scheme, sep, rest = url.partition("://")
    userinfo, at, hostpart = rest.rpartition("@")
    if not sep or not at or ":" not in userinfo:
        return url
    return f"{scheme}://{userinfo.split(':', 1)[0]}:***@{hostpart}"


REDIS_URL_SCHEMES = ("redis", "rediss", "unix")


class RedisSettings(Strict):
    """Shared state for several replicas (design §7): off (`url` unset) keeps everything in memory.

    The timeouts bound how long a call waits on Redis before it is refused (fail closed): a
    Redis that hangs must not hang the gateway.
    """

    url: str | None = Field(default=None, description="redis://[user:password@]host:port/db, rediss://… or unix://…")
    key_prefix: str = Field(default="dharma:", min_length=1, description="prefix of every key the gateway writes")
    connect_timeout_seconds: float = Field(default=1.0, gt=0, le=60)
    operation_timeout_seconds: float = Field(default=1.0, gt=0, le=60)
    idempotency_ttl_seconds: float = Field(default=86_400.0, gt=0, description="how long an answer stays replayable under its idempotency key")

    @field_validator("url")
    @classmethod
    def _redis_url(cls, value: str | None) -> str | None:
        if value is not None and value.partition("://")[0].lower() not in REDIS_URL_SCHEMES:
            raise ValueError(f"must be a redis://, rediss:// or unix:// URL, not {value.split('://')[0]!r}")
        return value


class ApprovalSettings(Strict):
    """Held calls: where approvals live follows the ledger (SQLite file beside it, or the same
    PostgreSQL database); wake-ups go over Redis when `redis.url` is set, else within the process."""

    poll_seconds: float = Field(default=1.0, gt=0, le=3600,
                                description="a held call reads its approval again at least this often, "
                                            "in case a wake-up was lost (the safety poll)")


class ServerSettings(Strict):
    """`dharma serve`'s listener and its connection limits (docs/operations.md#limits-and-abuse).

    The limits act on every connection whatever its path (`/mcp`, `/v1`, `/ui`), before a request
    reaches the app: a client that never finishes its request, or opens connections without end,
    holds at most a bounded share of the process's file descriptors for a bounded time."""

    host: str = "127.0.0.1"
    port: int = Field(default=8765, ge=0, le=65535)
    max_body_bytes: int = Field(default=2_097_152, gt=0)
    max_connections: int = Field(
        default=1024, ge=1, le=1_000_000,
        description="open client connections at most, all addresses together; one more is answered 503 and closed. "
                    "Lowered at start to half the process's file-descriptor limit when above it")
    max_connections_per_address: int = Field(
        default=64, ge=0, le=1_000_000,
        description="open connections at most from one client address (IPv6: one /64); one more is answered 429 "
                    "and closed. 0: no cap per address (behind a balancer, which limits per client itself)")
    header_timeout_seconds: float = Field(
        default=10.0, gt=0, le=3600,
        description="a request's line and headers must arrive within this, counted from their first byte (from "
                    "the connection's opening for its first request); else 408 and the connection is closed")
    body_idle_seconds: float = Field(
        default=30.0, gt=0, le=3600,
        description="a request body that sends no byte for this long closes the connection (408 while nothing was answered)")
    body_timeout_seconds: float = Field(
        default=120.0, gt=0, le=86_400,
        description="a request body must arrive whole within this after its headers, however it trickles")
    keep_alive_seconds: float = Field(
        default=5.0, gt=0, le=3600, description="an idle kept-alive connection is closed after this")
    max_requests_per_connection: int = Field(
        default=1000, ge=0, le=100_000_000,
        description="requests answered on one connection, the last with `connection: close`; 0: no limit")


JwsAlgorithm = Literal["RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"]


class ClaimMapping(Strict):
    """How a verified token names its principal and tier (bearer JWTs and the page's OIDC ID tokens alike)."""

    principal_claim: str = "sub"
    tier_claim: str | None = None
    tier_map: dict[str, str] = Field(default_factory=dict, description="tier-claim value -> policy tier; empty: the value is the tier")


class JwtSettings(ClaimMapping):
    """Bearer JWTs: where the signing keys are, and what a token must say to be accepted."""

    jwks: str = Field(description="JWKS as a file path (relative to dharma.yaml) or an https:// URL (http:// only on loopback)")
    issuer: str | list[str] = Field(description="accepted `iss` value(s)")
    audience: str | list[str] | None = Field(default=None, description="accepted `aud` value(s); default: auth.resource_url")
    algorithms: list[JwsAlgorithm] = Field(default_factory=lambda: list(get_args(JwsAlgorithm)))
    leeway_seconds: float = Field(default=30.0, ge=0, le=300)
    jwks_cache_seconds: float = Field(default=300.0, gt=0)
    jwks_min_refetch_seconds: float = Field(default=10.0, ge=0, description="at most one refetch on an unknown kid per interval")


class RefusalSettings(Strict):
    """How the auth layer's refusals reach the karma ledger (`gateway.core.refusals`): aggregated per
    (source address, reason) per interval, the first of each at once."""

    interval_seconds: float = Field(default=60.0, ge=1, le=3600,
                                    description="one record per (source, reason) per interval carries the count after the first")
    max_keys: int = Field(default=256, ge=1, le=100_000,
                          description="distinct (source, reason) keys held per interval; past it refusals fold into one overflow key")


class AuthSettings(Strict):
    """HTTP authentication (`gateway.transports.http_auth`): the gateway as an OAuth 2.1 resource server."""

    resource_url: str | None = Field(default=None, description="canonical URL of this gateway's MCP endpoint; default http://<host>:<port>/mcp")
    authorization_servers: list[str] = Field(default_factory=list)
    scopes_supported: list[str] = Field(default_factory=list)
    required_scopes: list[str] = Field(default_factory=list)
    allowed_origins: list[str] = Field(default_factory=list)
    protect: list[str] = Field(default_factory=lambda: ["/mcp", "/v1/"])
    defer: list[str] = Field(default_factory=list, description="protected paths whose unauthenticated calls the endpoint "
                                                               "answers (and records, one record per call: no aggregation)")
    jwt: JwtSettings | None = None
    refusals: RefusalSettings = Field(default_factory=RefusalSettings)


def _web_url(value: str, what: str) -> str:
    """An absolute https URL (plain http only on a loopback host), without fragment."""
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.fragment:
        raise ValueError(f"{what} {value!r}: must be an absolute https:// URL without fragment")
    from gateway.crypto.jwt import is_loopback  # here: the JWT module brings httpx, which `dharma stdio` never needs

    if parts.scheme == "http" and not is_loopback(parts.hostname):
        raise ValueError(f"{what} {value!r}: plain http is allowed only on a loopback host")
    return value


OIDC_CALLBACK = "/ui/oidc/callback"


class OidcSettings(ClaimMapping):
    """Log in to /ui with OpenID Connect (authorization code + PKCE S256, `state`, `nonce`).

    The client secret never lives in dharma.yaml: `DHARMA_UI__OIDC__CLIENT_SECRET` in the
    environment, or `client_secret_file`; neither makes a public client (PKCE only)."""

    issuer: str = Field(description="the provider's issuer URL; discovery is read from {issuer}/.well-known/openid-configuration")
    client_id: str = Field(min_length=1)
    client_secret: SecretStr | None = Field(default=None, description="from DHARMA_UI__OIDC__CLIENT_SECRET only")
    client_secret_file: Path | None = Field(default=None, description="a file holding the client secret (relative to dharma.yaml)")
    redirect_url: str = Field(description=f"this gateway's callback as the provider reaches it back: https://HOST{OIDC_CALLBACK}")
    scopes: list[str] = Field(default_factory=lambda: ["openid"], description="asked for; must include openid")
    algorithms: list[JwsAlgorithm] = Field(default_factory=lambda: list(get_args(JwsAlgorithm)))
    leeway_seconds: float = Field(default=30.0, ge=0, le=300)

    @field_validator("issuer")
    @classmethod
    def _issuer_url(cls, value: str) -> str:
        return _web_url(value, "issuer")

    @field_validator("redirect_url")
    @classmethod
    def _callback_url(cls, value: str) -> str:
        _web_url(value, "redirect_url")
        if urlsplit(value).path != OIDC_CALLBACK or urlsplit(value).query:
            raise ValueError(f"redirect_url {value!r}: its path must be {OIDC_CALLBACK} (the page's callback), without query")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> OidcSettings:
        if "openid" not in self.scopes:
            raise ValueError("scopes must include openid")
        if self.client_secret is not None and self.client_secret_file is not None:
            raise ValueError("give the client secret once: DHARMA_UI__OIDC__CLIENT_SECRET or client_secret_file, not both")
        return self


class UiSettings(Strict):
    """The approvals page at /ui (docs/operations.md#the-approvals-page)."""

    oidc: OidcSettings | None = Field(default=None, description="'Log in with SSO' through an OpenID Connect provider")
    overview_max_records: int = Field(
        default=20_000, ge=100, le=2_000_000,
        description="the overview page reads at most this many records of its range, newest first, and says when it stopped")
    verify_max_records: int = Field(
        default=2_000_000, ge=0,
        description="the overview's 'Verify now' refuses a ledger larger than this (0: never); use `dharma audit verify`")


_LIMITS = SessionLimits()


class McpHttpSettings(Strict):
    """The MCP Streamable HTTP endpoint of `dharma serve`."""

    path: str = "/mcp"
    #: A local user name callers without credentials are treated as (resolved by the policy's
    #: `local_user` principals). Off by default: /mcp then answers 401 without an API key.
    anonymous_user: str | None = None
    hold_seconds: float = Field(default=50.0, gt=0, description="how long a call held for approval waits")
    progress_interval: float = Field(default=5.0, gt=0, description="seconds between progress notes while holding")
    session_idle_seconds: float = Field(
        default=300.0, gt=0,
        description="a legacy session with no request in flight for this long expires; its upstream sessions end and its"
                    " stdio server processes stop (reaped in the background, not only on next use)")
    max_sessions_per_principal: int = Field(
        default=_LIMITS.per_principal, ge=1,
        description="legacy sessions one principal may have open at once; one more `initialize` gets HTTP 429")
    max_sessions: int = Field(default=_LIMITS.total, ge=1,
                              description="legacy sessions open at once in total (across replicas with redis.url); one more gets HTTP 429")
    max_streams_per_session: int = Field(
        default=_LIMITS.streams_per_session, ge=1,
        description="GET event streams one legacy session may hold open at once on a replica; one more gets HTTP 429")
    max_stdio_processes: int = Field(
        default=32, ge=1,
        description="per mcp_stdio upstream: server processes of legacy sessions running at once (each session runs its own);"
                    " an `initialize` that would start one more gets HTTP 429. The 2026-07-28 shared process is one more")

    def session_limits(self) -> SessionLimits:
        return SessionLimits(per_principal=self.max_sessions_per_principal, total=self.max_sessions,
                             streams_per_session=self.max_streams_per_session)


class ReloadSettings(Strict):
    """Live policy reload (docs/operations.md#live-reload). SIGHUP and `POST /v1/admin/reload`
    always work; `watch` adds reloading when a policy or rule file changes."""

    watch: bool = Field(default=True, description="reload when a file of the policy changes (dharma serve and dharma stdio)")
    debounce_ms: int = Field(default=300, ge=10, le=60_000, description="wait this long for an editor's burst of writes to end")


class MetricsSettings(Strict):
    """`GET /metrics` (Prometheus text format). By default it answers principals with role
    `metrics` or `admin` (a scraper sends its API key as a bearer token); `public: true` serves it
    to anyone who can reach the port (only for a bind that only the scraper reaches)."""

    enabled: bool = True
    public: bool = False


class TracingSettings(Strict):
    """OpenTelemetry spans (the `otel` extra): off by default, and then nothing of OpenTelemetry is imported."""

    otel: bool = False


class Settings(Strict):
    policy: Path = Field(
        default=PACKAGE_ROOT / "policies" / "standard.yaml",
        description="the policy profile; `dharma serve` refuses to start until one is named (see `policy_named`)",
    )
    rules: list[Path] = Field(default_factory=list)
    state_root: Path = Path("~/.dharma")
    engine: Literal["auto", "cel-python", "common-expression-language"] = "auto"
    ledger: LedgerSettings = LedgerSettings()
    redis: RedisSettings = RedisSettings()
    approvals: ApprovalSettings = ApprovalSettings()
    server: ServerSettings = ServerSettings()
    upstreams: list[UpstreamConfig] = Field(default_factory=list)
    mcp: McpHttpSettings = McpHttpSettings()
    groups: list[GroupConfig] = Field(default_factory=list, description="named tool groups at /mcp/{name} and /v1/groups/{name}")
    python_path: list[Path] = Field(default_factory=list, description="directories to import python upstreams from")
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    log_format: Literal["auto", "console", "json"] = Field(
        default="auto", description="stderr log lines: console (for a person), json (for a collector), "
                                    "auto (console on a terminal, else json)")
    auth: AuthSettings = AuthSettings()
    ui: UiSettings = UiSettings()
    reload: ReloadSettings = ReloadSettings()
    metrics: MetricsSettings = MetricsSettings()
    tracing: TracingSettings = TracingSettings()

    @model_validator(mode="after")
    def _mcp_names_do_not_collide(self) -> Settings:
        """Upstream ids are unique; MCP tool-name prefixes can never make two upstreams' names meet."""
        ids = [u.id for u in self.upstreams]
        dup = sorted({i for i in ids if ids.count(i) > 1})
        if dup:
            raise ValueError(f"upstream id {dup[0]!r} is used more than once")
        names = [g.name for g in self.groups]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"group name {twice[0]!r} is used more than once")
        mcp = [u for u in self.upstreams if u.is_mcp]
        for u in mcp:
            if u.type == "mcp_http" and not u.url:
                raise ValueError(f"upstream {u.id}: type mcp_http needs `url`")
            if u.type == "mcp_stdio" and not u.command:
                raise ValueError(f"upstream {u.id}: type mcp_stdio needs `command`")
        for i, a in enumerate(mcp):
            for b in mcp[i + 1:]:
                pa, pb = fold_name(a.prefix or ""), fold_name(b.prefix or "")  # tool globs fold names
                if pa == pb:
                    what = f"prefix {a.prefix!r}" if a.prefix else "no prefix"
                    raise ValueError(
                        f"MCP upstreams {a.id!r} and {b.id!r} both have {what}: their tool names could collide; "
                        "give each a distinct `prefix` (e.g. prefix: fs_)")
                if pa and pb and (pa.startswith(pb) or pb.startswith(pa)):
                    raise ValueError(
                        f"MCP upstreams {a.id!r} and {b.id!r}: prefix {a.prefix!r} and {b.prefix!r} overlap, "
                        "so a tool name could belong to either; use prefixes where neither starts the other")
        return self

    @property
    def policy_named(self) -> bool:
        """Whether a policy was named (dharma.yaml, DHARMA_POLICY or a flag) rather than defaulted.

        The default serves `dharma stdio` and `dharma eval`, where the caller is the local user;
        a network server must be told which policy, and so which callers, it serves.
        """
        return "policy" in self.model_fields_set

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
        value: Any = raw
        if raw.strip():
            try:  # read as dharma.yaml is read
                nodes = compose_yaml(raw)
                if len(nodes) <= 1:
                    value = construct_yaml(raw, nodes[0]) if nodes else None
            except YamlProblem:
                pass  # not one YAML value (or nested too deep): the text as given

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
    jwt = out["auth"].get("jwt") if isinstance(out.get("auth"), dict) else None
    if isinstance(jwt, dict) and isinstance(jwt.get("jwks"), str) and "://" not in jwt["jwks"] and not jwt["jwks"].startswith("~"):
        out["auth"] = {**out["auth"], "jwt": {**jwt, "jwks": str((base / jwt["jwks"]).resolve())}}
    oidc = out["ui"].get("oidc") if isinstance(out.get("ui"), dict) else None
    if isinstance(oidc, dict) and isinstance(oidc.get("client_secret_file"), str) and not oidc["client_secret_file"].startswith("~"):
        out["ui"] = {**out["ui"], "oidc": {**oidc, "client_secret_file": str((base / oidc["client_secret_file"]).resolve())}}
    if isinstance(out.get("upstreams"), list):
        out["upstreams"] = [_resolve_upstream(u, base) if isinstance(u, dict) else u for u in out["upstreams"]]
    return out


def _relative(value: Any) -> bool:
    return isinstance(value, str) and (value in (".", "..") or value.startswith(("./", "../")))


def _resolve_upstream(upstream: dict[str, Any], base: Path) -> dict[str, Any]:
    """An mcp_stdio `command` or `env` value written as ./x or ../x is relative to dharma.yaml.

    Symlinks are kept: a venv's `bin/python` must stay the venv's, not the interpreter it links to.
    """
    out = dict(upstream)
    if _relative(out.get("command")):
        out["command"] = os.path.normpath(base / out["command"])
    if isinstance(out.get("env"), dict):
        out["env"] = {k: os.path.normpath(base / v) if _relative(v) else v for k, v in out["env"].items()}
    return out


def read_config_file(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: config is not UTF-8 text") from None
    try:
        nodes = compose_yaml(text)
        if len(nodes) > 1:
            raise YamlProblem(nodes[1].start_mark.line + 1, "a config file holds one YAML document")
        data = construct_yaml(text, nodes[0]) if nodes else None
    except YamlProblem as exc:
        raise ConfigError(f"{path}:{exc.line}: malformed YAML: {exc.reason}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}:{nodes[0].start_mark.line + 1}: config must be a YAML mapping")
    oidc = data["ui"].get("oidc") if isinstance(data.get("ui"), dict) else None
    if isinstance(oidc, dict) and "client_secret" in oidc:
        where = line_of(node_lines(nodes[0]), ("ui", "oidc", "client_secret"))
        raise ConfigError(f"{path}:{where or 1}: ui.oidc.client_secret must not be written in a file: set "
                          "DHARMA_UI__OIDC__CLIENT_SECRET in the environment, or name a file with ui.oidc.client_secret_file")
    try:
        return _resolve_paths(data, path.parent)
    except ValueError:  # os refuses a path with a NUL character
        where = find_scalar(nodes, lambda value: "\x00" in value) or nodes[0]
        raise ConfigError(f"{path}:{where.start_mark.line + 1}: a path holds a NUL character") from None


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
        lines = _file_lines(file) if file else {}
        problems, first = [], None
        for error in exc.errors():
            loc = ".".join(str(p) for p in error["loc"])
            what = "unknown key" if error["type"] == "extra_forbidden" else error["msg"]
            line = line_of(lines, tuple(error["loc"])) if lines else None
            first = first or line
            problems.append(f"{loc}: {what}" + (f" (line {line})" if line else ""))
        source = (f"{file}:{first}" if first else str(file)) if file else "settings"
        raise ConfigError(f"{source}: invalid configuration: " + "; ".join(problems)) from None


def _file_lines(path: Path) -> dict[tuple[str | int, ...], int]:
    """Where each key of a config file is, for error messages (empty if it cannot be read)."""
    try:
        nodes = compose_yaml(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, YamlProblem):
        return {}
    return node_lines(nodes[0]) if nodes else {}
