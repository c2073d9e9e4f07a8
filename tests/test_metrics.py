"""`/metrics` of a real `dharma serve`: refused without role metrics/admin, parsed with
prometheus_client's exposition parser, and its counters move with real calls (allowed, denied by
a rule, unknown tool), reloads and approvals."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import KEYS
from tests.test_reload import healthy, read, served, wait_for  # noqa: F401  (served: the fixture)

ADMIN = {"authorization": f"Bearer {KEYS['admin']}"}


async def scrape(http: httpx.AsyncClient) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    answer = await http.get("/metrics", headers=ADMIN)
    assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/plain; version=0.0.4")
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(answer.text) for s in family.samples}


def value(samples: dict[Any, float], metric: str, **labels: str) -> float:
    return samples.get((metric, tuple(sorted(labels.items()))), 0.0)


async def test_metrics_move_with_real_calls(served: Any, state_root: Path) -> None:
    url, server, _log, _folder = served(watch=False)
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        await wait_for(lambda: healthy(http), "the gateway to be healthy", server)
        assert (await http.get("/metrics")).status_code == 401
        assert (await http.get("/metrics", headers={"authorization": f"Bearer {KEYS['reader']}"})).status_code == 403
        before = await scrape(http)
        ok = dict(tool="read_note", decision="allow", status="ok", error_code="")
        denied = dict(tool="read_note", decision="deny", status="blocked", error_code="policy_blocked")
        unknown = dict(tool="_unknown", decision="deny", status="blocked", error_code="tool_not_found")

        for _ in range(3):
            assert (await read(http)).json()["status"] == "ok"
        traversal = await http.post("/v1/tools/read_note:call", json={"arguments": {"path": "../x"}},
                                    headers={"authorization": f"Bearer {KEYS['reader']}"})
        assert traversal.json()["error_code"] == "policy_blocked"
        for name in ("no_such_tool_1", "no_such_tool_2"):  # unknown names collapse into one label
            await http.post(f"/v1/tools/{name}:call", json={"arguments": {}}, headers=ADMIN)
        assert (await http.post("/v1/admin/reload", headers=ADMIN)).status_code == 200

        after = await scrape(http)
        assert value(after, "dharma_calls_total", **ok) - value(before, "dharma_calls_total", **ok) == 3
        assert value(after, "dharma_calls_total", **denied) - value(before, "dharma_calls_total", **denied) == 1
        assert value(after, "dharma_calls_total", **unknown) - value(before, "dharma_calls_total", **unknown) == 2
        assert not any("no_such_tool" in str(key) for key in after), "an unknown tool name must not become a label"
        rule = dict(rule="fs-no-traversal", effect="deny", mode="enforce")
        assert value(after, "dharma_rule_matches_total", **rule) - value(before, "dharma_rule_matches_total", **rule) == 1
        for stage in ("sanitizer", "dharma_rules", "record", "receipt", "forward"):
            assert value(after, "dharma_stage_seconds_count", stage=stage) > value(before, "dharma_stage_seconds_count", stage=stage), stage
        assert value(after, "dharma_ledger_append_lag_seconds_count") >= value(before, "dharma_ledger_append_lag_seconds_count") + 9
        assert value(after, "dharma_ledger_batch_records_count") > value(before, "dharma_ledger_batch_records_count")
        assert value(after, "dharma_policy_reloads_total", result="ok", trigger="http") == 1
        assert value(after, "dharma_policy_reload_failing") == 0
        version = (await http.get("/healthz")).json()["policy_version"]
        assert value(after, "dharma_policy_info", name="test-profile", version=version) == 1
        assert value(after, "dharma_upstream_up", upstream="notes") == 1
        assert value(after, "dharma_dependency_up", dependency="ledger") == 1
        assert value(after, "dharma_approvals_pending") == 0
        assert value(after, "dharma_ledger_records") >= 1
