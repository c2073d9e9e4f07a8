"""`make run`: serve the demo backend through the gateway and show two calls to try."""

from __future__ import annotations

import sys
from pathlib import Path

from gateway.cli import main

CONFIG = Path(__file__).resolve().parent / "dharma.yaml"
BASE = "http://127.0.0.1:8765"

TRY = f"""
Dharma Gateway demo: the standard profile in front of the demo backend (examples/demo_backend.py).
State (keys, karma ledger, approvals) lives in $DHARMA_STATE_ROOT (default ~/.dharma).

Try an allowed call:
  curl -s -X POST {BASE}/v1/tools/read_file:call -H 'Authorization: Bearer demo-reader-key' \\
       -H 'content-type: application/json' -d '{{"arguments": {{"path": "README.txt"}}}}'

and a denied one (path traversal):
  curl -s -X POST {BASE}/v1/tools/read_file:call -H 'Authorization: Bearer demo-reader-key' \\
       -H 'content-type: application/json' -d '{{"arguments": {{"path": "../../etc/passwd"}}}}'

Then: .venv/bin/dharma audit query        (the ledger)   .venv/bin/dharma audit verify
      curl -s {BASE}/.well-known/jwks.json  (receipt keys)
Serving on {BASE} — Ctrl-C stops.
"""

if __name__ == "__main__":
    sys.stderr.write(TRY)
    sys.exit(main(["--config", str(CONFIG), "serve", *sys.argv[1:]]))
