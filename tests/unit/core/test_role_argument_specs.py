"""Every role's ``meta/argument_specs.yml`` agrees with its ``defaults/main.yml``, with the example inventories
and with the modules (``library/*.py``) its tasks call. Pure Python (YAML, the modules' AST, Ansible's own
ArgumentSpecValidator and templar); no playbook runs.

(a) the same option names in ``defaults/main.yml`` and the ``main`` entry point's options;
(b) a literal default in ``defaults/main.yml`` is the argument_specs default (and passes the option's own type
    and choices); a required option documents none. A Jinja-templated default depends on other phases'
    variables: it is skipped where the spec documents no default; where it does, that is the template verbatim
    or what it renders to when no other phase's variable is set (Ansible's templar over the role's own
    defaults);
(c) a task that passes a role option through to one of our modules (``param: "{{ role_var }}"``, optionally
    ``| default(omit[, true])`` or a cast) gives it a compatible type: equal, ``str``/``path`` either way, an
    ``int`` into a ``float``, the list's elements alike, and choices within the module's (values outside them
    only where an ``assert`` of the role or the task's ``when`` names the option). ``type: raw`` is accepted
    only for the options in ``RAW_OPTIONS``, which say what they accept, and only into a ``raw`` parameter;
(d) the literal values of every example inventory (``inventory/*/group_vars``, ``host_vars``) pass the specs,
    and every role-prefixed name they set or show commented is an option (or a fact a role sets).
"""

from __future__ import annotations

import functools
import re
import sys
from pathlib import Path

import pytest
import torch._dynamo  # noqa: F401 - before any ansible import: see below
import yaml

# Importing ansible.module_utils.common / ansible.parsing / ansible.template replaces sys.intern by an object
# (ansible's SysInternPatch); torch._dynamo, imported later in the same xdist worker (transformers' generation
# code does it), then refuses to start ("substitute_in_graph expects a function") and every later torch test of
# that worker errors. Dynamo imported first has registered its substitutions already.
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar

# the values as Ansible's loader hands them to the templar (the renderer's own adapter; the rendering is this test's)
from eagle3ops.option_render import trusted

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from library_docs import MODULES as MODULE_NAMES
from library_docs import _argument_spec
from role_tasks import each_task

REPO = Path(__file__).resolve().parents[3]
ROLES = sorted(p.name for p in (REPO / "roles").iterdir() if (p / "meta" / "argument_specs.yml").is_file())
# the modules by their names (not the old names, which roles never use: tests/unit/core/test_names.py)
MODULES = {name: _argument_spec(REPO / "library" / f"{name}.py") for name in MODULE_NAMES}

# The only role options that stay ``type: raw``: each accepts values of more than one type, says so in its
# description, and is checked where it is used (the test asserts each of these facts).
RAW_OPTIONS = {
    # "all", "none", or a list of GPU indices (also "0,1"); eagle3ops.host.pve.select_devices refuses anything else
    # with a message naming the value (PveError -> fail_json), tests/unit/host/test_pve.py
    "container_gpus": "list of GPU indices",
    # a count of capture servers, or a list of GPU groups; the sglang role refuses anything else naming the variable and
    # the host (roles/sglang/tasks/servers.yml, tests/unit/sglang/test_sglang_role.py)
    "eagle3ops_sglang_servers": "list of GPU groups",
    "sglang_servers": "list of GPU groups",
}
# A pass-through: the option itself, maybe with default(omit) or a cast (the type the module gets is the same).
PASS_THROUGH = re.compile(
    r"^\{\{\s*(?P<var>[a-z][a-z0-9_]*)\s*"
    r"(?:\|\s*(?:default\(\s*omit\s*(?:,\s*true\s*)?\)|int|float|bool|string)\s*)*\}\}$"
)  # fmt: skip


@functools.cache
def _role_spec(role: str) -> dict:
    return yaml.safe_load((REPO / "roles" / role / "meta" / "argument_specs.yml").read_text())[
        "argument_specs"
    ]


def _options(role: str) -> dict:
    return _role_spec(role)["main"].get("options") or {}


def _defaults(role: str) -> dict:
    return yaml.safe_load((REPO / "roles" / role / "defaults" / "main.yml").read_text()) or {}


