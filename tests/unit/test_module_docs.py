"""Every module in library/ documents itself: ansible-doc parses DOCUMENTATION/EXAMPLES/RETURN, the documented
options are exactly the argument_spec's, and check mode is declared."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
MODULES = sorted(p.stem for p in (REPO / "library").glob("*.py"))


def _spec_keys(path: Path) -> set[str]:
    """Option names of the module's AnsibleModule(argument_spec={...}) (a literal dict or a module-level name)."""
    tree = ast.parse(path.read_text())
    names = {
        t.id: n.value
        for n in tree.body
        if isinstance(n, ast.Assign)
        for t in n.targets
        if isinstance(t, ast.Name)
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "AnsibleModule":
            for kw in node.keywords:
                if kw.arg == "argument_spec":
                    v = kw.value
                    if isinstance(v, ast.Name):
                        v = names.get(v.id, v)
                    if isinstance(v, ast.Dict):
                        return {k.value for k in v.keys if isinstance(k, ast.Constant)}
    return set()


@pytest.mark.parametrize("name", MODULES)
def test_ansible_doc_parses_and_options_match(name):
    p = subprocess.run(
        [str(Path(sys.executable).with_name("ansible-doc")), "-M", str(REPO / "library"), "--json", name],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    doc = json.loads(p.stdout)[name]
    assert doc["doc"]["short_description"] and doc["examples"] and doc["return"] is not None
    yaml.safe_load(doc["examples"])
    documented = set((doc["doc"].get("options") or {}).keys())
    spec = _spec_keys(REPO / "library" / f"{name}.py")
    if spec:  # modules that build their spec dynamically are covered by ansible-doc parsing alone
        assert documented == spec, f"documented {sorted(documented)} vs argument_spec {sorted(spec)}"
    assert "supports_check_mode=True" in (REPO / "library" / f"{name}.py").read_text()
