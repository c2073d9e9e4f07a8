"""Run the labelled corpus through `dharma stdio` and judge every case (shared by
tests/test_corpus.py and bench/detection.py).

Each case gets its own gateway process (a fresh state root: new pins, new session, new ledger)
in front of its own MCP server (tests/corpus/server.py, forked from one pre-imported zygote),
with the corpus profile (`corpus_profile`: policies/standard.yaml with every tool granted to
the local user, elicitation approvals on), driven by the official SDK client. The client declines
every elicitation, so a call the gateway holds for approval comes back refused. Before each step the client lists the tools again (as a
client does after `notifications/tools/list_changed`), so a definition that changes after the
first listing is what the gateway sees at the next call.

`judge` is the one place that decides whether a case was blocked or allowed; see its docstring.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import yaml
from mcp import Client, MCPError, StdioServerParameters
from mcp.client.stdio import stdio_client

from gateway.crypto.receipts import RECEIPT_META_KEY
from gateway.mcp.governance import DECISION_META_KEY
from tests.corpus.model import Case, Step

REPO = Path(__file__).resolve().parents[2]
CORPUS = Path(__file__).resolve().parent
STANDARD = REPO / "policies" / "standard.yaml"
ZYGOTE = CORPUS / "zygote.py"
LAUNCH = CORPUS / "launch.py"

ATTACK_FAMILIES = ("tool_poisoning", "injected_results", "obfuscated_shell", "encoded_secrets", "exfil_chains")
#: Where an agent's calls go (issue 27): the held-out corpus has these from its freeze, the tuned one gains them.
EGRESS_FAMILIES = ("ssrf", "url_exfil", "fetched_injection")
RECALL_TARGET = 0.9
#: Error codes that mean the gateway refused or held the call (the attack did not get through).
REFUSALS = frozenset({"policy_blocked", "forbidden", "tool_not_found", "purpose_required", "invalid_params",
                      "approval_required", "approval_denied", "approval_timeout"})
#: Error codes that mean the run failed (a harness or gateway problem, neither blocked nor allowed).
FAILURES = frozenset({"rate_limited", "backend_unavailable", "backend_error", "timeout", "internal_error"})
CASE_SECONDS = 60.0


# ---- what happened, and the judgement ------------------------------------------------------


@dataclass
class StepResult:
    """What one step did: `listed` (the tool was in the client's listing just before the call),
    `code` (the gateway's error code, if any), `unchanged` (the result is the backend's, byte for
    byte apart from the receipt), `held` (the gateway asked the client to approve), `problem`
    (an exception the client raised)."""

    call: str
    expect: str
    listed: bool
    code: str | None = None
    unchanged: bool = False
    held: bool = False
    problem: str = ""
    excerpt: str = ""

    @property
    def failed(self) -> bool:
        return self.code in FAILURES or (bool(self.problem) and self.listed and not self.problem.startswith("client rejected"))

    @property
    def blocked(self) -> bool:
        """The call did not reach the client as the backend answered it."""
        return not self.failed and (not self.listed or self.code in REFUSALS or self.held or not self.unchanged)

    @property
    def passed(self) -> bool:
        return self.listed and not self.failed and self.code is None and self.unchanged and not self.held

    def describe(self) -> str:
        if self.failed:
            return f"{self.call}: run failed ({self.code or self.problem})"
        if not self.listed:
            return f"{self.call}: hidden from tools/list"
        if self.code in REFUSALS or self.held:
            return f"{self.call}: refused ({self.code or 'held'})"
        if not self.unchanged:
            return f"{self.call}: result changed ({self.problem or self.excerpt or 'withheld/redacted'})"
        return f"{self.call}: allowed"


@dataclass
class Observation:
    case: Case
    listed_first: list[str] = field(default_factory=list)
    steps: list[StepResult] = field(default_factory=list)
    error: str = ""
    seconds: float = 0.0


@dataclass(frozen=True)
class Verdict:
    case_id: str
    family: str
    looks_like: str | None
    expected: str
    actual: str  # "blocked", "allowed", "mixed" or "error"
    detail: str
    why: str

    @property
    def ok(self) -> bool:
        return self.actual == {"block": "blocked", "allow": "allowed"}[self.expected]


def judge(obs: Observation) -> Verdict:
    """Blocked or allowed, the one judgement the test and the bench share.

    A step is *blocked* when its call did not reach the client as the backend answered it: the
    tool was absent from the `tools/list` the client saw just before the call (a poisoned tool
    hidden), or the call came back `isError` with a gateway error code that refuses or holds it
    (policy_blocked, forbidden, tool_not_found, purpose_required, invalid_params,
    approval_required/denied/timeout, or the client was asked to approve: it always declines),
    or the result differs from the backend's (withheld or redacted). A step *passed* when the tool
    was listed, no error code came back and the result is the backend's byte for byte, the
    gateway's receipt in `_meta` aside. A gateway failure (rate_limited, backend_error, timeout,
    internal_error, backend_unavailable) or a client exception is neither: the case is `error`.

    A case is `blocked` when every step that expects `block` was blocked and every step that
    expects `allow` passed (steps that expect `any` do not count: the harmless start of a chain
    may be stopped or not). It is `allowed` when every step passed and, for a benign case, every
    tool was listed. Anything else is `mixed`.
    """
    case = obs.case
    where = f"{Path(case.file).name}: {case.why}"
    if obs.error:
        return Verdict(case.id, case.family, case.looks_like, case.expected, "error", obs.error, where)
    failed = [s for s in obs.steps if s.failed]
    if failed or len(obs.steps) != len(case.steps):
        detail = "; ".join(s.describe() for s in failed) or f"only {len(obs.steps)} of {len(case.steps)} steps ran"
        return Verdict(case.id, case.family, case.looks_like, case.expected, "error", detail, where)
    detail = "; ".join(s.describe() for s in obs.steps)
    unlisted = sorted({t["name"] for t in case.tools} - set(obs.listed_first))
    if all(s.passed for s in obs.steps) and not (case.family == "benign" and unlisted):
        actual = "allowed"
    elif all(s.blocked for s in obs.steps if s.expect == "block") and all(s.passed for s in obs.steps if s.expect == "allow") \
            and any(s.expect == "block" for s in obs.steps):
        actual = "blocked"
    else:
        actual = "blocked" if case.family == "benign" else "mixed"
    if case.family == "benign" and unlisted:
        detail = f"hidden from the first tools/list: {', '.join(unlisted)}; " + detail
    return Verdict(case.id, case.family, case.looks_like, case.expected, actual, detail, where)


# ---- running ----------------------------------------------------------------------------


def _received(result: types.CallToolResult) -> tuple[dict[str, Any], str | None]:
    """The result as JSON without the gateway's receipt, and the gateway's error code."""
    body = result.model_dump(mode="json", by_alias=True, exclude_none=True)
    meta = {k: v for k, v in (body.pop("_meta", None) or {}).items() if k != RECEIPT_META_KEY}
    decision = meta.get(DECISION_META_KEY)
    code = decision.get("error_code") if isinstance(decision, dict) else None
    if meta:
        body["_meta"] = meta
    return body, code


def _scripted(result: dict[str, Any]) -> dict[str, Any]:
    return types.CallToolResult.model_validate(result).model_dump(mode="json", by_alias=True, exclude_none=True)


def _tail(path: Path, size: int = 600) -> str:
    try:
        return path.read_text(errors="replace")[-size:]
    except OSError:
        return "(none)"


def _text(body: dict[str, Any]) -> str:
    texts = [c.get("text", "") for c in body.get("content", []) if isinstance(c, dict)]
    return " ".join(t for t in texts if t)[:160]


def corpus_profile(folder: Path) -> Path:
    """policies/standard.yaml with two changes, written to `folder`: the local user (the only
    principal) gets the standard profile's `admin` tier, which grants every tool, so the corpus
    measures the detection rules rather than the tier gate; and `approval.allow_elicitation` is on,
    so a held call is asked about at once (and declined) rather than waiting out a hold for an
    approver nobody is. Every rule set, limit and sanitizer setting is the standard profile's,
    read afresh on each run.

    Not an `extends` overlay: an extending profile may only add principals, and principals
    match in order, so the base's `local` (tier operator, any local user) would still win."""
    doc = yaml.safe_load(STANDARD.read_text(encoding="utf-8"))
    doc["metadata"] = {"name": "corpus", "description": "policies/standard.yaml, every tool granted to the local user"}
    doc["principals"] = [{"id": "local", "local_user": "*", "tier": "admin"}]
    doc["approval"] = {**doc.get("approval", {}), "allow_elicitation": True}
    doc["rule_sets"] = [str((STANDARD.parent / ref).resolve()) for ref in doc["rule_sets"]]
    path = folder / "corpus-profile.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return path


