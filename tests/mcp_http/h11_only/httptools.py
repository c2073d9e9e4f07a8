"""Put on the conformance fixture's PYTHONPATH so uvicorn's "auto" HTTP parser falls back to h11.

The fixture is the SDK's reference server; uvicorn's httptools protocol keeps trailing whitespace
in header values (h11 trims it, RFC 9110 §5.5), which would make the reference itself fail the
suite's whitespace check now that httptools is installed for `dharma serve` (which trims the
values itself). The gateway under test is started with its own PYTHONPATH and keeps httptools.
"""

raise ImportError("httptools is hidden from the conformance fixture (tests/mcp_http/h11_only)")
