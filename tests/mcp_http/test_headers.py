"""The 2026 routing-header codec's `header_map`: each definition gets its own map, a changed
definition its new one."""

from __future__ import annotations

import copy

from gateway.transports.mcp_http import headers as mh


def _schema(token: object, kind: str = "string") -> dict[str, object]:
    return {"type": "object", "properties": {"text": {"type": "string"}, "region": {"type": kind, "x-mcp-header": token}}}


def test_each_schema_object_gets_its_own_map_and_a_new_definition_its_new_one() -> None:
    first = _schema("Region")
    assert mh.header_map(first) == {("region",): ("Region", "string")}
    renamed = copy.deepcopy(first)
    renamed["properties"]["region"]["x-mcp-header"] = "Zone"  # type: ignore[index]
    assert mh.header_map(renamed) == {("region",): ("Zone", "string")}
    assert mh.header_map(first) == {("region",): ("Region", "string")}
    assert mh.header_map(_schema("Bad Token")) is None and mh.header_map(_schema("Region", "object")) is None
    assert mh.header_map(None) == {} and mh.header_map(["not", "a", "schema"]) == {}
    body = {"method": "tools/call", "params": {"name": "t", "arguments": {"text": "x", "region": "eu"}}}
    assert mh.forwarded({}, body, renamed)["Mcp-Param-Zone"] == "eu"
    assert mh.check([("mcp-method", "tools/call"), ("mcp-name", "t"), ("mcp-param-region", "eu")], body, first) is None
    assert mh.check([("mcp-method", "tools/call"), ("mcp-name", "t"), ("mcp-param-region", "eu")], body, renamed) is not None

