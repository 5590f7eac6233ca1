"""One definition per option (issue 19): each phase's ``python/eagle3ops/<phase>/options.py`` is the only place
where an option's name, type, default and choices are written; everything else either comes from it or is
checked against it here.

(a) the CLI is generated: every converted sub-command's parser (through ``eagle3ops.cli.build_parser``, as the
    user gets it) holds exactly the definition's flags, no argument added by hand;
(b) the module runs the definition: the argument_spec its ``main()`` gives AnsibleModule is the definition's;
(c) the module's DOCUMENTATION (as ansible-doc renders it, doc fragments merged) names the same options with
    the same type, elements, default (the module's: ``module_default`` where it differs), choices and required;
(d) the role: each option a role variable feeds is in ``meta/argument_specs.yml`` with the same type (``str``
    and ``path`` alike), elements, choices (the role may offer fewer, or more where an assert or the task's
    ``when`` guards them) and default, and in ``defaults/main.yml`` with that default (the module's, or the
    definition's ``role_default``; a template, pointing at the shared variables of roles/eagle3ops, documents
    it and renders to it with the shared defaults; an empty placeholder only for a required option), and a task
    of the role really passes it to that module parameter;
(e) params -> argv -> the generated parser gives every value back (the runner loses and renames nothing), for
    non-default values, for the defaults, and for a value that starts with ``-``;
(f) check mode is ``--check`` in every command, ``--plan`` still works; older flags (``--allow-unit``,
    ``--gpu-optional``, ...) still work; a renamed flag fails with one line naming the new one, exit 2;
(g) the Python API the commands call (``prepare()``, ``ExtractConfig``, ``TrainSpec``, ``ensure_free()``, ...)
    has the definition's defaults, or a reason beside the one that differs.

Every ``eagle3ops`` sub-command has a definition (checked): prepare, extract (+ sglang-extract, sglang-patch,
verify), regenerate, gpu_free, train, serve (convert, serve-process), benchmark, assets (fetch, convert, sharegpt:
a Group, and one Module), storage (plan, status: a Group), and the tools demo, layer-ids, pve (show, plan). The
host wing's modules that run without eagle3ops (storage, services, container) have module-only definitions
(``cli=False``): (b), (c) and (d) hold them to it.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import re
import sys
from pathlib import Path

import pytest
from eagle3ops import cli, options

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "module_utils"))
import eagle3ops_cli  # the runner as the modules use it (stdlib only, importable as a plain file)
from test_module_docs import _argument_spec, ansible_doc
from test_role_argument_specs import (
    PASS_THROUGH,
    _asserted,
    _defaults,
    _module_calls,
    _options,
    _templated,
    rendered,
)

REPO = Path(__file__).resolve().parents[2]
PKG = REPO / "python" / "eagle3ops"
DEFINITIONS = sorted(p.parent.name for p in PKG.glob("*/options.py"))  # the phases with a definition
TOOLS = "eagle3ops.commands._options"  # the tools of no phase (no module runs them: not shipped)


def _defined(kind) -> list:
    out = []
    for dotted in [*(f"eagle3ops.{name}.options" for name in DEFINITIONS), TOOLS]:
        mod = importlib.import_module(dotted)
        out += [v for v in vars(mod).values() if isinstance(v, kind)]
    return out


# every definition by its full name (``storage plan`` for a command of a Group; a module-only definition, one
# with no sub-command behind it, by its own name)
COMMANDS = {c.full_name: c for c in _defined(options.Command)}
CLI_COMMANDS = sorted(n for n, c in COMMANDS.items() if c.cli)
MULTI = {m.name: m for m in _defined(options.Module)}  # modules that run one of several commands
MODULES = sorted({c.module for c in COMMANDS.values() if c.module})
WITH_ROLE = sorted(n for n, c in COMMANDS.items() if c.role)


def test_every_phase_definition_is_shipped_and_found():
    """Each definition is a module_util (the modules import it on the target) and defines commands."""
    assert DEFINITIONS, "no python/eagle3ops/<phase>/options.py"
    for name, path in [
        *((f"{n}_options", PKG / n / "options.py") for n in DEFINITIONS),
        ("options", PKG / "options.py"),
    ]:
        link = REPO / "module_utils" / f"eagle3ops_{name}.py"
        assert link.is_symlink() and link.resolve() == path.resolve(), link
    assert COMMANDS, "no Command in the definitions"


# ---- (a) the CLI is generated ------------------------------------------------------------------------


def _subparsers(parser: argparse.ArgumentParser) -> dict:
    """{name: parser} of the sub-commands under ``parser``, by their current names (an older name a command
    keeps as an alias, ``status`` for ``extract-status``, is the same parser: tests/unit/test_cli_help.py)."""
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {a.dest: action.choices[a.dest] for a in action._choices_actions}


@functools.cache
def _top_parsers() -> dict:
    return _subparsers(cli.build_parser())


def _has_subparsers(parser: argparse.ArgumentParser) -> bool:
    return any(isinstance(a, argparse._SubParsersAction) for a in parser._actions)


def _real_parsers() -> dict:
    """{full name: parser} of every sub-command as ``eagle3ops`` builds it (a group's commands under it)."""
    out = {}
    for name, parser in _top_parsers().items():
        if _has_subparsers(parser):
            out.update({f"{name} {n}": p for n, p in _subparsers(parser).items()})
        out[name] = parser
    return out


def _flags(parser: argparse.ArgumentParser) -> set[str]:
    return {s for a in parser._actions for s in (a.option_strings or [a.dest]) if a.dest != "help"}


def _generated(cmd: options.Command) -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="eagle3ops")
    sub = top.add_subparsers()
    return cmd.add_parser(sub)


