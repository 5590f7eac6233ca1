"""The ``eagle3ops`` command line.

Sub-commands are discovered: every phase package ``eagle3ops.<phase>`` that has a ``commands`` module, and every
module in ``eagle3ops.commands`` (the tools that belong to no phase), defines ``register(subparsers)`` and sets
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
import sys
import traceback

import eagle3ops
from eagle3ops import __version__, commands
from eagle3ops.command import CommandError, json_line, os_error_message


def command_modules() -> list[str]:
    """The modules that register sub-commands: ``eagle3ops.<phase>.commands`` of every phase package present,
    then ``eagle3ops.commands.<tool>``; a trimmed install (a test guest with one phase) registers what it has."""
    names = []
    for mod in sorted(pkgutil.iter_modules(eagle3ops.__path__), key=lambda m: m.name):
        if (
            mod.ispkg
            and mod.name != "commands"
            and importlib.util.find_spec(f"eagle3ops.{mod.name}.commands")
        ):
            names.append(f"eagle3ops.{mod.name}.commands")
    for mod in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        if not mod.name.startswith("_"):
            names.append(f"eagle3ops.commands.{mod.name}")
    return names


class _Parser(argparse.ArgumentParser):
    """argparse's parser; with ``json_errors`` a usage error (a value outside an option's bounds, a missing
    option) is also the one JSON failure object on stdout that ``--json`` promises, then exit 2 as usual."""

    json_errors = False

    def error(self, message):
        if self.json_errors:
            json_line({"failed": True, "msg": f"{self.prog}: {message}"})
        super().error(message)


def build_parser(json_errors: bool = False) -> argparse.ArgumentParser:
    cls = type("Parser", (_Parser,), {"json_errors": json_errors})  # subparsers are made of the same class
    parser = cls(prog="eagle3ops", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"eagle3ops {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
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
