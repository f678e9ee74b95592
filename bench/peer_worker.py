"""The request loop of a peer's worker (``bench/tq_worker.py``, ``bench/catalyst_worker.py``):
one JSON object per line on stdin, ``{"cmd": name, ...}``, answered by ``handlers[name](req)``
as one JSON line on stdout; ``quit`` ends it. Standard library only: it runs under the peer's
own environment."""
from __future__ import annotations

import json
import sys


def serve(handlers: dict) -> None:
    for line in sys.stdin:
        req = json.loads(line)
        cmd = req.get("cmd")
        if cmd == "quit":
            break
        handler = handlers.get(cmd)
        ans = handler(req) if handler is not None else {"error": f"unknown command {cmd!r}"}
        sys.stdout.write(json.dumps(ans) + "\n")
        sys.stdout.flush()