def test_every_sub_command_has_a_definition():
    """No ``eagle3ops`` sub-command is written by hand: each (a group's commands too) is a definition's."""
    groups = {n for n, p in _top_parsers().items() if _has_subparsers(p)}
    assert set(_real_parsers()) - groups == set(CLI_COMMANDS)
    assert {c.group for c in COMMANDS.values() if c.group} == groups


@pytest.mark.parametrize("name", CLI_COMMANDS)
def test_the_cli_is_generated_from_the_definition(name):
    cmd = COMMANDS[name]
    real = _real_parsers()[name]
    assert _flags(real) == _flags(_generated(cmd)), f"eagle3ops {name}: flags not from the definition"
    expected = {o.flag for o in cmd.options if o.cli}
    assert expected <= _flags(real)
    real.format_help()  # every help string formats (a stray % would raise here)


# ---- (b), (c) the module -----------------------------------------------------------------------------


def _module_options(module: str) -> dict:
    """{parameter: option} of a module: its Module's, or the parameters of the one command it runs."""
    if module in MULTI:
        return MULTI[module].options()
    (cmd,) = [c for c in COMMANDS.values() if c.module == module]
    return {o.param: o for o in cmd.module_options()}


def _module_spec(module: str) -> dict:
    return {param: o.spec() for param, o in _module_options(module).items()}


@pytest.mark.parametrize("module", MODULES)
def test_the_module_builds_its_argument_spec_from_the_definition(module):
    got = _argument_spec(REPO / "library" / f"{module}.py")
    want = json.loads(json.dumps(_module_spec(module)))
    assert got == want, f"library/{module}.py: argument_spec is not the definition's"


def _norm_type(t: str | None) -> str:
    return {"path": "str"}.get(t or "str", t or "str")


def _disagreements(where: str, doc: dict, opt: options.Option, default) -> list[str]:
    """How a documented option (ansible-doc / argument_specs form) differs from the definition."""
    out = []
    if _norm_type(doc.get("type")) != _norm_type(opt.type):
        out.append(f"{where}: type {doc.get('type', 'str')}, the definition {opt.type}")
    if opt.type == "list" and _norm_type(doc.get("elements")) != _norm_type(opt.elements):
        out.append(f"{where}: elements {doc.get('elements')}, the definition {opt.elements}")
    if opt.choices is not None and [str(c) for c in doc.get("choices") or []] != [
        str(c) for c in opt.choices
    ]:
        out.append(f"{where}: choices {doc.get('choices')}, the definition {opt.choices}")
    if bool(doc.get("required")) != bool(opt.required):
        out.append(f"{where}: required {bool(doc.get('required'))}, the definition {opt.required}")
    if doc.get("default") != default:
        out.append(f"{where}: default {doc.get('default')!r}, the definition {default!r}")
    return out


@pytest.mark.parametrize("module", MODULES)
def test_module_documentation_agrees_with_the_definition(module):
    documented = ansible_doc()[module]["doc"].get("options") or {}
    spec = _module_spec(module)
    assert set(documented) == set(spec), (
        f"library/{module}.py documents {sorted(documented)}, defines {sorted(spec)}"
    )
    opts = _module_options(module)
    problems = [
        p
        for param, o in opts.items()
        for p in _disagreements(f"{module}.{param}", documented[param], o, o.module_default)
    ]
    assert not problems, "\n".join(problems)


# ---- (d) the role ------------------------------------------------------------------------------------


def _when(role: str, module: str) -> set[str]:
    """Role variables named in the ``when`` of a task calling ``module`` (they guard what it gets)."""
    return {
        n
        for _f, t, m in _module_calls(role)
        if m == module
        for n in re.findall(r"[a-z][a-z0-9_]*", str(t.get("when")))
    }


