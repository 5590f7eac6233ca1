"""Option values checked before any work (issue 32), from the definitions' bounds (tests/unit/core/test_options.py
holds the definitions' other checks): the generated parser, the module (CliRunner), the real ``eagle3ops`` entry
point and the real playbooks refuse a value outside an option's bounds, or a relative path, before anything
runs; the shared role's bounds table and the example inventories agree with the definitions.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from eagle3ops import cli, options

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "module_utils"))
import eagle3ops_cli  # the runner as the modules use it (stdlib only, importable as a plain file)
from options_defs import COMMANDS, REPO, _generated, _given, _Module, _sample

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


def test_the_roles_bounds_are_the_definitions():
    """The table the shared role's task checks every phase's variables against is the definitions' bounds."""
    import yaml
    from eagle3ops.option_render import bounds_table  # what make options writes there

    got = yaml.safe_load((REPO / "roles/eagle3ops/vars/main.yml").read_text())["eagle3ops_option_bounds"]
    want = bounds_table()
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
    """roles/eagle3ops/tasks/main.yml refuses a relative path in each shared variable that names a path (the paths
    its first task gives action_plugins/eagle3ops_preflight.py): every
    ``type: path`` option of its argument_specs, and the str/list ones that hold paths."""
    import yaml

    specs = yaml.safe_load((REPO / "roles/eagle3ops/meta/argument_specs.yml").read_text())
    opts = specs["argument_specs"]["main"]["options"]
    tasks = yaml.safe_load((REPO / "roles/eagle3ops/tasks/main.yml").read_text())
    listed = set(tasks[0]["eagle3ops_preflight"]["paths"])
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
