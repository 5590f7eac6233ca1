"""What a new user reads says what the code does (issue #32): the README's phase table is site.yml's phases in
site.yml's order, no inventory or doc calls a phase that is on main "the branch's phase", an error message
that names a file or a variable names one that exists, and every test a doc names exists."""

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


_TEST_REF = re.compile(r"(tests/[\w/]+\.py)?::(test_\w+|Test\w+)")


def _named_tests(text: str) -> list[tuple[int, str, str]]:
    """(line, file, test) of every ``tests/...py::name`` in ``text``; a bare ``::name`` after one on the same line
    is in that file (docs/known-pains.md lists several tests of one file that way)."""
    out = []
    for no, line in enumerate(text.splitlines(), 1):
        path = None
        for m in _TEST_REF.finditer(line):
            path = m.group(1) or path
            if path:
                out.append((no, path, m.group(2)))
    return out


def test_the_tests_the_docs_name_exist():
    # a test moved to another file, or renamed, leaves the docs pointing at nothing (docs/reliability.md named the
    # regenerate kill test in test_regenerate.py after it had moved to test_regenerate_output.py)
    files = [
        *REPO.glob("docs/*.md"),
        REPO / "README.md",
        REPO / "tests" / "README.md",
        *REPO.glob("roles/*/README.md"),
    ]
    named = [(f, *ref) for f in files for ref in _named_tests(f.read_text())]
    assert len(named) > 50  # the reliability table and docs/known-pains.md alone name more
    missing = []
    for f, no, path, test in named:
        src = REPO / path
        text = src.read_text() if src.is_file() else ""
        if not re.search(rf"^\s*(async def|def|class) {test}\b", text, re.M):
            missing.append(f"{f.relative_to(REPO)}:{no}: {path}::{test}")
    assert not missing, "\n".join(missing)


def test_the_layout_docs_name_what_is_there():
    """The README's Layout names every top-level folder the repository holds, each one that exists; the tree in
    docs/architecture.md "Where the logic lives" names every package and module of python/eagle3ops (the
    fixture's remote-code files aside) and no folder that is gone."""
    readme = (REPO / "README.md").read_text().split("## Layout", 1)[1]
    named = set(re.findall(r"`([\w.-]+)/", readme))
    folders = {p.name for p in REPO.iterdir() if p.is_dir() and not p.name.startswith(".")}
    tracked = folders - {"build", "work"} - {p.name for p in REPO.iterdir() if p.name.endswith(".egg-info")}
    assert tracked <= named, f"README Layout: {sorted(tracked - named)} not named"
    assert named <= folders | {"tests/unit", "bench/results"}, (
        f"README Layout: {sorted(named - folders)} gone"
    )
    text = (REPO / "docs/architecture.md").read_text()
    tree = text[text.index("```\npython/eagle3ops/") :]
    tree = tree[: tree.index("```", 4)]
    words = set(re.findall(r"\w+", tree))
    pkg = PKG / "eagle3ops"
    modules = {p.stem for p in pkg.rglob("*.py") if p.name != "__init__.py" and "remote" not in p.parts}
    packages = {p.parent.name for p in pkg.rglob("__init__.py") if p.parent != pkg} | {"templates"}
    assert not (modules | packages) - words, (
        f"docs/architecture.md's tree: {sorted((modules | packages) - words)}"
    )
    listed = set(re.findall(r"^  (\w+)/ ", tree, flags=re.M))
    assert listed <= packages, f"docs/architecture.md's tree: {sorted(listed - packages)} are gone"