class Zygote:
    """The corpus fork server (zygote.py) on a Unix socket in `folder`: the MCP SDK and the
    gateway imported once, one forked process per `dharma stdio` and per case server."""

    def __init__(self, folder: Path) -> None:
        self.socket = str(folder / "zygote.sock")
        self._log = open(folder / "zygote.log", "wb")  # noqa: SIM115 - closed in close()
        env = {k: v for k, v in os.environ.items() if not k.startswith("DHARMA_")}
        self.proc = subprocess.Popen([sys.executable, str(ZYGOTE), self.socket], stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=self._log, cwd=REPO, env=env)
        assert self.proc.stdout is not None
        if self.proc.stdout.readline().strip() != b"ready":
            self.close()
            raise RuntimeError(f"the corpus zygote did not start: {_tail(folder / 'zygote.log')}")

    def command(self, program: str, *args: str) -> list[str]:
        """The command line that runs `program` (`dharma` or `server`) forked from the zygote."""
        return [sys.executable, "-I", "-S", str(LAUNCH), self.socket, program, *args]

    def close(self) -> None:
        """Stop the zygote (it terminates the children still running) and its pipes."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._log.close()


async def run_case(case: Case, zygote: Zygote, workdir: Path, profile: Path) -> Observation:
    """One case through its own `dharma stdio`: list, then each step (list again, call)."""
    obs = Observation(case)
    state = workdir / case.id
    state.mkdir()
    held: list[int] = []

    async def decline(ctx: Any, params: Any) -> types.ElicitResult:
        held.append(len(obs.steps))
        return types.ElicitResult(action="decline")

    command = zygote.command("dharma", "--state-root", str(state), "stdio", "--policy", str(profile),
                             "--hold-seconds", "5", "--", *zygote.command("server", case.file, case.id))
    params = StdioServerParameters(command=command[0], args=command[1:], cwd=str(REPO))
    started = time.perf_counter()
    try:
        with anyio.fail_after(CASE_SECONDS), open(state / "gateway.log", "w") as errlog:
            async with Client(stdio_client(params, errlog=errlog), mode="legacy", elicitation_callback=decline) as client:  # type: ignore[arg-type]
                obs.listed_first = [t.name for t in (await client.list_tools(cache_mode="refresh")).tools]
                for step in case.steps:
                    listed = {t.name for t in (await client.list_tools(cache_mode="refresh")).tools}
                    obs.steps.append(await _call(client, step, step.call in listed, held))
    except TimeoutError:
        obs.error = f"timed out after {CASE_SECONDS:.0f} s; gateway log: {_tail(state / 'gateway.log')}"
    except Exception as exc:  # one broken case is reported, the others still run
        while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
            exc = exc.exceptions[0]
        obs.error = f"{type(exc).__name__}: {exc}; gateway log: {_tail(state / 'gateway.log')}"
    obs.seconds = time.perf_counter() - started
    return obs


async def _call(client: Client, step: Step, listed: bool, held: list[int]) -> StepResult:
    index = len(held)
    out = StepResult(step.call, step.expect, listed)
    try:
        result = await client.call_tool(step.call, step.arguments)
    except MCPError as exc:
        out.code = "tool_not_found" if not listed else None
        out.problem = f"JSON-RPC error {exc.error.code}: {exc.error.message}"
        return out
    except RuntimeError as exc:  # the SDK refused the result (e.g. structured content withheld)
        out.problem = f"client rejected the result: {exc}"
        return out
    body, out.code = _received(result)
    out.unchanged = body == _scripted(step.result)
    out.held = len(held) > index
    if not out.unchanged:
        out.excerpt = _text(body)
    return out


async def run_corpus(cases: Sequence[Case], *, concurrency: int = 4) -> list[Verdict]:
    """Run `cases` (`concurrency` at a time) and judge each; verdicts in the cases' order."""
    observations: list[Observation | None] = [None] * len(cases)
    limiter = anyio.CapacityLimiter(concurrency)
    with tempfile.TemporaryDirectory(prefix="dharma-corpus-") as tmp:
        folder = Path(tmp)
        profile = corpus_profile(folder)
        zygote = Zygote(folder)
        try:
            async def one(i: int, case: Case) -> None:
                async with limiter:
                    observations[i] = await run_case(case, zygote, folder, profile)

            async with anyio.create_task_group() as group:
                for i, case in enumerate(cases):
                    group.start_soon(one, i, case)
        finally:
            zygote.close()
    return [judge(obs) for obs in observations if obs is not None]


