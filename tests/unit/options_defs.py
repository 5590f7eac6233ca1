"""Shared by tests/unit/core/test_options*.py: every option definition (issue 19) by its command's full name, the
parsers ``eagle3ops`` builds from them, and the sample values and stand-in AnsibleModule those tests feed them."""

from __future__ import annotations

import argparse
import functools
import importlib
from pathlib import Path

from eagle3ops import cli, options

REPO = Path(__file__).resolve().parents[2]
PKG = REPO / "python" / "eagle3ops"
DEFINITIONS = sorted(p.parent.name for p in PKG.glob("*/options.py"))  # the phases with a definition
TOOLS = "eagle3ops.tools._options"  # the tools of no phase (no module runs them: not shipped)


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


def _subparsers(parser: argparse.ArgumentParser) -> dict:
    """{name: parser} of the sub-commands under ``parser``, by their current names (an older name a command
    keeps as an alias, ``status`` for ``extract-status``, is the same parser: tests/unit/core/test_cli_help.py)."""
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
