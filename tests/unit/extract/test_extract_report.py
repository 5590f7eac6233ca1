"""The extract role's report lines (eagle3ops.extract.report, printed by action_plugins/eagle3ops_report.py from
roles/extract/tasks/transformers.yml and sglang.yml). Through Ansible: tests/ansible/test_site_local.py,
test_extract_sglang.py, test_extract_reassign.py."""

from __future__ import annotations

from eagle3ops.extract import report

RUN = {"written": 6, "total": 9, "tokens": 600, "bytes": 3 * 2**20, "seconds": 1.5, "done_before": 3}


def test_size_is_binary_like_jinjas_filesizeformat():
    assert [report.size(n) for n in (None, 1, 1000, 1536, 3 * 2**30)] == [
        "0 Bytes", "1 Byte", "1000 Bytes", "1.5 KiB", "3.0 GiB",
    ]  # fmt: skip


def test_transformers_run_counts_adopted_and_imported_rows():
    said = report.transformers_line({**RUN, "layer_ids": [2, 4], "adopted": 1}, False, "/d")
    assert said == (
        "extracted 6 of 9 rows (600 tokens, 3.0 MiB) in 1.5 s; 2 were already in the manifests, 1 finished files "
        "without a manifest line adopted; layers [2, 4] + pre-norm last -> /d/hidden_states"
    )
    said = report.transformers_line(
        {**RUN, "imported": 2, "damaged": 1, "damaged_files": {"7": "x"}}, False, "/d", ["/b"]
    )
    assert said.startswith(
        "damaged: 1 (rows 7; moved to /d/hidden_states/damaged and extracted again); extracted"
    )
    assert (
        "3 were already in the manifests, of them 2 rows the lost hosts finished, copied from their parts (/b)"
        in said
    )


def test_transformers_check_mode_says_what_it_would_do():
    said = report.transformers_line({"total": 9, "adoptable": 2, "importable": 1}, True, "/d", ["/b", "/c"])
    assert said == (
        "check mode: would extract ? of 9 rows (0 Bytes); ? already done (2 of them finished files without a "
        "manifest line, which a run records); would copy 1 rows the lost hosts finished from their parts (/b, /c)"
    )


def test_sglang_lines_name_the_servers_and_the_patch():
    restored = ({"changed": True}, {"state": "absent", "path": "/site/m.py"})
    said = report.sglang_line({**RUN, "retries": 0, "layer_ids": [1]}, False, "/d", ["u1"], None, *restored)
    assert said == (
        "SGLang extracted 6 rows (600 tokens, 3.0 MiB) in 1.5 s with 0 retries; 3 of 9 were already done; "
        "layers [1] + pre-norm last -> /d/hidden_states; capture patch absent (/site/m.py)"
    )
    said = report.sglang_line(
        {"to_extract": 4, "total": 9}, True, "/d", ["u1", "u2"], patch_restore={"skipped": True}
    )
    assert said == "would send 4 of 9 rows to SGLang at u1, u2 (0 Bytes); capture patch left as it is"
    said = report.sglang_line(None, False, "/d", plan={"done_before": 9, "total": 9, "layer_ids": [1]})
    assert said.startswith(
        "nothing to extract: 9 of 9 rows already in the manifests (no SGLang server started);"
    )


def test_both_backends_say_what_an_adopted_dump_gave():
    dump = {"dump": "/old/dump", "files": 12, "adopted": 9, "damaged": {"/old/dump/a.pt": "truncated"},
            "wrong_shape": {}, "duplicates": {"/old/dump/b.pt": "/old/dump/c.pt"}, "unmatched": []}  # fmt: skip
    said = report.transformers_line({**RUN, "layer_ids": [2], "dump": dump}, False, "/d")
    assert said.startswith(
        "adopted 9 of the 12 files of /old/dump where they lie (1 damaged, 1 duplicates: listed in the result, "
        "their rows extracted); extracted 6 of 9 rows"
    ), said
    said = report.sglang_line({"to_extract": 3, "total": 9, "dump": {**dump, "damaged": {}, "duplicates": {}}},
                              True, "/d", ["u1"], patch_restore={"skipped": True})  # fmt: skip
    assert said.startswith("would adopt 9 of the 12 files of /old/dump where they lie; would send 3 of 9"), (
        said
    )
    said = report.sglang_line({**RUN, "retries": 0, "layer_ids": [1], "dump": dump}, False, "/d", ["u1"])
    assert said.startswith(
        "adopted 9 of the 12 files of /old/dump where they lie (1 damaged, 1 duplicates"
    ), said
    assert report.dump_line(RUN, False) == ""