# ---- figures ----------------------------------------------------------------------------


@dataclass(frozen=True)
class FamilyFigures:
    family: str
    attacks: int
    caught: int
    benign: int  # benign look-alikes of this family
    false_positives: int
    errors: int

    @property
    def recall(self) -> float:
        return self.caught / self.attacks if self.attacks else float("nan")

    @property
    def precision(self) -> float:
        flagged = self.caught + self.false_positives
        return self.caught / flagged if flagged else float("nan")


def families_of(verdicts: Iterable[Verdict]) -> tuple[str, ...]:
    """The attack families `verdicts` hold (as attacks or as what a benign case looks like), in
    the order of ATTACK_FAMILIES then EGRESS_FAMILIES."""
    present = {v.family for v in verdicts} | {v.looks_like for v in verdicts if v.looks_like}
    return tuple(f for f in (*ATTACK_FAMILIES, *EGRESS_FAMILIES) if f in present)


def figures(verdicts: Iterable[Verdict]) -> list[FamilyFigures]:
    """Per attack family: attacks caught (recall), benign look-alikes refused (false positives)."""
    verdicts = list(verdicts)
    rows = []
    for family in families_of(verdicts):
        attacks = [v for v in verdicts if v.family == family]
        benign = [v for v in verdicts if v.family == "benign" and v.looks_like == family]
        rows.append(FamilyFigures(
            family, len(attacks), sum(v.actual == "blocked" for v in attacks), len(benign),
            sum(not v.ok and v.actual != "error" for v in benign),
            sum(v.actual == "error" for v in attacks + benign)))
    return rows


