"""The aux-layer-id rule (eagle3ops.layers), its CLI (``eagle3ops layer-ids``) and the sglang role, which calls
that CLI instead of holding its own copy of the rule: real config.json files, the real console script, a real
ansible-playbook run of the role's ``layers.yml`` (connection local). Seconds."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from eagle3ops import cli, layers
from proc_helpers import HEAVY, cli_imports

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def _model(tmp_path: Path, name: str, num_layers: int, nested: bool = False) -> Path:
    d = tmp_path / name
    d.mkdir()
    text = {"num_hidden_layers": num_layers, "hidden_size": 64}
    cfg = {"model_type": "kimi_k25", "text_config": text} if nested else {"model_type": "llama", **text}
    (d / "config.json").write_text(json.dumps(cfg))
    return d


@pytest.mark.parametrize(
    "n, ids", [(7, [2, 3, 4]), (8, [2, 4, 5]), (30, [2, 15, 27]), (61, [2, 30, 58]), (94, [2, 47, 91])]
)
def test_default_ids_for_several_layer_counts(n, ids):
    assert layers.default_ids(n) == ids
    assert layers.resolve(n) == ids == layers.resolve(n, [])  # none given / empty: the default
    assert layers.check_sglang(ids) == ids  # the default always passes SGLang's rule


def test_default_is_refused_where_it_is_not_distinct():
    with pytest.raises(layers.LayerIdError, match=r"\[2, 3, 3\] for a target with 6 layers.*explicitly"):
        layers.default_ids(6)
    assert layers.resolve(6, [0, 2, 4]) == [0, 2, 4]  # explicit ids still work there
    with pytest.raises(layers.LayerIdError, match="3 decoder layers; EAGLE-3 needs at least 4"):
        layers.resolve(3, [0, 1, 2])


def test_num_layers_from_config_json_text_config_first(tmp_path):
    assert layers.num_layers_of(_model(tmp_path, "plain", 30)) == 30
    assert layers.num_layers_of(_model(tmp_path, "nested", 61, nested=True)) == 61
    both = tmp_path / "both"
    both.mkdir()  # a wrapper whose top level has another count: the language model's wins (as transformers')
    (both / "config.json").write_text(
        json.dumps({"num_hidden_layers": 2, "text_config": {"num_hidden_layers": 12}})
    )
    assert layers.num_layers_of(both) == 12
    with pytest.raises(layers.LayerIdError, match=rf"{tmp_path / 'none'}/config.json does not exist"):
        layers.num_layers_of(tmp_path / "none")
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text('{"text_config": {"hidden_size": 8}}')
    with pytest.raises(layers.LayerIdError, match=r"config.json: no usable num_hidden_layers \(None\)"):
        layers.num_layers_of(bad)
    (bad / "config.json").write_text("{not json")
    with pytest.raises(layers.LayerIdError, match="cannot be read as JSON"):
        layers.num_layers_of(bad)


def test_conventions_range_and_duplicates():
    assert layers.to_input([1, 29, 57], "output") == [2, 30, 58]
    assert layers.resolve(61, [1, 29, 57], "output") == [2, 30, 58]
    assert layers.resolve(30, [26, 3, 14]) == [3, 14, 26]  # extract sorts
    with pytest.raises(
        layers.LayerIdError, match=r"\[2, 4, 8\] \(input convention\) are out of range .* 8 layers"
    ):
        layers.resolve(8, [2, 4, 8])  # ids >= N
    with pytest.raises(layers.LayerIdError, match=r"0\.\.7"):
        layers.resolve(8, [1, 4, 7], "output")  # 7 names the output of the last layer: input id 8
    with pytest.raises(layers.LayerIdError, match=r"out of range"):
        layers.resolve(8, [-1, 3, 5])
    with pytest.raises(layers.LayerIdError, match=r"\[2, 3, 3\] must be distinct"):
        layers.resolve(8, [2, 3, 3])
    with pytest.raises(layers.LayerIdError, match="convention 'middle'"):
        layers.resolve(8, [2, 3], "middle")


def test_sglang_rule_refuses_first_1_unsorted_and_duplicates():
    assert layers.check_sglang([0, 3, 5]) == [0, 3, 5] and layers.check_sglang([2, 4, 5]) == [2, 4, 5]
    with pytest.raises(
        layers.LayerIdError, match=r"\[1, 3, 5\]: the first may not be 1 .*adds 1 to every id"
    ):
        layers.check_sglang([1, 3, 5])
    with pytest.raises(
        layers.LayerIdError, match=r"\[5, 3, 9\]: ids must be distinct and ascending.*\[3, 5, 9\]"
    ):
        layers.check_sglang([5, 3, 9])
    with pytest.raises(layers.LayerIdError, match=r"\[2, 3, 3\]: ids must be distinct and ascending"):
        layers.check_sglang([2, 3, 3])
    with pytest.raises(layers.LayerIdError, match="no aux layer ids"):
        layers.check_sglang([])
    # keep_order: the given order is kept for the check (extract's resolve would sort it away)
    with pytest.raises(layers.LayerIdError, match="ascending"):
        layers.check_sglang(layers.resolve(30, [14, 3, 26], keep_order=True))


def test_capture_ids_per_model_file_rule():
    assert layers.capture_ids([2, 4, 5], "as_is_unless_first_is_1") == [2, 4, 5]
    assert layers.capture_ids([2, 30, 58], "plus_one") == [1, 29, 57]


@pytest.mark.parametrize(
    ("ids", "rule", "match"),
    [
        ([1, 4, 5], "as_is_unless_first_is_1", "shifts ids that start with 1"),
        ([0, 4, 5], "plus_one", "layer id 0"),
        ([2, 4, 5], "minus_two", "unknown SGLang layer-id rule"),
    ],
)
def test_capture_ids_refuses_what_the_rule_cannot_capture(ids, rule, match):
    with pytest.raises(layers.LayerIdError, match=match):
        layers.capture_ids(ids, rule)


def _cli(*argv) -> tuple[int, dict]:
    """``eagle3ops layer-ids ... --json`` in this process (the console script's own main)."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(io.StringIO()):
        rc = cli.main(["layer-ids", *map(str, argv), "--json"])
    return rc, json.loads(buf.getvalue().splitlines()[-1])


def test_cli_resolves_and_refuses_without_torch(tmp_path):
    m = _model(tmp_path, "kimi", 61, nested=True)
    rc, out = _cli("--model", m)
    assert rc == 0 and out["layer_ids"] == [2, 30, 58] and out["num_layers"] == 61 and out["given"] is None
    rc, out = _cli("--model", m, "--ids", 1, 29, 57, "--convention", "output", "--sglang")
    assert rc == 0 and out["layer_ids"] == [2, 30, 58] and out["sglang_checked"]
    rc, out = _cli("--model", m, "--ids", 1, 3, 5, "--sglang")
    assert rc == 2 and out["failed"] and "adds 1 to every id" in out["msg"] and out["layer_ids"] == [1, 3, 5]
    rc, out = _cli("--model", m, "--ids", 1, 3, 5)  # without --sglang only range and distinctness count
    assert rc == 0 and out["layer_ids"] == [1, 3, 5]
    rc, out = _cli("--model", tmp_path / "missing")
    assert rc == 2 and f"{tmp_path / 'missing'}/config.json does not exist" in out["msg"]
    # the role runs the console script before SGLang is installed: it must not import torch / transformers
    r, imported = cli_imports("layer-ids", "--model", m, "--json")
    assert r.returncode == 0 and json.loads(r.stdout.splitlines()[-1])["layer_ids"] == [2, 30, 58], r.stderr
    assert "eagle3ops" in imported and not imported & HEAVY


def test_cli_gives_the_versions_capture_flags_from_the_table(tmp_path):
    """``--sglang-version``: the dump server's aux-capture flags for the resolved ids, the version table's own
    (``dump_capture_args``: the three flags where the version has them, none where its patch turns the capture
    on); the sglang role writes them into its unit. An unknown version is refused with the known ones."""
    from eagle3ops.sglang import versions

    m = _model(tmp_path, "kimi", 61, nested=True)
    for v in versions.KNOWN:
        rc, out = _cli("--model", m, "--sglang", "--sglang-version", v)
        assert rc == 0 and out["layer_ids"] == [2, 30, 58] and out["sglang_version"] == v
        assert out["sglang_capture_args"] == versions.dump_capture_args(v, [2, 30, 58])
        assert bool(out["sglang_capture_args"]) == versions.get(v).capture_only_flag
    rc, out = _cli("--model", m, "--sglang", "--sglang-version", "0.5.23")
    assert out["sglang_capture_args"][-4:] == ["--return-aux-hidden-state-layer-ids", "2", "30", "58"]
    rc, out = _cli("--model", m, "--sglang-version", "0.5.99")
    assert rc == 2 and out["known"] == list(versions.KNOWN) and "0.5.99" in out["msg"]
    rc, out = _cli("--model", m)
    assert rc == 0 and out["sglang_capture_args"] is None  # not asked


# role case -> (config layers, nested, sglang_layer_ids)
ROLE_CASES = {
    "default_nested": (61, True, None),
    "given": (30, False, [3, 14, 26]),
    "first_is_1": (30, False, [1, 3, 5]),
}


def _play_layers(tmp_path: Path, hosts: dict, *extra: str) -> tuple[dict, str]:
    """The role's layers.yml for each inventory host (connection local, one ansible-playbook run): per host,
    ``{"ids": sglang_resolved_layer_ids}`` or ``{"failed": the failure message}``; and the play's stdout."""
    inv = tmp_path / "inv.json"
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    inv.write_text(json.dumps({"all": {"hosts": {h: {**local, **v} for h, v in hosts.items()}}}))
    play = tmp_path / "play.yml"
    play.write_text(
        """
- hosts: all
  gather_facts: false
  tasks:
    - block:
        - ansible.builtin.include_role: {name: sglang, tasks_from: layers}
        - ansible.builtin.debug:
            msg: "RESULT {{ {'ids': sglang_resolved_layer_ids} | to_json }}"
      rescue:
        - ansible.builtin.debug:
            msg: "RESULT {{ {'failed': ansible_failed_result.msg} | to_json }}"
"""
    )
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_CALLBACK_RESULT_FORMAT": "json",
    }
    r = subprocess.run(
        [str(BIN / "ansible-playbook"), "-i", str(inv), str(play), *extra],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    results = {
        m["host"]: json.loads(json.loads(m["msg"])["msg"][len("RESULT ") :])
        for m in re.finditer(r"ok: \[(?P<host>\w+)\] => (?P<msg>\{.*?\n\})", r.stdout, re.S)
        if '"RESULT ' in m["msg"]
    }
    assert set(results) == set(hosts), r.stdout[-4000:]
    return results, r.stdout


@pytest.mark.slow  # one ansible-playbook run: 13-24 s on the loaded 2-core box
def test_the_role_takes_its_ids_from_the_cli(tmp_path):
    """The role's layers.yml holds no copy of the rule (no Jinja arithmetic on num_hidden_layers) and, run for
    real (one ansible-playbook, one local host per case), sets exactly what ``eagle3ops layer-ids --sglang``
    prints, or fails with its message, naming sglang_layer_ids.

    The run is a check run (``--check``), as the command only reads it runs then too, and it covers one host
    more: a fresh host whose runtime phase has not installed eagle3ops yet, where the configured ids are taken
    unchecked (the unit's prediction needs them) and the run says so. tests/unit/test_sglang_role.py runs the
    role without --check (ids starting at 1 refused before anything is installed)."""
    tasks = (REPO / "roles/sglang/tasks/layers.yml").read_text()
    assert "num_hidden_layers" not in tasks and "// 2" not in tasks and "slurp" not in tasks
    assert "'layer-ids'" in tasks and "'--sglang'" in tasks

    hosts = {
        case: {
            "sglang_eagle3ops_bin": str(BIN / "eagle3ops"),
            "sglang_model_path": str(_model(tmp_path, case, n, nested)),
            "sglang_layer_ids": ids,
        }
        for case, (n, nested, ids) in ROLE_CASES.items()
    }
    hosts["no_eagle3ops_yet"] = {
        "sglang_eagle3ops_bin": str(tmp_path / "no-eagle3ops"),
        "sglang_model_path": hosts["given"]["sglang_model_path"],
        "sglang_layer_ids": [1, 3, 5],  # not checked: nothing to check them with yet
    }
    results, stdout = _play_layers(tmp_path, hosts, "--check")
    assert results.pop("no_eagle3ops_yet") == {"ids": [1, 3, 5]}
    assert (
        f"check mode: {tmp_path / 'no-eagle3ops'} is not installed yet" in stdout and "not resolved" in stdout
    )
    for case, (_, _, ids) in ROLE_CASES.items():
        rc, out = _cli(
            "--model", hosts[case]["sglang_model_path"], "--sglang", *(["--ids", *ids] if ids else [])
        )
        if rc == 0:
            assert results[case] == {"ids": out["layer_ids"]}, case
        else:
            assert results[case]["failed"].startswith(f"sglang_layer_ids {ids}: "), results[case]
            assert out["msg"] in results[case]["failed"], (out, results[case])
    assert results["default_nested"] == {"ids": [2, 30, 58]} and results["given"] == {"ids": [3, 14, 26]}
    assert "adds 1 to every id" in results["first_is_1"]["failed"]
