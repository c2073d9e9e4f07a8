"""The fuzz targets: each pairs a strategy with a check that raises AssertionError (or lets an
unexpected exception through) when the gateway mishandles one input.

`tests/fuzz/test_properties.py` runs every target briefly in the suite; `python -m tests.fuzz`
(`make fuzz`) runs them for as long as asked and reports inputs tried, crashes and hangs.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import math
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

from tests.fuzz import strategies as s

Check = Callable[[Any], None]


@dataclass(frozen=True)
class Target:
    """`open()` yields the check (set-up such as a running Gateway lives as long as the context)."""

    name: str
    strategy: st.SearchStrategy[Any]
    open: Callable[[], contextlib.AbstractContextManager[Check]]


def _plain(check: Check) -> Callable[[], contextlib.AbstractContextManager[Check]]:
    return lambda: contextlib.nullcontext(check)


# ---- strict JSON and JSON-RPC --------------------------------------------------------------


def check_strict_json(data: bytes) -> None:
    """Only StrictJSONError; what is accepted is what the standard decoder reads, re-encodes
    without error and decodes back to the same value."""
    from gateway.crypto import strict_json
    from gateway.mcp import jsonrpc

    try:
        value = strict_json.loads(data)
    except strict_json.StrictJSONError as exc:
        assert exc.kind in {"encoding", "bom", "syntax", "depth", "duplicate", "constant", "number", "surrogate"}
        assert exc.message and "Traceback" not in exc.message
        return
    assert _same(json.loads(data), value)
    assert _same(strict_json.loads(jsonrpc.dumps(value)), value)


def _same(a: Any, b: Any) -> bool:
    """Equality that tells -0.0 from 0 and 1 from 1.0 and True (JSON texts that differ)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, float):
        return a == b and math.copysign(1, a) == math.copysign(1, b)
    return bool(a == b)


def check_jsonrpc_parse(line: bytes) -> None:
    """`parse` never raises; an Invalid is -32700/-32600 with an id that can be echoed; anything
    accepted round-trips through `dumps` and parses to the same shape."""
    from gateway.mcp import jsonrpc

    parsed = jsonrpc.parse(line)
    items = parsed.items if isinstance(parsed, jsonrpc.Batch) else (parsed,)
    for item in items:
        if isinstance(item, jsonrpc.Invalid):
            assert item.code in (jsonrpc.PARSE_ERROR, jsonrpc.INVALID_REQUEST), item
            answer = jsonrpc.dumps(jsonrpc.error(item.id, item.code, item.reason))
            assert jsonrpc.loads(answer)["id"] == item.id
            continue
        data = jsonrpc.dumps(item.message)
        again = jsonrpc.parse(data)
        assert type(again) is type(item) and again.message == item.message, (item, again)  # type: ignore[union-attr]


def check_framing(case: tuple[bytes, list[int], int]) -> None:
    """Lines come out exactly as they went in, whatever the chunking; lines over the limit come
    out as Oversize with their true size and the first bytes (to find the id)."""
    from gateway.mcp.framing import LineSplitter, Oversize

    data, cuts, limit = case
    splitter = LineSplitter(limit)
    out: list[bytes | Oversize] = []
    start = 0
    for cut in sorted(cuts) + [len(data)]:
        out.extend(splitter.feed(data[start:cut]))
        start = max(start, cut)
    expected = data.split(b"\n")[:-1]
    assert len(out) == len(expected)
    for got, want in zip(out, expected):
        if len(want) > limit:
            assert isinstance(got, Oversize) and got.size == len(want) and want.startswith(got.prefix)
        else:
            assert got == want


framing_cases = st.tuples(
    st.lists(st.binary(max_size=40) | st.sampled_from([b"\n", b"\r\n", b"x" * 300]), max_size=12).map(b"".join),
    st.lists(st.integers(0, 800), max_size=6),
    st.integers(1, 200),
)


def check_session_client(lines: list[bytes]) -> None:
    """A session fed hostile client lines never raises, every byte it emits is strict JSON, no
    tools/call goes to the server as received, and every rejection can be answered."""
    from gateway.mcp import jsonrpc
    from gateway.mcp.session import GovernCall, McpSession, Reject, ToClient, ToServer

    session = McpSession(nonce="fuzz")
    session.from_client(b'{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-03-26","capabilities":{}}}')
    session.from_server(b'{"jsonrpc":"2.0","id":0,"result":{"protocolVersion":"2025-03-26","capabilities":{}}}')
    for line in lines:
        for action in session.from_client(line):
            if isinstance(action, (ToServer, ToClient)):
                sent = jsonrpc.loads(action.data)
                if isinstance(action, ToServer):
                    for message in sent if isinstance(sent, list) else [sent]:
                        assert not (isinstance(message, dict) and message.get("method") == "tools/call" and "id" in message), message
            elif isinstance(action, Reject) and action.key is not None:
                for answer in session.answer(action.key, action.error()):
                    assert isinstance(answer, ToClient)
                    jsonrpc.loads(answer.data)
            elif isinstance(action, GovernCall):
                for answer in session.answer(action.key, jsonrpc.result(action.request.id, {"content": [], "isError": True})):
                    jsonrpc.loads(answer.data)  # type: ignore[union-attr]