def fmt_ratio(x: float) -> str:
    return "-" if x != x else f"{x:.2f}"


def family_table(verdicts: Sequence[Verdict]) -> str:
    """The per-family table the test prints and the bench prints: recall and false positives
    beside the targets (recall >= 0.9 per family, no benign case refused)."""
    rows = figures(verdicts)
    lines = [f"{'family':<18}{'attacks':>8}{'caught':>8}{'recall':>8}{'precision':>10}{'benign':>8}{'FP':>5}{'errors':>8}  target"]
    for r in rows:
        met = r.recall >= RECALL_TARGET and r.false_positives == 0 and r.errors == 0
        lines.append(f"{r.family:<18}{r.attacks:>8}{r.caught:>8}{fmt_ratio(r.recall):>8}{fmt_ratio(r.precision):>10}"
                     f"{r.benign:>8}{r.false_positives:>5}{r.errors:>8}  {'MET' if met else 'MISSED'}")
    benign = [v for v in verdicts if v.family == "benign"]
    fps = sum(not v.ok and v.actual != "error" for v in benign)
    lines.append(f"{'benign (all)':<18}{'':>8}{'':>8}{'':>8}{'':>10}{len(benign):>8}{fps:>5}"
                 f"{sum(v.actual == 'error' for v in benign):>8}  {'MET' if fps == 0 else 'MISSED'} (target: no false positive)")
    return "\n".join(lines)
