"""What every ``eagle3ops`` sub-command shares: the error it raises for the user (:class:`CommandError`, exit code
2, no traceback), the one-line message for a failed file-system call (:func:`os_error_message`), how a handler
hands the parsed options on (:func:`pick`), and how it prints its result (:func:`emit`, ``--json``; the human
summary's head and lists: :func:`outcome`, :func:`listing`). Standard library only; commands and phase code import this, never
``eagle3ops.cli`` (which imports every command).
"""

from __future__ import annotations

import errno
import json
import os
import sys

from eagle3ops.errors import WithDetails


class CommandError(WithDetails, Exception):
    """An error the user can act on; printed without a traceback, exit code 2."""


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


def pick(args, *names: str, **renamed: str) -> dict:
    """The keyword arguments a handler hands its phase's function from the parsed options: ``{name: args.name}``
    for each name, and ``{param: args.option}`` for each ``param="option"`` (a parameter named otherwise)."""
    return {**{n: getattr(args, n) for n in names}, **{k: getattr(args, o) for k, o in renamed.items()}}


def disk_margin_bytes(mib: float) -> int:
    """``--disk-margin-mib`` as bytes (refused below 0): ``extract``'s and ``extract-sglang``'s."""
    if mib < 0:
        raise CommandError(f"--disk-margin-mib {mib} must be 0 or more (MiB kept free on top of the need)")
    return int(mib * 2**20)


def pick_taken(args, api, command, *exclude: str, **renamed: str) -> dict:
    """:func:`pick` of every option of ``command`` on the command line that ``api`` (a dataclass or a function)
    takes under the same name, but ``exclude`` (the handler passes those itself), and of ``renamed``: an option
    added to the definition and to the API under one name reaches it with no change to the handler."""
    import dataclasses
    import inspect

    if dataclasses.is_dataclass(api):
        takes = {f.name for f in dataclasses.fields(api)}
    else:
        takes = set(inspect.signature(api).parameters)
    skip = set(exclude) | set(renamed)
    return pick(
        args, *(o.name for o in command.cli_options() if o.name in takes and o.name not in skip), **renamed
    )


def outcome(name: str, out, changed: bool, check: bool) -> str:
    """The head of a phase command's human summary: ``NAME: OUT would change`` / ``is up to date`` in check mode,
    ``NAME: OUT written`` / ``up to date`` after a run."""
    if check:
        return f"{name}: {out} {'would change' if changed else 'is up to date'}"
    return f"{name}: {out} {'written' if changed else 'up to date'}"


def listing(title: str, items) -> str:
    """An indented list under ``title`` to append to a human summary; ``""`` when there is nothing to list."""
    items = list(items)
    return f"\n  {title}:\n    " + "\n    ".join(items) if items else ""


def emit(args, result: dict, human: str | None = None) -> None:
    """Print a command's result: JSON on stdout with --json, else the human summary."""
    if getattr(args, "json", False):
        sys.stdout.write(json.dumps(result, default=str, sort_keys=True) + "\n")
    else:
        print(human if human is not None else json.dumps(result, indent=2, default=str, sort_keys=True))


def json_line(obj: dict) -> None:
    """The failure record on stdout; a stdout that cannot be written (closed pipe, full disk) is left alone:
    the message on stderr is the one that matters then."""
    try:
        sys.stdout.write(json.dumps(obj, default=str) + "\n")
        sys.stdout.flush()
    except OSError:
        with_devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(with_devnull, sys.stdout.fileno())  # so the interpreter's final flush does not raise again
