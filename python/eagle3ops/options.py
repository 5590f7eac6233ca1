"""Typed option definitions: each phase's options are written once, and its CLI, its Ansible module's
``argument_spec`` and the module's argv are derived from them.

A phase's definition is ``<phase>/options.py`` in its package (``eagle3ops/prepare/options.py``, ...): one
:class:`Command` per ``eagle3ops`` sub-command, each a list of :class:`Option` (name, type, default, choices,
help; the CLI flag, the module parameter and the role variable where they differ from the name). From it:

- ``eagle3ops.<phase>.commands`` generates the sub-command's argparse parser (:meth:`Command.add_parser`): the
  parsed ``args.<name>`` is what the phase's function takes;
- the module in ``library/`` builds ``AnsibleModule(argument_spec=COMMAND.argument_spec())`` and hands its
  params to ``module_utils/eagle3ops_cli.CliRunner``, which turns them into argv with :meth:`Option.argv`;
- ``tests/unit/test_options.py`` fails when the module's DOCUMENTATION, the role's ``meta/argument_specs.yml``
  or ``defaults/main.yml`` disagree with the definition (names, types, defaults, choices), and proves that
  params -> argv -> the generated parser gives every value back.

**Standard library only, and no other eagle3ops import** (Python >= 3.9): the modules run on the target with
the system Python, where Ansible ships this file as ``module_utils/eagle3ops_options.py`` (a symlink to it) and
each phase's definition as ``module_utils/eagle3ops_<phase>_options.py``; ``tests/unit/test_durable.py``
enforces the rule for every shipped file.

Check mode is one flag everywhere: ``--check`` (``--plan``, its older name in some commands, is an alias).
"""

from __future__ import annotations

import argparse
import json
import sys

__all__ = [
    "CHECK_FLAG",
    "EXECUTABLE",
    "Command",
    "Group",
    "Module",
    "Option",
    "conversation_inputs",
    "one_of",
    "target_model",
]

_UNSET = object()
CHECK_FLAG = "--check"
CHECK_ALIASES = ("--plan",)  # what extract, sglang-extract and regenerate called it before
_ARG_TYPES = {"str": str, "path": str, "int": int, "float": float}


