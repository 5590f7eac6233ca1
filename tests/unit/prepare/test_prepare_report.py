"""The prepare role's report line (eagle3ops.prepare.report, printed by action_plugins/eagle3ops_report.py from
roles/prepare/tasks/main.yml)."""

from __future__ import annotations

from eagle3ops.prepare.report import line


def test_prepare_line_says_written_or_unchanged():
    assert line({"changed": True, "summary": "20 rows"}, False, "/d") == "prepared 20 rows -> /d"
    assert line({"changed": False, "num_rows": 5}, False, "/d") == "prepared 5 rows -> /d (unchanged)"
    assert line({"changed": True}, True, "/d") == "check mode: /d would be written"
    assert (
        line({"changed": False, "summary": "5 rows"}, True, "/d") == "check mode: /d is up to date (5 rows)"
    )
