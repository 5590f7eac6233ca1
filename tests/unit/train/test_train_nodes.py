"""What the train role works out over every training node (eagle3ops.train.nodes, run by
action_plugins/eagle3ops_train_nodes.py from roles/train/tasks/nodes.yml, main.yml and data.yml). Through Ansible:
tests/ansible/test_train_multinode_role.py and tests/hosts/test_train_multinode_nspawn.py."""

from __future__ import annotations

from eagle3ops.train import nodes


def test_the_newest_checkpoint_is_by_epoch_then_step():
    found = {"a": {"epoch": 1, "global_step": 90}, "b": {"epoch": 2, "global_step": 10}, "c": None}
    assert nodes.newest_checkpoint(found) == "b"
    assert nodes.newest_checkpoint({"a": {"epoch": 1, "global_step": 5}, "b": {"epoch": 1}}) == "a"
    assert nodes.newest_checkpoint({"a": None, "b": {}}) == ""


def test_each_node_and_the_job_in_a_line():
    node, result = {"status": "running", "job": "j-1"}, {"status": "launched", "job": "j-2", "pid": 42}
    assert (
        nodes.node_line("a", node, result, False)
        == "a: was running (job j-1), now launched (job j-2, PID 42)"
    )
    assert nodes.node_line("b", {}, {}, True) == "b: was ? (job -), now FAILED or unreachable (job -, PID -)"
    kw = dict(restart=True, start_over=False, resume=None, source="", check_mode=False)
    assert nodes.job_line("j-2", 2, **{**kw, "restart": False}).endswith(
        "every node runs it (or finished it), nothing to do"
    )
    assert (
        nodes.job_line("j-2", 2, **kw)
        == "job j-2 on 2 nodes: started on every node, from the start (no checkpoint yet)"
    )
    assert nodes.job_line("j-2", 2, **{**kw, "resume": {"epoch": 3}, "source": "a", "check_mode": True}) == (
        "job j-2 on 2 nodes: would start on every node, resuming from epoch 3 (the checkpoint of a, copied to the "
        "others)"
    )
    assert "over, its configuration changed" in nodes.job_line("j", 2, **{**kw, "start_over": True})


def test_the_gather_report_reads_rsyncs_stats():
    msg = "Total transferred file size: 2,097,152 bytes\nsent 10 bytes  received 20 bytes  1,000,000.00 bytes/sec"
    assert nodes.sync_figures(msg) == (2097152, 1000000.0) and nodes.sync_figures("") == (0, 0.0)
    line = nodes.sync_report(
        ["a (dataset)", "a", "b"], [msg, "", msg], "/g", check_mode=False, rate_mbps=10000
    )
    assert line == (
        "copied 4.0 MiB (4194304 bytes) into /g: a (dataset) 2.0 MiB at 8.0 Mbit/s, a 0 Bytes, b 2.0 MiB at 8.0 "
        "Mbit/s; this host's own rows are hard links, not copies"
    )
    check = nodes.sync_report(["a"], [msg], "/g", check_mode=True, rate_mbps=10000)
    assert (
        check.startswith("would copy 2.0 MiB (2097152 bytes)")
        and "; about 0.00168 s at 10000 Mbit/s" in check
    )


def test_the_stores_kept_out_are_named_with_their_directories():
    assert nodes.kept_out_line(["a"], {"b": "/data/b"}) == (
        "kept out of the gather (rows re-assigned to a, extract_reassign_from): b (/data/b/hidden_states, left as it "
        "is)"
    )
