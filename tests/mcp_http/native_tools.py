"""Tools of the gateway's own backends for the one-catalog tests: a python backend (`backend`) and
a plain HTTP tool API (`http_api`, a Starlette app the tests serve under uvicorn)."""

from __future__ import annotations

from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from gateway.core.backends import ToolSpec
from gateway.transports.upstreams.python import CallableBackend

ADD_SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}


def add_numbers(a: int, b: int) -> dict[str, Any]:
    return {"sum": a + b}


def admin_wipe() -> str:
    return "wiped"


def backend(backend_id: str = "calc") -> CallableBackend:
    return CallableBackend(backend_id, {
        "add_numbers": (add_numbers, ToolSpec("add_numbers", "Add two integers.", ADD_SCHEMA, annotations={"readOnlyHint": True})),
        "admin_wipe": (admin_wipe, ToolSpec("admin_wipe", "Wipe everything (admins only).", {"type": "object"},
                                            annotations={"destructiveHint": True})),
    })


CITY_TOOL = {"name": "lookup_city", "description": "Look a city up by name.",
             "input_schema": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]},
             "annotations": {"readOnlyHint": True, "openWorldHint": True}}


async def _lookup(request: Request) -> JSONResponse:
    body = await request.json()
    name = body["arguments"].get("name", "")
    return JSONResponse({"result": {"city": name, "country": "FR" if name == "Paris" else "unknown"}})


def http_api() -> Starlette:
    return Starlette(routes=[Route("/lookup_city", _lookup, methods=["POST"])])
