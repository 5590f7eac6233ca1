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
(f) check mode is ``--check`` in every command (a flag beside the definition's fails (a));
(g) the Python API the commands call (``prepare()``, ``ExtractConfig``, ``TrainSpec``, ``ensure_free()``, ...)
    has the definition's defaults, or a reason beside the one that differs.

Since issue 33 the copies (c) and (d) look at - DOCUMENTATION options, role defaults, argument_specs, the tasks'
pass-through - are written by ``make options`` (eagle3ops.option_render; tests/unit/core/test_options_generated.py
holds them equal to what it writes); these checks stay, and still hold what is written by hand (a task that passes
a subset, the host wing's tasks).

(g) is tests/unit/core/test_options_api.py; the values checked before any work (issue 32, the bounds) are
tests/unit/core/test_options_bounds.py; the definitions and helpers they share are tests/unit/options_defs.py.

Every ``eagle3ops`` sub-command has a definition (checked): prepare, extract (+ sglang-extract, sglang-patch,
verify), regenerate, gpu_free, train, serve (convert, serve-process), benchmark, assets (fetch, convert, sharegpt:
a Group, and one Module), storage (plan, status: a Group), and the tools demo, layer-ids, pve (show, plan). The
host wing's modules that run without eagle3ops (storage, services, container) have module-only definitions
(``cli=False``): (b), (c) and (d) hold them to it.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
from eagle3ops import cli, options

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "module_utils"))
import eagle3ops_cli  # the runner as the modules use it (stdlib only, importable as a plain file)
from options_defs import (
    CLI_COMMANDS,
    COMMANDS,
    DEFINITIONS,
    MODULES,
    MULTI,
    PKG,
    REPO,
    WITH_ROLE,
    _flags,
    _generated,
    _given,
    _has_subparsers,
    _left_out,
    _Module,
    _real_parsers,
    _sample,
    _top_parsers,
)
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
            # the documented default is what it renders to alone (tests/unit/core/test_role_argument_specs.py); where
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
        if o.role_choices is not None:  # the role's own (the CLI and module refuse by their own message)
            as_role = as_role.but(choices=o.role_choices)
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


# ---- (f) check mode --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(n for n, c in COMMANDS.items() if c.check and c.cli))
def test_check_mode_is_check(name):
    cmd = COMMANDS[name]
    required = [w for o in _given(cmd) for w in o.argv(_sample(o))]
    parser = _real_parsers()[name]
    assert parser.parse_args([*required, "--check"]).check is True
    assert parser.parse_args(required).check is False


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
