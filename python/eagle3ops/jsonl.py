"""JSON Lines: the one definition of a record line that every writer and reader in eagle3ops uses.

A record is one line: ``dumps(obj)`` followed by ``"\\n"``, UTF-8. Readers split at ``"\\n"`` only (a ``"\\r"``
before it is dropped, for CRLF files) - :func:`split_lines`, :func:`file_lines`.

Why both halves matter (the live SGLang run of 2026-12-01 lost 4 of 3000 regenerated ShareGPT conversations):
``json.dumps(..., ensure_ascii=False)`` escapes the C0 controls but writes U+0085 (NEL), U+2028 (LINE
SEPARATOR) and U+2029 (PARAGRAPH SEPARATOR) raw - valid JSON - while ``str.splitlines()`` (what ``prepare``
split its inputs with) breaks lines at them. ShareGPT's human turns hold U+2028 (as ``\\u2028`` escapes in the
source JSON), a small model's answers any Unicode; the regenerated file had them raw and ``prepare`` read each
such conversation as several broken lines. So the writer escapes every character any common line splitter
breaks at (``str.splitlines``, JavaScript, editors), and the readers split where the writer ends a line, so a
file from another tool with raw separators inside its strings reads right too.

``dumps`` also escapes lone surrogates (a server's JSON may hold half of a surrogate pair, e.g. ``"\\ud83d"``;
``json.loads`` gives a ``str`` that ``.encode("utf-8")`` refuses): they are written as ``\\udXXX`` escapes and
read back as the same string.

:func:`check_file` reads a written file back the strictest way (UTF-8, one JSON value per line, no raw line
breaks inside, a newline at the end) - what a writer that must not be trusted blindly verifies.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

# what str.splitlines() breaks at; json.dumps escapes all of them but the last three (and "\n" ends a record)
SPLITLINES_BREAKS = "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
_ESCAPE = re.compile("[\x85\u2028\u2029\ud800-\udfff]")
_RAW_BREAK = re.compile("[\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]")
WRITER_VERSION = 2  # 1: json.dumps(ensure_ascii=False) as it was (raw U+0085/U+2028/U+2029); 2: dumps below


def _esc(m: re.Match) -> str:
    return f"\\u{ord(m.group()):04x}"


def dumps(obj, *, sort_keys: bool = False, compact: bool = False, default=None) -> str:
    """``obj`` as one JSON line (no newline): readable UTF-8, with every line-break character escaped."""
    text = json.dumps(
        obj,
        ensure_ascii=False,
        sort_keys=sort_keys,
        separators=(",", ":") if compact else None,
        default=default,
    )
    # outside strings json.dumps writes ASCII only, so every match is inside a string literal, where the
    # \\uXXXX escape means the same character
    return _ESCAPE.sub(_esc, text)


def line(obj, **kw) -> bytes:
    """One record line, ``"\\n"``-terminated UTF-8 (keywords as :func:`dumps`)."""
    return (dumps(obj, **kw) + "\n").encode("utf-8")


def lines(records: Iterable, **kw) -> Iterator[bytes]:
    for r in records:
        yield line(r, **kw)


def write(path: str | os.PathLike, records: Iterable, **kw) -> None:
    """``records`` to ``path`` (not atomic: for files built in a temp directory that is renamed)."""
    with open(path, "wb") as f:
        for b in lines(records, **kw):
            f.write(b)


def split_lines(text: str) -> Iterator[tuple[int, str]]:
    """``(line number, line)`` of a JSON Lines text, split at ``"\\n"`` only (a trailing ``"\\r"`` dropped).
    Line numbers count ``"\\n"`` like every ``file:line`` the project reports. Blank lines are yielded too."""
    parts = text.split("\n")
    if parts and parts[-1] == "":
        parts.pop()
    for n, s in enumerate(parts, 1):
        yield n, s[:-1] if s.endswith("\r") else s


def file_lines(path: str | os.PathLike, *, errors: str = "strict") -> Iterator[tuple[int, str]]:
    """:func:`split_lines` of a file, streamed (``newline="\\n"``: Python's universal newlines would also
    break at ``"\\r"``)."""
    with open(path, encoding="utf-8", errors=errors, newline="\n") as f:
        for n, s in enumerate(f, 1):
            if s.endswith("\n"):
                s = s[:-1]
            yield n, s[:-1] if s.endswith("\r") else s


def read(path: str | os.PathLike) -> Iterator[object]:
    """Every record of a JSON Lines file (blank lines skipped); ``ValueError`` names ``path:line``."""
    for _n, obj in numbered(path):
        yield obj


def numbered(path: str | os.PathLike, error: type[Exception] = ValueError) -> Iterator[tuple[int, object]]:
    """``(line number, record)`` of every record of a JSON Lines file (blank lines skipped); a line that is not
    JSON raises ``error`` naming ``path:line``."""
    for n, s in file_lines(path):
        if not s.strip():
            continue
        try:
            yield n, json.loads(s)
        except ValueError as e:
            raise error(f"{path}:{n}: not valid JSON ({e})") from None


def line_problem(raw: bytes) -> str | None:
    """Why one line (without its ``"\\n"``) is not exactly one record to every reader; None if it is."""
    try:
        s = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        return f"not UTF-8 (byte {e.start + 1})"
    m = _RAW_BREAK.search(s)
    if m:
        return (
            f"a raw U+{ord(m.group()):04X} at column {m.start() + 1}: readers that split lines with "
            "str.splitlines() see two broken lines there"
        )
    if not s.strip():
        return "a blank line"
    try:
        json.loads(s)
    except ValueError as e:
        return f"not valid JSON ({e})"
    return None


@dataclass
class FileCheck:
    records: int = 0  # lines that are exactly one record to every reader
    bad: list[tuple[int, str]] = field(default_factory=list)  # (line number, why)

    def first(self, path, shown: int = 3) -> str:
        return "; ".join(f"{path}:{n}: {why}" for n, why in self.bad[:shown])


def check_file(path: str | os.PathLike) -> FileCheck:
    """Read ``path`` back line by line, the strictest way (see :func:`line_problem`); a last line without its
    newline is a bad one (torn). ``OSError`` is the caller's."""
    res = FileCheck()
    with open(path, "rb") as f:  # binary lines end at b"\n" only
        for n, raw in enumerate(f, 1):
            if not raw.endswith(b"\n"):
                res.bad.append((n, "no newline at its end (a torn last line)"))
                continue
            why = line_problem(raw[:-1])
            if why is None:
                res.records += 1
            else:
                res.bad.append((n, why))
    return res
