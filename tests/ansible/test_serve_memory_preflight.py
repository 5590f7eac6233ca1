"""The serve phase's memory preflight runs before the conversion: a serving server that cannot fit the GPUs is
refused naming the numbers, and nothing was converted or started (the draft directory is not written). The
draft's bytes come from the speculators checkpoint (``eagle3ops.serve.draft_bytes``), since no converted draft
exists yet.

No GPU here: a stand-in ``nvidia-smi`` first on PATH answers as the real one does (one line a GPU, MiB), for a
12,000 MiB card, too small for SGLang's activation reserve at the default flags. The target is a tiny random DeepseekV3 and the checkpoint is made by speculators' own code, as
in test_serve_process_role; the server itself is never reached."""

from __future__ import annotations

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "hosts"))
sys.path.insert(0, str(REPO / "tests" / "unit"))
from eagle3_draft_fixture import make_draft_checkpoint
from eagle3ops.serve.draft_bytes import served_bytes
from eagle3ops.train.fixtures import make_tiny_verifier
from runner import run_playbook


def test_a_server_that_cannot_fit_is_refused_before_the_draft_is_converted(tmp_path):
    verifier = make_tiny_verifier(tmp_path / "verifier", vocab_size=512)
    make_draft_checkpoint(tmp_path / "run" / "checkpoints" / "0", verifier)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 12000\n")
    smi.chmod(0o755)
    ev = {
        "eagle3ops_workdir": str(tmp_path / "work"),
        "eagle3ops_checkpoint": str(tmp_path / "run"),
        "eagle3ops_model_path": str(verifier),
        "serve_server_enabled": True,
        "serve_launcher": "process",
        "serve_check_capture_patch": False,
        "serve_sglang_venv_dir": str(tmp_path / "no-venv"),
        "serve_tp_size": 1,
    }
    r = run_playbook(REPO / "site.yml", REPO / "inventory" / "local", extravars=ev, tags="serve",
                     envvars={"PATH": f"{bin_dir}:{os.environ['PATH']}"}, private_data_dir=tmp_path / "pdd")  # fmt: skip
    assert r.rc != 0
    assert "does not fit 1 GPUs of 12,000 MiB" in r.stdout, r.stdout[-3000:]
    assert "serve_extra_args: --cuda-graph-max-bs" in r.stdout  # the variable to change, named
    # refused before the conversion: no draft written, no server run directory
    assert not (tmp_path / "work" / "serve" / "draft").exists()
    assert not (tmp_path / "work" / "serve" / "run").exists()
    # and the draft it weighed was the checkpoint's (no converted draft existed)
    bytes_, source = served_bytes(tmp_path / "run")
    assert bytes_ > 0 and source.startswith("the speculators checkpoint")
