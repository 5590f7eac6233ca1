"""The ``eagle3ops`` command line.

Sub-commands are discovered from ``eagle3ops.commands``: each module there defines
``register(subparsers)`` and sets ``func`` on its parser. Every command accepts ``--json``: the
result is then printed as one JSON object on the last line of stdout (what the Ansible modules read),
and human progress goes to stderr.
"""

from __future__ import annotations

import argparse
import importlib
import json
import pkgutil
import sys
import traceback

from eagle3ops import __version__, commands


class CommandError(Exception):
    """An error the user can act on; printed without a traceback, exit code 2."""

    def __init__(self, message: str, **details):
        super().__init__(message)
        self.details = details


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="eagle3ops", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"eagle3ops {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for mod in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        if mod.name.startswith("_"):
            continue
        module = importlib.import_module(f"eagle3ops.commands.{mod.name}")
        module.register(sub)
    return parser


def add_json_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print the result as one JSON object on stdout")


def emit(args, result: dict, human: str | None = None) -> None:
    """Print a command's result: JSON on stdout with --json, else the human summary."""
    if getattr(args, "json", False):
        sys.stdout.write(json.dumps(result, default=str, sort_keys=True) + "\n")
    else:
        print(human if human is not None else json.dumps(result, indent=2, default=str, sort_keys=True))


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        rc = args.func(args)
        return int(rc or 0)
    except CommandError as e:
        if getattr(args, "json", False):
            sys.stdout.write(json.dumps({"failed": True, "msg": str(e), **e.details}, default=str) + "\n")
        print(f"eagle3ops {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"eagle3ops {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # an unexpected failure: keep the traceback for the log
        traceback.print_exc()
        if getattr(args, "json", False):
            sys.stdout.write(json.dumps({"failed": True, "msg": f"{type(e).__name__}: {e}"}) + "\n")
        return 1


if __name__ == "__main__":
    sys.exit(main())
