"""Typed option definitions: each phase's options are written once, and its CLI, its Ansible module's
``argument_spec`` and the module's argv are derived from them.

A phase's definition is ``<phase>/options.py`` in its package (``eagle3ops/prepare/options.py``, ...): one
:class:`Command` per ``eagle3ops`` sub-command, each a list of :class:`Option` (name, type, default, choices,
its one description ``doc``; the CLI flag, the module parameter and the role variable where they differ from the
name; the class is
:mod:`eagle3ops.option_def`'s, re-exported here). From it:

- ``eagle3ops.<phase>.commands`` generates the sub-command's argparse parser (:meth:`Command.add_parser`): the
  parsed ``args.<name>`` is what the phase's function takes;
- the module in ``library/`` builds ``AnsibleModule(argument_spec=COMMAND.argument_spec())`` and hands its
  params to ``module_utils/eagle3ops_cli.CliRunner``, which turns them into argv with :meth:`Option.argv`;
- ``make options`` (:mod:`eagle3ops.option_render`) writes the module's DOCUMENTATION options, the role's
  ``defaults/main.yml``, ``meta/argument_specs.yml``, task pass-through and README entries from it, between marker
  comments (``tests/unit/core/test_options_generated.py`` fails when they differ from what it writes);
- ``tests/unit/core/test_options.py`` fails when the module's DOCUMENTATION, the role's ``meta/argument_specs.yml``
  or ``defaults/main.yml`` disagree with the definition (names, types, defaults, choices), and proves that
  params -> argv -> the generated parser gives every value back.

**Standard library only, and no other eagle3ops import but** :mod:`eagle3ops.option_def` (Python >= 3.9): the
modules run on the target with the system Python, where Ansible ships this file as
``module_utils/eagle3ops_options.py`` (a symlink to it), ``option_def`` as ``eagle3ops_option_def.py`` and each
phase's definition as ``module_utils/eagle3ops_<phase>_options.py``; ``tests/unit/core/test_durable.py``
enforces the rule for every shipped file.

Check mode is one flag everywhere: ``--check``.
"""

from __future__ import annotations

try:
    from eagle3ops.option_def import _UNSET, EXECUTABLE, Option, plain
except ImportError:  # on a target, as module_utils/eagle3ops_options.py: eagle3ops is not installed there
    from ansible.module_utils.eagle3ops_option_def import _UNSET, EXECUTABLE, Option, plain

__all__ = [
    "CHECK_FLAG",
    "EXECUTABLE",
    "Command",
    "Group",
    "Module",
    "Option",
    "conversation_inputs",
    "count",
    "data_dir",
    "one_of",
    "plain",
    "seconds",
    "seed",
    "target_model",
    "trust_remote_code",
    "work_path",
]

CHECK_FLAG = "--check"


