"""The request loop of a peer's worker (``bench/tq_worker.py``, ``bench/catalyst_worker.py``):
one JSON object per line on stdin, ``{"cmd": name, ...}``, answered by ``handlers[name](req)``
as one JSON line on stdout (``{"error": ...}`` when the handler raised); ``quit`` ends it.
Standard library only: it runs under the peer's
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
        if handler is None:
            ans = {"error": f"unknown command {cmd!r}"}
        else:
            try:
                ans = handler(req)
            except Exception as exc:  # the peer failed on this request: say so and go on
                first = (str(exc).strip().splitlines() or [""])[0][:300]
                ans = {"error": f"{type(exc).__name__}: {first}"}
        sys.stdout.write(json.dumps(ans) + "\n")
        sys.stdout.flush()
