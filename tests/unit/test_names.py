"""Names (issue 19): every module in library/ is ``eagle3ops_<phase>[_<action>]``, each old module name still runs
its module with a deprecation warning naming the new one, and every task of a role is named "Phase | Action".

Real: ``ansible-doc`` and ``ansible-playbook`` (connection local) load the old names from ``library/`` exactly as
a user's playbook does; the modules run and fail at their first real step (no eagle3ops executable, no ``pct``),
which is after the deprecation is recorded.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import yaml
from role_tasks import each_task
from test_module_docs import MODULES, REPO, ansible_doc

sys.path.insert(0, str(REPO / "module_utils"))
from eagle3ops_names import RENAMED

LIBRARY = REPO / "library"
OLD = sorted(p.stem for p in LIBRARY.glob("*.py") if p.is_symlink())


def _phases() -> list[str]:
    """The phases, as site.yml tags its imports."""
    return [tag for play in yaml.safe_load((REPO / "site.yml").read_text()) for tag in play["tags"]]


def test_every_module_is_named_eagle3ops_phase_action():
    phases = _phases()
    assert "gpu_free" in phases and "container" in phases, phases
    pattern = re.compile(rf"eagle3ops_({'|'.join(phases)})(_[a-z0-9]+)*")
    wrong = [m for m in MODULES if not pattern.fullmatch(m)]
    assert not wrong, f"library/: {wrong} are not eagle3ops_<phase>[_<action>] (phases: {phases})"


def test_old_names_are_the_table_and_link_to_the_new_module():
    assert sorted(RENAMED) == OLD, "library/'s symlinks vs module_utils/eagle3ops_names.RENAMED"
    for old, new in RENAMED.items():
        link = LIBRARY / f"{old}.py"
        assert os.readlink(link) == f"{new}.py", f"{link} -> {os.readlink(link)}, want {new}.py"
        assert new in MODULES, f"{old} -> {new}: no such module"
        text = (LIBRARY / f"{new}.py").read_text()
        assert "deprecate_old_name(module)" in text, f"library/{new}.py never calls deprecate_old_name"
        assert f"Formerly named C({old})" in text, f"library/{new}.py's DOCUMENTATION does not name {old}"


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


def test_ansible_doc_renders_the_old_names():
    """``ansible-doc <old name>`` shows the renamed module's documentation (whose description names the old name)."""
    r = subprocess.run(
        [str(Path(sys.executable).with_name("ansible-doc")), "-M", str(LIBRARY), "--json", *RENAMED],
        capture_output=True, text=True, cwd=REPO, check=False,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    docs = json.loads(r.stdout)
    for old, new in RENAMED.items():
        doc = docs[old]["doc"]
        assert doc["options"] == ansible_doc()[new]["doc"]["options"], old
        assert f"Formerly named C({old})" in doc["description"][0] and f"C({new})" in doc["description"][0], (
            old
        )


# arguments each old name accepts (its spec's required options) that fail at the module's first real step
ARGS = {
    "dataset_prepare": {"model": "/nonexistent", "inputs": [], "out": "/nonexistent/out"},
    "hidden_states_extract": {"data_dir": "/nonexistent", "model": "/nonexistent"},
    "sglang_extract": {"data_dir": "/nonexistent", "model": "/nonexistent"},
    "gpu_vram_free": {},
    "eagle3_train": {
        "data_dir": "/nonexistent",
        "verifier_path": "/nonexistent",
        "run_dir": "/nonexistent/run",
    },
    "eagle3_convert": {"checkpoint": "/nonexistent", "out": "/nonexistent/out"},
    "eagle3_serve_process": {"run_dir": "/nonexistent", "name": "x", "state": "status"},
    "eagle3_benchmark": {"action": "report", "out": "/nonexistent/out"},
    "sglang_capture_patch": {"path": "/nonexistent/deepseek_v2.py", "state": "query"},
    "proxmox_lxc_gpu": {"vmid": 1, "pct": "/nonexistent/pct"},
    "eagle3ops_assets": {"step": "fetch", "cache": "/nonexistent"},
    "eagle3ops_unit_backup": {"unit": "x.service", "state": "forgotten"},  # a no-op in an empty backup_dir
}
NO_EXE = {"proxmox_lxc_gpu", "eagle3ops_unit_backup"}  # modules that do not run the eagle3ops CLI


def test_old_names_run_the_module_with_a_deprecation_naming_the_new_one(tmp_path):
    assert sorted(ARGS) == sorted(RENAMED)
    tasks = []
    for old in RENAMED:
        args = dict(ARGS[old])
        if old not in NO_EXE:
            args["executable"] = "/nonexistent/eagle3ops"
        if old == "eagle3ops_unit_backup":
            args["backup_dir"] = str(tmp_path / "backup")
        tasks.append({"name": old, old: args, "ignore_errors": True})
    plain = RENAMED["gpu_vram_free"]  # called by its new name: no deprecation
    tasks.append({"name": plain, plain: {"executable": "/nonexistent/eagle3ops"}, "ignore_errors": True})
    (tmp_path / "pb.yml").write_text(
        yaml.safe_dump([{"hosts": "localhost", "gather_facts": False, "tasks": tasks}])
    )
    r = subprocess.run(
        [str(Path(sys.executable).with_name("ansible-playbook")), "-i", "localhost,", "-c", "local",
         "-e", f"ansible_python_interpreter={sys.executable}", str(tmp_path / "pb.yml")],
        capture_output=True, text=True, cwd=REPO, check=False,
        env={**os.environ, "ANSIBLE_STDOUT_CALLBACK": "ansible.posix.json", "ANSIBLE_CONFIG": str(REPO / "ansible.cfg")},
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    results = {t["task"]["name"]: t["hosts"]["localhost"] for t in json.loads(r.stdout)["plays"][0]["tasks"]}
    for old, new in RENAMED.items():
        res = results[old]
        # the deprecation comes from the module's own code, after its arguments were accepted: the module ran
        msgs = [d["msg"] for d in res.get("deprecations", [])]
        assert any(f"{old} is now named {new}" in m for m in msgs), (old, msgs, res.get("msg"))
        # and stopped at its first real step (or, eagle3ops_unit_backup, forgot a record there was none of)
        assert res.get("failed") or old == "eagle3ops_unit_backup", (old, res)
    assert results[plain].get("failed") and not results[plain].get("deprecations"), results[plain]