@pytest.mark.parametrize("name", WITH_ROLE)
def test_role_variables_agree_with_the_definition(name):
    cmd = COMMANDS[name]
    role = cmd.role
    spec, defaults, asserted = _options(role), _defaults(role), _asserted(role) | _when(role, cmd.module)
    problems = []
    for var, o in cmd.role_variables().items():
        want = o.module_default if o.role_default is options._UNSET else o.role_default
        if var not in spec or var not in defaults:
            problems.append(
                f"roles/{role}: {var} (feeds {cmd.module}.{o.param}) missing from argument_specs/defaults"
            )
            continue
        value, templated = defaults[var], _templated(defaults[var])
        # a required parameter is required of the role's user too, unless the role fills it (a template that
        # points at other phases' variables) or the definition gives the role its own default
        required = o.required and not templated and o.role_default is options._UNSET
        if templated:
            # the documented default is what it renders to alone (tests/unit/test_role_argument_specs.py); where
            # the definition has a default, that is the one documented, and the one the shared variables give
            doc_want = spec[var].get("default") if want is None else want
            got = rendered(role, var)
            if want is not None and got != want:
                problems.append(
                    f"roles/{role}/defaults/main.yml: {var}: {value!r} is {got!r} with the shared defaults "
                    f"(roles/eagle3ops), the definition {want!r}"
                )
        elif required:
            if value not in ("", [], None):
                problems.append(f"roles/{role}/defaults/main.yml: {var}: {value!r} for a required parameter")
            doc_want = None
        else:
            if value != want:
                problems.append(f"roles/{role}/defaults/main.yml: {var}: {value!r}, the definition {want!r}")
            doc_want = want
        as_role = o.but(required=required)
        role_choices = set(spec[var].get("choices") or [])
        if o.choices and role_choices and role_choices < set(o.choices):
            as_role = as_role.but(
                choices=spec[var]["choices"]
            )  # the role offers fewer (serve_state: no status)
        elif o.choices and role_choices > set(o.choices) and var in asserted:
            as_role = as_role.but(choices=spec[var]["choices"])  # one variable, two modules: asserted there
        problems += _disagreements(
            f"roles/{role}/meta/argument_specs.yml: {var}",
            spec[var],
            as_role,
            doc_want,
        )
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("name", WITH_ROLE)
def test_the_role_passes_each_variable_to_its_module_parameter(name):
    """The mapping role variable -> module parameter in the definition is the one the role's tasks use."""
    cmd = COMMANDS[name]
    passed = set()
    for _f, task, module in _module_calls(cmd.role):
        if module != cmd.module:
            continue
        for param, value in (task[module] or {}).items():
            m = PASS_THROUGH.match(value.strip()) if isinstance(value, str) else None
            if m:
                passed.add((m["var"], param))
    missing = [
        f"{var} -> {o.param}" for var, o in cmd.role_variables().items() if (var, o.param) not in passed
    ]
    assert not missing, f"roles/{cmd.role} never passes: {missing}"


# ---- (e) params -> argv -> parser --------------------------------------------------------------------


def _sample(o: options.Option):
    """A value other than the default, of the option's type."""
    if o.choices:
        choice = next((c for c in reversed(o.choices) if c != o.default), o.choices[0])
        return [choice] if o.type == "list" else choice
    low = max(7, o.minimum or 0)  # within the option's bounds (Option.problem)
    return {
        "str": str(low) if o.words else "a b",  # a space survives (no shell)
        "path": "/p/with space",
        "int": low if o.default != low else low + 1,
        "float": 2.5 if o.maximum is None or o.maximum >= 2.5 else o.maximum / 2,
        "bool": not o.default,
        "dict": {"one": "/x/1.jsonl", "two": "/x/2.jsonl"},
        "list": [7, 9] if o.elements == "int" else ["/p/1", "/p/2"],
        "raw": [0, 1],
    }[o.type]


def _given(cmd: options.Command) -> list:
    """The options a command line must give: the required ones and the first of each exclusive group."""
    return [o for o in cmd.cli_options() if o.required] + [cmd.option(g[0]) for g in cmd.exclusive]


def _left_out(cmd: options.Command) -> set:
    """The module parameters left out so that an exclusive group gets one value (its first option's)."""
    return {cmd.option(n).param for g in cmd.exclusive for n in g[1:]}


class _Module:
    """The two attributes CliRunner reads from an AnsibleModule."""

    def __init__(self, params, check_mode=False):
        self.params, self.check_mode = params, check_mode


