"""Run ansible-core's own ``validate-modules`` sanity validator over ``library/`` (part of ``make lint``).

``ansible-test sanity --test validate-modules`` needs a collection layout and bootstraps a venv with a pip
script it downloads from a host this project's machines cannot reach; the validator itself ships inside the
``ansible-test`` package. So this script lays out a throwaway collection copy in a temporary directory
(``ansible_collections/eagle3ops/pipeline/plugins/{modules,module_utils,doc_fragments}``, imports of our module_utils
and the doc fragments' names rewritten to the collection's, a ``galaxy.yml``) and runs that validator on it with the pinned ``voluptuous`` and
``antsibull-docs-parser`` of requirements/control.txt, in this venv. Exit 0 when clean, 1 with the findings.

Ignored, with the reason (the same thing a collection's ``tests/sanity/ignore-2.19.txt`` would say):
``missing-gplv3-license`` — eagle3ops is Apache-2.0 (pyproject.toml); the GPLv3 header is ansible-core's own rule.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import ansible_test

ROOT = Path(__file__).resolve().parents[2]
NS, NAME, VERSION = "eagle3ops", "pipeline", "0.1.0"
IGNORED = {"missing-gplv3-license": "eagle3ops is Apache-2.0; the GPLv3 header rule is ansible-core's own"}
_IMPORT = re.compile(r"\bansible\.module_utils\.(eagle3ops_\w+)")
# ``extends_documentation_fragment`` items (doc_fragments/, by short name) become the collection's FQCNs
_FRAGMENTS = re.compile(r"^extends_documentation_fragment:\n(?:  - .+\n)+", re.M)
_FRAGMENT = re.compile(r"^(  - )(\S+)$", re.M)


def layout(base: Path) -> Path:
    coll = base / "ansible_collections" / NS / NAME
    (coll / "plugins" / "modules").mkdir(parents=True)
    (coll / "plugins" / "module_utils").mkdir(parents=True)
    (coll / "plugins" / "doc_fragments").mkdir(parents=True)
    (coll / "meta").mkdir()
    for src, sub in (
        (ROOT / "library", "modules"),
        (ROOT / "module_utils", "module_utils"),
        (ROOT / "doc_fragments", "doc_fragments"),
    ):
        for f in sorted(src.glob("*.py")):
            text = _IMPORT.sub(rf"ansible_collections.{NS}.{NAME}.plugins.module_utils.\1", f.read_text())
            text = _FRAGMENTS.sub(lambda m: _FRAGMENT.sub(rf"\1{NS}.{NAME}.\2", m[0]), text)
            (coll / "plugins" / sub / f.name).write_text(text)
    (coll / "galaxy.yml").write_text(
        f"namespace: {NS}\nname: {NAME}\nversion: {VERSION}\nreadme: README.md\nauthors: [eagle3ops]\n"
    )
    (coll / "README.md").write_text("throwaway copy for validate-modules\n")
    (coll / "meta" / "runtime.yml").write_text('requires_ansible: ">=2.19.0"\n')
    return coll


def main() -> int:
    validator = Path(ansible_test.__file__).parent / "_util/controller/sanity/validate-modules"
    with tempfile.TemporaryDirectory(prefix="e3o-validate-") as tmp:
        coll = layout(Path(tmp))
        modules = sorted(str(p.relative_to(coll)) for p in (coll / "plugins" / "modules").glob("*.py"))
        r = subprocess.run(
            [sys.executable, str(validator / "validate.py"), "--format", "json", "--arg-spec",
             "--collection", f"ansible_collections/{NS}/{NAME}", "--collection-version", VERSION, *modules],
            cwd=coll, capture_output=True, text=True,
            env={"PYTHONPATH": f"{validator}:{tmp}", "PATH": str(Path(sys.executable).parent) + ":/usr/bin:/bin",
                 "ANSIBLE_COLLECTIONS_PATH": tmp},
        )  # fmt: skip
        if r.returncode not in (0, 3) or not r.stdout.strip():
            print(f"validate-modules did not run (exit {r.returncode}):\n{r.stderr[-3000:]}", file=sys.stderr)
            return 1
        found = json.loads(r.stdout)
        shutil.rmtree(coll / "plugins" / "modules" / "__pycache__", ignore_errors=True)
    problems = []
    for path, res in sorted(found.items()):
        for e in res.get("errors", []):
            if e["code"] in IGNORED:
                continue
            problems.append(f"library/{Path(path).name}: {e['code']}: {e['msg']}")
    for p in problems:
        print(p)
    print(f"validate-modules: {len(modules)} modules, {len(problems)} problems "
          f"(ignored: {', '.join(IGNORED)})")  # fmt: skip
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
