"""Issue 33: every list of a phase's options outside its definition is generated. ``make options``
(:mod:`eagle3ops.option_render`) writes, between marker comments, the module DOCUMENTATION options, the doc
fragments' options, each phase role's ``defaults/main.yml`` and ``meta/argument_specs.yml`` entries, the
``param: "{{ var }}"`` lines of the role tasks that pass every variable of a module, the variable table of each
such role's README, and the bounds table of
``roles/eagle3ops/vars/main.yml``. These tests fail when a block differs from what ``make options`` would write
(run it), and when a module or role the definitions name has no block."""

from __future__ import annotations

import argparse
import ast
import difflib
import sys
from pathlib import Path

import pytest
import yaml
from eagle3ops import option_render, options

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from options_defs import CLI_COMMANDS, COMMANDS, _real_parsers

REPO = option_render.REPO
STALE = option_render.stale()
RUN = "run `make options` (python -m eagle3ops.option_render) and commit what it rewrites"


@pytest.mark.parametrize("path", option_render.files(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_generated_block_is_what_make_options_writes(path):
    if path in STALE:
        diff = "\n".join(
            difflib.unified_diff(
                path.read_text().splitlines(),
                STALE[path].splitlines(),
                "now",
                "make options",
                lineterm="",
                n=1,
            )
        )
        pytest.fail(f"{path.relative_to(REPO)} differs from its definitions: {RUN}\n{diff}")


def _keys() -> set:
    return {(str(p.relative_to(REPO)), key) for p, key in option_render.blocks()}


def test_every_module_and_role_of_a_definition_has_its_blocks():
    """A module documents its options in a generated block; a role with variables from a definition has them in
    its generated defaults and argument_specs; the fragments and the bounds table are generated."""
    keys = _keys()
    want = {(f"library/{m}.py", f"doc {m}") for m in {c.module for c in option_render.commands() if c.module}}
    for role in {c.role for c in option_render.commands() if c.role}:
        if option_render.role_variables(role):
            want |= {
                (f"roles/{role}/defaults/main.yml", f"defaults {role}"),
                (f"roles/{role}/meta/argument_specs.yml", f"argument_specs {role}"),
                (f"roles/{role}/README.md", f"readme {role}"),
            }
    want |= {("doc_fragments/eagle3ops.py", f"fragment {name}") for name in option_render.FRAGMENTS}
    want |= {("roles/eagle3ops/vars/main.yml", "bounds")}
    missing = sorted(want - keys)
    assert not missing, f"no generated block (add its markers, then {RUN}): {missing}"


def test_each_block_is_in_its_own_kind_of_file():
    where = {"doc": "library/", "fragment": "doc_fragments/", "defaults": "/defaults/main.yml",
             "argument_specs": "/meta/argument_specs.yml", "task": "/tasks/", "readme": "/README.md", "bounds": "roles/eagle3ops/vars/",
             "sglang_versions": "/meta/argument_specs.yml", "sglang_default": "roles/eagle3ops/defaults/main.yml",
             "returns": "library/"}  # fmt: skip
    wrong = [(f, k) for f, k in _keys() if where[k.split()[0]] not in f]
    assert not wrong, wrong


def test_a_changed_definition_makes_its_blocks_stale(monkeypatch):
    """The check can fail: a definition's default changed without `make options` shows in every copy."""
    from eagle3ops.extract import options as extract

    o = extract.EXTRACT.option("max_batch_tokens")
    monkeypatch.setattr(o, "default", 4096)
    monkeypatch.setattr(o, "module_default", 4096)
    stale = {str(p.relative_to(REPO)) for p in option_render.stale()}
    assert {
        "library/eagle3ops_extract.py",
        "roles/extract/defaults/main.yml",
        "roles/extract/meta/argument_specs.yml",
    } <= stale, stale


def test_a_new_sglang_version_reaches_every_version_choice(monkeypatch):
    """Adding a version to the table (and making it the default) is all a role's version variable needs: the
    blocks of sglang_version and eagle3ops_sglang_version (no option definition holds them) are stale until
    `make options` lists it; no role file names a version by hand."""
    from eagle3ops.sglang import versions

    monkeypatch.setattr(versions, "KNOWN", (*versions.KNOWN, "0.5.99"))
    monkeypatch.setattr(versions, "DEFAULT_VERSION", "0.5.99")
    stale = {str(p.relative_to(REPO)) for p in option_render.stale()}
    assert {
        "roles/sglang/meta/argument_specs.yml",
        "roles/eagle3ops/meta/argument_specs.yml",
        "roles/eagle3ops/defaults/main.yml",
    } <= stale, stale
    text = (REPO / "roles/sglang/meta/argument_specs.yml").read_text()
    assert "choices: [" + ", ".join(versions.KNOWN) + "]" in option_render.rewrite(text)
    assert 'default: "0.5.99"' in option_render.rewrite(text)
    defaults = option_render.rewrite((REPO / "roles/eagle3ops/defaults/main.yml").read_text())
    assert yaml.safe_load(defaults)["eagle3ops_sglang_version"] == "0.5.99"


def test_the_text_outside_the_markers_is_kept():
    text = "a: 1\n# BEGIN generated by make options (eagle3ops.option_render): bounds -- do not edit\nstale line\n# END generated: bounds\nb: 2\n"
    new = option_render.rewrite(text)
    assert (
        new.startswith("a: 1\n")
        and new.endswith("# END generated: bounds\nb: 2\n")
        and "stale line" not in new
    )
    assert "eagle3ops_option_bounds" in yaml.safe_load(new)


def test_a_block_without_its_end_marker_is_refused():
    with pytest.raises(ValueError, match="no end marker"):
        option_render.rewrite(
            "# BEGIN generated by make options (eagle3ops.option_render): bounds -- do not edit\n"
        )


def test_the_check_command_names_make_options(capsys, monkeypatch):
    monkeypatch.setattr(option_render, "stale", lambda: {REPO / "Makefile": ""})
    assert option_render.main(["--check"]) == 1
    assert "make options" in capsys.readouterr().err


# ---- one description per option: every copy is rendered from the definition's doc ---------------------------
def _documentation(module: str) -> dict:
    """{parameter: description} of a module's DOCUMENTATION as the file holds it (read statically, as ansible-doc)."""
    tree = ast.parse((REPO / "library" / f"{module}.py").read_text())
    (text,) = [
        n.value.value
        for n in tree.body
        if isinstance(n, ast.Assign)
        and [t.id for t in n.targets if isinstance(t, ast.Name)] == ["DOCUMENTATION"]
    ]
    return {p: d["description"] for p, d in (yaml.safe_load(text).get("options") or {}).items()}


def _text(description) -> str:
    return " ".join(description) if isinstance(description, list) else description


def test_no_option_has_a_second_description():
    """An option is described once (``doc``): the former ``help`` (CLI) and ``role_doc`` (argument_specs) copies
    are refused, and every option of every definition has a description of its own."""
    for field in ("help", "role_doc"):
        with pytest.raises(TypeError):
            options.Option("x", **{field: "a second description"})
    missing = []
    for cmd in option_render.commands():
        for o in cmd.options:
            paragraphs = o.doc if isinstance(o.doc, (list, tuple)) else [o.doc]
            if not paragraphs or not all(isinstance(p, str) and p.strip() for p in paragraphs):
                missing.append(f"{cmd.full_name} {o.name}")
    assert not missing, f"options without a description (doc): {missing}"


@pytest.mark.parametrize("name", CLI_COMMANDS)
def test_the_cli_help_is_the_module_documentation(name):
    """``eagle3ops <command> --help`` says of each option what the module's DOCUMENTATION (the file, as committed)
    says, as plain text: a help or a documentation that drifted from the other fails here."""
    cmd = COMMANDS[name]
    documented = _documentation(cmd.module) if cmd.module else {}
    flags = {key: o.flag for o in cmd.options if o.cli for key in (o.name, o.param) if key}
    helps = {a.dest: (a.help or "").replace("%%", "%") for a in _real_parsers()[name]._actions}
    checked = 0
    for o in cmd.options:
        if not o.cli:
            continue
        source = _text(option_render.doc_of(o))  # a CLI-only option: its definition
        if o.param in documented and option_render.module_options(cmd.module)[o.param].doc == o.doc:
            source = _text(documented[o.param])  # a command of several of one module has its own text
        want = options.plain(source, flags)
        want = want[:-1] if want.endswith(".") and not want.endswith("...") else want
        assert helps[o.name].startswith(want), (
            f"eagle3ops {name} {o.flag}: --help {helps[o.name]!r}, doc {want!r}"
        )
        checked += 1
    assert checked == len([o for o in cmd.options if o.cli])


def test_a_changed_description_reaches_every_copy(monkeypatch):
    """One edit of a definition's ``doc`` is all it takes: the module documentation, the role's argument_specs,
    defaults comment and README row are stale until ``make options``, and ``--help`` says the new text (with the
    option it names as the CLI flag there, as the role variable in the role's copies)."""
    from eagle3ops.extract import options as extract

    o = extract.EXTRACT.option("disk_margin_mib")
    monkeypatch.setattr(o, "doc", "Free space kept besides O(margin), in MiB (a new description).")
    stale = option_render.stale()
    assert {
        "doc_fragments/eagle3ops.py",  # the extraction modules' shared options
        "roles/extract/meta/argument_specs.yml",
        "roles/extract/defaults/main.yml",
        "roles/extract/README.md",
    } <= {str(p.relative_to(REPO)) for p in stale}
    specs = stale[REPO / "roles/extract/meta/argument_specs.yml"]
    assert "besides O(extract_margin), in MiB (a new description)." in " ".join(specs.split())
    parser = argparse.ArgumentParser()
    extract.EXTRACT.add_parser(parser.add_subparsers())
    (action,) = [
        a
        for p in parser._subparsers._group_actions[0].choices.values()
        for a in p._actions
        if a.dest == "disk_margin_mib"
    ]
    assert action.help.startswith("Free space kept besides --margin, in MiB (a new description)")
