"""Every module in library/ documents itself: ansible-doc parses DOCUMENTATION/EXAMPLES/RETURN, the documented
options are exactly the argument_spec's with the same type, default, choices and required flag, and check mode
is declared."""

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


def _literal(node):
    """A spec value: a literal, or dict(...) with literal keyword arguments (both spellings are in use)."""
    if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "dict" and not node.args:
        return {kw.arg: _literal(kw.value) for kw in node.keywords}
    if isinstance(node, ast.Dict):
        return {_literal(k): _literal(v) for k, v in zip(node.keys, node.values, strict=True)}
    return ast.literal_eval(node)


def _argument_spec(path: Path) -> dict:
    """The module's AnsibleModule(argument_spec=...) (inline, or a module-level name), evaluated from the AST."""
    tree = ast.parse(path.read_text())
    names = {
        t.id: n.value
        for n in ast.walk(tree)
        if isinstance(n, ast.Assign)
        for t in n.targets
        if isinstance(t, ast.Name)
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "AnsibleModule":
            for kw in node.keywords:
                if kw.arg == "argument_spec":
                    v = names.get(kw.value.id, kw.value) if isinstance(kw.value, ast.Name) else kw.value
                    return _literal(v)
    raise AssertionError(f"{path}: no AnsibleModule(argument_spec=...) found")


def module_docs(path: Path) -> tuple[dict, dict]:
    """A library/ module's DOCUMENTATION, EXAMPLES and RETURN (each YAML, read from its source; all three must be
    there) and its argument_spec, for the per-module tests that check more than this file does."""
    docs = {
        n.targets[0].id: yaml.safe_load(n.value.value)
        for n in ast.parse(path.read_text()).body
        if isinstance(n, ast.Assign)
        and getattr(n.targets[0], "id", "") in ("DOCUMENTATION", "EXAMPLES", "RETURN")
    }
    assert set(docs) == {"DOCUMENTATION", "EXAMPLES", "RETURN"}, f"{path}: {sorted(docs)}"
    return docs, _argument_spec(path)


def _ansible_doc(*names: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(Path(sys.executable).with_name("ansible-doc")), "-M", str(REPO / "library"), "--json", *names],
        capture_output=True,
        text=True,
        cwd=REPO,
    )


@pytest.fixture(scope="module")
def all_docs() -> dict:
    """ansible-doc's JSON for every module at once (one ansible-doc process, ~0.6 s of CPU, instead of one per
    module); empty when any of them fails to parse: each test then asks for its own module alone, so the one
    that fails says why."""
    p = _ansible_doc(*MODULES)
    return json.loads(p.stdout) if p.returncode == 0 else {}


@pytest.mark.parametrize("name", MODULES)
def test_ansible_doc_parses_and_options_match(name, all_docs):
    if name in all_docs:
        doc = all_docs[name]
    else:
        p = _ansible_doc(name)
        assert p.returncode == 0, p.stderr[-2000:]
        doc = json.loads(p.stdout)[name]
    assert doc["doc"]["short_description"] and doc["examples"] and doc["return"] is not None
    yaml.safe_load(doc["examples"])
    options = doc["doc"].get("options") or {}
    spec = _argument_spec(REPO / "library" / f"{name}.py")
    assert set(options) == set(spec), f"documented {sorted(options)} vs argument_spec {sorted(spec)}"
    for opt, s in spec.items():
        d = options[opt]
        want = (s.get("type", "str"), s.get("default"), s.get("choices"), bool(s.get("required")))
        got = (d.get("type", "str"), d.get("default"), d.get("choices"), bool(d.get("required")))
        assert want == got, f"{name}.{opt}: argument_spec {want} vs DOCUMENTATION {got}"
    assert "supports_check_mode=True" in (REPO / "library" / f"{name}.py").read_text()
