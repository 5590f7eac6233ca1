"""A fork server for ``eagle3ops`` runs (test-only; tests/reliability).

Importing torch + transformers + datasets costs ~10 s a process on this 2-core machine, and the fault suite
runs ``eagle3ops extract`` dozens of times. This process imports them ONCE, runs no torch op (so no OpenMP
pool exists at fork time), and forks one child per request. The child is a real, separate process running
the real CLI (``eagle3ops.cli.main(argv)``, the function the ``eagle3ops`` entry point calls) with its own
environment, stdout/stderr files and, optionally, a fault from ``faults.install(spec)``; SIGKILL of the child
is a real SIGKILL. The only difference from a shell invocation: the imports happened before the fork.

Protocol (JSON lines): stdin ``{"argv": [...], "env": {...}, "fault": "point:N" | "", "stdout": path,
"stderr": path, "counts": path | null}`` -> stdout ``{"pid": N}`` at once, then ``{"pid": N, "rc": R}``
(R < 0: killed by signal -R) when the child ended. Requests are served one at a time.
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.append(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
)  # tests/: forkserver

import datasets  # noqa: F401 - preloaded for the children
import faults
import forkserver
import safetensors.torch  # noqa: F401
import torch  # noqa: F401
import transformers  # noqa: F401
from eagle3ops import cli, store  # noqa: F401
from eagle3ops.extract import commands as _extract_cmd  # noqa: F401
from eagle3ops.extract import transformers_backend  # noqa: F401


def _child(req: dict) -> int:
    os.environ.update(req.get("env") or {})
    out = os.open(req["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    err = os.open(req["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(out, 1)
    os.dup2(err, 2)
    faults.install(req.get("fault") or "")
    try:
        rc = cli.main(req["argv"])
    except SystemExit as e:  # argparse errors
        rc = e.code if isinstance(e.code, int) else 2
    sys.stdout.flush()
    sys.stderr.flush()
    if req.get("counts"):
        with open(req["counts"], "w") as f:
            json.dump(faults.counts(), f)
    return rc


def _report(pid: int) -> None:
    _, status = os.waitpid(pid, 0)
    print(json.dumps({"pid": pid, "rc": os.waitstatus_to_exitcode(status)}), flush=True)


def main() -> None:
    forkserver.serve(_child, started=_report)  # requests served one at a time: _report waits for each


if __name__ == "__main__":
    main()
