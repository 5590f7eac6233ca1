"""The request loop of the tests' fork servers (``tests/reliability/faulthook/zygote.py``: the ``eagle3ops`` CLI;
``tests/fixtures/standin_forkserver.py``: the SGLang stand-in). Each imports what is slow to import once, then
forks one child per request; the child is a real process of its own.

Protocol (JSON lines): ``{"ready": true}`` on stdout once, then per request line on stdin ``{"pid": N}`` at once;
``child(request)`` runs in the forked process and its return value is that process's exit code (it never
returns into the loop: ``os._exit``). ``started(pid)`` runs in the server after each fork (e.g. to wait for the
child and report its exit code). The loop ends when stdin closes.
"""

from __future__ import annotations

import json
import os
import sys


def serve(child, started=None) -> None:
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        pid = os.fork()
        if pid == 0:
            rc = 1
            try:
                rc = child(req)
            finally:
                os._exit(rc)
        print(json.dumps({"pid": pid}), flush=True)
        if started is not None:
            started(pid)