class Command:
    """One ``eagle3ops`` sub-command and the module that drives it.

    module: the library/ module that runs this command (its argument_spec is :meth:`argument_spec`).
    role: the role whose variables feed that module; its variables are ``<role_prefix>_<param>`` (role_prefix:
      the role's name unless given) unless an option names its own.
    check: the command has the check-mode flag (``--check``).
    exclusive: tuples of option names of which exactly one must be given (a required mutually exclusive group on
      the command line; the module's ``required_one_of`` and ``mutually_exclusive``: :meth:`one_of`).
    cli: False for a module that calls the host wing directly and has no sub-command behind it (the storage and
      services modules: the PVE host has no eagle3ops); the definition gives its argument_spec only, and the role
      and documentation are checked against it; its options' own ``cli`` is then ignored.
    A command inside a :class:`Group` (``eagle3ops storage plan``) has the group's name in :attr:`words`.
    """

    def __init__(
        self,
        name,
        options,
        *,
        help,
        description=None,
        module=None,
        role=None,
        role_prefix=None,
        check=True,
        check_help="write nothing; report what would change",
        exclusive=(),
        cli=True,
    ):
        self.name = name
        self.group = None  # set by Group
        self.cli = cli
        self.exclusive = [tuple(names) for names in exclusive]
        self.options = list(options)
        self.help = help
        self.description = description
        self.module = module
        self.role = role
        self.role_prefix = role_prefix or role
        self.check = check
        self.check_help = check_help
        names = [o.name for o in self.options]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup or "check" in names:
            raise ValueError(f"command {name}: options named twice or reserved: {dup or ['check']}")
        params = {o.param for o in self.options if o.param}
        clash = sorted(o.name for o in self.options if not o.param and o.name in params)
        if clash:  # argv() takes CLI-only values by name beside the module params
            raise ValueError(f"command {name}: CLI-only options named like module parameters: {clash}")
        for group in self.exclusive:
            bad = [n for n in group if n not in names or self.option(n).required or not self.option(n).cli]
            if bad or len(group) < 2:
                raise ValueError(f"command {name}: exclusive {group}: unknown, required or module-only {bad}")
        if not cli and not module:
            raise ValueError(f"command {name}: a module-only definition (cli=False) needs its module")
        if cli:
            raw = [o.name for o in self.options if o.cli and o.type == "raw"]
            if raw:
                raise ValueError(f"command {name}: raw options are module parameters only (cli=False): {raw}")

    def __repr__(self):
        return f"Command({self.full_name!r}, {len(self.options)} options)"

    @property
    def words(self) -> tuple:
        """The sub-command's words after ``eagle3ops``: ``("prepare",)``, ``("storage", "plan")``."""
        return (self.group, self.name) if self.group else (self.name,)

    @property
    def full_name(self) -> str:
        return " ".join(self.words)

    def option(self, name) -> Option:
        for o in self.options:
            if o.name == name:
                return o
        raise KeyError(f"{self.name}: no option {name}")

    def defaults(self) -> dict:
        """{option name: its default}: what the Python API the command calls takes as its own defaults
        (``margin_frac: float = _D["margin"]`` in ``ExtractConfig``), so each value is written once, here. A list
        or dict default is a field's ``default_factory``, not a shared value."""
        return {o.name: o.default for o in self.options}

    # ---- the CLI side ----------------------------------------------------------------------------------
    def add_parser(self, subparsers):
        """The sub-command's parser, every option on it, ``--check`` and ``--json``."""
        if not self.cli:
            raise ValueError(f"{self.name}: a module-only definition has no sub-command")
        p = subparsers.add_parser(
            self.name, help=self.help, description=_description(self.help, self.description)
        )
        self.add_arguments(p)
        return p

    def add_arguments(self, parser) -> None:
        groups = {}
        for names in self.exclusive:
            group = parser.add_mutually_exclusive_group(required=True)
            groups.update(dict.fromkeys(names, group))
        flags = {key: o.flag for o in self.options if o.cli for key in (o.name, o.param) if key}
        for o in self.options:
            if o.cli:
                o.add_to(groups.get(o.name, parser), flags)
        if self.check:
            parser.add_argument(CHECK_FLAG, dest="check", action="store_true", help=self.check_help)
        parser.add_argument(
            "--json", action="store_true", help="print the result as one JSON object on stdout"
        )

    # ---- the module side -------------------------------------------------------------------------------
    def module_options(self) -> list:
        """The options that are module parameters, in definition order."""
        return [o for o in self.options if o.param]

    def argument_spec(self) -> dict:
        return {o.param: o.spec() for o in self.module_options()}

    def problems(self, params) -> list:
        """What is wrong with these module params, one line each (the parameter, its role variable, the value and
        what is allowed): a value out of its option's bounds, a relative path. Empty when they are all right."""
        roles = {o.param: var for var, o in self.role_variables().items()}
        out = []
        for o in self.module_options():
            value = params.get(o.param)
            why = o.problem(value) or o.path_problem(value)
            if why:
                var = roles.get(o.param)
                out.append(f"{o.param}{f' (role variable {var})' if var else ''}: {why}")
        return out

    def cli_options(self) -> list:
        """The options on the command line (none for a module-only definition)."""
        return [o for o in self.options if o.cli] if self.cli else []

    def one_of(self) -> list:
        """``exclusive`` as module parameters: the module's ``required_one_of`` and ``mutually_exclusive``."""
        return [tuple(self.option(n).param for n in names) for names in self.exclusive]

    def argv(self, params, check=False) -> list:
        """``[name, ...]``: the command line that gives the command these module params (None = left out). A
        CLI-only option takes its value from ``params`` by its name when the module computed one (e.g.
        ``action``), else its ``module_value`` if it has one."""
        if not self.cli:
            raise ValueError(f"{self.name}: a module-only definition has no command line")
        words = list(self.words)
        for o in self.options:
            if not o.cli:
                continue
            if o.param:
                words += o.argv(params.get(o.param))
            elif o.name in params:
                words += o.argv(params[o.name])
            elif o.module_value is not _UNSET:
                words += o.argv(o.module_value)
        if check:
            if not self.check:
                raise ValueError(f"eagle3ops {self.name} has no check mode")
            words.append(CHECK_FLAG)
        return words

    def role_variables(self) -> dict:
        """{role variable: option} for the options a role variable feeds."""
        out = {}
        for o in self.module_options():
            if o.role is False:
                continue
            var = o.role or (f"{self.role_prefix}_{o.param}" if self.role else None)
            if var:
                out[var] = o
        return out


