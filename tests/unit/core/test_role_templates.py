"""Roles only wire (docs/conventions.md): no Jinja statement (``{% if %}``, ``{% for %}``) in a role's tasks or
handlers - a decision or a report's wording lives in Python a unit test reaches (an action plugin, a module's
return) - and every ``eagle3ops_report`` task names a report of action_plugins/eagle3ops_report.py and gives it
only arguments that report takes, with every one it needs."""

from __future__ import annotations

import importlib.util
import inspect

import yaml
from library_docs import REPO
from role_tasks import each_task


def test_no_jinja_statement_in_role_tasks():
    files = sorted(REPO.glob("roles/*/tasks/*.yml")) + sorted(REPO.glob("roles/*/handlers/*.yml"))
    assert len(files) > 30
    found = [
        f"{p.relative_to(REPO)}:{n}: {line.strip()}"
        for p in files
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if "{%" in line
    ]
    assert found == [], "\n".join(found)


def test_every_report_task_fits_its_report():
    spec = importlib.util.spec_from_file_location(
        "eagle3ops_report", REPO / "action_plugins/eagle3ops_report.py"
    )
    plugin = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(plugin)
    seen, bad = set(), []
    for p in sorted(REPO.glob("roles/*/tasks/*.yml")):
        for task in each_task(yaml.safe_load(p.read_text())):
            args = task.get("eagle3ops_report")
            if args is None:
                continue
            where = f"{p.relative_to(REPO)}: {task['name']}"
            words = plugin.REPORTS.get(args.get("report"))
            if words is None:
                bad.append(f"{where}: no report {args.get('report')!r}")
                continue
            seen.add(args["report"])
            params = inspect.signature(words).parameters
            given = set(args) - {"report"} | ({"check_mode"} & set(params))  # the plugin gives check_mode
            needed = {n for n, q in params.items() if q.default is inspect.Parameter.empty}
            if given - set(params) or needed - given:
                bad.append(f"{where}: takes {sorted(params)}, given {sorted(given)}")
    assert bad == [], "\n".join(bad)
    assert seen == set(plugin.REPORTS)  # every report is used, and the walk found the tasks
