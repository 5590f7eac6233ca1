"""Several hosts share the rows: what the extract role works out from every host's variables
(eagle3ops.extract.hosts, run by action_plugins/eagle3ops_extract_hosts.py from roles/extract/tasks/shard.yml and
main.yml). Through Ansible: tests/ansible/test_extract_multihost.py and test_extract_reassign.py."""

from __future__ import annotations

from eagle3ops.extract import hosts
from eagle3ops.extract.shards import Reassignment


def test_worker_counts_are_known_only_as_whole_numbers():
    assert [hosts.worker_count(v) for v in (3, "2", " 4 ", "auto", None, True, "", "1.5")] == [
        3, 2, 4, None, None, None, None, None
    ]  # fmt: skip


def test_the_world_and_each_hosts_first_rank_follow_the_hosts_order():
    names, counts = ["a", "b", "c"], [2, 1, 3]
    assert hosts.share(names, counts, "a") == {"world_size": 6, "first_rank": 0}
    assert hosts.share(names, counts, "c") == {"world_size": 6, "first_rank": 3}


def test_the_lost_hosts_ranks_are_theirs_and_the_plan_takes_them():
    names, counts = ["a", "b", "c"], [2, 1, 3]
    lost = hosts.lost_ranks(names, counts, ["b", "c"])
    assert lost == [2, 3, 4, 5] and hosts.lost_ranks(names, counts, []) == []
    assert Reassignment.of(6, lost).survivors == [0, 1]


def test_a_store_that_keeps_another_reassignment_is_named():
    rec = {"reassigned": {"lost_ranks": [1], "at": "2026-01-01"}}
    assert hosts.reassign_conflicts({"a": rec, "b": None}, [1]) == []
    (bad,) = hosts.reassign_conflicts({"a": rec, "b": None}, [])
    assert bad == "the store of a took over the rows of lost rank(s) [1] (re-assigned at 2026-01-01)"


def test_the_summary_counts_every_hosts_rows_and_names_the_open_ones():
    per_host = {
        "a": {"result": {"done_before": 1, "written": 3}, "plan": {"total": 4, "ranks": [0]}, "world_size": 3,
              "data_dir": "/d/a"},
        "b": {"result": {"failed": True, "msg": "boom"}, "plan": {"total": 4, "done_before": 1, "ranks": [1]},
              "world_size": 3, "data_dir": "/d/b"},
        "c": {"data_dir": "/d/c"},
    }  # fmt: skip
    lines = hosts.run_summary(["a", "b", "c"], per_host, ["c"], [2], reachable=["a", "b"], check_mode=False)
    assert lines[0] == "a: ranks [0] of 3, 4/4 rows done, 0 missing; extracted 3 -> /d/a", lines
    assert lines[1].startswith("b: ranks [1] of 3, 1/4 rows done, 3 missing; FAILED or unreachable (boom)")
    assert lines[2].startswith("c: share RE-ASSIGNED to a, b") and lines[2].endswith("; unreachable now")
    assert lines[3] == (
        "all hosts: 5/8 rows done, missing on b: re-run this phase, each host resumes its own rows (with the rows "
        "of c, ranks [2], dealt over the other hosts)"
    )


def test_the_summary_of_a_check_run_says_what_would_be_done():
    per_host = {"a": {"result": {"to_extract": 3, "importable": 1}, "plan": {"total": 4, "importable": 1,
                "ranks": [0, 1]}, "world_size": 2, "data_dir": "/d"}}  # fmt: skip
    lines = hosts.run_summary(["a"], per_host, [], [], reachable=["a"], check_mode=True)
    assert lines == [
        "a: ranks [0, 1] of 2, 0/4 rows done, 4 missing; would extract 3; would copy 1 finished rows of the lost "
        "hosts from their parts -> /d",
        "all hosts: 0/4 rows done, missing on a: re-run this phase, each host resumes its own rows",
    ]
