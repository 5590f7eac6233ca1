"""Shared by tests/ansible/test_progress.py and test_extract_waits_for_running.py: the extract phase's playbook
(playbooks/extract.yml) through ansible-runner on this machine (inventory/local), on the CPU."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "hosts"))
from runner import PlaybookResult, run_playbook


def extract_vars(model, data, **extra) -> dict:
    """The extract role's variables for ``model`` and ``data`` on the CPU, one worker, polled every second;
    ``extra`` adds to them."""
    return {
        "extract_model_path": str(model),
        "extract_data_dir": str(data),
        "extract_device": "cpu",
        "extract_workers": "1",
        "extract_poll_interval": 1,
        **extra,
    }


def run_extract_local(extravars: dict, private_data_dir: Path, on_event=None) -> PlaybookResult:
    """playbooks/extract.yml on inventory/local with ``extravars``; ``on_event`` as in runner.run_playbook."""
    return run_playbook(
        REPO / "playbooks" / "extract.yml",
        REPO / "inventory" / "local",
        extravars=extravars,
        private_data_dir=private_data_dir,
        on_event=on_event,
    )
