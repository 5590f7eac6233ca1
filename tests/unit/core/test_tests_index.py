"""tests/README.md's table says where each phase's tests are (issue 33: tests findable from the package they
test). Every test file (``test_*.py``) under tests/ is named by exactly one row, directly or through its
``unit/<package>/`` folder, and every path the table names exists."""

from __future__ import annotations

import re
from pathlib import Path

TESTS = Path(__file__).resolve().parents[2]
README = TESTS / "README.md"


def _rows() -> list[tuple[str, list[str]]]:
    rows = []
    for line in README.read_text(encoding="utf-8").splitlines():
        if not line.startswith("| ") or line.startswith("| phase") or line.startswith("|---"):
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows.append((cells[0], re.findall(r"`([a-z_]+/[^`]*)`", " ".join(cells[1:]))))
    return rows


def _test_files() -> set[str]:
    return {
        p.relative_to(TESTS).as_posix()
        for p in TESTS.rglob("test_*.py")
        if ".artifacts" not in p.parts and "__pycache__" not in p.parts
    }


def _covered(name: str, row_paths: list[str]) -> bool:
    return any(name == p or (p.endswith("/") and name.startswith(p)) for p in row_paths)


def test_the_table_has_a_row_a_phase():
    phases = [r[0].split(" (")[0] for r in _rows()]
    assert phases[:12] == [
        "storage", "container", "services", "runtime", "sglang", "regenerate", "prepare", "extract", "gpu_free",
        "train", "serve", "benchmark",
    ]  # fmt: skip


def test_every_test_file_is_in_exactly_one_row():
    rows = _rows()
    missing, twice = [], {}
    for name in sorted(_test_files()):
        where = [phase for phase, paths in rows if _covered(name, paths)]
        if not where:
            missing.append(name)
        elif len(where) > 1:
            twice[name] = where
    assert not missing, f"test files in no row of tests/README.md: {missing}"
    assert not twice, f"test files in more than one row of tests/README.md: {twice}"


def test_every_path_the_table_names_exists():
    gone = [p for _, paths in _rows() for p in paths if not (TESTS / p).exists()]
    assert not gone, f"tests/README.md names paths that do not exist: {gone}"