class Option:
    """One option of one command.

    name: the Python name (``args.<name>``; the function parameter); also the module parameter and the role
      variable's suffix unless ``param`` / ``role`` say otherwise.
    type: an Ansible type: str, path, int, float, bool, list (with ``elements``), dict (``NAME=VALUE`` pairs on
      the command line, or with ``as_json`` one JSON object: a nested mapping such as speculators' config groups);
      raw (a module parameter only, of several types: the container module's ``gpus``, ``all`` or a list).
    default, choices, help, required: as in argparse and Ansible (one default for the CLI and the module).
    flag: the CLI flag (default ``--name-with-dashes``); ``positional=True`` makes it a positional argument.
      A bool whose default is True gets ``--flag/--no-flag``; one whose default is False ``--flag``.
    aliases: older CLI flags that still work (same meaning); false_aliases: older flags that set a bool to False
      (``--gpu-optional`` for ``gpu_required``).
    nargs: for a list, ``"+"`` (``--flag a b``, the default) or ``"append"`` (``--flag a --flag b``).
    param: the module parameter's name, or False when the module has no such parameter (CLI only).
    module_value: for a CLI-only option, the value the module always passes (e.g. ``progress=False``).
    cli: False for a module-only parameter (``executable``: where the CLI is; ``state``: mapped by the module).
    role: the role variable that feeds the module parameter (default ``<role prefix>_<param>``), or False.
    module_default: the module parameter's default where it deliberately differs from the CLI's (say why beside
      it); the module always passes its value, so the CLI's default only serves direct CLI calls.
    role_default: the role's default where it deliberately differs from the module's (the agreement test checks
      ``defaults/main.yml`` and ``meta/argument_specs.yml`` against it, else against the module's default).
    no_log: passed to the argument_spec (Ansible asks for it on names that look like secrets: ``*_tokens``).
    as_json: a dict given on the command line as one JSON object (``--extra '{"loss": {...}}'``).
    minimum, maximum: the smallest / largest value an int or float option takes (``above``: a strict lower bound,
      ``lr > 0``); on a str option with ``words`` the value is one of the words or a whole number within them
      (``workers``: ``auto`` or at least 1). Checked before anything runs: the generated parser refuses another
      value (exit 2, the flag and what is allowed named) and ``module_utils/eagle3ops_cli.CliRunner`` fails the
      task naming the parameter and its role variable (:meth:`Command.problems`); the role's argument_specs cannot
      say it.
    words: with ``minimum`` on a str option, the words taken beside a number (``("auto",)``).
    why: why the bounds are what they are, said with a refused value (``the target needs at least 1 step``).
    command: a path option that names a program: a bare name (no ``/``) is looked up on PATH, so only a value
      with a ``/`` in it must be absolute (``executable``).

    A module parameter of type path (or a list of paths) must be absolute: a module's working directory is not
    the inventory's nor the playbook's (a relative ``data_dir`` wrote into ``playbooks/``); the CLI resolves a
    relative path against the shell's directory as usual.
    """

    def __init__(
        self,
        name,
        type="str",
        *,
        default=None,
        help="",
        choices=None,
        elements=None,
        required=False,
        flag=None,
        aliases=(),
        false_aliases=(),
        positional=False,
        nargs=None,
        metavar=None,
        param=None,
        module_value=_UNSET,
        module_default=_UNSET,
        cli=True,
        role=None,
        role_default=_UNSET,
        no_log=None,
        as_json=False,
        minimum=None,
        maximum=None,
        above=None,
        words=(),
        why=None,
        command=False,
    ):
        if type not in ("str", "path", "int", "float", "bool", "list", "dict", "raw"):
            raise ValueError(f"option {name}: unknown type {type!r}")
        if type == "list" and not elements:
            raise ValueError(f"option {name}: a list needs elements")
        if as_json and type != "dict":
            raise ValueError(f"option {name}: as_json is for a dict")
        bounded = minimum is not None or maximum is not None or above is not None
        if bounded and type not in ("int", "float") and not (type == "str" and words):
            raise ValueError(f"option {name}: a bound is for an int or float (or a str with words)")
        if words and (type != "str" or minimum is None):
            raise ValueError(f"option {name}: words are for a str option with a minimum")
        self.name = name
        self.type = type
        self.default = default
        self.help = help
        self.choices = list(choices) if choices is not None else None
        self.elements = elements
        self.required = required or positional  # argparse requires a positional argument
        self.positional = positional
        self.flag = name if positional else (flag or "--" + name.replace("_", "-"))
        self.aliases = tuple(aliases)
        self.false_aliases = tuple(false_aliases)
        self.nargs = nargs or ("+" if type == "list" else None)
        self.metavar = metavar
        self.param = name if param is None else param
        self.module_value = module_value
        self.module_default = default if module_default is _UNSET else module_default
        self.cli = cli
        self.role = role
        self.role_default = role_default
        self.no_log = no_log
        self.as_json = as_json
        self.minimum = minimum
        self.maximum = maximum
        self.above = above
        self.words = tuple(words)
        self.why = why
        self.command = command

    def __repr__(self):
        return f"Option({self.name!r}, {self.type!r}, default={self.default!r})"

    def but(self, **changes) -> Option:
        """A copy with some fields changed (one option shared by two commands with, say, fewer choices)."""
        new = object.__new__(Option)
        new.__dict__.update(self.__dict__)
        for k, v in changes.items():
            if k not in new.__dict__:
                raise TypeError(f"option {self.name}: no field {k}")
            new.__dict__[k] = list(v) if k == "choices" and v is not None else v
        return new

    @property
    def negatable(self) -> bool:
        """A bool that is on by default: the CLI offers ``--no-<flag>``."""
        return self.type == "bool" and self.default is True

    @property
    def no_flag(self) -> str:
        return "--no-" + self.flag[2:]

    # ---- what values are allowed -----------------------------------------------------------------------
    @property
    def bounded(self) -> bool:
        return self.minimum is not None or self.maximum is not None or self.above is not None

    def allowed(self) -> str:
        """What the option takes, in words (``'auto' or a whole number, 1 or more``)."""
        parts = []
        if self.above is not None:
            parts.append(f"more than {self.above}")
        if self.minimum is not None:
            parts.append(f"{self.minimum} or more")
        if self.maximum is not None:
            parts.append(f"at most {self.maximum}")
        text = " and ".join(parts)
        if self.type in ("int", "str"):
            text = f"a whole number, {text}"
        if self.words:
            text = " or ".join(repr(w) for w in self.words) + " or " + text
        return text

    def problem(self, value) -> str | None:
        """None when ``value`` (a parsed or module value; None: not given) is allowed, else what is wrong with it
        (``-1.0 must be 0 or more``; with ``why``: ``0: the target needs ... (a whole number, 1 or more)``)."""
        if value is None or not self.bounded:
            return None
        shown = repr(value) if isinstance(value, str) else str(value)
        wrong = f"{shown}: {self.why} ({self.allowed()})" if self.why else f"{shown} must be {self.allowed()}"
        if self.type == "str":
            text = str(value).strip()
            if text in self.words:
                return None
            try:
                value = int(text)
            except ValueError:
                return wrong
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return wrong
        if (
            (self.minimum is not None and value < self.minimum)
            or (self.maximum is not None and value > self.maximum)
            or (self.above is not None and value <= self.above)
        ):
            return wrong
        return None

    def path_problem(self, value) -> str | None:
        """For a module parameter of type path (or a list of paths): what is wrong with a relative path in it."""
        if self.type == "path":
            values = [value]
        elif self.type == "list" and self.elements == "path":
            values = list(value or [])
        else:
            return None
        for v in values:
            if v is None or v == "" or str(v).startswith("/"):
                continue
            if self.command and "/" not in str(v):
                continue  # a program looked up on PATH
            return (
                f"{v!r} is a relative path: give an absolute one (a module does not run in the inventory's "
                "or the playbook's directory, so a relative path would land somewhere else)"
            )
        return None

    def _arg_type(self):
        """The argparse ``type`` of a scalar: the conversion, and the bounds checked with the flag named."""
        base = _ARG_TYPES[self.elements if self.type == "list" else self.type]
        if not self.bounded or self.type == "list":
            return base

        def convert(text):
            try:
                value = base(text)
            except ValueError:
                value = text
            why = self.problem(value)
            if why:
                raise argparse.ArgumentTypeError(f"{self.flag} {why}")
            return value

        convert.__name__ = self.type
        return convert

    # ---- the module side -------------------------------------------------------------------------------
    def spec(self) -> dict:
        """This option's entry in the module's argument_spec."""
        s = {"type": self.type}
        if self.elements:
            s["elements"] = self.elements
        if self.required:
            s["required"] = True
        if self.module_default is not None:
            d = self.module_default
            s["default"] = list(d) if isinstance(d, tuple) else d
        if self.choices is not None:
            s["choices"] = list(self.choices)
        if self.no_log is not None:
            s["no_log"] = self.no_log
        return s

    def argv(self, value) -> list:
        """The command-line words that give this option ``value``: nothing for None, an empty list, or an empty
        string where the option has no default (a role's ``""`` means "not set")."""
        if value is None or (value == "" and self.default is None):
            return []
        if self.type == "bool":
            if self.negatable:
                return [self.flag] if value else [self.no_flag]
            return [self.flag] if value else []
        if self.type == "list":
            if not value:
                return []
            words = [str(v) for v in value]
            if self.positional:
                return words
            if self.nargs == "append":
                return [w for v in words for w in self._one(v)]
            return [self.flag, *words]
        if self.type == "dict" and self.as_json:
            return self._one(json.dumps(value, sort_keys=True)) if value else []
        if self.type == "dict":
            return [w for k, v in sorted(value.items()) for w in self._one(f"{k}={v}")]
        return [str(value)] if self.positional else self._one(str(value))

    def _one(self, word: str) -> list:
        """``--flag VALUE``, or ``--flag=VALUE`` for a value argparse would take for a flag (``-m sglang``)."""
        return [f"{self.flag}={word}"] if word.startswith("-") else [self.flag, word]

    # ---- the CLI side ----------------------------------------------------------------------------------
    def add_to(self, parser) -> None:
        if self.type == "raw":
            raise ValueError(f"option {self.name}: a raw option is a module parameter only (cli=False)")
        kw = {"help": self._help()}
        if self.metavar:
            kw["metavar"] = self.metavar
        if self.type == "bool":
            kw["action"] = argparse.BooleanOptionalAction if self.negatable else "store_true"
            kw["default"] = bool(self.default)
        elif self.type == "dict" and self.as_json:
            kw.update(type=_json_object, default=dict(self.default or {}))
            kw.setdefault("metavar", "JSON")
        elif self.type == "dict":
            kw.update(action=_PairsAction, default=dict(self.default or {}))
            kw.setdefault("metavar", "NAME=VALUE")
        else:
            kw["type"] = self._arg_type()
            if self.choices is not None:
                kw["choices"] = self.choices
            if self.type == "list":
                if self.nargs == "append":
                    kw["action"] = _Append
                else:
                    kw["nargs"] = "+"
            kw["default"] = list(self.default) if isinstance(self.default, (list, tuple)) else self.default
        if self.positional:
            kw.pop("default", None)
            parser.add_argument(self.name, **kw)
            return
        if self.required:
            kw["required"] = True
        parser.add_argument(self.flag, *self.aliases, dest=self.name, **kw)
        for old in self.false_aliases:
            parser.add_argument(old, dest=self.name, action="store_false", help=f"the same as {self.no_flag}")

    def _help(self) -> str:
        text = self.help
        if self.negatable:
            text += f" (default: {self.flag})"
        elif not (
            self.required or self.default is None or self.default is False or self.default in ([], (), {})
        ):
            shown = (
                " ".join(map(str, self.default)) if isinstance(self.default, (list, tuple)) else self.default
            )
            text += f" (default: {shown})"
        if self.bounded:
            text += f" ({self.allowed()})"
        return text.replace("%", "%%")