def _description(help_line: str, more: str | None) -> str:
    """A command's own ``--help`` starts with its one-line help as a sentence, then what more it says."""
    first = help_line[:1].upper() + help_line[1:]
    first = first if first.endswith(".") else first + "."
    return f"{first} {more}" if more else first


class Group:
    """A sub-command whose actions are commands of their own (``eagle3ops storage plan|status``): each
    :class:`Command` gets the group's name in its :attr:`Command.words`; :meth:`add_parser` registers them all
    under one parser (given alone, the group prints its help, exit 2)."""

    def __init__(self, name, commands, *, help, description=None):
        self.name = name
        self.commands = list(commands)
        self.help = help
        self.description = description
        for c in self.commands:
            if not c.cli or c.group not in (None, name):
                raise ValueError(f"group {name}: command {c.name} is module-only or in group {c.group}")
            c.group = name

    def __repr__(self):
        return f"Group({self.name!r}, {[c.name for c in self.commands]})"

    def command(self, name) -> Command:
        for c in self.commands:
            if c.name == name:
                return c
        raise KeyError(f"{self.name}: no command {name}")

    def add_parser(self, subparsers) -> dict:
        """The group's parser and each command's under it: {command name: its parser}."""
        p = subparsers.add_parser(
            self.name, help=self.help, description=_description(self.help, self.description)
        )
        sub = p.add_subparsers(dest=f"{self.name}_command", metavar="ACTION")
        p.set_defaults(func=lambda args: p.print_help() or 2)
        return {c.name: c.add_parser(sub) for c in self.commands}


class Module:
    """A module that runs one of several commands, picked by its ``action`` parameter.

    actions: {action: Command}. Its parameters are the union of the commands' (a parameter several commands
    share must have one type, elements and choices; its default is the first command's, so a command whose CLI
    default differs says so with ``module_default``), none of them ``required`` (the module's ``required_if``
    says what each action needs), plus ``extra`` module-only options (the ``action`` itself, ...).
    """

    def __init__(self, name, actions, extra=()):
        self.name = name
        self.actions = dict(actions)
        self.extra = list(extra)
        for c in self.actions.values():
            if c.module != name:
                raise ValueError(f"module {name}: command {c.name} names module {c.module}")
        self.options()  # refuse a definition whose shared parameters disagree, at import

    def __repr__(self):
        return f"Module({self.name!r}, {sorted(self.actions)})"

    def options(self) -> dict:
        """{parameter: option} as the module has them (not required; the first command's default)."""
        out = {o.param: o for o in self.extra}
        for o in (o for c in self.actions.values() for o in c.module_options()):
            mine = o.but(required=False)
            if o.param not in out:
                out[o.param] = mine
                continue
            first = out[o.param].spec()
            if {k: v for k, v in mine.spec().items() if k != "default"} != {
                k: v for k, v in first.items() if k != "default"
            }:
                raise ValueError(
                    f"module {self.name} parameter {o.param}: {first} in one action, {mine.spec()} in another"
                )
            bounds = ("minimum", "maximum", "above", "words", "command")
            if [getattr(mine, b) for b in bounds] != [getattr(out[o.param], b) for b in bounds]:
                raise ValueError(f"module {self.name} parameter {o.param}: other bounds in one action")
            if mine.module_default != out[o.param].module_default:
                raise ValueError(
                    f"module {self.name} parameter {o.param}: default {out[o.param].module_default!r} in one "
                    f"action, {mine.module_default!r} in another (give the second a module_default)"
                )
        return out

    def argument_spec(self) -> dict:
        return {param: o.spec() for param, o in self.options().items()}


def one_of(name, choices, **kw) -> Option:
    """A str option that takes one of ``choices``, the first of them by default (``on_error``: fail or skip)."""
    return Option(name, choices=choices, default=choices[0], **kw)


