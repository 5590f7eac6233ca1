"""What a new user reads says what the code does (issue #32): the README's phase table is site.yml's phases in
site.yml's order, no inventory or doc calls a phase that is on main "the branch's phase", and an error message
that names a file or a variable names one that exists."""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from eagle3ops.sglang import versions as sglang_versions

REPO = Path(__file__).resolve().parents[3]
PKG = REPO / "python"


def _site_tags() -> list[str]:
    return [
        t for play in yaml.safe_load((REPO / "site.yml").read_text()) for t in play["tags"] if t != "always"
    ]


def test_the_readme_phase_table_is_site_yml_in_order():
    text = (REPO / "README.md").read_text()
    table = text.split("## Phases (tags)", 1)[1].split("\n\n", 2)[1]
    rows = [ln for ln in table.splitlines() if ln.startswith("| `")]
    tags = [t for ln in rows for t in re.findall(r"`(\w+)`", ln.split("|")[1])]
    assert tags == _site_tags()


def test_no_phase_is_called_a_branch_that_is_not_on_main():
    stale = re.compile(r"branch's phase|until that role is on main|phase of the `\w+` branch", re.I)
    files = [*REPO.glob("inventory/**/*.yml"), *REPO.glob("docs/*.md"), REPO / "README.md",
             *REPO.glob("roles/*/README.md")]  # fmt: skip
    hits = [f"{f.relative_to(REPO)}: {m.group(0)}" for f in files for m in stale.finditer(f.read_text())]
    assert not hits
    for tag in _site_tags():  # every phase site.yml imports has its role, of the same name
        assert (REPO / "roles" / tag / "tasks" / "main.yml").is_file(), tag


def test_the_unknown_sglang_version_message_names_files_and_a_variable_that_exist():
    msg = sglang_versions.unknown_message("0.5.99")
    files = re.findall(r"eagle3ops/[\w/]+\.py", msg)
    assert files and all((PKG / f).is_file() for f in files), files
    (var,) = re.findall(r"Set (\w+) ", msg)
    defaults = yaml.safe_load((REPO / "roles" / "eagle3ops" / "defaults" / "main.yml").read_text())
    assert var in defaults, f"{var} is no variable a user sets (the shared one is eagle3ops_sglang_version)"
