"""The ``eagle3ops`` command line.

Sub-commands are discovered: every phase package ``eagle3ops.<phase>`` that has a ``commands`` module, and every
module in ``eagle3ops.tools`` (the tools that belong to no phase), defines ``register(subparsers)`` and sets
``func`` on its parsers. Every command accepts ``--json``: the result is then printed as one JSON object on the
last line of stdout (what the Ansible modules read), and human progress goes to stderr. What the commands share
(``CommandError``, ``emit``) lives in :mod:`eagle3ops.command`; nothing imports this module but the entry points.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import importlib.util
import json
import pkgutil
import shutil
import sys
import textwrap
import traceback

import eagle3ops
from eagle3ops import __version__, tools
from eagle3ops.command import CommandError, json_line, os_error_message


def command_modules() -> list[str]:
    """The modules that register sub-commands: ``eagle3ops.<phase>.commands`` of every phase package present,
    then ``eagle3ops.tools.<tool>``; a trimmed install (a test guest with one phase) registers what it has."""
    names = []
    for mod in sorted(pkgutil.iter_modules(eagle3ops.__path__), key=lambda m: m.name):
        if mod.ispkg and mod.name != "tools" and importlib.util.find_spec(f"eagle3ops.{mod.name}.commands"):
            names.append(f"eagle3ops.{mod.name}.commands")
    for mod in sorted(pkgutil.iter_modules(tools.__path__), key=lambda m: m.name):
        if not mod.name.startswith("_"):
            names.append(f"eagle3ops.tools.{mod.name}")
    return names


DESCRIPTION = (
    "The EAGLE-3 pipeline's command line: the logic behind every Ansible phase of eagle3ops (site.yml runs them "
    "in this order). Every command takes --json: its result as one JSON object on the last line of stdout; "
    "progress goes to stderr."
)

# The commands under the phase whose role runs them, in site.yml's order (tests/unit/core/test_cli_help.py holds this
# to site.yml and to the registered commands); "tools" belong to no phase. A phase without a command of its own
# (services: Ansible and systemd only) is not listed.
PHASES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("storage", "a new disk becomes /data (on the PVE host)", ("storage",)),
    ("container", "the LXC container, its GPUs and /data (on the PVE host)", ("pve",)),
    ("runtime", "the workload venv; the real-model profile's assets", ("assets",)),
    ("sglang", "SGLang and its hidden-state capture patch", ("sglang-patch", "layer-ids", "memory-fit")),
    ("regenerate", "the target answers the conversations itself", ("regenerate",)),
    ("prepare", "conversations -> training rows", ("prepare",)),
    (
        "extract",
        "the target's hidden states for every row",
        (
            "extract",
            "extract-sglang",
            "extract-status",
            "extract-verify",
            "extract-workers",
            "extract-lengths",
            "store",
        ),
    ),
    ("gpu_free", "the checkpoint before training: every GPU's memory free", ("gpu-free",)),
    ("train", "the EAGLE-3 draft", ("train", "train-verify", "train-status", "train-stop")),
    ("serve", "the draft served by SGLang", ("serve-convert", "serve-process")),
    (
        "benchmark",
        "acceptance length and speed",
        (
            "benchmark-acceptance",
            "benchmark-live",
            "benchmark-spec-probe",
            "benchmark-contamination",
            "benchmark-dataset",
            "benchmark-report",
        ),
    ),
    ("tools", "no phase", ("demo", "demo-kimi")),
)


def _entry(name: str, line: str, width: int) -> str:
    """``    name   its one line``, the line wrapped under itself to the terminal's width (argparse's own)."""
    columns = max(shutil.get_terminal_size().columns - 2, 60)
    head = f"    {name:<{width}}"
    if len(head) > 4 + width:  # a name longer than the column: its line starts below it
        head += "\n" + " " * (4 + width)
    return head + textwrap.fill(line, max(columns - 4 - width, 30), subsequent_indent=" " * (4 + width))


class _JsonErrors(argparse.ArgumentParser):
    """argparse's parser; with ``json_errors`` a usage error (a value outside an option's bounds, a missing
    option) is also the one JSON failure object on stdout that ``--json`` promises, then exit 2 as usual."""

    json_errors = False

    def error(self, message):
        if self.json_errors:
            json_line({"failed": True, "msg": f"{self.prog}: {message}"})
        super().error(message)


class _Parser(_JsonErrors):
    """The top-level parser: its help lists the commands by phase in pipeline order, each with its one line, and
    an unknown command is answered with the names of the commands."""

    def _commands(self) -> argparse._SubParsersAction:
        return next(a for a in self._actions if isinstance(a, argparse._SubParsersAction))

    def format_help(self) -> str:
        sub = self._commands()
        lines = {a.dest: a.help or "" for a in sub._choices_actions}  # primary names only
        width = max((len(n) for n in lines), default=0) + 2
        fmt = self._get_formatter()
        fmt.add_usage(self.usage, self._actions, self._mutually_exclusive_groups)
        fmt.add_text(self.description)
        out = [fmt.format_help().rstrip("\n"), "", "commands, by phase in pipeline order (site.yml's tags):"]
        listed = set()
        for phase, what, names in PHASES:
            present = [n for n in names if n in lines]
            if not present:
                continue
            out.append(f"  {phase}: {what}")
            out += [_entry(n, lines[n], width) for n in present]
            listed.update(present)
        rest = [n for n in lines if n not in listed]
        if rest:  # registered but in no phase above (a test fails on it)
            out.append("  other")
            out += [_entry(n, lines[n], width) for n in rest]
        options = self._get_formatter()
        options.start_section("options")
        options.add_arguments([a for a in self._actions if a is not sub])
        options.end_section()
        out += [
            "",
            options.format_help().strip("\n"),
            "",
            "'eagle3ops COMMAND --help' shows a command's options.",
        ]
        return "\n".join(out) + "\n"

    def _check_value(self, action, value):
        if isinstance(action, argparse._SubParsersAction) and value not in action.choices:
            current = [a.dest for a in action._choices_actions]
            ordered = [n for _, _, names in PHASES for n in names if n in current]
            names = ", ".join(ordered + [n for n in current if n not in ordered])
            raise argparse.ArgumentError(action, f"invalid choice: {value!r} (choose from {names})")
        return super()._check_value(action, value)


def build_parser(json_errors: bool = False) -> argparse.ArgumentParser:
    top = type("Parser", (_Parser,), {"json_errors": json_errors})
    parser = top(prog="eagle3ops", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"eagle3ops {__version__}")
    commands = type("CommandParser", (_JsonErrors,), {"json_errors": json_errors})  # each command's parser
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=commands)
    for name in command_modules():
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else argv
    parser = build_parser(json_errors="--json" in words)
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # a usage error (exit 2, said on stderr) or --help/--version (0): an exit code
        return e.code if isinstance(e.code, int) else 2
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        rc = args.func(args)
        return int(rc or 0)
    except CommandError as e:
        if getattr(args, "json", False):
            json_line({"failed": True, "msg": str(e), **e.details})
        print(f"eagle3ops {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"eagle3ops {args.command}: interrupted", file=sys.stderr)
        return 130
    except OSError as e:  # a disk full, read-only, unreadable, missing path: one line, never a traceback
        msg = os_error_message(e)
        if getattr(args, "json", False):
            detail = {"errno": errno.errorcode.get(e.errno, e.errno), "path": e.filename}
            json_line({"failed": True, "msg": msg, **detail})
        print(f"eagle3ops {args.command}: error: {msg}", file=sys.stderr)
        return 2
    except Exception as e:  # an unexpected failure: keep the traceback for the log
        traceback.print_exc()
        if getattr(args, "json", False):
            sys.stdout.write(json.dumps({"failed": True, "msg": f"{type(e).__name__}: {e}"}) + "\n")
        return 1


if __name__ == "__main__":
    sys.exit(main())
