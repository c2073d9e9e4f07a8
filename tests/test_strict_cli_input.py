"""Every JSON file or argument a `dharma` command reads goes through the one strict decoder
(`audit.strict_json`, the gateway's `gateway.crypto.strict_json`): a text that could be read two
ways (a duplicate key: Python's `json` keeps the last value, other readers the first) is refused,
naming the key and the file, never with a traceback.

A file the command checks (`receipt verify`'s response and request, an export bundle) fails the
check (exit 1, `FAIL ...`); an input that only feeds the command (`eval --args/--response`,
`check --tools`, a JWKS) is a usage or configuration error (exit 2); `dharma tools` says it cannot
read a pins file that does not decode (exit 1, as when the pin store is down). Real
subprocesses over a ledger and keys written by a real in-process Gateway."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gateway.core.gateway import envelope as envelope_of
from gateway.stores.file_pins import PINS_FILE
from tests.conftest import KEYS
from tests.test_cli import dharma, dharma_many, recorded  # noqa: F401 - `recorded` is a fixture


def _with_duplicate(doc: dict[str, Any], key: str, first: Any) -> str:
    """`doc` as JSON text with `key` twice: `first` before the genuine value, which Python's `json`
    (last one wins) reads back as `doc` itself."""
    members = [json.dumps(key) + ":" + json.dumps(first)]
    members += [json.dumps(k) + ":" + json.dumps(v) for k, v in doc.items()]
    text = "{" + ",".join(members) + "}"
    assert json.loads(text) == doc  # what every reader built on `json.loads` sees
    return text


async def _saved_response(gateway: Any, sandbox: Path, tmp_path: Path) -> tuple[dict[str, Any], Path, Path]:
    """A genuine signed envelope of a real call, saved, and the published JWKS beside it."""
    (sandbox / "a.txt").write_text("A", encoding="utf-8")
    outcome = await gateway.call("read_file", {"path": "a.txt"}, api_key=KEYS["reader"])
    await gateway.aclose()
    envelope = {**envelope_of(outcome), "receipt": outcome.receipt}
    saved = tmp_path / "saved.json"
    saved.write_text(json.dumps(envelope), encoding="utf-8")
    jwks = tmp_path / "jwks.json"
    jwks.write_text(json.dumps(gateway.keys.jwks()), encoding="utf-8")
    return envelope, saved, jwks


async def test_receipt_verify_refuses_a_forged_result_beside_the_genuine_one(
        demo_gateway: Any, sandbox: Path, state_root: Path, tmp_path: Path) -> None:
    envelope, saved, jwks = await _saved_response(demo_gateway, sandbox, tmp_path)
    forged = tmp_path / "forged.json"  # the forged result first, where a first-wins reader looks
    forged.write_text(_with_duplicate(envelope, "result", {"content": [{"type": "text", "text": "forged"}]}), encoding="utf-8")
    request = tmp_path / "request.json"
    request.write_text('{"tool": "read_file", "tool": "delete_file"}', encoding="utf-8")
    ok, refused, bad_request, bad_jwks = dharma_many([
        ["receipt", "verify", saved, "--jwks", jwks],
        ["receipt", "verify", forged, "--jwks", jwks],
        ["receipt", "verify", saved, "--jwks", jwks, "--request", request],
        ["receipt", "verify", saved, "--jwks", forged],
    ], state_root)
    assert ok.rc == 0 and ok.out.startswith("OK"), ok.out + ok.err
    assert refused.rc == 1, refused.out + refused.err
    assert refused.out.startswith(f"FAIL response file {forged} is not valid JSON: duplicate member name 'result'")
    assert "OK" not in refused.out
    assert bad_request.rc == 1 and f"request file {request}" in bad_request.out and "'tool'" in bad_request.out
    assert bad_jwks.rc == 2 and str(forged) in bad_jwks.err and "duplicate member name 'result'" in bad_jwks.err


async def test_receipt_verify_refuses_a_duplicate_deep_in_a_json_rpc_answer(
        demo_gateway: Any, sandbox: Path, state_root: Path, tmp_path: Path) -> None:
    envelope, _, jwks = await _saved_response(demo_gateway, sandbox, tmp_path)
    result = envelope["result"]
    nested = {**envelope, "result": "@@"}
    text = json.dumps(nested).replace('"@@"', _with_duplicate(result, "content", [{"type": "text", "text": "forged"}]))
    assert json.loads(text) == envelope
    forged = tmp_path / "nested.json"
    forged.write_text(text, encoding="utf-8")
    run = dharma("receipt", "verify", forged, "--jwks", jwks, state_root=state_root)
    assert run.rc == 1 and "duplicate member name 'content'" in run.out and str(forged) in run.out, run.out + run.err


def test_eval_and_check_refuse_duplicate_keys_naming_them(policy_path: Path, state_root: Path, tmp_path: Path) -> None:
    response = tmp_path / "response.json"
    response.write_text('{"content": [], "isError": false, "isError": true}', encoding="utf-8")
    tools = tmp_path / "tools.json"
    tools.write_text('{"tools": [{"name": "read_file", "name": "delete_file"}]}', encoding="utf-8")
    base = ["eval", "--policy", policy_path, "--tool", "read_file"]
    args, annotations, answer, inventory, bom = dharma_many([
        [*base, "--args", '{"path": "notes.txt", "path": "../etc/passwd"}'],
        [*base, "--args", "{}", "--annotations", '{"readOnlyHint": true, "readOnlyHint": false}'],
        [*base, "--args", "{}", "--response", f"@{response}"],
        ["check", policy_path, "--tools", tools],
        [*base, "--args", "\ufeff{}"],
    ], state_root)
    assert args.rc == 2 and "--args is not valid JSON: duplicate member name 'path'" in args.err, args.out + args.err
    assert annotations.rc == 2 and "duplicate member name 'readOnlyHint'" in annotations.err
    assert answer.rc == 2 and f"--response {response} is not valid JSON: duplicate member name 'isError'" in answer.err
    assert inventory.rc == 2 and f"--tools {tools}" in inventory.err and "'name'" in inventory.err
    assert bom.rc == 2 and "byte order mark" in bom.err


async def test_audit_verify_bundle_refuses_duplicate_keys_naming_them(
        recorded: dict[str, Any], state_root: Path, tmp_path: Path) -> None:  # noqa: F811 - the fixture
    bundle = tmp_path / "export.jsonl"
    exported, jwks_out = dharma_many([["audit", "export", "--out", bundle], ["keys", "jwks"]], state_root)
    assert exported.rc == 0, exported.out + exported.err
    jwks = tmp_path / "jwks.json"
    jwks.write_text(jwks_out.out, encoding="utf-8")
    lines = bundle.read_text(encoding="utf-8").splitlines()
    record = json.loads(lines[3])  # line 4: record 3; a second `record` a first-wins reader would take
    forged_line = _with_duplicate(record, "record", json.loads(lines[2])["record"])
    forged = tmp_path / "forged.jsonl"
    forged.write_text("\n".join([*lines[:3], forged_line, *lines[4:]]) + "\n", encoding="utf-8")
    header = json.loads(lines[0])
    forged_header = tmp_path / "header.jsonl"
    forged_header.write_text("\n".join([_with_duplicate(header, "size", 1), *lines[1:]]) + "\n", encoding="utf-8")
    saved = tmp_path / "saved.json"  # a receipt checked against the forged bundle fails the same way
    outcome = recorded["outcomes"][0]
    saved.write_text(json.dumps({**envelope_of(outcome), "receipt": outcome.receipt}), encoding="utf-8")
    ok, line, head, receipt = dharma_many([
        ["audit", "verify", "--bundle", bundle, "--jwks", jwks],
        ["audit", "verify", "--bundle", forged, "--jwks", jwks],
        ["audit", "verify", "--bundle", forged_header, "--jwks", jwks],
        ["receipt", "verify", saved, "--jwks", jwks, "--ledger", forged],
    ], state_root)
    assert ok.rc == 0 and ok.out.startswith("OK"), ok.out + ok.err
    assert line.rc == 1 and line.out.startswith(f"FAIL {forged} line 4: not a JSON object (duplicate member name 'record')"), line.out + line.err
    assert head.rc == 1 and f"{forged_header} line 1" in head.out and "duplicate member name 'size'" in head.out, head.out + head.err
    assert receipt.rc == 1 and "the bundle does not verify" in receipt.out and "duplicate member name 'record'" in receipt.out


def test_the_pins_file_is_read_strictly(state_root: Path) -> None:
    pins = state_root / PINS_FILE
    pins.write_text('{"version": 1, "backends": {}, "backends": {"demo": {}}}', encoding="utf-8")
    listed, accepted = dharma_many([["tools", "pins"], ["tools", "accept", "demo"]], state_root)
    for run in (listed, accepted):
        assert run.rc == 1 and str(pins) in run.out and "duplicate member name 'backends'" in run.out, run.out + run.err