def check_session_server(lines: list[bytes]) -> None:
    """A session fed hostile server lines (answers to pending requests among them) never raises
    and forwards only strict JSON to the client."""
    from gateway.mcp import jsonrpc
    from gateway.mcp.session import McpSession, ToClient, ToServer

    session = McpSession(nonce="fuzz")
    for rid in range(3):
        session.from_client(jsonrpc.dumps(jsonrpc.request(rid, "tools/list" if rid == 1 else "ping")))
    for line in lines:
        for action in session.from_server(line):
            if isinstance(action, (ToClient, ToServer)):
                jsonrpc.loads(action.data)


# ---- the HTTP tool API body ----------------------------------------------------------------


def check_http_body(body: bytes) -> None:
    """`parse_json_body` refuses with BadRequest (a 400 naming the problem), nothing else."""
    from gateway.transports.http_api.common import BadRequest, parse_json_body

    try:
        parse_json_body(body, 1 << 20)
    except BadRequest as exc:
        assert exc.message and "Traceback" not in exc.message


# ---- policy and config loaders -------------------------------------------------------------


@contextlib.contextmanager
def _yaml_file(name: str) -> Iterator[Callable[[str], Path]]:
    with tempfile.TemporaryDirectory(prefix="dharma-fuzz-") as tmp:
        path = Path(tmp) / name

        def write(text: str) -> Path:
            path.write_bytes(text.encode("utf-8", "surrogatepass"))
            return path

        yield write


@contextlib.contextmanager
def open_policy_loader() -> Iterator[Check]:
    from gateway.core.errors import PolicyErrors
    from gateway.policy.compile import load_policy

    with _yaml_file("policy.yaml") as write:
        def check(text: str) -> None:
            """Arbitrary YAML loads or fails with PolicyErrors whose every problem names the file
            and a line (or, for bytes that are not UTF-8, the byte offset)."""
            path = write(text)
            try:
                load_policy(path)
            except PolicyErrors as exc:
                assert exc.problems
                for problem in exc.problems:
                    assert problem.file == str(path) or Path(problem.file).parent == path.parent, problem
                    assert problem.line >= 1 or "not UTF-8" in problem.message, problem

        yield check


@contextlib.contextmanager
def open_config_loader() -> Iterator[Check]:
    from gateway.config import load_settings
    from gateway.core.errors import ConfigError

    with _yaml_file("dharma.yaml") as write:
        def check(text: str) -> None:
            """Arbitrary YAML gives Settings or a ConfigError that names the file and the line
            (bytes that are not UTF-8 have no line)."""
            path = write(text)
            try:
                load_settings(path, env={})
            except ConfigError as exc:
                message = str(exc)
                assert message.startswith(f"{path}:"), message
                assert message[len(str(path)) + 1].isdigit() or "not UTF-8" in message, message

        yield check


# ---- CEL activation through the Gateway ----------------------------------------------------

FUZZ_PROFILE = """\
apiVersion: dharma/v1
kind: Policy
metadata: {name: fuzz}
principals:
  - {id: alice, tier: t, api_key_sha256: %s}
tiers:
  - name: t
    grants: [{tools: ["probe"]}]
sanitizer: {max_depth: 64, max_string: 100000, max_items: 10000, max_bytes: 4000000}
rule_sets: [rules.yaml]
"""
FUZZ_RULES = f"""\
apiVersion: dharma/v1
kind: RuleSet
metadata: {{name: fuzz}}
rules:
  - id: look-at-values
    description: Touches every argument value; may fail on any of them.
    tools: ["probe"]
    when: 'args.exists(k, args[k] == 1.5 || args[k] == "x" || size(string(args[k])) > 3)'
    effect: warn
    message_expr: '"saw " + string(args)'
  - id: deny-by-error
    description: Reads an argument no call has, so it always fails, and a failing deny rule denies.
    tools: ["probe"]
    when: 'args.{s.ABSENT} == 1'
    effect: deny
    message_expr: '"refused: " + string(args)'
"""