@pytest.mark.parametrize("name", sorted(n for n, c in COMMANDS.items() if c.module and c.cli))
@pytest.mark.parametrize("values", ["samples", "defaults"])
def test_module_params_reach_the_cli_unchanged(name, values):
    cmd = COMMANDS[name]
    given = {o.name for o in _given(cmd)}
    params = {
        o.param: (_sample(o) if values == "samples" or o.name in given else o.default)
        for o in cmd.module_options()
    }
    params |= dict.fromkeys(_left_out(cmd))
    computed = {o.name: _sample(o) for o in cmd.options if o.cli and not o.param and o.required}
    argv = eagle3ops_cli.CliRunner(_Module(params, check_mode=cmd.check), cmd).argv(**computed)
    words = list(cmd.words)
    assert argv[: len(words)] == words and (argv[-1] == "--check") == cmd.check
    args = _generated(cmd).parse_args(argv[len(words) :])
    got = {o.param: getattr(args, o.name) for o in cmd.module_options() if o.cli}
    want = {o.param: params[o.param] for o in cmd.module_options() if o.cli}
    assert got == want, argv
    for o in cmd.options:
        if not o.param and o.module_value is not options._UNSET:
            assert getattr(args, o.name) == o.module_value, (o.name, argv)


# ---- (f) check mode and renamed flags ----------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(n for n, c in COMMANDS.items() if c.check and c.cli))
def test_check_mode_is_check_and_plan_still_works(name):
    cmd = COMMANDS[name]
    required = [w for o in _given(cmd) for w in o.argv(_sample(o))]
    parser = _real_parsers()[name]
    assert parser.parse_args([*required, "--check"]).check is True
    assert parser.parse_args([*required, "--plan"]).check is True
    assert parser.parse_args(required).check is False


ALIASED = sorted(
    (n, o.name) for n, c in COMMANDS.items() for o in c.cli_options() if o.aliases or o.false_aliases
)


@pytest.mark.parametrize(("name", "option"), ALIASED)
def test_older_flags_still_work(name, option):
    """``--allow-unit`` is ``--stop-unit``, ``--grace`` ``--stop-grace``, ``--gpu-optional`` ``--no-gpu-required``."""
    cmd = COMMANDS[name]
    o = cmd.option(option)
    required = [w for r in _given(cmd) if r is not o for w in r.argv(_sample(r))]
    parser = _real_parsers()[name]
    new = o.argv(_sample(o))
    want = getattr(parser.parse_args([*required, *new]), o.name)
    for old in o.aliases:
        assert (
            getattr(parser.parse_args([*required, *[old if w == o.flag else w for w in new]]), o.name) == want
        )
    for old in o.false_aliases:
        assert getattr(parser.parse_args([*required, old]), o.name) is False


def test_a_value_that_looks_like_a_flag_reaches_the_cli():
    """A command-line pattern such as ``-m sglang`` is passed as ``--flag=VALUE`` (argparse would take it for a
    flag otherwise); the parser gets it back unchanged."""
    cmd = COMMANDS["gpu-free"]
    params = {o.param: o.module_default for o in cmd.module_options()}
    params |= {"stop_cmdline_patterns": ["-m sglang", "^python"], "stop_units": ["-weird.service"]}
    argv = cmd.argv(params)
    assert "--stop-cmdline=-m sglang" in argv, argv
    args = _generated(cmd).parse_args(argv[1:])
    assert args.stop_cmdline_patterns == ["-m sglang", "^python"] and args.stop_units == ["-weird.service"]


def test_a_renamed_flag_fails_with_one_line_naming_the_new_one(capsys):
    cmd = options.Command("demo", [options.Option("allow_unit", "list", elements="str", nargs="append")],
                          help="x", renamed={"--old-unit": "--allow-unit"})  # fmt: skip
    with pytest.raises(SystemExit) as e:
        _generated(cmd).parse_args(["--old-unit", "x"])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and "--old-unit" in err[0] and "--allow-unit" in err[0], err


def test_an_exclusive_group_takes_exactly_one(capsys):
    """``exclusive``: the parser refuses none and two of the group (exit 2, one line naming them); the module
    gets the same rule as ``required_one_of`` + ``mutually_exclusive`` (sglang-patch's file/python/site_packages)."""
    cmd = COMMANDS["sglang-patch"]
    assert cmd.one_of() == [("path", "python", "site_packages")]
    parser = _generated(cmd)
    assert parser.parse_args(["status", "--python", "/p"]).python == "/p"
    for argv in (["status"], ["status", "--file", "/f", "--python", "/p"]):
        with pytest.raises(SystemExit) as e:
            parser.parse_args(argv)
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert e.value.code == 2 and "--file" in err and "--python" in err, err


def test_a_group_alone_prints_its_help_and_exits_2(capsys):
    assert cli.main(["storage"]) == 2
    out = capsys.readouterr().out
    assert "plan" in out and "status" in out


