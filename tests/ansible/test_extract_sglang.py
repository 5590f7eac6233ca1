"""The extract phase's SGLang backend and the sglang phase's patch rule, through site.yml (ansible-runner) on
this machine (connection local), with ``eagle3ops_extract_backend: sglang``.

Real: both roles, every module (``eagle3ops_sglang_patch``, ``eagle3ops_extract_sglang``), the ``eagle3ops`` CLI, the
extraction plan, the client, the in-server hook and the store; SGLang 0.5.23's own ``deepseek_v2.py`` (the real
wheel, installed ``--no-deps`` by the sglang role from an offline wheelhouse, as tests/unit/sglang/test_sglang_role.py
does), patched and restored by the roles and compared by sha256 and bytes with the upstream file.

STAND-IN: the server. SGLang's runtime needs CUDA, so ``tests/fixtures/sglang_standin_server.py`` plays the
patched server on loopback (``/health`` + ``/generate``, a batching scheduler) and runs the REAL hook, configured
from the environment the systemd unit sets, over a tiny transformers DeepSeek-V3 target
(``tests/fixtures/sglang_standin.py`` says what is stood in). The extract role attaches to it
(``extract_sglang_server_unit: ""``: no systemd here); its unit is only rendered into a test directory.
"""

from __future__ import annotations

import hashlib
import json
import sys
import urllib.request
from pathlib import Path

import pytest
import run_cache
from eagle3ops.sglang import patch as sglang_patch
from eagle3ops.store import HiddenStateStore

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
sys.path.insert(0, str(REPO / "tests" / "hosts"))
sys.path.insert(0, str(REPO / "tests" / "unit"))
sys.path.insert(0, str(REPO / "tests" / "fixtures"))
from runner import EXTRACT_POLL_S, run_playbook
from sglang_standin import offline_role_inputs, pristine_deepseek_v2, standin_server
from tinymodels import build_prepared_dataset

SPEC = sglang_patch.SPECS["0.5.23"]
LENGTHS = [5, 17, 33, 9, 12, 2, 21, 7]
LAYERS = [2, 4, 5]  # [2, N//2, N-3] of the 8-layer tiny target: what both roles resolve by default
PATCH_TASK = "SGLang | Capture patch in deepseek_v2.py"
# the run's result (the extraction task starts an async job; this one collects what the job returned)
EXTRACT_TASK = "Extract | Collect the result of the extraction through SGLang"
RESTORE_TASK = "Extract | Restore the capture patch byte-exact (SGLang as shipped; serving needs it)"


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    base = tmp_path_factory.mktemp("extract-sglang")
    role_vars, inv = offline_role_inputs(base)
    model = run_cache.tiny_target(tmp_path_factory)  # once per run, shared with tests/unit (read-only here)
    xv = {
        "runtime_eagle3ops_bin": str(BIN / "eagle3ops"),
        # sglang phase: the real wheel into a fresh venv, offline, --no-deps (its CUDA deps cannot install here)
        **role_vars,
        "sglang_model_path": str(model),
        "sglang_tp_size": 1,
        # extract phase: the SGLang backend, attached to the stand-in (no unit to start)
        "eagle3ops_extract_backend": "sglang",  # both phases read it
        "extract_model_path": str(model),
        "extract_sglang_server_unit": "",
        "extract_sglang_concurrency": 3,
        "extract_sglang_health_timeout": 120,
        "extract_poll_interval": EXTRACT_POLL_S,
    }
    return base, inv, model, xv


def _data(env, name):
    base, _, _, xv = env
    d = build_prepared_dataset(base / name, LENGTHS)
    return d, {**xv, "sglang_dump_data_dir": str(d), "extract_data_dir": str(d)}


def _target(env):
    (p,) = (env[0] / "sglang-venv").glob("lib/python3*/site-packages/" + sglang_patch.TARGET_RELPATH)
    return p


def _sha(p):
    return hashlib.sha256(Path(p).read_bytes()).hexdigest()


def _one(r, task):
    (res,) = [x for x in r.task_results(task) if x]
    return res


def _patch_fact(res):
    """The patch state a eagle3ops_sglang_patch task reports (its fact: Ansible overwrites a result's top-level
    ``state`` with file info whenever the result has a ``path``)."""
    return res["ansible_facts"]["eagle3ops_sglang_patch"]


def _calls(url):
    with urllib.request.urlopen(url + "/standin/stats", timeout=5) as f:
        return json.loads(f.read())["calls"]


