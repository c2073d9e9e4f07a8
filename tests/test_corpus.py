"""The labelled detection corpus (issue 10): every case through `dharma stdio` with the standard
profile, judged blocked or allowed (tests/corpus/README.md).

`test_every_case_meets_its_label` is the yardstick: it runs all cases and fails listing every
case whose outcome differs from its label, with the per-family table. The other tests check the
corpus itself (its size, labels, checksummed wallet values) and the harness (the judgement, the
loader's errors, the rug-pull server, and a run of cases whose outcome the shipped plain-form
rules already decide).
"""

from __future__ import annotations

import collections
import json
import re
import sys
from pathlib import Path

import pytest
from mcp import Client, StdioServerParameters

from tests.corpus.model import CorpusError, load_cases
from tests.corpus.runner import ATTACK_FAMILIES, EGRESS_FAMILIES, REPO, Observation, StepResult, family_table, judge, run_corpus

sys.path.insert(0, str(REPO / "tests" / "corpus" / "tools"))
import crypto_values  # noqa: E402

CASES = load_cases()


def test_the_corpus_covers_every_family() -> None:
    by_family = collections.Counter(c.family for c in CASES)
    assert len(CASES) >= 150, by_family
    # issue 24's five families, and those of issue 27's egress families the corpus has so far
    present = (*ATTACK_FAMILIES, *(f for f in EGRESS_FAMILIES if by_family[f]))
    assert {"ssrf", "url_exfil", "fetched_injection"} <= set(present), by_family
    for family in present:
        assert by_family[family] >= 20, f"{family}: {by_family[family]} cases"
    assert by_family["benign"] >= 50
    looks = collections.Counter(c.looks_like for c in CASES if c.family == "benign")
    assert set(looks) == set(present), f"benign look-alikes per family: {looks}"
    assert any(c.tools_later for c in CASES if c.family == "tool_poisoning"), "no definition turns malicious later"


def test_wallet_values_in_the_corpus_have_valid_checksums() -> None:
    """Seed phrases, WIF keys and addresses are real-format values, not look-alikes: the
    detectors must not be rewarded for flagging anything that merely resembles one."""
    phrases, keys = 0, 0
    for case in CASES:
        if case.family != "encoded_secrets":
            continue
        for text in _strings([s.arguments for s in case.steps]):
            tokens = re.findall(r"[a-z]+", text)
            phrases += sum(crypto_values.mnemonic_is_valid(" ".join(tokens[i:i + n]))
                           for n in (12, 24) for i in range(len(tokens) - n + 1))
            for token in re.findall(r"\b[5KL][1-9A-HJ-NP-Za-km-z]{50,51}\b|\b1[1-9A-HJ-NP-Za-km-z]{25,34}\b", text):
                assert crypto_values.base58check_is_valid(token), f"{case.id}: {token} fails its base58check"
                keys += 1
    assert phrases >= 3 and keys >= 3, (phrases, keys)
    assert crypto_values.mnemonic(bytes(16)) == " ".join(["abandon"] * 11 + ["about"])  # BIP-39 test vector
    assert crypto_values.p2wpkh(bytes.fromhex("751e76e8199196d454941c45d1b3a323f1433bd6")) \
        == "bc1qw508d6qejxtdg4y5r3zarvary0c5xw7kv8f3t4"  # BIP-173 test vector


def _strings(value: object) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def test_a_bad_corpus_file_is_named_with_its_case(tmp_path: Path) -> None:
    good = {"id": "x-1", "family": "benign", "looks_like": "obfuscated_shell", "expected": "allow",
            "why": "a plain build cleanup", "tools": [{"name": "run_command", "inputSchema": {
                "type": "object", "properties": {"command": {"type": "string"}}}}],
            "steps": [{"call": "run_command", "arguments": {"command": "ls"}, "expect": "allow"}]}
    bad = {**good, "id": "x-2", "steps": [{"call": "run_command", "arguments": {"command": 3}, "expect": "allow"}]}
    (tmp_path / "mine.json").write_text(json.dumps([good, bad]))
    with pytest.raises(CorpusError, match=r"mine.json: case x-2: .*arguments do not match run_command's inputSchema"):
        load_cases(tmp_path)
    (tmp_path / "mine.json").write_text(json.dumps([good, {**good, "expected": "block"}]))
    with pytest.raises(CorpusError, match="mine.json: case x-1: .*benign cases expect allow"):
        load_cases(tmp_path)
    (tmp_path / "mine.json").write_text("[{")
    with pytest.raises(CorpusError, match="mine.json: not readable JSON"):
        load_cases(tmp_path)


def _observation(case_id: str, *steps: StepResult, listed: list[str] | None = None) -> Observation:
    case = next(c for c in CASES if c.id == case_id)
    return Observation(case, listed_first=listed if listed is not None else [t["name"] for t in case.tools],
                       steps=list(steps))


