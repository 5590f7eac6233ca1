"""What may import what in ``python/eagle3ops`` (docs/architecture.md, "What may import what"), and no import circle.

- A phase package (``eagle3ops.<phase>``) imports its own modules and the shared ones (the top-level modules:
  ``store``, ``durable``, ``options``, ``runlock``, ``conversations``, ``checkpoints``, ...), never another
  phase's, except the edges declared below with their reason (one module's, or a whole package's).
- A shared module imports no phase (``eagle3ops.sglang_hook``, the import path the patched SGLang file holds, is
  the declared exception: it only re-exports its phase's module).
- Only the entry point (``python -m eagle3ops``) imports ``eagle3ops.cli``; only command modules (those that
  ``register`` sub-commands) import command modules: the logic never imports upward.
- The host wing's rule (standard library only) is tests/unit/core/test_durable.py's.

Every import counts, also one inside a function (read from the source, not from an import at run time).
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[3] / "python" / "eagle3ops"
PHASES = ("benchmark", "extract", "gpu_free", "prepare", "regenerate", "serve", "sglang", "train")
# (importing module, imported module): why the one phase may use the other's
DECLARED = {
    (
        "eagle3ops.train.run",
        "eagle3ops.gpu_free.check",
    ): "train runs the gpu_free check before it launches on GPUs",
    (
        "eagle3ops.serve.convert",
        "eagle3ops.train.specforge",
    ): "serve converts a SpecForge run's checkpoint, whose layout (its inputs, checkpoint link, exporter) the train "
    "phase's SpecForge backend owns",
    (
        "eagle3ops.serve.draft_bytes",
        "eagle3ops.train.specforge",
    ): "the serve phase's memory preflight weighs a SpecForge run's newest checkpoint, whose layout the train "
    "phase's SpecForge backend owns (as for its conversion)",
    (
        "eagle3ops.tools.memory_fit",
        "eagle3ops.serve.draft_bytes",
    ): "memory-fit --draft weighs the serve phase's draft the way the serve phase will write it, before it is "
    "converted",
    (
        "eagle3ops.tools.layer_ids",
        "eagle3ops.sglang.versions",
    ): "layer-ids --sglang-version answers the version's capture flags for the ids (the sglang role's unit takes "
    "them from it instead of a copy of the version table)",
    (
        "eagle3ops.option_render",
        "eagle3ops.extract.returns",
    ): "make options writes the RETURN entries both extraction modules share into each (a build tool reading "
    "the definitions, as it reads every phase's options by name)",
    (
        "eagle3ops.serve.process",
        "eagle3ops.sglang.server",
    ): "a served process's health wait is the SGLang server's (poll_health): one /health wait for the capture "
    "server and the served one, each phase saying its own error",
    (
        "eagle3ops.option_render",
        "eagle3ops.sglang.versions",
    ): "make options writes the version table's keys into the choices of the version variables no option "
    "definition holds",
    (
        "eagle3ops.serve.tokcheck",
        "eagle3ops.prepare.tokcheck",
    ): "the serve-time tokenizer check is prepare's pointed at the server: one client render of a conversation, "
    "one row render, one first difference",
    (
        "eagle3ops.benchmark.commands",
        "eagle3ops.serve.tokcheck",
    ): "the guard and the live benchmark check the server's tokenizer against the prepared rows before they "
    "measure (serve's check)",
}
# (importing package, imported package or module): every module of the one may use the other, why
DECLARED_PACKAGES = {
    (
        "eagle3ops.sglang",
        "eagle3ops.extract",
    ): "SGLang's package is the extraction's second backend: its client, in-server hook and extract-sglang "
    "command share the extract session with the transformers backend (settings, plan, shards, status and run log, "
    "the writer step and pinned-buffer pool, the store options extract-sglang's definition shares)",
    (
        "eagle3ops.serve",
        "eagle3ops.sglang.versions",
    ): "the SGLang version table: serve's definition and converter take the versions and layer-id rules from it",
}


def _under(dotted: str, name: str) -> bool:
    return dotted == name or dotted.startswith(name + ".")


def _declared(mod: str, target: str) -> bool:
    return (mod, target) in DECLARED or any(
        _under(mod, a) and _under(target, b) for a, b in DECLARED_PACKAGES
    )


# shared-looking modules kept by name for what imports them: {module: the phase's module it re-exports}
ENTRY_POINTS = {
    "eagle3ops.sglang_hook": "eagle3ops.sglang.hook",
}


def _module_name(path: Path, pkg: Path) -> str:
    parts = [p for p in path.relative_to(pkg).with_suffix("").parts if p != "__init__"]
    return ".".join(["eagle3ops", *parts])


def _is_module(dotted: str, pkg: Path) -> bool:
    p = pkg.joinpath(*dotted.split(".")[1:])
    return p.with_suffix(".py").is_file() or (p / "__init__.py").is_file()


@functools.cache
def _parse(text: str) -> ast.Module:
    return ast.parse(text)


def _sources(pkg: Path, extra: dict[str, str]) -> dict[Path, str]:
    """The package's files and their text, ``extra`` ({relative path: text}) added or replacing."""
    out = {p: p.read_text() for p in sorted(pkg.rglob("*.py"))}
    out.update({pkg / rel: text for rel, text in extra.items()})
    return out


