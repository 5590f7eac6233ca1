"""Names: every module in library/ is ``eagle3ops_<phase>[_<action>]`` under that one name (no symlink in
library/), and every task of a role is named "Phase | Action"."""

from __future__ import annotations

import re

import yaml
from library_docs import MODULES, REPO
from role_tasks import each_task

LIBRARY = REPO / "library"


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


def test_a_module_has_one_name():
    links = sorted(p.name for p in LIBRARY.iterdir() if p.is_symlink())
    assert not links, f"library/: symlinks {links} (a module has one name, its eagle3ops_* file)"


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