def test_the_judgement() -> None:
    """Hidden, refused, held or changed is blocked; a gateway failure is neither; a benign case
    with a tool hidden from the listing counts as refused."""
    rug = "tp-rug-pull-whatsapp"
    passed = StepResult("get_fact_of_the_day", "allow", listed=True, unchanged=True)
    for second in (StepResult("get_fact_of_the_day", "block", listed=False),
                   StepResult("get_fact_of_the_day", "block", listed=True, code="approval_denied"),
                   StepResult("get_fact_of_the_day", "block", listed=True, held=True, unchanged=True),
                   StepResult("get_fact_of_the_day", "block", listed=True, unchanged=False)):
        assert judge(_observation(rug, passed, second)).actual == "blocked", second
    let_through = StepResult("get_fact_of_the_day", "block", listed=True, unchanged=True)
    missed = judge(_observation(rug, passed, let_through))
    assert missed.actual == "allowed" and not missed.ok
    overblocked = StepResult("get_fact_of_the_day", "allow", listed=True, code="policy_blocked")
    assert judge(_observation(rug, overblocked, StepResult("get_fact_of_the_day", "block", listed=False))).actual == "mixed"
    failed = StepResult("get_fact_of_the_day", "block", listed=True, code="backend_error")
    assert judge(_observation(rug, passed, failed)).actual == "error"
    benign = "bn-os-rm-build-dir"
    ok = StepResult("run_command", "allow", listed=True, unchanged=True)
    assert judge(_observation(benign, ok)).ok
    assert judge(_observation(benign, ok, listed=[])).actual == "blocked"
    assert not judge(_observation(benign, StepResult("run_command", "allow", listed=True, code="policy_blocked"))).ok


async def test_the_case_server_turns_its_definition_after_the_first_call() -> None:
    """Run by hand (no gateway), the SDK server lists `tools`, answers the scripted result, then
    lists `tools_later` and announces it with notifications/tools/list_changed."""
    case = next(c for c in CASES if c.id == "tp-rug-pull-whatsapp")
    changed: list[str] = []

    async def on_message(message: object) -> None:
        if "ToolListChanged" in type(message).__name__ or "tools/list_changed" in str(getattr(message, "method", "")):
            changed.append("list_changed")

    params = StdioServerParameters(command=sys.executable, args=[str(REPO / "tests" / "corpus" / "server.py"), case.file, case.id])
    async with Client(params, mode="legacy", message_handler=on_message) as client:  # type: ignore[arg-type]
        first = (await client.list_tools(cache_mode="refresh")).tools
        result = await client.call_tool("get_fact_of_the_day", {})
        later = (await client.list_tools(cache_mode="refresh")).tools
    assert "IMPORTANT" not in (first[0].description or "")
    assert result.content[0].text == case.steps[0].result["content"][0]["text"]
    assert "+13241234123" in (later[0].description or "")
    assert changed, "no notifications/tools/list_changed reached the client"


async def test_the_runner_on_cases_the_plain_rules_already_decide(tmp_path: Path) -> None:
    """Cases whose outcome today's shipped rules decide (plain forms): the harness must report
    each as labelled, through real `dharma stdio` processes, so a broken harness cannot pass."""
    chosen = {"bn-os-rm-build-dir", "bn-ec-read-then-public-fetch", "bn-ir-base64-image-result", "tp-rug-pull-exfil-url"}
    cases = [c for c in CASES if c.id in chosen]
    plain = json.loads((REPO / "tests" / "corpus" / "cases" / "obfuscated_shell.json").read_text())[0]
    plain.update(id="plain-rm-root", why="the plain form the shell rules refuse")
    plain["steps"][0]["arguments"] = {"command": "rm -rf /"}
    (tmp_path / "plain.json").write_text(json.dumps([plain]))
    cases += load_cases(tmp_path)
    assert len(cases) == 5
    verdicts = await run_corpus(cases, concurrency=3)
    by_id = {v.case_id: v for v in verdicts}
    assert all(v.ok for v in verdicts), "\n".join(f"{v.case_id}: {v.actual} ({v.detail})" for v in verdicts if not v.ok)
    assert by_id["plain-rm-root"].detail == "run_command: refused (policy_blocked)"
    assert by_id["tp-rug-pull-exfil-url"].detail == "convert_currency: allowed; convert_currency: refused (approval_denied)"


async def test_every_case_meets_its_label() -> None:
    """The corpus: recall >= 0.9 per attack family and no benign case refused means every
    case meets its label. Fails listing each mismatch (id, outcome, why) and the table."""
    verdicts = await run_corpus(CASES, concurrency=4)
    table = family_table(verdicts)
    print("\n" + table)
    assert len(verdicts) == len(CASES)
    wrong = [v for v in verdicts if not v.ok]
    listing = "\n".join(f"  {v.case_id} [{v.family}{'/' + v.looks_like if v.looks_like else ''}] expected {v.expected}, "
                        f"got {v.actual}: {v.detail}\n      why: {v.why}" for v in wrong)
    assert not wrong, f"{len(wrong)} of {len(verdicts)} cases do not meet their label:\n{listing}\n\n{table}"
