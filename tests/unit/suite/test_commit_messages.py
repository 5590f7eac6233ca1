"""The commit habit's check (tests/lint/commit_messages.py, run by .ci/run): the rule on messages, and the
check over this clone's history after its base."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "lint"))
import commit_messages


def test_a_short_subject_and_a_blank_second_line_pass():
    assert commit_messages.problems("extract: rows by rank\n\nWhy it changed, wrapped at 72.\n") == []
    assert commit_messages.problems("Merge branch 'thin-roles'\n") == []
    assert commit_messages.problems("x" * 72) == []


def test_a_long_subject_or_a_body_without_a_blank_line_is_named():
    (long,) = commit_messages.problems("x" * 73 + "\n\nbody")
    assert "73 characters (at most 72)" in long
    (glued,) = commit_messages.problems("subject\nbody right under it")
    assert "second line is not blank" in glued
    assert len(commit_messages.problems("y" * 100 + "\nbody")) == 2