@contextlib.contextmanager
def open_cel_activation(engine: str) -> Iterator[Check]:
    import anyio.from_thread

    from gateway.core.call import Credentials, Status, ToolCall
    from gateway.core.errors import ErrorCode
    from gateway.policy.compile import load_policy
    from tests.helpers import Recorder, open_gateway

    with tempfile.TemporaryDirectory(prefix="dharma-fuzz-") as tmp_name:
        tmp = Path(tmp_name)
        (tmp / "rules.yaml").write_text(FUZZ_RULES)
        (tmp / "policy.yaml").write_text(FUZZ_PROFILE % hashlib.sha256(b"alice-key").hexdigest())
        policy = load_policy(tmp / "policy.yaml", engine=engine)
        recorder = Recorder()
        with anyio.from_thread.start_blocking_portal() as portal:
            gateway = portal.call(open_gateway, tmp, policy, [recorder.backend({"probe": lambda **kw: "ran"})])
            counter = iter(range(1 << 62))

            def check(arguments: dict[str, Any]) -> None:
                """Arbitrary argument values never crash evaluation, and the deny rule that fails
                on every call still denies it: nothing reaches the backend."""
                call = ToolCall("probe", arguments, f"fuzz-{next(counter)}", Credentials(api_key="alice-key"))
                governed = portal.call(gateway.govern, call)
                outcome = governed.outcome
                assert outcome.status == Status.BLOCKED, outcome
                assert outcome.error_code in (ErrorCode.POLICY_BLOCKED, ErrorCode.INVALID_PARAMS), outcome
                assert not recorder.calls
                if outcome.error_code == ErrorCode.POLICY_BLOCKED:
                    assert "deny-by-error" in outcome.decision.rule_ids, outcome.decision

            try:
                yield check
            finally:
                portal.call(gateway.aclose)


# ---- receipts and JWTs ---------------------------------------------------------------------


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


@st.composite
def signed_tokens(draw: st.DrawFn, header: dict[str, Any]) -> tuple[bytes, bytes, str]:
    """(header bytes, payload bytes, tail) for a token signed over arbitrary JSON-ish bytes."""
    head = draw(st.sampled_from([s.dump(header, True), s.dump({**header, "alg": "none"}, True)])
                | s.lines().filter(lambda b: len(b) < 2000))
    body = draw(st.sampled_from([b'{"v":1}', b"{}"]) | s.lines().filter(lambda b: len(b) < 2000)
                | st.builds(lambda v: s.dump(v, True), s.json_values))
    return head, body, draw(st.sampled_from(["", "x", "=", ".", "..", "AAAA"]))


def _receipt_key() -> tuple[Any, str, str]:
    """A fixed Ed25519 key (so the strategies can name its kid): (key, x, kid)."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    from gateway.crypto.receipts import jwk_thumbprint

    key = Ed25519PrivateKey.from_private_bytes(bytes(range(32)))
    x = _b64(key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw))
    return key, x, jwk_thumbprint(x)


@contextlib.contextmanager
def open_receipts() -> Iterator[Check]:
    from gateway.crypto.receipts import ReceiptInvalid, verify_receipt

    key, x, kid = _receipt_key()
    jwks = {"keys": [{"kty": "OKP", "crv": "Ed25519", "kid": kid, "x": x, "alg": "Ed25519", "use": "sig"}]}

    def check(case: Any) -> None:
        """Any token, signed or not, is refused with ReceiptInvalid or verified; nothing else."""
        token = _token(case, lambda data: _b64(key.sign(data)))
        try:
            verify_receipt(token, jwks, response={"content": []}, request={"tool": "x"})
        except ReceiptInvalid as exc:
            assert str(exc)

    yield check


def token_cases(header: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Arbitrary text, dotted segments, or (header, payload, tail) to sign with a real key."""
    return st.one_of(st.text(max_size=200), st.lists(s.token_segments, min_size=1, max_size=5).map(".".join),
                     signed_tokens(header))


def _token(case: Any, sign: Callable[[bytes], str]) -> str:
    if not isinstance(case, tuple):
        return str(case)
    head, body, tail = case
    signing_input = f"{_b64(head)}.{_b64(body)}"
    return f"{signing_input}.{sign(signing_input.encode())}{tail}"


@contextlib.contextmanager
def open_jwt() -> Iterator[Check]:
    import anyio
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature
    from cryptography.hazmat.primitives import hashes

    from gateway.transports.http_auth import JwtVerifier, TokenInvalid
    from gateway.crypto.jwt import Jwks

    key = ec.generate_private_key(ec.SECP256R1())
    numbers = key.public_key().public_numbers()
    jwk = {"kty": "EC", "crv": "P-256", "kid": "ec-1", "alg": "ES256", "use": "sig",
           "x": _b64(numbers.x.to_bytes(32, "big")), "y": _b64(numbers.y.to_bytes(32, "big"))}
    with tempfile.TemporaryDirectory(prefix="dharma-fuzz-") as tmp:
        path = Path(tmp) / "jwks.json"
        path.write_text(json.dumps({"keys": [jwk]}))
        verifier = JwtVerifier(Jwks(str(path), min_refetch=1e9), issuer="https://idp.example", audience="https://gw.example/mcp")

        def sign(data: bytes) -> str:
            r, s_ = decode_dss_signature(key.sign(data, ec.ECDSA(hashes.SHA256())))
            return _b64(r.to_bytes(32, "big") + s_.to_bytes(32, "big"))

        def check(case: Any) -> None:
            """Any token, signed or not, is refused with TokenInvalid or verified; nothing else."""
            try:
                anyio.run(verifier.verify, _token(case, sign))
            except TokenInvalid as exc:
                assert str(exc)

        yield check