def test_definitions_that_cannot_work_are_refused_at_import():
    """A module-only definition has no command line; a raw option none either; an exclusive group must name
    optional options of the command line; a command belongs to one group."""
    module_only = options.Command("m", [options.Option("x")], help="h", cli=False, module="eagle3ops_m")
    assert module_only.argument_spec() == {"x": {"type": "str"}} and module_only.cli_options() == []
    with pytest.raises(ValueError, match="no sub-command"):
        _generated(module_only)
    with pytest.raises(ValueError, match="no command line"):
        module_only.argv({})
    with pytest.raises(ValueError, match="needs its module"):
        options.Command("m", [], help="h", cli=False)
    with pytest.raises(ValueError, match="raw"):
        options.Command("c", [options.Option("g", "raw")], help="h")
    with pytest.raises(ValueError, match="exclusive"):
        options.Command("c", [options.Option("a", required=True), options.Option("b")], help="h",
                        exclusive=[("a", "b")])  # fmt: skip
    with pytest.raises(ValueError, match="exclusive"):
        options.Command("c", [options.Option("a")], help="h", exclusive=[("a", "nope")])
    with pytest.raises(ValueError, match="in group"):
        options.Group("other", [COMMANDS["storage plan"]], help="h")


def test_the_agreement_checks_can_fail():
    """A definition that differs from a documented option in each checked field is reported."""
    o = options.Option("x", "int", default=3, choices=[1, 3])
    assert not _disagreements("w", {"type": "int", "default": 3, "choices": [1, 3]}, o, 3)
    assert _disagreements("w", {"type": "float", "default": 3, "choices": [1, 3]}, o, 3)
    assert _disagreements("w", {"type": "int", "default": 4, "choices": [1, 3]}, o, 3)
    assert _disagreements("w", {"type": "int", "default": 3, "choices": [1]}, o, 3)
    assert _disagreements("w", {"type": "int", "default": 3, "choices": [1, 3], "required": True}, o, 3)
    lst = options.Option("y", "list", elements="int")
    assert _disagreements("w", {"type": "list", "elements": "str"}, lst, None)


# ---- (h) values checked before any work --------------------------------------------------------------
# Issue 32: ``extract --workers banana`` passed the parser and check mode, then died in int(); ``--workers 0``,
# ``train --epochs -1`` and ``--max-steps -5`` ran. A bound is part of the definition (``minimum``, ``maximum``,
# ``above``, ``words``): the generated parser refuses a value outside it (exit 2, the flag and what is allowed
# named) and CliRunner fails the module's task before it runs anything, check mode included.


def _bounded() -> list:
    return [(n, o) for n, c in sorted(COMMANDS.items()) for o in c.options if o.bounded]


def _outside(o: options.Option) -> list:
    """Values just outside the option's bounds (and a word it does not take)."""
    out = []
    step = 1 if o.type in ("int", "str") else 0.5
    if o.minimum is not None:
        out.append(o.minimum - step)
    if o.above is not None:
        out.append(o.above)
    if o.maximum is not None:
        out.append(o.maximum + step)
    if o.type in ("int", "str"):
        out.append("banana")
    return out


def _inside(o: options.Option):
    """The edge value the option still takes."""
    if o.minimum is not None:
        return o.minimum
    if o.above is not None:
        return o.above + (1 if o.type == "int" else 0.5)
    return o.maximum


def test_every_number_option_has_its_bounds():
    """Every int and float option says what it takes: the class of problem of issue 32 (0 and negative counts,
    a negative epoch count, a non-number worker count) cannot come back through a new option."""
    unbounded = [f"{n}: {o.name}" for n, c in COMMANDS.items() for o in c.options if o.type in ("int", "float")
                 and not o.bounded]  # fmt: skip
    assert not unbounded, unbounded
    assert len(_bounded()) > 60  # the scan reaches the definitions
    extract = COMMANDS["extract"].option("workers")
    assert extract.words == ("auto",) and extract.minimum == 1  # a str option: 'auto' or a count


@pytest.mark.parametrize("name,option", [(n, o.name) for n, o in _bounded() if COMMANDS[n].cli and o.cli])
def test_the_parser_refuses_a_value_outside_the_bounds(name, option, capsys):
    cmd = COMMANDS[name]
    o = cmd.option(option)
    parser = _generated(cmd)
    required = [w for g in _given(cmd) if g is not o for w in g.argv(_sample(g))]
    assert not any(x.positional for x in cmd.options if x.bounded)  # argv() below is a flag's
    edge = parser.parse_args([*required, *o.argv(str(_inside(o)))])
    assert getattr(edge, o.name) == (str(_inside(o)) if o.type == "str" else _inside(o))
    for bad in _outside(o):
        with pytest.raises(SystemExit) as e:
            parser.parse_args([*required, *o.argv(str(bad))])  # --flag=-1 for a negative value
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert e.value.code == 2 and o.flag in err and o.allowed() in err and "Traceback" not in err, err


