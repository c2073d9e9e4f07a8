"""The disclosure step builds only the fields of `response` its rules can read.

`cel.fields_read` lists the fields of a variable a condition selects by name (None when it may
read the variable any other way); `disclosure.response_fields` unites them over a tool's rules.
Checked on expressions one by one, on the shipped profiles, on the activation a call leaves
(the answer is not copied into it when no rule reads it), and end to end in both CEL engines:
every answer is disclosed exactly as with the whole `response` built, and a rule that reads the
answer still fires on it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import gateway.stages.disclosure as disclosure
from gateway.policy import cel
from gateway.policy.compile import load_policy
from gateway.policy.evaluate import RESPONSE_FIELDS, response_variables
from tests.helpers import Recorder, open_gateway, text_result, write_policy
from tests.test_disclosure_scan import PROFILE, outcomes  # PROFILE grants alice every tool

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(
    ("source", "fields"),
    [
        ('response.findings.exists(f, f.kind == "ssn")', {"findings"}),
        ('request.disclosure_mode != "direct"', set()),
        ('has(response.text) && response.is_error', {"text", "is_error"}),
        ('response.result.content[0].text == "x"', {"result"}),
        ('response.is_error ? response.text.contains("x") : size(response.findings) > 0', {"is_error", "text", "findings"}),
        ('[response.text, "a"].exists(t, t == "a")', {"text"}),
        ('response.findings.exists(f, f.kind == "a") && response.nope == 1', {"findings", "nope"}),
    ],
)
def test_fields_read_lists_the_fields_a_condition_selects(source: str, fields: set[str]) -> None:
    assert cel.fields_read(source, "response") == frozenset(fields)


@pytest.mark.parametrize(
    "source",
    [
        "size(response) == 4",
        'response["result"] != null',
        "response != null",
        'response.exists(k, k == "result")',
        '{"a": response.text}.size() > 0',
        "dyn(response).text == 1",
        "response.findings(1)",
        'response.findings.exists(response, response.kind == "a")',
        "this is not CEL (",
    ],
)
def test_fields_read_is_unsure_of_anything_else(source: str) -> None:
    assert cel.fields_read(source, "response") is None


@pytest.mark.parametrize("profile", ["permissive", "standard", "strict"])
def test_shipped_profiles_read_only_findings(profile: str) -> None:
    """No shipped disclosure rule reads the answer itself: only its findings are built."""
    policy = load_policy(ROOT / "policies" / f"{profile}.yaml")
    for tool in ("read_file", "run_command", "health_records"):
        assert disclosure.response_fields(policy, tool) <= {"findings"}  # type: ignore[operator]


def test_response_variables_builds_only_the_fields_asked_for() -> None:
    result = text_result("hello")
    full = response_variables({"a": 1}, result, True, ())
    assert list(full["response"]) == list(RESPONSE_FIELDS)
    assert full["response"]["result"] is result and full["response"]["text"] == "hello"
    only = response_variables({"a": 1}, result, True, (), frozenset({"findings", "is_error"}))
    assert only == {"a": 1, "response": {"is_error": True, "findings": []}}


ANSWERS = {
    "plain": text_result("the build is green"),
    "secret": text_result("the word is SWORDFISH"),
    "key": text_result("the key is AKIAZ3MSJV4W7QYHRT5N"),
    "structured": {"content": [{"type": "text", "text": "ok"}], "structuredContent": {"level": 7}},
}


def _rules(when: str) -> dict[str, str]:
    return {"disclosure.yaml": f"""\
        apiVersion: dharma/v1
        kind: DisclosureRuleSet
        metadata: {{name: disclosure}}
        no_information_response: {{content: [{{type: text, text: "nothing found"}}]}}
        rules:
          - id: the-rule
            tools: ["*"]
            when: '{when}'
            verdict: WITHHOLD
        """}


async def _disclosed(tmp: Path, when: str, engine: str) -> tuple[frozenset[str] | None, list[tuple[Any, ...]], set[str]]:
    """Call every tool; return the fields built, each outcome and outcome record, and what the last
    call's activation held of `response`."""
    recorder = Recorder()
    backend = recorder.backend({name: (lambda answer=answer: answer) for name, answer in ANSWERS.items()})
    tmp.mkdir()
    policy = load_policy(write_policy(tmp, PROFILE, _rules(when)), engine=engine)
    gateway = await open_gateway(tmp, policy, [backend])
    built: set[str] = set()
    make = disclosure.response_variables

    def spy(*args: Any) -> dict[str, Any]:
        variables = make(*args)
        built.update(variables["response"])
        return variables

    fields = disclosure.response_fields(gateway.policy, "plain")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(disclosure, "response_variables", spy)
        out = await outcomes(gateway, tmp, ANSWERS)
    return fields, out, built


ENGINES = cel.available_engines()


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize(
    ("when", "fields", "withheld"),
    [
        ('response.findings.exists(f, f.kind == "api_key")', {"findings"}, {"key"}),
        ('response.text.contains("SWORDFISH")', {"text"}, {"secret"}),
        ('has(response.result.structuredContent) && response.result.structuredContent.level > 5', {"result"}, {"structured"}),
        ('!response.is_error && response.text.size() < 3', {"is_error", "text"}, {"structured"}),
        ('size(response) == 4 && response.text.endsWith("green")', None, {"plain"}),
        ('response["result"].content[0].text.contains("key")', None, {"key"}),
    ],
)
async def test_answers_are_disclosed_as_with_the_whole_response(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, engine: str, when: str, fields: set[str] | None, withheld: set[str]
) -> None:
    """Results, statuses, warnings and outcome records equal those with every field built (the
    reference, forced); a rule reading the answer still withholds it; and the activation holds
    only the fields the rule reads (the answer itself is not built unless read)."""
    got_fields, got, built = await _disclosed(tmp_path / "as-is", when, engine)
    assert got_fields == (None if fields is None else frozenset(fields))
    assert built == set(RESPONSE_FIELDS if fields is None else fields)
    monkeypatch.setattr(disclosure, "response_fields", lambda policy, tool: None)
    _, reference, all_built = await _disclosed(tmp_path / "whole", when, engine)
    assert all_built == set(RESPONSE_FIELDS)
    assert got == reference
    verdicts = {row[0]: row[1] for row in got[len(ANSWERS):]}
    assert {tool for tool, note in verdicts.items() if note == "WITHHOLD"} == withheld
    results = {row[0]: row[2] for row in got[: len(ANSWERS)]}
    for tool in withheld:
        assert results[tool] == text_result("nothing found")


def test_response_text_holds_each_text_once() -> None:
    """The SDK mirrors a plain answer as a text block and `structuredContent`: `response.text` holds
    it once (it was scanned twice), and structured strings no text block holds are still in it."""
    from gateway.policy.evaluate import response_text

    mirrored = {"content": [{"type": "text", "text": "sunny, 21C"}], "structuredContent": {"result": "sunny, 21C"}}
    assert response_text(mirrored) == "sunny, 21C"
    extra = {"content": [{"type": "text", "text": "see record"}], "structuredContent": {"note": "AKIA only here"}}
    assert response_text(extra) == "see record\nAKIA only here"
