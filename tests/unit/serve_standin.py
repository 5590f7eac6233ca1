"""Shared by tests/unit/serve/test_serve_live.py and benchmark/test_benchmark_live.py: the STAND-IN SGLang server
(``tests/fixtures/sglang_standin_server.py`` in its serve mode) started through the real process launcher
(``eagle3ops.serve.process``), each on a free port."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

from eagle3ops.serve import process as sp

REPO = Path(__file__).resolve().parents[2]
STANDIN = REPO / "tests" / "fixtures" / "sglang_standin_server.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_with_and_without(run_dir, model_dir, draft, *, step_seconds: float) -> tuple[str, str]:
    """Two stand-in servers under ``run_dir``, started and healthy, each on a free port: ``w`` with the EAGLE3
    draft, ``o`` without; returns their URLs. The caller stops both (``sp.stop(run_dir, "w")``, ``"o"``)."""
    step = ["--standin-step-seconds", str(step_seconds)]
    urls = []
    for name, d in (("w", draft), ("o", None)):
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        sp.start(run_dir, name, sp.make_spec(standin_argv(model_dir, port, d, *step), {}, url), health_timeout=30,
                 interval=0.1)  # fmt: skip
        urls.append(url)
    return urls[0], urls[1]


def standin_argv(model_dir, port, draft=None, *extra):
    argv = [sys.executable, str(STANDIN), "--model-path", str(model_dir), "--port", str(port)]
    if draft:
        argv += ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", str(draft)]
        argv += [
            "--speculative-num-steps",
            "3",
            "--speculative-eagle-topk",
            "1",
            "--speculative-num-draft-tokens",
            "4",
        ]
    return argv + [str(a) for a in extra]
