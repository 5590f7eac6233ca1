"""Shared by the tests of library/'s modules (tests/unit/core/test_module_docs.py, test_names.py, test_options.py,
test_role_argument_specs.py, gpu_free/test_gpu_free_cli.py, host/test_pve_cli.py): the modules, their documentation as
ansible-doc renders it, and the keyword arguments their main() gives AnsibleModule."""

from __future__ import annotations

import ast
import functools
import json
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
# the modules; a symlink in library/ is an old name of the module it points at (tests/unit/core/test_names.py)
MODULES = sorted(p.stem for p in (REPO / "library").glob("*.py") if not p.is_symlink())


# Run in a child interpreter: importing ansible.module_utils.basic here would patch sys.intern for every later
# test of this xdist worker (see tests/unit/core/test_role_argument_specs.py).
_CAPTURE = """
import importlib.util, json, sys
import ansible.module_utils
ansible.module_utils.__path__.append(sys.argv[1])  # ansible.module_utils.eagle3ops_* as Ansiballz ships them
import ansible.module_utils.basic as basic


class Captured(Exception):
    pass


class Capture:
    def __init__(self, *args, **kwargs):
        raise Captured(kwargs)


basic.AnsibleModule = Capture
out = {}
for path in sys.argv[2:]:
    spec = importlib.util.spec_from_file_location("library_" + path.rsplit("/", 1)[1][:-3], path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    try:
        mod.main()
    except Captured as c:
        out[path] = c.args[0]
    else:
        raise SystemExit(f"{path}: main() did not build an AnsibleModule")
print(json.dumps(out, default=list))
"""


@functools.cache
def _captured() -> dict:
    """{library/x.py: the keyword arguments its main() gives AnsibleModule}: what the module really passes,
    whether written out or built from a definition (the way ansible-test's validate-modules reads it)."""
    paths = [str(REPO / "library" / f"{name}.py") for name in MODULES]
    return _json_of([sys.executable, "-c", _CAPTURE, str(REPO / "module_utils"), *paths])


def _json_of(argv: list[str]):
    """The JSON a child process prints (run in the repository, so ansible.cfg applies); its stderr on a failure."""
    r = subprocess.run(argv, capture_output=True, text=True, check=False, cwd=REPO)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout)


def module_kwargs(path: Path) -> dict:
    """The keyword arguments of the module's AnsibleModule(...) call (argument_spec, mutually_exclusive, ...)."""
    return _captured()[str(path)]


def _argument_spec(path: Path) -> dict:
    """The module's argument_spec as its main() passes it to AnsibleModule."""
    return module_kwargs(path)["argument_spec"]


def module_docs(path: Path) -> tuple[dict, dict]:
    """A library/ module's DOCUMENTATION, EXAMPLES and RETURN (each YAML, read from its source; all three must be
    there; the DOCUMENTATION's options with its doc fragments' merged in, as ansible-doc renders them) and its
    argument_spec, for the per-module tests that check more than this file does."""
    docs = {
        n.targets[0].id: yaml.safe_load(n.value.value)
        for n in ast.parse(path.read_text()).body
        if isinstance(n, ast.Assign)
        and getattr(n.targets[0], "id", "") in ("DOCUMENTATION", "EXAMPLES", "RETURN")
    }
    assert set(docs) == {"DOCUMENTATION", "EXAMPLES", "RETURN"}, f"{path}: {sorted(docs)}"
    if docs["DOCUMENTATION"].get("extends_documentation_fragment"):
        docs["DOCUMENTATION"]["options"] = ansible_doc()[path.stem]["doc"]["options"]
    return docs, _argument_spec(path)


@functools.cache
def ansible_doc() -> dict:
    """{module: what ``ansible-doc --json`` renders for it} for every module in library/ (doc fragments merged,
    through ansible.cfg's doc_fragment_plugins), one ansible-doc run for all."""
    return _json_of(
        [str(Path(sys.executable).with_name("ansible-doc")), "-M", str(REPO / "library"), "--json", *MODULES]
    )
