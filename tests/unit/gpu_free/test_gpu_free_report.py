"""The gpu_free role's words (eagle3ops.gpu_free.report, printed by action_plugins/eagle3ops_gpu_free_report.py
from roles/gpu_free/tasks/main.yml). Through Ansible, with several hosts: tests/ansible/test_gpu_free_role.py."""

from __future__ import annotations

from eagle3ops.gpu_free import report

GPU = {
    "index": 0,
    "used_mib": 1.0,
    "total_mib": 100.0,
    "reserved_mib": 0.5,
    "memory_source": "v2",
    "free": True,
}


def test_a_hosts_line_lists_its_gpus_or_says_why_the_check_was_skipped():
    assert report.gpus_line({"msg": "1 GPU(s) free", "gpus": [GPU]}) == (
        "1 GPU(s) free: GPU 0 used 1.0 / 100.0 MiB (reserved 0.5, v2)"
    )
    assert report.gpus_line({"msg": "no usable NVIDIA driver", "skipped": True}) == "no usable NVIDIA driver"


def test_the_verdict_names_each_host_and_gpu_not_free():
    held = {**GPU, "index": 1, "used_mib": 1234.0, "free": False}
    out = report.verdict({
        "a": {"free": True, "msg": "2 GPU(s) free"},
        "b": {"free": False, "msg": "not free", "gpus": [GPU, held], "holders": [{"pid": 77}]},
        "c": None,
        "d": {"skipped": True, "msg": "no driver"},
        "e": {"failed": True, "msg": "nvml broke"},
    })  # fmt: skip
    assert out["bad"] == ["b", "c", "e"]
    assert out["lines"] == [
        "a: 2 GPU(s) free",
        "b: GPU 1 NOT FREE (1234.0 MiB used): held by PID 77 - not free",
        "c: NOT CHECKED (unreachable or failed before the check)",
        "d: skipped - no driver",
        "e: FAILED - nvml broke",
        "not free on b, c, e: nothing trains until every host is free (free them, allow-list our own runs, or take "
        "the host out of the inventory), then re-run",
    ]
    assert report.verdict({"a": {"free": True, "msg": "ok"}})["lines"][-1] == "every host: 1 host(s) checked"