# ---- a real `dharma stdio` ------------------------------------------------------------------


@contextlib.contextmanager
def open_stdio_proxy() -> Iterator[Check]:
    """`dharma stdio` around the SDK test server of tests/mcp, for the whole campaign."""
    import os
    import queue
    import subprocess
    import threading

    from gateway.crypto import strict_json
    from tests.mcp.conftest import (
        REPO, TEST_DISCLOSURE, TEST_PROFILE, TEST_RULES, backend_calls, gateway_command, gateway_env, test_server_command,
    )

    with tempfile.TemporaryDirectory(prefix="dharma-fuzz-") as tmp_name:
        tmp = Path(tmp_name)
        (tmp / "state").mkdir()
        (tmp / "rules.yaml").write_text(TEST_RULES)
        (tmp / "disclosure.yaml").write_text(TEST_DISCLOSURE)
        policy = tmp / "profile.yaml"
        policy.write_text(TEST_PROFILE % {"timeout": 1.5, "mcp_rules": REPO / "rules" / "mcp.yaml"})
        command = gateway_command(tmp / "state", policy, test_server_command(), "--max-message-bytes", "200000")
        with open(tmp / "gateway.log", "wb") as log:
            proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, cwd=str(REPO),
                                    env={**os.environ, **gateway_env(tmp)})
        assert proc.stdin is not None and proc.stdout is not None
        out: queue.Queue[bytes] = queue.Queue()
        threading.Thread(target=lambda: [out.put(line) for line in proc.stdout], daemon=True).start()  # type: ignore[union-attr]
        counter = iter(range(1 << 62))

        def send(data: bytes) -> None:
            proc.stdin.write(data + b"\n")  # type: ignore[union-attr]
            proc.stdin.flush()  # type: ignore[union-attr]

        def answer(rpc_id: str) -> dict[str, Any]:
            while True:
                message = strict_json.loads(out.get(timeout=15))  # everything the gateway writes is strict JSON
                if isinstance(message, dict) and message.get("id") == rpc_id:
                    return message

        send(b'{"jsonrpc":"2.0","id":"init","method":"initialize","params":{"protocolVersion":"2025-03-26",'
             b'"capabilities":{},"clientInfo":{"name":"fuzz","version":"0"}}}')
        answer("init")
        send(b'{"jsonrpc":"2.0","method":"notifications/initialized"}')

        def check(line: bytes) -> None:
            """After any line, a ping is answered, the proxy runs, and admin_reset never ran."""
            ping = f"ping-{next(counter)}"
            send(line)
            send(jsonrpc_ping(ping))
            assert answer(ping).get("result") == {}, line
            assert proc.poll() is None, f"dharma stdio exited with {proc.returncode}"
            assert "admin_reset" not in backend_calls(tmp)

        try:
            yield check
        finally:
            proc.stdin.close()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def jsonrpc_ping(rpc_id: str) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": rpc_id, "method": "ping"}).encode()


TARGETS: list[Target] = [
    Target("strict_json", s.lines(), _plain(check_strict_json)),
    Target("jsonrpc_parse", s.lines(), _plain(check_jsonrpc_parse)),
    Target("framing", framing_cases, _plain(check_framing)),
    Target("session_client", st.lists(s.lines(huge=2000), max_size=6), _plain(check_session_client)),
    Target("session_server", st.lists(s.lines(huge=2000), max_size=6), _plain(check_session_server)),
    Target("http_body", s.lines(), _plain(check_http_body)),
    Target("policy_loader", s.yaml_texts(s.POLICY_SAMPLES), open_policy_loader),
    Target("config_loader", s.yaml_texts(s.CONFIG_SAMPLES), open_config_loader),
    Target("cel_activation_python", s.cel_arguments, lambda: open_cel_activation("cel-python")),
    Target("cel_activation_rust", s.cel_arguments, lambda: open_cel_activation("common-expression-language")),
    Target("receipt_verify", token_cases({"alg": "Ed25519", "typ": "dharma-receipt+jws", "kid": _receipt_key()[2]}), open_receipts),
    Target("stdio_proxy", s.lines(huge=300_000), open_stdio_proxy),
    Target("jwt_verify", token_cases({"alg": "ES256", "typ": "JWT", "kid": "ec-1"}), open_jwt),
]