# every module that runs the CLI has it: where the eagle3ops command is on the target (doc fragment eagle3ops)
EXECUTABLE = Option("executable", "path", cli=False, command=True, help="the eagle3ops command on the target")


class _Append(argparse.Action):
    """``--flag a --flag b`` -> [a, b]; a given flag replaces the default list instead of adding to it."""

    def __call__(self, parser, namespace, value, option_string=None):
        current = getattr(namespace, self.dest)
        items = [] if current is None or current is self.default else list(current)
        setattr(namespace, self.dest, [*items, value])


def _json_object(text: str) -> dict:
    """A command-line word that must be one JSON object."""
    try:
        value = json.loads(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"not valid JSON ({e})") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"must be a JSON object, not {type(value).__name__}")
    return value


class _PairsAction(argparse.Action):
    """``--flag NAME=VALUE`` (repeatable) -> a dict; a flag given replaces the default, a name given twice is
    refused."""

    def __call__(self, parser, namespace, value, option_string=None):
        name, sep, v = value.partition("=")
        if not sep or not name:
            parser.error(f"{option_string} {value!r}: expected NAME=VALUE")
        d = {} if getattr(namespace, self.dest) is self.default else dict(getattr(namespace, self.dest) or {})
        if name in d:
            parser.error(f"{option_string} {name}: given twice")
        d[name] = v
        setattr(namespace, self.dest, d)


