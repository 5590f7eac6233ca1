"""No task registers its result under the name of a role variable.

A registered result outranks inventory variables and role defaults, so such a task silently replaces the
variable for every later task of the play. Found live on 2026-12-02: the serve role's stat of the SGLang
interpreter was registered as ``serve_sglang_python``; when ``serve_server_enabled`` is true the stat is skipped,
and the server command became ``[{'skipped': True, ...}, '-m', 'sglang.launch_server', ...]``.
"""

from __future__ import annotations

from pathlib import Path

import yaml
from role_tasks import each_task

ROLES = Path(__file__).resolve().parents[3] / "roles"


def _role_variables() -> dict[str, str]:
    names: dict[str, str] = {}
    for role in sorted(p for p in ROLES.iterdir() if p.is_dir()):
        defaults = role / "defaults" / "main.yml"
        if defaults.exists():
            for k in yaml.safe_load(defaults.read_text()) or {}:
                names[k] = f"{role.name}/defaults/main.yml"
        specs = role / "meta" / "argument_specs.yml"
        if specs.exists():
            for ep in (yaml.safe_load(specs.read_text()) or {}).get("argument_specs", {}).values():
                for k in ep.get("options", {}):
                    names.setdefault(k, f"{role.name}/meta/argument_specs.yml")
    return names


def test_no_register_shadows_a_role_variable():
    variables = _role_variables()
    assert "serve_sglang_python" in variables  # the scan sees the role variables at all
    clashes = []
    registered = 0
    for path in sorted(ROLES.glob("*/tasks/*.yml")) + sorted(ROLES.glob("*/handlers/*.yml")):
        for task in each_task(yaml.safe_load(path.read_text())):
            name = task.get("register")
            if name:
                registered += 1
                if name in variables:
                    clashes.append(
                        f"{path.relative_to(ROLES)}: register {name} (a variable of {variables[name]})"
                    )
    assert registered > 20  # the walk reaches the tasks, blocks included
    assert not clashes, "\n".join(clashes)


def test_a_skippable_task_does_not_register_a_name_an_earlier_task_of_its_file_registered():
    """A skipped task registers too (``{skipped: true}``): a task with a ``when`` that registers the name of an
    earlier task's result in the same tasks file replaces that result whenever it is skipped. Found by issue 32:
    the extract role's wait for a sharded run registered ``extract_result`` again, so on one host the report read
    the skipped wait and said "nothing to extract: 0 of 867 rows already in the manifests" after extracting all
    867 (and "866 of 867" after re-extracting one lost file). Files included by a ``when`` of their own (the
    backends' sglang.yml / transformers.yml, runtime's controller / venv branches) are alternatives, not
    checked against each other."""
    clashes = []
    files = 0
    for path in sorted(ROLES.glob("*/tasks/*.yml")) + sorted(ROLES.glob("*/handlers/*.yml")):
        files += 1
        seen: dict[str, str] = {}
        for task in each_task(yaml.safe_load(path.read_text())):
            name = task.get("register")
            if not name:
                continue
            if name in seen and task.get("when"):
                clashes.append(f"{path.relative_to(ROLES)}: {task.get('name')!r} registers {name} again")
            seen.setdefault(name, task.get("name"))
    assert files > 30  # the walk reaches every role's tasks
    assert not clashes, "\n".join(clashes)