def _reference(env, tmp_path):
    """The same rows through the transformers backend (what the hook must reproduce byte for byte)."""
    from eagle3ops.extract.session import ExtractConfig
    from eagle3ops.extract.transformers_backend import run_extraction

    ref = build_prepared_dataset(tmp_path / "ref", LENGTHS)
    run_extraction(ExtractConfig(data_dir=str(ref), model_path=str(env[2]), progress=False, max_batch_size=1))
    return HiddenStateStore(ref)


@pytest.mark.slow  # minutes in the CI run (the mark also starts it early: tests/conftest.py)
def test_sglang_backend_extracts_restores_and_a_rerun_changes_nothing(env, tmp_path):
    _, inv, model, _ = env
    data, xv = _data(env, "data")
    with standin_server(tmp_path, data, model, LAYERS) as url:
        xv["extract_sglang_url"] = url
        first = run_playbook(REPO / "site.yml", inv, extravars=xv, tags="sglang,extract")
        s = first.host("localhost")
        assert first.rc == 0 and s["failed"] == 0, first.summary()
        changed = first.changed_tasks()
        for task in (PATCH_TASK, EXTRACT_TASK, RESTORE_TASK):
            assert f"localhost: {task}" in changed, changed
        patch = _one(first, PATCH_TASK)
        assert _patch_fact(patch)["state"] == "applied" and patch["sha256"] == SPEC.patched_sha256
        assert f"{len(LENGTHS)} of {len(LENGTHS)} rows are left to extract through SGLang" in first.stdout
        res = _one(first, EXTRACT_TASK)
        assert res["written"] == len(LENGTHS) and res["errors"] == [] and res["done_before"] == 0, res
        assert res["layer_ids"] == LAYERS
        restored = _one(first, RESTORE_TASK)
        assert restored["changed"] is True and _patch_fact(restored)["state"] == "pristine"

        # the files landed, every one byte-equal to the transformers backend's; the manifest lists them all
        got, ref = HiddenStateStore(data), _reference(env, tmp_path)
        assert sorted(got.scan_manifest().entries) == list(range(len(LENGTHS)))
        for i in range(len(LENGTHS)):
            assert got.path(i).read_bytes() == ref.path(i).read_bytes(), f"row {i} differs"
        assert json.loads(got.meta_path.read_text())["backend"] == "sglang"
        # SGLang is back as shipped: sha256 and bytes of the upstream file
        target = _target(env)
        assert _sha(target) == SPEC.pristine_sha256 == _sha(pristine_deepseek_v2())
        assert target.read_bytes() == pristine_deepseek_v2().read_bytes()
        calls, mtime = _calls(url), target.stat().st_mtime_ns

        second = run_playbook(REPO / "site.yml", inv, extravars=xv, tags="sglang,extract")
        assert second.rc == 0 and second.host("localhost")["failed"] == 0, second.summary()
        assert second.host("localhost")["changed"] == 0, second.changed_tasks()
        patch = _one(second, PATCH_TASK)  # asked, not applied: nothing is left for SGLang
        assert patch["invocation"]["module_args"]["state"] == "query" and patch["changed"] is False
        assert _patch_fact(patch)["state"] == "pristine"
        assert f"all {len(LENGTHS)} rows are extracted: nothing for the patch to do" in second.stdout
        assert not [r for r in second.task_results(EXTRACT_TASK) if r.get("written") is not None]
        assert (
            f"nothing to extract: {len(LENGTHS)} of {len(LENGTHS)} rows already in the manifests"
            in second.stdout
        )
        assert _one(second, RESTORE_TASK)["changed"] is False
        assert _calls(url) == calls  # no request reached the server
        assert _sha(target) == SPEC.pristine_sha256 and target.stat().st_mtime_ns == mtime

        check = run_playbook(REPO / "site.yml", inv, extravars=xv, tags="sglang,extract", check=True)
        assert check.rc == 0 and check.host("localhost")["changed"] == 0, check.changed_tasks()


