"""Hostile JSON-RPC lines at the parser and session level (issue 12): the two one-line kills of
`dharma stdio` and what the fuzzers found, each answered with a JSON-RPC error, never raised."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.crypto.strict_json import MAX_DEPTH
from gateway.mcp import jsonrpc
from gateway.mcp.session import McpSession, Reject, Resolve, ToClient, ToServer


@pytest.mark.parametrize("line, code, rpc_id, words", [
    (b"[" * 5000, jsonrpc.PARSE_ERROR, None, f"deeper than {MAX_DEPTH} levels"),
    (b'{"jsonrpc":"2.0","id":1,"method":"ping","params":' + b"[" * 3000 + b"]" * 3000 + b"}",
     jsonrpc.PARSE_ERROR, None, "(the limit)"),
    # a lone surrogate in the id: the id cannot be echoed, so the answer goes to id null
    (b'{"jsonrpc":"2.0","id":"\\ud800","method":"ping"}', jsonrpc.INVALID_REQUEST, None, "lone surrogate U+D800"),
    (b'{"jsonrpc":"2.0","id":"\\udfff","method":"tools/call","params":{"name":"admin_reset"}}',
     jsonrpc.INVALID_REQUEST, None, "valid Unicode"),
    # elsewhere in the message: the id is fine and is echoed
    (b'{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"echo","arguments":{"text":"\\ud800"}}}',
     jsonrpc.INVALID_REQUEST, 7, "lone surrogate"),
    # a duplicate key inside a batch element: jsonrpc.parse raised TypeError before
    (b'[1,{"a":1,"a":2}]', jsonrpc.INVALID_REQUEST, None, "duplicate key 'a'"),
    (b'[["id",5],{"a":1,"a":2}]', jsonrpc.INVALID_REQUEST, None, "duplicate key"),
    (b'{"jsonrpc":"2.0","id":3,"method":"x","params":{"n":1e400}}', jsonrpc.PARSE_ERROR, None, "range of a double"),
    (b'{"jsonrpc":"2.0","id":' + b"9" * 5000 + b',"method":"ping"}', jsonrpc.PARSE_ERROR, None, "4300 digits"),
    (b'\xef\xbb\xbf{"jsonrpc":"2.0","id":1,"method":"ping"}', jsonrpc.PARSE_ERROR, None, "byte order mark"),
])
def test_hostile_lines_become_answerable_errors(line: bytes, code: int, rpc_id: object, words: str) -> None:
    parsed = jsonrpc.parse(line)
    assert isinstance(parsed, jsonrpc.Invalid), parsed
    assert (parsed.code, parsed.id) == (code, rpc_id) and words in parsed.reason, parsed
    answer = jsonrpc.dumps(jsonrpc.error(parsed.id, parsed.code, parsed.reason))
    assert json.loads(answer)["id"] == rpc_id


def test_carriage_return_and_surrogate_pairs_are_fine() -> None:
    parsed = jsonrpc.parse(b'{"jsonrpc":"2.0","id":"\\ud83d\\ude00","method":"ping"}\r')
    assert isinstance(parsed, jsonrpc.Request) and parsed.id == "\U0001f600"
    assert jsonrpc.dumps(jsonrpc.result(parsed.id, {})) == '{"jsonrpc":"2.0","id":"\U0001f600","result":{}}'.encode()


def test_sniffed_id_of_an_oversized_line_is_never_a_lone_surrogate() -> None:
    assert jsonrpc.sniff_id(b'{"jsonrpc":"2.0","id":"\\ud800","method":"tools/call","params":{') is None
    assert jsonrpc.sniff_id(b'{"jsonrpc":"2.0","id":"ok","method":"tools/call","params":{') == "ok"


def test_session_answers_both_one_line_kills_and_keeps_going() -> None:
    session = McpSession(nonce="n")
    for line in (b"[" * 5000, b'{"jsonrpc":"2.0","id":"\\ud800","method":"ping"}'):
        actions = session.from_client(line)
        assert len(actions) == 1 and isinstance(actions[0], Reject) and actions[0].id is None
        (answer,) = session.answer(actions[0].key, actions[0].error())
        assert isinstance(answer, ToClient) and json.loads(answer.data)["id"] is None
    ping = b'{"jsonrpc":"2.0","id":1,"method":"ping"}'
    assert session.from_client(ping) == [ToServer(ping)]


def test_a_refused_server_answer_fails_the_request_it_answers() -> None:
    """A server answer the strict parser refuses (a lone surrogate in its result) would leave the
    client waiting forever: the client gets an error for that id instead."""
    session = McpSession(nonce="n")
    session.from_client(b'{"jsonrpc":"2.0","id":4,"method":"resources/read","params":{"uri":"x"}}')
    (action,) = session.from_server(b'{"jsonrpc":"2.0","id":4,"result":{"contents":[{"text":"\\ud800"}]}}')
    assert isinstance(action, ToClient)
    error = json.loads(action.data)
    assert error["id"] == 4 and error["error"]["code"] == jsonrpc.BACKEND_FAILED
    assert "server's answer was refused" in error["error"]["message"] and "lone surrogate" in error["error"]["message"]
    # an answer to nothing pending, and junk, give no action
    assert session.from_server(b'{"jsonrpc":"2.0","id":99,"result":{"a":1,"a":2}}') == []
    assert session.from_server(b"[" * 5000) == []


def test_a_refused_answer_to_a_gateway_request_resolves_it() -> None:
    session = McpSession(nonce="n")
    rid, _ = session.originate("server", "tools/list")
    line = json.dumps({"jsonrpc": "2.0", "id": rid, "result": {"tools": []}}).encode()
    line = line.replace(b'"tools": []}', b'"tools": [], "tools": []}', 1)
    (action,) = session.from_server(line)
    assert isinstance(action, Resolve) and action.id == rid and action.response["error"]["code"] == jsonrpc.BACKEND_FAILED


_JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=20,
)


@given(value=_JSON_VALUES)
@settings(max_examples=500, deadline=None)
def test_dumps_writes_the_bytes_of_the_compact_json_encoder(value: object) -> None:
    """`dumps` takes msgspec for plain values: the bytes must be those of `json`'s compact encoder
    (approval digests and mirrored result texts hash them), and a float or NaN keeps `json`'s own."""
    try:
        expected = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
    except ValueError:  # NaN or infinity: refused as before
        with pytest.raises(ValueError):
            jsonrpc.dumps(value)
        return
    assert jsonrpc.dumps(value) == expected


def test_dumps_escapes_a_lone_surrogate_the_gateway_built() -> None:
    assert jsonrpc.dumps({"text": "a\ud800"}) == b'{"text":"a\\ud800"}'
