"""Issue #10.6: ``ansible-playbook site.yml --check`` with EVERY phase (no --tags) on a fresh local default
changes nothing on disk: not the work directory, not fstab, not systemd units, not the checkout.

tests/ansible/test_site_local.py proves that check mode on a finished work directory predicts no change; this
run, with test_site_local's variables (``small_local_default``: a 20-conversation demo, its training sizes),
carries its "--check on a fresh work dir writes nothing" for the phases it runs (runtime, prepare, extract,
gpu_free, train: that file no longer runs its own) and adds all the other phases of site.yml (container,
storage, services, sglang, ...) as the local default runs them. Real ansible-playbook through ansible-runner on
this machine.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from hosts.runner import run_playbook, small_local_default

REPO = Path(__file__).resolve().parents[2]


def _tree(root: Path) -> dict:
    if not root.exists():
        return {}
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*") if not p.is_symlink()}


def test_check_mode_of_every_phase_writes_nothing(tmp_path, figures):
    work = tmp_path / "work"
    watched = [Path("/etc/fstab"), Path("/etc/systemd/system")]
    before = {
        str(w): _tree(w) if w.is_dir() else (w.stat().st_mtime_ns if w.exists() else None) for w in watched
    }
    git_before = subprocess.run(
        ["git", "status", "--porcelain", "--ignored"], cwd=REPO, capture_output=True, text=True
    ).stdout
    r = run_playbook(
        REPO / "site.yml",
        REPO / "inventory" / "local",
        extravars=small_local_default(work),
        check=True,
        private_data_dir=tmp_path / "runner",
    )
    assert r.rc == 0 and r.host("localhost")["failed"] == 0, r.summary()
    assert not work.exists() or _tree(work) == {}, sorted(_tree(work))[:20]
    after = {
        str(w): _tree(w) if w.is_dir() else (w.stat().st_mtime_ns if w.exists() else None) for w in watched
    }
    assert after == before
    git_after = subprocess.run(
        ["git", "status", "--porcelain", "--ignored"], cwd=REPO, capture_output=True, text=True
    ).stdout
    # other sessions may edit the shared checkout meanwhile: only insist nothing NEW appeared from the run
    new = set(git_after.splitlines()) - set(git_before.splitlines())
    assert not [n for n in new if "work" in n.split("/")[0] or n.endswith(("work/", "work"))], new