def _dependencies(role: str) -> list[str]:
    meta = yaml.safe_load((REPO / "roles" / role / "meta" / "main.yml").read_text()) or {}
    return [d["role"] if isinstance(d, dict) else d for d in meta.get("dependencies") or []]


def _visible_defaults(role: str) -> dict:
    """The defaults the role's tasks see: its dependencies' (roles/eagle3ops: the shared variables), then its own
    over them, as Ansible merges a role's dependency chain."""
    out = {}
    for dep in _dependencies(role):
        out.update(_visible_defaults(dep))
    return {**out, **_defaults(role)}


def _templated(value) -> bool:
    if isinstance(value, str):
        return "{{" in value or "{%" in value
    if isinstance(value, dict):
        return any(_templated(k) or _templated(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_templated(v) for v in value)
    return False


def _spec_for_validator(options: dict) -> dict:
    """The options as ArgumentSpecValidator takes them: type, elements, choices and default (no ansible-doc
    keys; ``required`` left out, as only some of the values are checked at a time)."""
    keep = ("type", "elements", "choices", "default", "options")
    return {k: {a: v for a, v in o.items() if a in keep} for k, o in options.items()}


@pytest.mark.parametrize("role", ROLES)
def test_defaults_and_argument_specs_name_the_same_options(role):
    options, defaults = _options(role), _defaults(role)
    assert options, f"roles/{role}/meta/argument_specs.yml: no options"
    only_defaults = sorted(set(defaults) - set(options))
    only_spec = sorted(set(options) - set(defaults))
    assert not only_defaults, (
        f"roles/{role}: in defaults/main.yml but not in meta/argument_specs.yml: {only_defaults}"
    )
    assert not only_spec, (
        f"roles/{role}: in meta/argument_specs.yml but not in defaults/main.yml: {only_spec}"
    )


@pytest.mark.parametrize("role", ROLES)
def test_literal_defaults_are_the_documented_defaults(role):
    options, defaults = _options(role), _defaults(role)
    literal = {k: v for k, v in defaults.items() if k in options and not _templated(v)}
    # a required option has no documented default (its placeholder in defaults/main.yml must be replaced)
    wrong = {
        k: (options[k].get("default", "<no default>"), v)
        for k, v in literal.items()
        if not options[k].get("required")
        and (options[k].get("default") != v or (v is not None and "default" not in options[k]))
    }
    assert not wrong, f"roles/{role}: argument_specs default vs defaults/main.yml: {wrong}"
    # the defaults themselves pass the option's type and choices
    r = ArgumentSpecValidator(_spec_for_validator(options)).validate(literal)
    assert not r.error_messages, f"roles/{role}/defaults/main.yml: {r.error_messages}"


@pytest.mark.parametrize("role", ROLES)
def test_templated_defaults_are_documented_verbatim_or_as_rendered(role):
    """A templated default documented in the spec is either the template itself or its value when no other
    phase's variable is set (the role's own defaults and the shared ones of roles/eagle3ops are known); options
    without a spec default are skipped."""
    options = _options(role)
    defaults = _defaults(role)
    templar = Templar(loader=DataLoader(), variables=trusted(_visible_defaults(role)))
    wrong = {}
    for k, v in defaults.items():
        if not _templated(v) or "default" not in options.get(k, {}):
            continue  # literal (the test above), or templated and not documented: skipped
        doc = options[k]["default"]
        if doc == v:
            continue
        try:
            rendered = templar.template(trusted(v))
        except Exception as e:  # an undefined variable: only the verbatim template can be documented then
            rendered = f"<does not render alone: {e}>"
        if doc != rendered:
            wrong[k] = {"documented": doc, "defaults/main.yml": v, "renders": rendered}
    assert not wrong, f"roles/{role}: {wrong}"


# ---- shared variables: defaults live once (issue 19) --------------------------------------------------------

SHARED = "eagle3ops"  # the role whose defaults every phase role sees (a dependency of each: meta/main.yml)
# what a default may name besides its own role's and the shared variables: Ansible's own, and the connection
# variable of community.proxmox's proxmox_pct_remote (proxmox_vmid: the container a host is, set per host)
MAGIC = re.compile(
    r"^(ansible_\w+|inventory_\w+|playbook_dir|role_path|groups|group_names|hostvars|omit|none|proxmox_vmid)$"
)


def _names(value) -> set[str]:
    """The variables a default's templates read (jinja2's own analysis of each template string)."""
    import jinja2
    from jinja2 import meta

    if isinstance(value, dict):
        return set().union(set(), *(_names(k) | _names(v) for k, v in value.items()))
    if isinstance(value, list):
        return set().union(set(), *(_names(v) for v in value))
    if isinstance(value, str) and _templated(value):
        env = jinja2.Environment()
        env.filters, env.tests = _AnyName(env.filters), _AnyName(env.tests)  # Ansible's filters and tests too
        return meta.find_undeclared_variables(env.parse(value))
    return set()


class _AnyName(dict):
    """Jinja's filter/test table that has every name (plain jinja2 does not know Ansible's, e.g. regex_replace)."""

    def __contains__(self, key) -> bool:
        return True

    def get(self, key, default=None):
        return super().get(key) or (lambda *a, **k: None)


PHASE_ROLES = [r for r in ROLES if r != SHARED]


def _role_vars(role: str) -> dict:
    """The role's derived values (``vars/main.yml``: e.g. train's ``train_data_gather``), which defaults may read."""
    path = REPO / "roles" / role / "vars" / "main.yml"
    return (yaml.safe_load(path.read_text()) or {}) if path.exists() else {}


def rendered(role: str, var: str):
    """The value the role's tasks get for ``var`` when the inventory sets nothing: its default rendered with
    the role's own and the shared defaults and its derived vars, on a one-host inventory (raises when it names a
    variable none of them has)."""
    one_host = {"inventory_hostname": "localhost", "ansible_play_hosts_all": ["localhost"], "hostvars": {}}
    variables = {**one_host, **_visible_defaults(role), **_role_vars(role)}
    return Templar(loader=DataLoader(), variables=trusted(variables)).template(trusted(_defaults(role)[var]))


@pytest.mark.parametrize("role", PHASE_ROLES)
def test_phase_defaults_point_at_shared_variables_not_at_other_phases(role):
    """A phase's default names its own variables, the shared ``eagle3ops_*`` ones, or Ansible's; never another
    phase's (``serve_checkpoint: "{{ train_run_dir }}"`` was the habit this replaces)."""
    shared = set(_defaults(SHARED))
    foreign = {
        k: sorted(
            n for n in _names(v) if not n.startswith(f"{role}_") and n not in shared and not MAGIC.match(n)
        )
        for k, v in _defaults(role).items()
    }
    foreign = {k: v for k, v in foreign.items() if v}
    assert not foreign, f"roles/{role}/defaults/main.yml reads other phases' variables: {foreign}"
    if any(n in shared for v in _defaults(role).values() for n in _names(v)):
        assert SHARED in _dependencies(role), f"roles/{role}/meta/main.yml: no dependency on {SHARED}"


def test_shared_variables_read_only_each_other_and_phase_outputs():
    """The shared defaults name each other, Ansible's variables, or a fact a phase's tasks set (its output:
    ``runtime_eagle3ops_bin``), and every shared variable is read by at least two phase roles (else it is that
    phase's own option)."""
    shared = _defaults(SHARED)
    facts = set().union(*(_facts(r) for r in PHASE_ROLES))
    bad = {
        k: sorted(n for n in _names(v) if n not in shared and n not in facts and not MAGIC.match(n))
        for k, v in shared.items()
    }
    assert not {k: v for k, v in bad.items() if v}, bad
    # a phase reads a shared variable in its defaults or in its derived values (vars/main.yml)
    readers = {
        k: {
            r
            for r in PHASE_ROLES
            if k in set().union(set(), *map(_names, [*_defaults(r).values(), *_role_vars(r).values()]))
        }
        for k in shared
    }
    readers_of_shared = {k: {s for s, v in shared.items() if k in _names(v)} for k in shared}
    lonely = {k: sorted(r) for k, r in readers.items() if len(r) < 2 and not readers_of_shared[k]}
    assert not lonely, (
        f"shared variables read by fewer than two phases (and no other shared variable): {lonely}"
    )


def _literals(value):
    if isinstance(value, dict):
        for v in value.values():
            yield from _literals(v)
    elif isinstance(value, list):
        for v in value:
            yield from _literals(v)
    elif isinstance(value, str):
        yield value


def test_shared_paths_and_the_sglang_version_are_typed_once():
    """A path the shared role defines (``/data/eagle3``, ``/opt/eagle3ops/venv``, ...) or the pinned SGLang
    version appears in no phase role's defaults: the phase points at the shared variable instead."""
    shared = _defaults(SHARED)
    typed = {v for v in shared.values() if isinstance(v, str) and not _templated(v) and v.startswith("/")}
    typed.add(shared["eagle3ops_sglang_version"])
    assert "/data/eagle3" in typed, typed
    found = [
        f"roles/{r}/defaults/main.yml: {k}: {text!r} repeats {t!r}"
        for r in PHASE_ROLES
        for k, v in _defaults(r).items()
        for text in _literals(v)
        for t in typed
        if (t in text if t.startswith("/") else text == t)
    ]
    assert not found, found


def _asserted(role: str) -> set[str]:
    """Role options named in an assert's ``that`` anywhere in the role's tasks."""
    names = set()
    for f in sorted((REPO / "roles" / role / "tasks").glob("*.yml")):
        for t in each_task(yaml.safe_load(f.read_text())):
            a = t.get("ansible.builtin.assert") or t.get("assert")
            if a:
                names |= set(re.findall(r"[a-z][a-z0-9_]*", str(a.get("that"))))
    return names


def _compatible(role_type: str, mod_type: str) -> bool:
    if mod_type == "raw":
        return True
    return (
        role_type == mod_type
        or {role_type, mod_type} <= {"str", "path"}
        or (role_type, mod_type) == ("int", "float")
    )


def _disagreement(
    name: str, opt: dict, param: str, mp: dict, guarded: bool, omits_empty: bool = False
) -> str | None:
    """Why role option ``opt`` may not be passed to module parameter ``mp``; None when it may (``omits_empty``:
    the task passes it through ``default(omit, true)``, so an empty string never reaches the module)."""
    rt, mt = opt.get("type", "str"), mp.get("type", "str")
    if rt == "raw":
        if name not in RAW_OPTIONS or mt != "raw":
            return f"{name} is type raw but {param} is {mt}: give {name} a real type"
    elif not _compatible(rt, mt):
        return f"{name} is {rt}, {param} is {mt}"
    if rt == "list" and mt == "list" and mp.get("elements"):
        re_, me = opt.get("elements", "raw"), mp["elements"]
        if not _compatible(re_, me):
            return f"{name} elements {re_}, {param} elements {me}"
    if mp.get("choices") and not guarded:
        extra = sorted(
            set(opt.get("choices") or ["<any>"]) - set(mp["choices"]) - ({""} if omits_empty else set()),
            key=str,
        )
        if extra:
            return f"{name} accepts {extra}, {param} only {mp['choices']} (no assert or when guards it)"
    return None


def _module_calls(role: str):
    """(file, task, module) for each task (or handler) of the role that calls one of our modules."""
    for f in sorted((REPO / "roles" / role).glob("*/*.yml")):
        if f.parent.name in ("tasks", "handlers"):
            for t in each_task(yaml.safe_load(f.read_text())):
                for module in sorted(set(t) & set(MODULES)):
                    yield f.relative_to(REPO), t, module


@pytest.mark.parametrize("role", ROLES)
def test_tasks_pass_options_to_modules_of_a_compatible_type(role):
    options, asserted = _options(role), _asserted(role)
    problems, calls, checked = [], 0, 0
    for f, task, module in _module_calls(role):
        calls += 1
        for param, value in (task[module] or {}).items():
            mp = MODULES[module].get(param)
            if mp is None:
                problems.append(f"{f}: {module} has no parameter {param}")
                continue
            m = PASS_THROUGH.match(value.strip()) if isinstance(value, str) else None
            if not (m and m["var"] in options):
                continue  # a literal, an expression, or a variable that is not this role's option
            var, checked = m["var"], checked + 1
            guarded = var in asserted or var in str(task.get("when", ""))
            omits_empty = "default(omit, true)" in value.replace(" ", "").replace(",", ", ")
            why = _disagreement(var, options[var], f"{module}.{param}", mp, guarded, omits_empty)
            if why:
                problems.append(f"{f}: {why}")
    assert not problems, "\n".join(problems)
    assert checked or not calls, f"roles/{role} calls our modules {calls}x but no pass-through was recognised"


def test_raw_options_are_the_listed_ones_and_say_what_they_accept():
    raw = {k: o for role in ROLES for k, o in _options(role).items() if o.get("type") == "raw"}
    assert set(raw) == set(RAW_OPTIONS), (
        f"type raw: {sorted(raw)}; documented as multi-type: {sorted(RAW_OPTIONS)}"
    )
    for k, words in RAW_OPTIONS.items():
        text = (
            " ".join(raw[k]["description"])
            if isinstance(raw[k]["description"], list)
            else raw[k]["description"]
        )
        assert words in text, f"{k}: the description does not say it takes a {words}: {text!r}"


def test_the_compatibility_check_can_fail():
    """The rules of (c) refuse what a module would refuse (so the role test above could fail)."""
    assert _disagreement("x", {"type": "raw"}, "m.p", {"type": "int"}, False)
    assert _disagreement("x", {"type": "float"}, "m.p", {"type": "int"}, False)
    assert _disagreement(
        "x", {"type": "list", "elements": "str"}, "m.p", {"type": "list", "elements": "int"}, False
    )
    assert _disagreement(
        "x", {"type": "str", "choices": ["a", "b"]}, "m.p", {"type": "str", "choices": ["a"]}, False
    )
    assert _disagreement("x", {"type": "str"}, "m.p", {"type": "str", "choices": ["a"]}, False)
    assert not _disagreement("x", {"type": "str", "choices": ["a", "b"]}, "m.p", {"choices": ["a"]}, True)
    assert not _disagreement("x", {"type": "int"}, "m.p", {"type": "float"}, False)
    assert not _disagreement("x", {"type": "path"}, "m.p", {"type": "str"}, False)
    assert PASS_THROUGH.match("{{ a_b | default(omit, true) }}")["var"] == "a_b"
    assert not PASS_THROUGH.match("{{ a_b | ternary('x', 'y') }}")


INVENTORY_VARS = sorted(
    p.relative_to(REPO) for p in (REPO / "inventory").glob("*/*_vars/*.yml")
)  # fmt: skip


@pytest.mark.parametrize("rel", INVENTORY_VARS, ids=str)
def test_example_inventories_literal_values_pass_the_specs(rel):
    """Templated values are checked by the real validation run (tests/ansible/test_production_example.py)."""
    values = yaml.safe_load((REPO / rel).read_text()) or {}
    errors = []
    for options in map(_options, ROLES):
        mine = {k: v for k, v in values.items() if k in options and not _templated(v)}
        if mine:
            errors += ArgumentSpecValidator(_spec_for_validator(options)).validate(mine).error_messages
    assert not errors, f"{rel}: {errors}"


def test_every_sglang_version_option_offers_the_known_versions():
    """sglang_version, extract_sglang_version, serve_sglang_version: the version table's keys, no more."""
    from eagle3ops.sglang import versions as sglang_versions

    found = {
        k: o.get("choices") for r in ROLES for k, o in _options(r).items() if k.endswith("sglang_version")
    }
    assert set(found) >= {"sglang_version", "extract_sglang_version", "serve_sglang_version"}, found
    assert all(c == list(sglang_versions.KNOWN) for c in found.values()), found


def _facts(role: str) -> set[str]:
    """Variables the role's tasks set (set_fact): its outputs, which an inventory may preset."""
    names = set()
    for f in sorted((REPO / "roles" / role / "tasks").glob("*.yml")):
        for t in each_task(yaml.safe_load(f.read_text())):
            names |= set(t.get("ansible.builtin.set_fact") or t.get("set_fact") or {})
    return names


@pytest.mark.parametrize("rel", INVENTORY_VARS, ids=str)
def test_example_inventories_name_only_existing_options(rel):
    """A role-prefixed name an example sets, or shows commented (``# serve_port: 30000``), is an option of that
    role (or a fact the role sets): a typo or a renamed option is not silently ignored."""
    known = set().union(*(set(_options(r)) | _facts(r) for r in ROLES))
    prefixes = tuple(f"{r}_" for r in ROLES)
    unknown = [
        f"{rel}:{n}: {m[1]}"
        for n, line in enumerate((REPO / rel).read_text().splitlines(), 1)
        if (m := re.match(r"^(?:#\s?)?([a-z][a-z0-9_]*):(?:\s|$)", line))
        and m[1].startswith(prefixes)
        and m[1] not in known
    ]
    assert not unknown, f"not a role option: {unknown}"