@pytest.mark.parametrize(
    "name,option", [(n, o.name) for n, o in _bounded() if COMMANDS[n].module and o.param]
)
def test_the_module_refuses_a_value_outside_the_bounds(name, option):
    """CliRunner fails the task (check mode too) before it builds a command line, naming the parameter, its role
    variable and what is allowed."""
    cmd = COMMANDS[name]
    o = cmd.option(option)
    var = next((v for v, x in cmd.role_variables().items() if x is o), None)
    params = {p.param: p.module_default for p in cmd.module_options()}
    for bad in _outside(o):
        if cmd.cli:
            module = _Failing(params | {o.param: bad}, check_mode=True)
            with pytest.raises(_Failed) as e:
                eagle3ops_cli.CliRunner(module, cmd).argv()
            msg = e.value.args[0]["msg"]
        else:
            msg = "; ".join(cmd.problems(params | {o.param: bad}))
        assert f"{o.param}" in msg and repr(bad) in msg and o.allowed() in msg, msg
        if var:
            assert f"role variable {var}" in msg, msg
    assert not cmd.problems(params | {o.param: _inside(o)})


class _Failed(Exception):
    pass


class _Failing(_Module):
    """CliRunner's AnsibleModule, whose fail_json ends the call as Ansible's does."""

    def fail_json(self, **kw):
        raise _Failed(kw)


def test_the_cli_refuses_the_values_of_issue_32(capsys):
    """The real ``eagle3ops`` entry point: exit 2, one line naming the flag and what it takes (with ``--json`` also
    as the JSON failure object), no traceback, and nothing read or written (the paths do not exist)."""
    cases = [
        (
            ["extract", "--data", "/nonexistent/d", "--model", "/nonexistent/m", "--workers", "banana"],
            "--workers",
        ),
        (["extract", "--data", "/nonexistent/d", "--model", "/nonexistent/m", "--workers", "0"], "--workers"),
        (["extract", "--data", "/nonexistent/d", "--model", "/nonexistent/m", "--workers=-3"], "--workers"),
        (["train", "--data", "/n/d", "--verifier", "/n/m", "--run-dir", "/n/r", "--epochs=-1"], "--epochs"),
        (
            ["train", "--data", "/n/d", "--verifier", "/n/m", "--run-dir", "/n/r", "--max-steps=-5"],
            "--max-steps",
        ),
        (["prepare", "--model", "/n/m", "--input", "/n/i", "--out", "/n/o", "--workers", "0"], "--workers"),
    ]
    for argv, flag in cases:
        for check in ([], ["--check"]):
            assert cli.main([*argv, *check]) == 2
            err = capsys.readouterr().err
            assert flag in err and "must be" in err and "Traceback" not in err, err
        # --json: the failure is also the one JSON object on stdout (what a module or a script reads)
        assert cli.main([*argv, "--json"]) == 2
        res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert res["failed"] and flag in res["msg"] and "must be" in res["msg"], res
    assert not Path("/nonexistent").exists() and not Path("/n").exists()


def test_the_module_refuses_a_relative_path():
    """A module parameter of type path (or a list of paths) must be absolute: the module's working directory is
    neither the inventory's nor the playbook's (``eagle3ops_data_dir=relative/path`` wrote into playbooks/).
    A program (``executable``) may be a bare name looked up on PATH."""
    cmd = COMMANDS["prepare"]
    params = {p.param: p.module_default for p in cmd.module_options()}
    params |= {"model": "/m", "inputs": ["/c.jsonl"], "out": "/data/eagle3/data", "executable": "eagle3ops"}
    assert not cmd.problems(params)
    for bad in (
        {"out": "relative/path"},
        {"inputs": ["/c.jsonl", "conv.jsonl"]},
        {"executable": "bin/eagle3ops"},
    ):
        module = _Failing(params | bad, check_mode=True)
        with pytest.raises(_Failed) as e:
            eagle3ops_cli.CliRunner(module, cmd).run()
        msg = e.value.args[0]["msg"]
        (param,) = bad
        assert param in msg and "relative path" in msg and "absolute" in msg, msg


def _role_bounds() -> dict:
    """{role: {variable: bounds}} of the roles that depend on roles/eagle3ops, from the definitions: what
    roles/eagle3ops/vars/main.yml must hold."""
    deps = {
        p.parent.parent.name for p in REPO.glob("roles/*/meta/main.yml") if "role: eagle3ops" in p.read_text()
    }
    table: dict = {}
    for cmd in COMMANDS.values():
        if cmd.role not in deps:
            continue
        for var, o in cmd.role_variables().items():
            if o.bounded:
                entry = {"type": o.type}
                entry |= {
                    k: getattr(o, k) for k in ("minimum", "maximum", "above") if getattr(o, k) is not None
                }
                entry |= {"words": list(o.words)} if o.words else {}
                table.setdefault(cmd.role, {})[var] = entry | {"allowed": o.allowed()}
    return table


