"""Names (issues 19 and 33): every module in library/ is ``eagle3ops_<phase>[_<action>]``, the old module names of
before the rename are gone (no symlinks in library/, nothing in the roles or tests uses them), and every task of a
role is named "Phase | Action".

Real: ``ansible-playbook`` (connection local) asked to run an old name fails as for any unknown module.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import yaml
from library_docs import MODULES, REPO
from role_tasks import each_task

LIBRARY = REPO / "library"
# the names of before issue 19, each now under its eagle3ops_<phase> name; they ran as symlinks with a deprecation
# until issue 33 removed them (the project had no users of them)
RENAMED = {
    "dataset_prepare": "eagle3ops_prepare",
    "hidden_states_extract": "eagle3ops_extract",
    "sglang_extract": "eagle3ops_extract_sglang",
    "gpu_vram_free": "eagle3ops_gpu_free",
    "eagle3_train": "eagle3ops_train",
    "eagle3_convert": "eagle3ops_serve_convert",
    "eagle3_serve_process": "eagle3ops_serve_process",
    "eagle3_benchmark": "eagle3ops_benchmark",
    "sglang_capture_patch": "eagle3ops_sglang_patch",
    "proxmox_lxc_gpu": "eagle3ops_container_gpu",
    "eagle3ops_assets": "eagle3ops_runtime_assets",
    "eagle3ops_unit_backup": "eagle3ops_services_backup",
}


def _phases() -> list[str]:
    """The phases, as site.yml tags its imports."""
    return [
        tag
        for play in yaml.safe_load((REPO / "site.yml").read_text())
        for tag in play["tags"]
        if tag != "always"
    ]


def test_every_module_is_named_eagle3ops_phase_action():
    phases = _phases()
    assert "gpu_free" in phases and "container" in phases, phases
    pattern = re.compile(rf"eagle3ops_({'|'.join(phases)})(_[a-z0-9]+)*")
    wrong = [m for m in MODULES if not pattern.fullmatch(m)]
    assert not wrong, f"library/: {wrong} are not eagle3ops_<phase>[_<action>] (phases: {phases})"


def test_no_old_module_name_is_left_in_library():
    links = sorted(p.name for p in LIBRARY.iterdir() if p.is_symlink())
    assert not links, f"library/: symlinks {links} (old module names are gone: write the eagle3ops_* name)"
    assert not set(RENAMED) & {p.stem for p in LIBRARY.glob("*.py")}
    for new in RENAMED.values():
        assert new in MODULES, new
        text = (LIBRARY / f"{new}.py").read_text()
        assert "deprecate_old_name" not in text and "Formerly named" not in text, new


def test_every_role_task_is_named_phase_action():
    """Kubespray's habit: "Extract | Work out what is left ..." says in a run's log which phase a task is of. The
    phase is what its playbook's play name starts with ("Extract - target hidden states ...")."""
    seen = set()
    for pb in sorted((REPO / "playbooks").glob("*.yml")):
        for play in yaml.safe_load(pb.read_text()):
            label = play["name"].split(" - ")[0]
            for role in (r["role"] if isinstance(r, dict) else r for r in play.get("roles", [])):
                seen.add(role)
                files = sorted(
                    [*REPO.glob(f"roles/{role}/tasks/*.yml"), *REPO.glob(f"roles/{role}/handlers/*.yml")]
                )
                assert files, role
                for f in files:
                    for t in each_task(yaml.safe_load(f.read_text())):
                        name = t.get("name", "")
                        assert name.startswith(f"{label} | ") and len(name) > len(label) + 4, (
                            f"{f.relative_to(REPO)}: task {name or t} is not named '{label} | <action>'"
                        )
    # the shared role (roles/eagle3ops, every phase role's dependency) runs in every phase's play: its tasks
    # say so with their own label
    dependencies = set()
    for role in seen:
        meta = yaml.safe_load((REPO / "roles" / role / "meta" / "main.yml").read_text()) or {}
        dependencies |= {d["role"] if isinstance(d, dict) else d for d in meta.get("dependencies") or []}
    for role in sorted(dependencies - seen):
        for f in sorted(REPO.glob(f"roles/{role}/tasks/*.yml")):
            for t in each_task(yaml.safe_load(f.read_text())):
                name = t.get("name", "")
                assert name.startswith("Shared variables | "), (
                    f"{f.relative_to(REPO)}: task {name or t} is not named 'Shared variables | <action>'"
                )
    # every role with tasks belongs to a phase playbook (or is a dependency of the roles of one)
    assert seen | dependencies >= {p.parent.parent.name for p in REPO.glob("roles/*/tasks/main.yml")}, seen


def test_no_role_or_playbook_uses_an_old_name():
    word = re.compile(rf"\b({'|'.join(RENAMED)})\b")
    files = [
        *REPO.glob("roles/*/tasks/*.yml"),
        *REPO.glob("roles/*/handlers/*.yml"),
        *REPO.glob("playbooks/*.yml"),
    ]
    files += [*REPO.glob("tests/**/*.yml"), REPO / "site.yml"]
    used = [f"{f.relative_to(REPO)}: {m[0]}" for f in files for m in word.finditer(f.read_text())]
    assert not used, used


def test_an_old_name_fails_as_an_unknown_module(tmp_path):
    """A playbook still written with an old name stops at Ansible's own "couldn't resolve module" for that task."""
    (tmp_path / "pb.yml").write_text(
        yaml.safe_dump(
            [{"hosts": "localhost", "gather_facts": False, "tasks": [{"name": "old", "gpu_vram_free": {}}]}]
        )
    )
    r = subprocess.run(
        [str(Path(sys.executable).with_name("ansible-playbook")), "-i", "localhost,", "-c", "local",
         "-e", f"ansible_python_interpreter={sys.executable}", str(tmp_path / "pb.yml")],
        capture_output=True, text=True, cwd=REPO, check=False,
        env={**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"},
    )  # fmt: skip
    assert r.returncode != 0
    assert (
        "gpu_vram_free" in r.stdout + r.stderr and "couldn't resolve module" in (r.stdout + r.stderr).lower()
    )
