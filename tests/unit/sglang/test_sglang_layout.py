"""Several capture servers on one host: sglang_servers checked and laid out (eagle3ops.sglang.layout, run by
action_plugins/eagle3ops_sglang_servers.py from roles/sglang/tasks/servers.yml and, the shape alone, by the shared
role's first play). The role through Ansible: tests/unit/sglang/test_sglang_role.py."""

from __future__ import annotations

from eagle3ops.sglang.layout import described, server_layout, servers_of


def test_a_count_lays_out_consecutive_groups_of_the_tp_size():
    assert server_layout(2, 4, 30000) == {"count": 2, "groups": [[0, 1, 2, 3], [4, 5, 6, 7]], "bad": []}
    assert server_layout("1", 8, 30000) == {
        "count": 1,
        "groups": [],
        "bad": [],
    }  # one server: the host's GPUs


def test_groups_are_taken_as_given_indices_as_text_too():
    assert server_layout([[4, 5], ["0", "1"]], 2, 30000)["groups"] == [[4, 5], [0, 1]]


def test_each_wrong_layout_is_named():
    cases = [
        (True, "not a count or a list of GPU groups"),
        (None, "not a count or a list of GPU groups"),
        ("two", "not a count of 1 or more"),
        (0, "not a count of 1 or more"),
        (2.0, "not a count of 1 or more"),
        ([], "not a count or a non-empty list"),
        ({"a": 1}, "not a count or a non-empty list"),
        ([[0, 1], []], "group 1 [] is not a list of GPU indices"),
        (["0,1"], 'group 0 "0,1" is not a list of GPU indices'),
        ([[0, -1]], "is not a list of GPU indices"),
        ([[0, 1, 2]], "group 0 [0, 1, 2] has 3 GPUs, but each server is sglang_tp_size 2"),
        ([[0, 0]], "group 0 [0, 0] names a GPU twice"),
        ([[0, 1], [1, 2]], "groups 0 and 1 share GPUs [1]"),
    ]
    for servers, words in cases:
        bad = server_layout(servers, 2, 30000)["bad"]
        assert any(words in b for b in bad), (servers, bad)
    assert "CUDA_VISIBLE_DEVICES" in server_layout(2, 2, 30000, {"CUDA_VISIBLE_DEVICES": "0"})["bad"][0]
    assert (
        server_layout(1, 2, 30000, {"CUDA_VISIBLE_DEVICES": "0"})["bad"] == []
    )  # one server: the user's choice
    assert "go past 65535" in server_layout(2, 2, 65535)["bad"][0]


def test_the_shape_alone_without_the_tp_size():
    """The shared role's first play knows no TP size: only the shape is checked there."""
    assert server_layout([[0, 1, 2]])["bad"] == [] and server_layout(3)["bad"] == []
    assert server_layout([[0, 1], []])["bad"]


def test_each_server_gets_its_unit_port_gpus_and_manifest_rank():
    layout = server_layout([[4, 5], [0, 1]], 2, 30000)
    assert servers_of(layout, "u", 30000, 3) == [
        {"unit": "u-0", "port": 30000, "gpus": [4, 5], "manifest_rank": 3},
        {"unit": "u-1", "port": 30001, "gpus": [0, 1], "manifest_rank": 4},
    ]
    assert servers_of(server_layout(1, 8, 30000), "u", 30000, 0) == [
        {"unit": "u", "port": 30000, "gpus": [], "manifest_rank": 0}
    ]
    assert described(servers_of(layout, "u", 30000, 3)) == (
        "u-0.service (port 30000, GPUs 4,5, manifest-rank3), u-1.service (port 30001, GPUs 0,1, manifest-rank4)"
    )
