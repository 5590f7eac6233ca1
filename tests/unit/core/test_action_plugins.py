"""The action plugins in action_plugins/ load on a controller whose Python holds ansible-core but not this
package (each then finds the checkout's python/, Ansible puts nothing of the repository on sys.path), and they
share plain() from eagle3ops.plain_values instead of each carrying a copy.

Real: a fresh ``python -S`` given only ansible-core's directory (no site processing, so the editable install's
finder of this venv is not there) imports every plugin file."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import ansible
from library_docs import REPO

PLUGINS = sorted((REPO / "action_plugins").glob("*.py"))

LOAD = """
import importlib.util, sys
sys.path.append({site!r})
for path in {paths!r}:
    spec = importlib.util.spec_from_file_location("plugin_" + str(len(sys.modules)), path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.ActionModule, path
import eagle3ops
print(eagle3ops.__file__)
"""


def test_every_plugin_loads_without_the_package_installed():
    assert len(PLUGINS) >= 6
    site = str(Path(ansible.__file__).resolve().parents[1])
    code = LOAD.format(site=site, paths=[str(p) for p in PLUGINS])
    r = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip() == str(REPO / "python" / "eagle3ops" / "__init__.py")


def test_no_plugin_carries_its_own_copy_of_the_shared_parts():
    for p in PLUGINS:
        tree = ast.parse(p.read_text())
        defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
        assert "plain" not in defined, p.name
        assert not any(isinstance(n, ast.Try) for n in tree.body), f"{p.name}: an import fallback of its own"


def test_a_hosts_variable_is_plain_and_falls_back_to_the_default():
    """host_var reads another host's variable as plain values; a host without it, or one whose variables raise
    when read (a stand-in: Ansible's hostvars of a host that failed before the variable was set), gives the
    default."""
    from eagle3ops.plain_values import host_var

    class Failing(dict):
        def __contains__(self, name):
            raise RuntimeError("host failed")

    task_vars = {"hostvars": {"a": {"x": ("tuple", 1)}, "b": {}, "c": Failing()}}
    assert host_var(task_vars, "a", "x") == ["tuple", 1]
    assert host_var(task_vars, "b", "x", 7) == 7
    assert host_var(task_vars, "c", "x", 8) == 8
    assert host_var(task_vars, "gone", "x") is None


def test_a_step_is_run_by_name_and_an_unknown_one_fails_naming_the_steps():
    from eagle3ops.plain_values import run_step

    steps = {"share": lambda a: {"msg": f"ranks of {a['n']}"}, "summary": lambda a: {}}
    assert run_step({"x": 1}, steps, {"step": "share", "n": 2}) == {
        "x": 1,
        "changed": False,
        "msg": "ranks of 2",
    }
    bad = run_step({"x": 1}, steps, {"step": "shares"})
    assert bad["failed"] and bad["msg"] == "step must be one of share, summary, not 'shares'"