def test_the_roles_bounds_are_the_definitions():
    """The table the shared role's task checks every phase's variables against is the definitions' bounds."""
    import yaml

    got = yaml.safe_load((REPO / "roles/eagle3ops/vars/main.yml").read_text())["eagle3ops_option_bounds"]
    want = _role_bounds()
    assert got == want, "roles/eagle3ops/vars/main.yml must be:\n" + yaml.safe_dump(want, width=200)
    assert (
        want["extract"]["extract_workers"]["words"] == ["auto"]
        and want["train"]["train_epochs"]["minimum"] == 1
    )


@pytest.mark.parametrize(
    "rel", sorted(p.relative_to(REPO) for p in REPO.glob("inventory/*/*_vars/*.yml")), ids=str
)
def test_example_inventories_pass_the_bounds(rel):
    import yaml

    values = yaml.safe_load((REPO / rel).read_text()) or {}
    bounds = {var: o for cmd in COMMANDS.values() for var, o in cmd.role_variables().items() if o.bounded}
    checked = {k: v for k, v in values.items() if k in bounds and v is not None and "{{" not in str(v)}
    bad = [
        f"{k}: {why}"
        for k, v in checked.items()
        if (why := bounds[k].problem(v if bounds[k].type != "str" else str(v)))
    ]
    assert not bad, f"{rel}: {bad}"


def test_the_shared_path_check_names_every_shared_path_variable():
    """roles/eagle3ops/tasks/main.yml refuses a relative path in each shared variable that names a path: every
    ``type: path`` option of its argument_specs, and the str/list ones that hold paths."""
    import yaml

    specs = yaml.safe_load((REPO / "roles/eagle3ops/meta/argument_specs.yml").read_text())
    opts = specs["argument_specs"]["main"]["options"]
    tasks = yaml.safe_load((REPO / "roles/eagle3ops/tasks/main.yml").read_text())
    listed = set(tasks[0]["vars"]["eagle3ops_path_variables"])
    paths = {k for k, o in opts.items() if o.get("type") == "path"}
    assert paths <= listed, sorted(paths - listed)
    holding_paths = {"eagle3ops_heldout_prompts", "eagle3ops_conversations", "eagle3ops_sglang_site_packages"}
    assert holding_paths <= listed and listed <= set(opts), sorted(listed - set(opts))


def _playbook(tmp_path, playbook, *extra, check=True):
    """``ansible-playbook -i inventory/local playbooks/<playbook>`` run from tmp_path, the work directory there;
    the JSON callback's result."""
    import os
    import subprocess

    cmd = [str(Path(sys.executable).with_name("ansible-playbook")), "-i", str(REPO / "inventory/local"),
           str(REPO / "playbooks" / playbook), "-e", f"eagle3ops_workdir={tmp_path / 'work'}", *extra]  # fmt: skip
    env = {
        **os.environ,
        "ANSIBLE_STDOUT_CALLBACK": "ansible.posix.json",
        "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
    }
    r = subprocess.run([*cmd, *(["--check"] if check else [])], capture_output=True, text=True, cwd=tmp_path,
                       env=env, check=False)  # fmt: skip
    return r.returncode, json.loads(r.stdout)


@pytest.mark.parametrize(
    "playbook,extra,check,names",
    [
        (
            "extract.yml",
            ["-e", "extract_workers=banana"],
            True,
            ["extract_workers", "'auto' or a whole number"],
        ),
        (
            "train.yml",
            ["-e", "train_epochs=-1", "-e", "train_max_steps=-5"],
            True,
            ["train_epochs", "train_max_steps"],
        ),
        (
            "prepare.yml",
            ["-e", "eagle3ops_data_dir=relative/path"],
            False,
            ["eagle3ops_data_dir", "relative"],
        ),
    ],
)
def test_a_playbook_refuses_a_bad_value_before_anything_runs(tmp_path, playbook, extra, check, names):
    """Issue 32, through the real playbooks of the local default: the first task of the phase's play fails
    naming the variable and what it takes, in check mode too, and nothing is written (no work directory, no
    ``relative/path`` beside the playbook or here)."""
    rc, out = _playbook(tmp_path, playbook, *extra, check=check)
    tasks = out["plays"][0]["tasks"]
    failed = [t for t in tasks if t["hosts"]["localhost"].get("failed")]
    assert rc == 2 and len(failed) == 1, [t["task"]["name"] for t in tasks]
    # the checks of the shared role ran (its argument_specs and its two tasks), nothing else
    ran = [t["task"]["name"] for t in tasks]
    checks = ("Shared variables | Refuse", "Validating arguments against arg spec")
    assert all(any(c in n for c in checks) for n in ran) and ran[-1] == failed[0]["task"]["name"], ran
    msg = failed[0]["hosts"]["localhost"]["msg"]
    assert all(n in msg for n in names) and "Traceback" not in msg, msg
    assert sorted(p.name for p in tmp_path.iterdir()) == [], list(tmp_path.iterdir())
    assert not (REPO / "playbooks" / "relative").exists()