def imports(pkg: Path = PKG, extra: dict[str, str] | None = None) -> dict[str, set[tuple[str, int]]]:
    """{module: {(imported eagle3ops module, line)}}: ``from eagle3ops.x import y`` counts as ``eagle3ops.x.y``
    when that is a module, else as ``eagle3ops.x``."""
    out: dict[str, set[tuple[str, int]]] = {}
    for path, text in _sources(pkg, extra or {}).items():
        mod = _module_name(path, pkg)
        found = out.setdefault(mod, set())
        for node in ast.walk(_parse(text)):
            if (
                isinstance(node, ast.ImportFrom)
                and node.level == 0
                and (node.module or "").startswith("eagle3ops")
            ):
                for a in node.names:
                    sub = f"{node.module}.{a.name}"
                    found.add((sub if _is_module(sub, pkg) else node.module, node.lineno))
            elif isinstance(node, ast.Import):
                found |= {(a.name, node.lineno) for a in node.names if a.name.startswith("eagle3ops")}
    return out


def _phase(dotted: str) -> str | None:
    parts = dotted.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in PHASES else None


def _command_modules(pkg: Path, extra: dict[str, str]) -> set[str]:
    """Modules that register sub-commands (a top-level ``register``), and the packages holding them."""
    out = set()
    for path, text in _sources(pkg, extra).items():
        tree = _parse(text)
        if any(isinstance(n, ast.FunctionDef) and n.name == "register" for n in tree.body):
            out.add(_module_name(path, pkg))
    return out | {"eagle3ops.tools"}


def violations(pkg: Path = PKG, extra: dict[str, str] | None = None) -> list[str]:
    """Every import that breaks the rules; ``extra``: files added to the package as it is ({path: text})."""
    bad = []
    commands = _command_modules(pkg, extra or {})
    for mod, found in imports(pkg, extra).items():
        where = mod.replace(".", "/")
        for target, line in sorted(found):
            mine, theirs = _phase(mod), _phase(target)
            if theirs and mine != theirs:
                if mine is None and ENTRY_POINTS.get(mod) == target:
                    continue
                if not _declared(mod, target):
                    who = f"phase {mine}" if mine else "shared module"
                    bad.append(f"{where}.py:{line}: {who} imports {target} (phase {theirs}): not declared")
            if target == "eagle3ops.cli" and mod != "eagle3ops.__main__":
                bad.append(f"{where}.py:{line}: imports eagle3ops.cli (only the entry point may)")
            if target in commands and mod not in commands and mod != "eagle3ops.cli":
                bad.append(
                    f"{where}.py:{line}: imports the command module {target} (logic never imports upward)"
                )
    return bad


def test_phases_use_each_other_only_through_declared_edges_and_shared_modules():
    assert violations() == []


def test_every_declared_edge_and_entry_point_is_still_used():
    """A declaration nobody needs any more goes (else it would hide a new use)."""
    found = imports()
    used = {(m, t) for m, ts in found.items() for t, _ in ts}
    assert set(DECLARED) <= used, sorted(set(DECLARED) - used)
    unused = [e for e in DECLARED_PACKAGES if not any(_under(m, e[0]) and _under(t, e[1]) for m, t in used)]
    assert not unused, unused
    assert set(ENTRY_POINTS.items()) <= used, sorted(set(ENTRY_POINTS.items()) - used)


@pytest.mark.parametrize(
    ("rel", "code", "expected"),
    [
        ("prepare/x.py", "def f():\n    from eagle3ops.extract import session\n", "phase prepare imports"),
        (
            "jsonl2.py",
            "from eagle3ops.train.spec import TrainSpec\n",
            "shared module imports eagle3ops.train.spec",
        ),
        ("store/y.py", "from eagle3ops import cli\n", "imports eagle3ops.cli"),
        (
            "train/z.py",
            "import eagle3ops.train.commands\n",
            "imports the command module eagle3ops.train.commands",
        ),
    ],
)
def test_the_check_can_fail(rel, code, expected):
    """The package with one more file holding a forbidden import (in a function too) is reported, naming the line."""
    bad = violations(extra={rel: code})
    assert len(bad) == 1 and expected in bad[0] and bad[0].startswith(f"eagle3ops/{rel[:-3]}.py:"), bad


def circles(pkg: Path = PKG, extra: dict[str, str] | None = None) -> list[list[str]]:
    """The package's import circles: each set of modules that reach one another through their imports (a
    strongly connected component of more than one module, Tarjan's algorithm), sorted; every import counts, also
    one inside a function."""
    graph = {m: sorted({t for t, _ in found} - {m}) for m, found in imports(pkg, extra).items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(mod: str) -> None:
        index[mod] = low[mod] = len(index)
        stack.append(mod)
        for nxt in graph.get(mod, ()):
            if nxt not in index:
                visit(nxt)
                low[mod] = min(low[mod], low[nxt])
            elif nxt in stack:
                low[mod] = min(low[mod], index[nxt])
        if low[mod] == index[mod]:
            group = []
            while not group or group[-1] != mod:
                group.append(stack.pop())
            if len(group) > 1:
                out.append(sorted(group))

    for mod in sorted(graph):
        if mod not in index:
            visit(mod)
    return sorted(out)


def test_the_package_has_no_import_circle():
    assert circles() == []


def test_a_circle_through_a_function_level_import_is_found():
    """Two modules added to the package that import each other (one inside a function) make one circle."""
    extra = {
        "store/circle_a.py": "from eagle3ops.store.circle_b import f\n",
        "store/circle_b.py": "def f():\n    import eagle3ops.store.circle_a\n",
    }
    assert circles(extra=extra) == [["eagle3ops.store.circle_a", "eagle3ops.store.circle_b"]]
