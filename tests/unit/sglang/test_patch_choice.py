"""The capture patch's state under sglang_capture_patch_state auto (eagle3ops.sglang.patch_choice, run by
action_plugins/eagle3ops_report.py from roles/sglang/tasks/patch_state.yml). Through Ansible:
tests/ansible/test_extract_sglang.py."""

from __future__ import annotations

from eagle3ops.sglang.patch_choice import auto


def test_patch_present_while_rows_are_left_else_left_alone():
    assert auto(False, False, {"skipped": True}, "/d") == {
        "state": "present",
        "reason": "/d is not prepared yet: every row is left",
    }
    taken = auto(True, True, {"to_extract": 0, "total": 4}, "/d", ["b", "c"])
    assert taken["state"] == "present" and taken["reason"].startswith("the rows of b, c are re-assigned")
    assert auto(True, False, {"to_extract": 3, "total": 4}, "/d") == {
        "state": "present",
        "reason": "3 of 4 rows are left to extract through SGLang",
    }
    assert auto(True, False, {"to_extract": 0, "total": 4}, "/d") == {
        "state": "query",
        "reason": "all 4 rows are extracted: nothing for the patch to do",
    }