def count(name, **kw) -> Option:
    """An int option that counts something (rows, steps, workers, requests in flight): a whole number, 1 or more;
    no default unless given."""
    return Option(name, "int", minimum=1, **kw)


def seconds(name, **kw) -> Option:
    """A float option that is a time in seconds (a timeout, a wait, a retry delay): 0 or more."""
    return Option(name, "float", minimum=0, **kw)


def seed(**kw) -> Option:
    """The int ``seed`` option (of whatever the command draws at random): 0 or more."""
    return Option("seed", "int", minimum=0, **kw)


def target_model(name: str, use: str, **kw) -> Option:
    """The required path option naming the target model's directory; ``use``: what the command takes of it."""
    kw.setdefault("doc", f"target model directory ({use})")
    return Option(name, "path", required=True, **kw)


def trust_remote_code(what: str = "tokenizer and config", **kw) -> Option:
    """``--trust-remote-code``: let the target's own code (an ``auto_map`` in its tokenizer_config.json or
    config.json: Kimi-K2.5's tiktoken tokenizer) run where this command loads its ``what``; one shared
    ``eagle3ops_trust_remote_code`` for every phase (eagle3ops.remote_code refuses a remote-code target without
    it, before any work)."""
    kw.setdefault("role_value", "{{ eagle3ops_trust_remote_code }}")
    kw.setdefault(
        "doc",
        f"Let the target's own code (an auto_map in tokenizer_config.json or config.json) load its {what}; "
        "Kimi-K2.5 needs it. Off, a remote-code target is refused before any work. Only for trusted model "
        "directories.",
    )
    return Option("trust_remote_code", "bool", default=False, **kw)


def server_tokenizer_check() -> list[Option]:
    """The serve-time tokenizer check's options (eagle3ops.serve.tokcheck), for the commands that measure a running
    server (the guard, benchmark-live): on by default, the prepared data it samples, the tokenizer's model."""
    check = Option(
        "tokenizer_check",
        "bool",
        default=True,
        doc=(
            "Before anything is measured, compare the server's C(/v1/tokenize) with a sample of the prepared rows "
            "(O(data_dir)) and the target's chat template; a difference fails (exit 2) naming the row and the "
            "first differing token. A server without the endpoint, or no prepared data, is reported as not "
            "checked. C(guard), C(live)."
        ),
    )
    data = Option(
        "data_dir",
        "path",
        flag="--data",
        doc=(
            "The prepared data directory the draft was trained on: the tokenizer check's sample (unset: not "
            "checked); C(guard), C(live)."
        ),
        role_value="{{ eagle3ops_data_dir }}",
    )
    model = Option(
        "tokenizer_model",
        "path",
        metavar="MODEL_DIR",
        role=False,  # the roles pass the target they serve
        doc=(
            "The model directory whose tokenizer the server loads (default the one prepare recorded); C(guard), "
            "C(live)."
        ),
    )
    return [check, data, model]


def data_dir(name: str, **kw) -> Option:
    """The required path option naming the pipeline's data directory, one for every phase that reads or writes it
    (prepare writes the Arrow rows, extract writes hidden_states/ inside it, train reads both); the role's default
    is the shared ``eagle3ops_data_dir`` unless the phase says otherwise (``role_value``)."""
    kw.setdefault("role_value", "{{ eagle3ops_data_dir }}")
    return Option(name, "path", required=True, **kw)


def work_path(name: str, under: str, **kw) -> Option:
    """A required path option for what a phase writes, by default ``under`` the shared work directory (the role's
    default ``{{ eagle3ops_workdir }}/<under>``: one tree a run's outputs live in unless the inventory moves one)."""
    return Option(name, "path", required=True, role_value="{{ eagle3ops_workdir }}/" + under, **kw)


def conversation_inputs(role: str, **kw) -> Option:
    """``--input PATH`` (repeatable; the module's ``inputs``): the conversations prepare and regenerate read, in
    the forms eagle3ops.conversations takes."""
    return Option(
        "input",
        "list",
        elements="path",
        required=True,
        nargs="append",
        metavar="PATH",
        param="inputs",
        role=role,
        **{
            "doc": "JSONL/JSON file, directory of them, or a datasets.save_to_disk directory (repeatable)",
            **kw,
        },
    )