class _Renamed(argparse.Action):
    """A flag that no longer exists: one line naming the new one, exit 2."""

    def __init__(self, option_strings, dest, new="", why="", **kw):
        self.new, self.why = new, why
        super().__init__(option_strings, dest, nargs=0, help=argparse.SUPPRESS)

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"{parser.prog}: error: {option_string} was replaced by {self.new}{self.why}", file=sys.stderr)
        sys.exit(2)


class Command:
    """One ``eagle3ops`` sub-command and the module that drives it.

    module: the library/ module that runs this command (its argument_spec is :meth:`argument_spec`).
    role: the role whose variables feed that module; its variables are ``<role_prefix>_<param>`` (role_prefix:
      the role's name unless given) unless an option names its own.
    check: the command has the check-mode flag (``--check``; ``--plan`` still works).
    renamed: {old flag: new flag}: an old flag fails with one line naming the new one (exit 2).
    aliases: older names of the sub-command itself that still run it (``status`` for ``extract-status``); left out
      of ``eagle3ops --help``, which lists the names by phase.
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
        renamed=None,
        aliases=(),
        exclusive=(),
        cli=True,
    ):
        self.name = name
        self.aliases = tuple(aliases)
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
        self.renamed = dict(renamed or {})
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

    # ---- the CLI side ----------------------------------------------------------------------------------
    def add_parser(self, subparsers):
        """The sub-command's parser, every option on it, ``--check`` and ``--json``."""
        if not self.cli:
            raise ValueError(f"{self.name}: a module-only definition has no sub-command")
        kw = {"help": self.help, "description": _description(self.help, self.description)}
        if self.aliases:
            kw["aliases"] = list(self.aliases)
        p = subparsers.add_parser(self.name, **kw)
        self.add_arguments(p)
        return p

    def add_arguments(self, parser) -> None:
        groups = {}
        for names in self.exclusive:
            group = parser.add_mutually_exclusive_group(required=True)
            groups.update(dict.fromkeys(names, group))
        for o in self.options:
            if o.cli:
                o.add_to(groups.get(o.name, parser))
        if self.check:
            parser.add_argument(
                CHECK_FLAG, *CHECK_ALIASES, dest="check", action="store_true", help=self.check_help
            )
        for old, new in self.renamed.items():
            parser.add_argument(
                old, action=_Renamed, new=new, dest="_renamed_" + old.strip("-").replace("-", "_")
            )
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


def target_model(name: str, use: str, **kw) -> Option:
    """The required path option naming the target model's directory; ``use``: what the command takes of it."""
    return Option(name, "path", required=True, help=f"target model directory ({use})", **kw)


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
        help="JSONL/JSON file, directory of them, or a datasets.save_to_disk directory (repeatable)",
        **kw,
    )
