"""`make run`: serve the demo backend through the gateway and show how to use it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from gateway.cli.main import main

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "examples" / "dharma.yaml"
BASE = "http://127.0.0.1:8765"


def stdio_snippet() -> str:
    """A ready `mcpServers` entry for desktop agents: the agent launches `dharma stdio`."""
    venv = ROOT / ".venv" / "bin"
    entry = {
        "mcpServers": {
            "dharma-demo": {
                "command": str(venv / "dharma"),
                "args": ["stdio", "--config", str(CONFIG), "--", str(venv / "python"), "-m", "examples.demo_mcp_server"],
                "env": {"PYTHONPATH": str(ROOT)},
            }
        }
    }
    return json.dumps(entry, indent=2)


TRY = f"""
Dharma Gateway demo: the standard profile with the demo API keys (examples/policies/demo.yaml)
in front of the demo backend (examples/). These keys are published: never use that profile elsewhere.
State (keys, karma ledger, approvals) lives in $DHARMA_STATE_ROOT (default ~/.dharma).

HTTP tool API — an allowed call:
  curl -s -X POST {BASE}/v1/tools/read_file:call -H 'Authorization: Bearer demo-reader-key' \\
       -H 'content-type: application/json' -d '{{"arguments": {{"path": "README.txt"}}}}'
and a denied one (path traversal):
  curl -s -X POST {BASE}/v1/tools/read_file:call -H 'Authorization: Bearer demo-reader-key' \\
       -H 'content-type: application/json' -d '{{"arguments": {{"path": "../../etc/passwd"}}}}'

MCP over Streamable HTTP: point any MCP client at {BASE}/mcp with the header
  Authorization: Bearer demo-reader-key      (or demo-operator-key, demo-clinician-key, demo-admin-key)
e.g. with the Python SDK (mcp 2.x):
  Client(streamable_http_client("{BASE}/mcp", http_client=httpx2.AsyncClient(headers={{"X-API-Key": "demo-reader-key"}})))

MCP over stdio, for desktop agents (Claude Desktop, IDEs) — add to their MCP config:
{stdio_snippet()}

Audit: .venv/bin/dharma audit query | .venv/bin/dharma audit verify | curl -s {BASE}/.well-known/jwks.json
Serving on {BASE} — Ctrl-C stops.
"""

if __name__ == "__main__":
    sys.stderr.write(TRY)
    sys.exit(main(["--config", str(CONFIG), "serve", *sys.argv[1:]]))
