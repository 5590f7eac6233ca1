"""One option of an ``eagle3ops`` command, as :mod:`eagle3ops.options` defines commands with it: :class:`Option`
(name, type, default, choices, bounds, its one description ``doc``; its CLI flag, module parameter and role
variable), what it checks of a value, its module ``argument_spec`` entry, its argv words and its argparse argument
(with the argparse actions that reads lists and ``NAME=VALUE`` pairs; the ``--help`` line is :func:`plain` of the
description); and :data:`EXECUTABLE`, the option every module that runs the CLI has.

**Standard library only, and no eagle3ops import** (Python >= 3.9), like :mod:`eagle3ops.options`, which imports
it and re-exports its names (``options.Option``): on the target Ansible ships it as
``module_utils/eagle3ops_option_def.py`` (a symlink to it) beside ``eagle3ops_options.py``;
``tests/unit/core/test_durable.py`` enforces the rule for every shipped file.
"""

from __future__ import annotations

import argparse
import json
import re

_UNSET = object()
_ARG_TYPES = {"str": str, "path": str, "int": int, "float": float}


class Option:
    """One option of one command.

    name: the Python name (``args.<name>``; the function parameter); also the module parameter and the role
      variable's suffix unless ``param`` / ``role`` say otherwise.
    type: an Ansible type: str, path, int, float, bool, list (with ``elements``), dict (``NAME=VALUE`` pairs on
      the command line, or with ``as_json`` one JSON object: a nested mapping such as speculators' config groups);
      raw (a module parameter only, of several types: the container module's ``gpus``, ``all`` or a list).
    default, choices, required: as in argparse and Ansible (one default for the CLI and the module).
    doc: the option's one description, written once (a string, or a list of paragraphs; Ansible markup such as
      ``C(value)``, ``O(other_param)``, ``V(value)``, ``E(ENV)``). Every copy is rendered from it: the module's
      DOCUMENTATION takes it as it is (each paragraph as a sentence), the role's ``meta/argument_specs.yml``, its
      ``defaults/main.yml`` comment and README row with ``O(param)`` as the role variable that feeds it (and the
      role's templated default, see ``role_value``), ``--help`` all of it as plain text (:func:`plain`:
      ``O(param)`` as the CLI flag, ``C(x)`` as ``x``, no final period; the default and bounds appended). A fact
      only a role has (its default) comes from a structured field, not from a second description.
    flag: the CLI flag (default ``--name-with-dashes``); ``positional=True`` makes it a positional argument.
      A bool whose default is True gets ``--flag/--no-flag``; one whose default is False ``--flag``.
    nargs: for a list, ``"+"`` (``--flag a b``, the default) or ``"append"`` (``--flag a --flag b``).
    param: the module parameter's name, or False when the module has no such parameter (CLI only).
    module_value: for a CLI-only option, the value the module always passes (e.g. ``progress=False``).
    cli: False for a module-only parameter (``executable``: where the CLI is; ``state``: mapped by the module).
    role: the role variable that feeds the module parameter (default ``<role prefix>_<param>``), or False.
    module_default: the module parameter's default where it deliberately differs from the CLI's (say why beside
      it); the module always passes its value, so the CLI's default only serves direct CLI calls.
    role_default: the role's default where it deliberately differs from the module's (the agreement test checks
      ``defaults/main.yml`` and ``meta/argument_specs.yml`` against it, else against the module's default).
    role_choices: the choices the role's ``meta/argument_specs.yml`` offers for its variable (refused at the role's
      start, before anything runs), where the CLI and the module refuse another value themselves with a message
      of their own: the SGLang versions, from eagle3ops' version table (the known ones listed, JSON ``known``).
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
    role_value: the role's default in ``defaults/main.yml`` when it is a template of the shared variables of
      roles/eagle3ops (``"{{ eagle3ops_data_dir }}"``); argument_specs documents what it renders to.
    role_pass: what the role's task adds after the variable when it passes it (``" | default(omit, true)"``,
      the default for an option without a default).
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
        doc="",
        choices=None,
        elements=None,
        required=False,
        flag=None,
        positional=False,
        nargs=None,
        metavar=None,
        param=None,
        module_value=_UNSET,
        module_default=_UNSET,
        cli=True,
        role=None,
        role_default=_UNSET,
        role_choices=None,
        no_log=None,
        as_json=False,
        minimum=None,
        maximum=None,
        above=None,
        words=(),
        why=None,
        command=False,
        role_value=None,
        role_pass=None,
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
        self.doc = doc
        self.choices = list(choices) if choices is not None else None
        self.elements = elements
        self.required = required or positional  # argparse requires a positional argument
        self.positional = positional
        self.flag = name if positional else (flag or "--" + name.replace("_", "-"))
        self.nargs = nargs or ("+" if type == "list" else None)
        self.metavar = metavar
        self.param = name if param is None else param
        self.module_value = module_value
        self.module_default = default if module_default is _UNSET else module_default
        self.cli = cli
        self.role = role
        self.role_default = role_default
        self.role_choices = list(role_choices) if role_choices is not None else None
        self.no_log = no_log
        self.as_json = as_json
        self.minimum = minimum
        self.maximum = maximum
        self.above = above
        self.words = tuple(words)
        self.why = why
        self.command = command
        self.role_value = role_value
        self.role_pass = role_pass

    def __repr__(self):
        return f"Option({self.name!r}, {self.type!r}, default={self.default!r})"

    def but(self, **changes) -> Option:
        """A copy with some fields changed (one option shared by two commands with, say, fewer choices)."""
        new = object.__new__(Option)
        new.__dict__.update(self.__dict__)
        for k, v in changes.items():
            if k not in new.__dict__:
                raise TypeError(f"option {self.name}: no field {k}")
            new.__dict__[k] = list(v) if k in ("choices", "role_choices") and v is not None else v
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
    def add_to(self, parser, flags=None) -> None:
        """Add the argparse argument; ``flags``: {parameter or name: CLI flag} of the command's options, for the
        ``O(param)`` of the description."""
        if self.type == "raw":
            raise ValueError(f"option {self.name}: a raw option is a module parameter only (cli=False)")
        kw = {"help": self.cli_help(flags)}
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
        parser.add_argument(self.flag, dest=self.name, **kw)

    def cli_help(self, flags=None) -> str:
        """The ``--help`` text: :attr:`doc` (its paragraphs in one) as plain text (:func:`plain`), capitalised,
        without its final period, then the default (or ``--flag``'s being on) and the bounds in parentheses."""
        text = " ".join(self.doc) if isinstance(self.doc, (list, tuple)) else (self.doc or "")
        text = text[:1].upper() + text[1:]  # the module documentation's sentence (C(fail) stays fail)
        text = plain(text, {self.param or self.name: self.flag, **(flags or {})})
        text = text[:-1] if text.endswith(".") and not text.endswith("...") else text
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


_MARKUP = re.compile(r"\b(C|I|O|V|E|RV|M|U|L)\(([^()]*)\)")


def plain(text: str, flags=None) -> str:
    """A description without Ansible markup, as ``--help`` shows it: ``O(param)`` (or ``I(param)``) as the CLI flag
    of that option where ``flags`` ({parameter or name: flag}) has it, ``O(param=value)`` as ``flag=value``,
    ``L(text,url)`` as its text, ``C(x)``/``V(x)``/``E(x)`` and the rest as ``x``."""
    flags = flags or {}

    def one(m):
        kind, body = m.group(1), m.group(2)
        if kind in ("O", "I"):
            name, eq, value = body.partition("=")
            return flags.get(name, name) + eq + value
        if kind == "L":
            return body.split(",")[0]
        return body

    return _MARKUP.sub(one, " ".join(text.split()))


# every module that runs the CLI has it: where the eagle3ops command is on the target (doc fragment eagle3ops)
EXECUTABLE = Option(
    "executable",
    "path",
    cli=False,
    command=True,
    doc=[
        "Path of the C(eagle3ops) command on the target (from the C(runtime) phase's venv).",
        "When omitted, C(eagle3ops) next to the module's Python interpreter, then on E(PATH).",
    ],
    role_value="{{ eagle3ops_bin }}",
    role_pass="",
)


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