# ---- (g) the Python API's defaults -------------------------------------------------------------------
# The functions and settings classes the commands call keep their own defaults (a caller from Python, a test, a
# bench script gets them); here they must equal the definition's (the CLI's), or differ for the reason given.


def _api_defaults(api) -> dict:
    """{parameter: default} of a function, or of a dataclass's fields (factories called)."""
    import dataclasses
    import inspect

    if dataclasses.is_dataclass(api):
        out = {}
        for f in dataclasses.fields(api):
            if f.default is not dataclasses.MISSING:
                out[f.name] = f.default
            elif f.default_factory is not dataclasses.MISSING:
                out[f.name] = f.default_factory()
        return out
    return {
        n: p.default
        for n, p in inspect.signature(api).parameters.items()
        if p.default is not inspect.Parameter.empty
    }


def _api(dotted: str):
    mod, _, name = dotted.rpartition(".")
    return getattr(importlib.import_module(mod), name)


# (API, command, {API name: option name} where they differ, {API name: why its default differs})
API_DEFAULTS = [
    ("eagle3ops.prepare.dataset.prepare", "prepare", {}, {}),
    (
        "eagle3ops.extract.session.ExtractConfig",
        "extract",
        {"data_dir": "data", "model_path": "model", "margin_frac": "margin"},
        {
            "world_size": "the option's None means one worker: the command passes world_size or 1",
            "rank": "the option's None means rank 0 (or --first-rank's ranks): the command passes rank or 0",
        },
    ),
    (
        "eagle3ops.extract.sglang_client.SGLangExtractConfig",
        "extract-sglang",
        {"data_dir": "data", "model_path": "model", "margin_frac": "margin"},
        {},
    ),
    ("eagle3ops.regenerate.config.RegenerateConfig", "regenerate", {}, {}),
    (
        "eagle3ops.gpu_free.check.ensure_free",
        "gpu-free",
        {
            "timeout_s": "timeout",
            "poll_s": "poll_interval",
            "grace_s": "stop_grace",
            "v1_allowance_mib": "v1_reserved_allowance_mib",
        },
        {"gpus": "None selects every GPU, the option's ['all'] too"},
    ),
    ("eagle3ops.train.spec.TrainSpec", "train", {"extra": "extra_config"}, {}),
    ("eagle3ops.serve.convert.convert", "serve-convert", {}, {}),
    ("eagle3ops.benchmark.acceptance.run", "benchmark-acceptance", {}, {}),
    ("eagle3ops.host.storage.plan", "storage plan", {}, {}),
    ("eagle3ops.demo.build_demo", "demo", {}, {}),
]


@pytest.mark.parametrize(
    ("api", "name", "renamed", "differs"), API_DEFAULTS, ids=[a[0] for a in API_DEFAULTS]
)
def test_the_python_api_defaults_are_the_definitions(api, name, renamed, differs):
    cmd = COMMANDS[name]
    opts = {o.name: o for o in cmd.options}
    compared, problems = 0, []
    for param, default in _api_defaults(_api(api)).items():
        o = opts.get(renamed.get(param, param))
        if o is None or param in differs:
            continue
        compared += 1
        if default != o.default and not (isinstance(o.default, list) and list(default or ()) == o.default):
            problems.append(
                f"{api}({param}={default!r}): the definition's {o.name} defaults to {o.default!r}"
            )
    assert compared, f"{api}: no parameter maps to an option of {name}"
    assert not problems, "\n".join(problems)
    for param in differs:  # a documented difference must still be one (else the reason is stale)
        o = opts[renamed.get(param, param)]
        assert _api_defaults(_api(api))[param] != o.default, (
            f"{api}({param}): the same default now; drop the reason"
        )


def test_the_named_constants_are_the_definitions():
    """Constants the logic uses for a default the definition also states."""
    from eagle3ops.gpu_free import nvml
    from eagle3ops.train import options as train_options
    from eagle3ops.train import spec

    assert (
        COMMANDS["gpu-free"].option("v1_reserved_allowance_mib").default
        == nvml.DEFAULT_V1_RESERVED_ALLOWANCE_MIB
    )
    assert spec.DEFAULT_DRAFT_VOCAB == train_options.DEFAULT_DRAFT_VOCAB
    # the plan's loss kernel when none is given is the module's and the role's default
    assert COMMANDS["train"].option("loss_implementation").module_default == "eager"
