"""The commit habit, checked by .ci/run: each commit after BASE has a subject of at most 72 characters and, when
it has a body, a blank second line (``git log --oneline`` stays readable; the why goes in the body, wrapped at
72). Commits up to BASE (main when the habit began) are exempt. Exit 0 when every commit keeps it, 1 naming each
that does not, 2 when BASE is not in this clone's history (a shallow clone: ``git fetch --unshallow``).

    python3 tests/lint/commit_messages.py [REVISION]   # default HEAD
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BASE = "5e4eb52"  # the main of 2026-12-07; it and every older commit are exempt
SUBJECT_MAX = 72


def problems(message: str) -> list:
    """What is wrong with one commit message (its full text), one line each; empty when it keeps the habit."""
    lines = message.rstrip("\n").split("\n")
    out = []
    if len(lines[0]) > SUBJECT_MAX:
        out.append(f"subject is {len(lines[0])} characters (at most {SUBJECT_MAX}): put the why in the body")
    if len(lines) > 1 and lines[1].strip():
        out.append("second line is not blank: a blank line between the subject and the body")
    return out


def _git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=False)


def main(argv: list) -> int:
    head = argv[1] if len(argv) > 1 else "HEAD"
    if _git("merge-base", "--is-ancestor", BASE, head).returncode != 0:
        print(
            f"commit_messages: {BASE} is not in the history of {head} (a shallow clone? git fetch --unshallow)"
        )
        return 2
    log = _git("log", "--format=%h%x00%B%x01", f"{BASE}..{head}")
    if log.returncode != 0:
        print(f"commit_messages: git log failed: {log.stderr.strip()}")
        return 2
    bad = []
    for entry in filter(str.strip, log.stdout.split("\x01")):
        sha, _, message = entry.strip("\n").partition("\x00")
        bad += [f"{sha} {message.splitlines()[0][:60]!r}: {why}" for why in problems(message)]
    print("\n".join(bad) if bad else f"commit_messages: every commit after {BASE} keeps the habit")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