@pytest.mark.slow
def test_other_backend_leaves_the_patch_alone_and_sglang_refuses_an_unpatched_server(env, tmp_path):
    """Rows are left, but the extract phase uses transformers: the sglang phase does not patch. The sglang
    backend then refuses to send rows to a server without the patch, before contacting it."""
    _, inv, model, _ = env
    data, xv = _data(env, "data-other")
    r = run_playbook(
        REPO / "site.yml", inv, extravars={**xv, "eagle3ops_extract_backend": "transformers"}, tags="sglang"
    )
    assert r.rc == 0 and r.host("localhost")["failed"] == 0, r.summary()
    patch = _one(r, PATCH_TASK)
    assert patch["invocation"]["module_args"]["state"] == "query" and patch["changed"] is False
    assert "the extract phase uses the transformers backend" in r.stdout
    assert _sha(_target(env)) == SPEC.pristine_sha256

    with standin_server(tmp_path, data, model, LAYERS) as url:
        r = run_playbook(REPO / "site.yml", inv, extravars={**xv, "extract_sglang_url": url}, tags="extract")
        assert r.rc != 0 and r.host("localhost")["failed"] == 1
        assert "is pristine, not patched" in r.stdout and "--tags sglang,extract" in r.stdout, r.summary()
        assert _calls(url) == 0
    assert not HiddenStateStore(data).meta_path.exists()


@pytest.mark.slow
def test_two_hosts_share_the_rows_through_their_own_capture_servers(env, tmp_path):
    """Issue #34: ``extract_backend: sglang`` over two hosts of ``extract_shard_hosts`` (the role refused this
    before). Each host attaches to its own capture server and sends only its strided share; each store holds its
    share with the bytes of the transformers backend's one-host run; a re-run changes nothing.

    STAND-IN, besides the server: the two hosts are two inventory hosts on this machine (connection local), each with
    its own data directory and server, sharing one SGLang install (patched once by the sglang phase on the first;
    the patch is restored once at the end, since both read the same file)."""
    _, _, model, xv = env
    a, b = (build_prepared_dataset(tmp_path / h, LENGTHS) for h in ("hostA", "hostB"))
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    for w in ("a", "b"):
        (tmp_path / w).mkdir()
    with (
        standin_server(tmp_path / "a", a, model, LAYERS) as ua,
        standin_server(tmp_path / "b", b, model, LAYERS) as ub,
    ):
        hosts = {
            "hostA": {
                **local,
                "extract_data_dir": str(a),
                "sglang_dump_data_dir": str(a),
                "extract_sglang_url": [ua],
            },
            "hostB": {
                **local,
                "extract_data_dir": str(b),
                "sglang_dump_data_dir": str(b),
                "extract_sglang_url": ub,
            },
        }
        inv = tmp_path / "hosts.json"
        inv.write_text(json.dumps({"all": {"children": {"gpu_hosts": {"hosts": hosts}}}}))
        common = {k: v for k, v in xv.items() if k not in ("extract_data_dir", "sglang_dump_data_dir")}
        common["extract_sglang_restore_patch"] = False
        try:
            pre = run_playbook(REPO / "site.yml", inv, extravars=common, tags="sglang", limit="hostA")
            assert pre.rc == 0, pre.summary()
            first = run_playbook(REPO / "playbooks" / "extract.yml", inv, extravars=common)
            assert first.rc == 0, first.summary()
            results = {h: _one_for(first, EXTRACT_TASK, h) for h in ("hostA", "hostB")}
            second = run_playbook(REPO / "playbooks" / "extract.yml", inv, extravars=common)
            assert second.rc == 0 and all(second.host(h)["changed"] == 0 for h in hosts), (
                second.changed_tasks()
            )
            calls = (_calls(ua), _calls(ub))
        finally:  # the other tests of this module start from SGLang as shipped
            sglang_patch.restore(_target(env), "0.5.23")
    assert results["hostA"]["ranks"] == [0] and results["hostB"]["ranks"] == [1], results
    assert results["hostA"]["world_size"] == results["hostB"]["world_size"] == 2
    assert calls == (4, 4), "each server got its host's share only"
    rows_a = sorted(HiddenStateStore(a).scan_manifest().entries)
    rows_b = sorted(HiddenStateStore(b).scan_manifest().entries)
    assert rows_a == list(range(0, len(LENGTHS), 2)) and rows_b == list(range(1, len(LENGTHS), 2))
    ref = _reference(env, tmp_path)
    for i in range(len(LENGTHS)):
        got = HiddenStateStore(a if i % 2 == 0 else b).path(i)
        assert got.read_bytes() == ref.path(i).read_bytes(), f"row {i} differs"
    # each host's capture server appended to its own manifest rank (distinct names when the stores are gathered)
    assert json.loads((b / "hidden_states" / "shard.json").read_text())["ranks"] == [1]


def _one_for(r, task, host):
    (res,) = [x for x in r.task_results(task, host=host) if x]
    return res
