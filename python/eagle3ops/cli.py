"""The ``eagle3ops`` command line.

Sub-commands are discovered from ``eagle3ops.commands``: each module there defines
``register(subparsers)`` and sets ``func`` on its parser. Every command accepts ``--json``: the
result is then printed as one JSON object on the last line of stdout (what the Ansible modules read),
and human progress goes to stderr.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import json
import os
import pkgutil
import sys
import traceback

from eagle3ops import __version__, commands


class CommandError(Exception):
    """An error the user can act on; printed without a traceback, exit code 2."""

    def __init__(self, message: str, **details):
        super().__init__(message)
        self.details = details


# what to do about a failed file-system call, by errno (the generic line of :func:`os_error_message`)
_OS_ADVICE = {
    errno.ENOSPC: "the file system is full: free space there or point the directory at a larger disk, then re-run "
    "(finished work is kept)",
    errno.EDQUOT: "the disk quota is exhausted: free space or raise the quota, then re-run (finished work is kept)",
    errno.EACCES: "permission denied: run as the owner of that path (or fix its owner/mode), or choose another "
    "path",
    errno.EPERM: "operation not permitted: run as the owner of that path (or fix its owner/mode), or choose "
    "another path",
    errno.EROFS: "the file system is mounted read-only: remount it read-write (or fix the disk it is on), or "
    "choose a path on a writable disk",
    errno.EIO: "the disk reported an I/O error: check the device (dmesg, smartctl) before re-running; files "
    "finished before are kept",
    errno.ENOENT: "it does not exist: check the path (or run the phase that creates it first)",
    errno.ENOTDIR: "a part of the path is not a directory: check the path",
    errno.EISDIR: "it is a directory where a file was expected: check the path",
    errno.ENOTEMPTY: "the directory is not empty: move it aside or choose another path",
    errno.EEXIST: "it already exists: move it aside or choose another path",
    errno.EMFILE: "too many open files: raise the limit (ulimit -n) and re-run",
    errno.ECONNREFUSED: "nothing listens there: start the server (or fix the URL) and re-run",
}


def os_error_message(e: OSError) -> str:
    """One line for a failed file-system call: the path, what happened (errno name + text), what to do."""
    paths = [str(p) for p in (e.filename, e.filename2) if p is not None]
    where = " -> ".join(paths) if paths else "(the failing call named no path; see the command's arguments)"
    name = errno.errorcode.get(e.errno, "") if e.errno else ""
    what = e.strerror or str(e)
    advice = _OS_ADVICE.get(e.errno, "fix the cause and re-run")
    return f"{where}: {what}{f' ({name})' if name else ''}; {advice}."


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
            _json_line({"failed": True, "msg": str(e), **e.details})
        print(f"eagle3ops {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"eagle3ops {args.command}: interrupted", file=sys.stderr)
        return 130
    except OSError as e:  # a disk full, read-only, unreadable, missing path: one line, never a traceback
        msg = os_error_message(e)
        if getattr(args, "json", False):
            detail = {"errno": errno.errorcode.get(e.errno, e.errno), "path": e.filename}
            _json_line({"failed": True, "msg": msg, **detail})
        print(f"eagle3ops {args.command}: error: {msg}", file=sys.stderr)
        return 2
    except Exception as e:  # an unexpected failure: keep the traceback for the log
        traceback.print_exc()
        if getattr(args, "json", False):
            sys.stdout.write(json.dumps({"failed": True, "msg": f"{type(e).__name__}: {e}"}) + "\n")
        return 1


def _json_line(obj: dict) -> None:
    """The failure record on stdout; a stdout that cannot be written (closed pipe, full disk) is left alone:
    the message on stderr is the one that matters then."""
    try:
        sys.stdout.write(json.dumps(obj, default=str) + "\n")
        sys.stdout.flush()
    except OSError:
        with_devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(with_devnull, sys.stdout.fileno())  # so the interpreter's final flush does not raise again


if __name__ == "__main__":
    sys.exit(main())
