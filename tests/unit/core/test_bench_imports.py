"""No import circle among the scripts of bench/ (they import each other by their file names, e.g.
``import sglang_live as L``): every import counts, also one inside a function, read from the source. The live
harness's shared parts are bench/sglang_live.py, which imports none of the scripts built on it."""

from __future__ import annotations

import ast
from pathlib import Path

BENCH = Path(__file__).resolve().parents[3] / "bench"


def imports_of(path: Path, names: set) -> set:
    """The bench modules ``path`` imports (anywhere in it)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module.split(".")[0])
    return out & names - {path.stem}


def circles(graph: dict) -> list:
    """Each import circle of ``graph`` ({module: modules it imports}) once, as the path around it."""
    found, done = [], set()

    def visit(mod, path):
        if mod in path:
            cycle = path[path.index(mod) :]
            if frozenset(cycle) not in done:
                done.add(frozenset(cycle))
                found.append([*cycle, mod])
            return
        for nxt in sorted(graph.get(mod, ())):
            visit(nxt, [*path, mod])

    for mod in sorted(graph):
        visit(mod, [])
    return found


def test_circles_finds_a_circle():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_bench_has_no_import_circle():
    files = sorted(BENCH.glob("*.py"))
    names = {p.stem for p in files}
    graph = {p.stem: imports_of(p, names) for p in files}
    assert "sglang_live" in graph["sglang_live_smol"]  # the reading sees the imports it must
    assert circles(graph) == [], circles(graph)
