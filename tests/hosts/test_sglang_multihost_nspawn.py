"""Issue #34 on real hosts: two systemd-nspawn hosts extract through the SGLang capture path together, one is
powered off mid-run and comes back, the re-run completes; the union of the stores is one host's run byte for
byte; a third run is ``changed=0``; SGLang's ``deepseek_v2.py`` is as shipped on both hosts at the end.

Real: two booted Debian hosts (systemd PID 1, sshd), Ansible over ssh with ``site.yml --tags sglang,extract``
and ``eagle3ops_extract_backend: sglang``: on each host the sglang phase (the real SGLang 0.5.23 wheel's files
as ``pip install --target`` leaves them, on the host's own disk, ``sglang_site_packages``; the capture patch
applied there while rows are left; the systemd unit rendered by the role and daemon-reloaded), the extract phase
(the share maths over both hosts' capture servers, the client started detached and watched, the unit started and
stopped by the client through systemd, the patch restored on each host once its share is done), the in-server
capture hook writing each host's own store, a real tiny DeepseekV3 target on CPU. hostB is powered off (SIGKILL
to its PID 1: every process of it dies at once) while its server is held at its 5th ``os.replace`` by the
test-only fault hook (tests/reliability/faulthook, in the unit's environment), so the loss lands mid-run on any
box; it boots again with its disk.

STAND-INS, said here: each capture server is the test's stand-in of SGLang's server
(tests/fixtures/sglang_standin_server.py in capture mode: ``/health``, ``/generate``, a batching scheduler, the
REAL hook over the tiny target computed with transformers), started by the role's unit as ``python -m
sglang.launch_server ...`` through a small ``sglang/launch_server.py`` the test puts beside the real wheel's
files (SGLang's runtime needs CUDA). That shim refuses to start when the real patch check says the file is not
patched (SGLang imports the hook only through the patch). The hosts run the controller's venv (torch,
transformers) and this checkout's ``python/`` and ``tests/fixtures/`` bound read-only (the runtime phase would
install eagle3ops: tests/hosts/test_runtime_remote.py), the model bound read-only into both.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from store_helpers import hs_files, manifest_rows

from hosts import multihost, nspawn
from hosts.runner import EXTRACT_POLL_S

# one worker runs the SGLang nspawn tests one after the other: twice (a CI run, and -n 3 by hand) a survivor's
# capture server stopped mid take-over while all three ran at once, never alone or under a CPU hog; cause not
# found yet - the client's message now carries the unit's journal (eagle3ops.sglang.client.unit_log_tail)
SGLANG_NSPAWN_MARKS = [
    pytest.mark.root,
    pytest.mark.nspawn,
    pytest.mark.slow,
    pytest.mark.xdist_group("sglang-nspawn"),
]
pytestmark = SGLANG_NSPAWN_MARKS

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "unit"))
sys.path.insert(0, str(REPO / "tests" / "fixtures"))
LENGTHS = [5, 17, 33, 9, 12, 2, 21, 7, 14, 3, 26, 11, 8, 19, 4, 15]
SUMMARY = "Extract | Sum up the extraction over every host that shares the rows"
SITE = "/opt/sglang-site"
UNIT = "eagle3ops-sglang-extract"
LAUNCH_SERVER = '''"""STAND-IN for SGLang's launch_server on an eagle3ops test host (tests/hosts/test_sglang_multihost_nspawn.py):
SGLang's runtime needs CUDA. Takes the flags the sglang role's unit renders, refuses to start on an unpatched
deepseek_v2.py (SGLang would dump nothing), then runs tests/fixtures/sglang_standin_server.py in capture mode."""

import argparse
import os
import sys

sys.path.insert(0, "/opt/e3/fixtures")
from eagle3ops.sglang import patch as sglang_patch  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--model-path", required=True)
ap.add_argument("--port", type=int, required=True)
args, _rest = ap.parse_known_args()
here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
target = os.path.join(here, sglang_patch.TARGET_RELPATH)
if not sglang_patch.status(target, "0.5.23")["applied"]:
    sys.exit(f"{target} is not patched: this server would dump nothing")
sys.argv = [sys.argv[0], "--model", args.model_path, "--port", str(args.port), "--port-file", "/run/e3o-port"]
import sglang_standin_server  # noqa: E402

sglang_standin_server.main()
'''


def _why(r, *hosts) -> str:
    """The run's summary and, for each host still up, the capture unit's journal and the hook's error file: what
    a failed assertion of a run that had rows to extract needs to say why a capture server stopped."""
    out = [r.summary()]
    for h in hosts:
        if h.pid:
            log = h.ssh(f"journalctl -a -u {UNIT} --no-pager | tail -60", check=False).stdout
            err = h.merged / "srv/e3/data/hidden_states/sglang_hook_errors.jsonl"
            out.append(f"--- {h.name}: journal of {UNIT} ---\n{log}")
            out.append(
                f"--- {h.name}: {err.name} ---\n{err.read_text()[-3000:] if err.exists() else '(none)'}"
            )
    return "\n".join(out)


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def _cluster(make_host, tmp_path, host_vars: dict | None = None) -> SimpleNamespace:
    """The two hosts of both tests: the real 0.5.23 wheel's files and the launch shim on each host's own disk, the
    prepared rows in each one's data directory, the tiny target bound read-only; hostB's capture server held at its
    5th ``os.replace`` by the fault hook (its port file, then rows renamed and in its manifest), so the power-off
    lands mid-run. ``xv``: the extra vars of ``site.yml --tags sglang,extract`` on them."""
    from sglang_standin import site_packages
    from tinymodels import build_prepared_dataset, build_tiny_target

    model = build_tiny_target(tmp_path / "model")
    prepared = build_prepared_dataset(tmp_path / "prepared", LENGTHS)
    site = site_packages(tmp_path / "sglang-site", "0.5.23")  # the real wheel's files, copied onto each host
    ro = multihost.ro_binds({model: "/srv/model", REPO / "tests" / "fixtures": "/opt/e3/fixtures"})
    path = f"{SITE}:/opt/e3/python:/opt/e3/fixtures"
    env = {"PYTHONPATH": path, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    fault = {
        "PYTHONPATH": f"{path}:/opt/e3/faulthook",
        "E3_FAULT": "pause:replace:5",
        "E3_FAULT_GO": "/opt/e3/go",
    }
    common = {**multihost.HOST_VARS, **(host_vars or {})}
    a = make_host(ro_binds=ro, groups=("gpu_hosts",), host_vars={**common, "sglang_environment": env})
    b = make_host(
        ro_binds=ro, groups=("gpu_hosts",), host_vars={**common, "sglang_environment": {**env, **fault}}
    )
    hosts = [a, b]
    multihost.link(hosts)
    multihost.install_cli(hosts)
    for name in ("sitecustomize.py", "faults.py"):
        b.put(f"/opt/e3/faulthook/{name}", (REPO / "tests/reliability/faulthook" / name).read_text())
    for h in hosts:
        shutil.copytree(prepared, h.merged / "srv/e3/data")  # each host's own disk
        shutil.copytree(site, h.merged / SITE.lstrip("/"))
        h.put(f"{SITE}/sglang/launch_server.py", LAUNCH_SERVER)
    inv = tmp_path / "inventory.ini"
    inv.write_text(nspawn.inventory_ini(hosts))
    xv = {
        "eagle3ops_extract_backend": "sglang",  # both phases read it
        "eagle3ops_model_path": "/srv/model",
        "eagle3ops_data_dir": "/srv/e3/data",
        "eagle3ops_sglang_site_packages": SITE,
        "eagle3ops_sglang_version": "0.5.23",
        "eagle3ops_bin": multihost.EXE,
        "runtime_eagle3ops_bin": multihost.EXE,
        "sglang_enabled": True,  # no GPU on the hosts: the stand-in needs none
        "sglang_python": f"{multihost.VENV}/bin/python",
        "sglang_tp_size": 1,
        "extract_sglang_python": f"{multihost.VENV}/bin/python",
        "extract_sglang_concurrency": 2,
        "extract_sglang_health_timeout": 600,
        "extract_poll_interval": EXTRACT_POLL_S,
    }
    return SimpleNamespace(a=a, b=b, hosts=hosts, inv=inv, xv=xv, env=env, model=model, prepared=prepared,
                           store_a=a.merged / "srv/e3/data", store_b=b.merged / "srv/e3/data")  # fmt: skip


def _power_off_b_mid_run(c: SimpleNamespace, run_playbook):
    """``site.yml --tags sglang,extract`` on both hosts, hostB powered off (SIGKILL to its PID 1) once its server
    is held with at least one row in its manifest; hostA finishes. The run's result."""

    def b_paused_mid_run():
        return (c.b.merged / "opt/e3/go.paused").exists() and len(manifest_rows(c.store_b, torn_ok=True)) >= 1

    killer = multihost.power_off_when(c.b, b_paused_mid_run, timeout=900)
    r1 = run_playbook("site.yml", c.inv, extravars=c.xv, tags="sglang,extract")
    killer.join(timeout=60)
    assert c.b.pid == 0, f"{c.b.name} was never seen extracting: {r1.summary()}"
    assert r1.host(c.a.name)["failed"] == 0 and r1.host(c.a.name)["unreachable"] == 0, _why(r1, c.a)
    return r1


def test_two_hosts_extract_through_sglang_survive_a_power_off_and_end_pristine(
    make_host, run_playbook, tmp_path
):
    from eagle3ops.sglang import patch as sglang_patch
    from sglang_standin import pristine_deepseek_v2

    c = _cluster(make_host, tmp_path)
    a, b, hosts, inv, xv, env = c.a, c.b, c.hosts, c.inv, c.xv, c.env
    model, prepared, store_a, store_b = c.model, c.prepared, c.store_a, c.store_b
    pristine = pristine_deepseek_v2("0.5.23").read_bytes()
    target = Path(SITE.lstrip("/")) / sglang_patch.TARGET_RELPATH
    r1 = _power_off_b_mid_run(c, run_playbook)
    assert r1.host(b.name)["failed"] + r1.host(b.name)["unreachable"] >= 1, r1.summary()
    summaries = r1.task_results(SUMMARY)
    assert len(summaries) == 1, r1.summary()
    (summary,) = summaries
    assert f"missing on {b.name}" in json.dumps(summary["msg"]), summary
    assert (
        a.merged / target
    ).read_bytes() == pristine  # hostA's share is done: its SGLang is as shipped again
    assert "--disable-radix-cache" in (a.merged / f"etc/systemd/system/{UNIT}.service").read_text()
    assert a.ssh(f"systemctl is-active {UNIT}", check=False).stdout.strip() == "inactive"  # stopped after it

    b.start()  # the host comes back with its disk; the re-run goes on with its rows
    multihost.link(hosts)
    b.host_vars["sglang_environment"] = env  # without the pause
    inv.write_text(nspawn.inventory_ini(hosts))
    died_with = manifest_rows(store_b, torn_ok=True)
    assert 0 < len(died_with) < 8 and all(i % 2 == 1 for i in died_with), died_with  # it died with rows left
    assert _sha(b.merged / target) == sglang_patch.SPECS["0.5.23"].patched_sha256  # its rows were left
    r2 = run_playbook("site.yml", inv, extravars=xv, tags="sglang,extract")
    assert r2.rc == 0, _why(r2, a, b)
    assert r2.host(a.name)["changed"] == 0, r2.changed_tasks(a.name)
    (summary,) = r2.task_results(SUMMARY)
    assert f"all hosts: {len(LENGTHS)}/{len(LENGTHS)} rows done" in json.dumps(summary["msg"]), summary

    rows_a, rows_b = manifest_rows(store_a), manifest_rows(store_b, torn_ok=True)  # b lost mid-append
    assert sorted(rows_a + rows_b) == list(range(len(LENGTHS))), (rows_a, rows_b)  # each row once
    assert all(i % 2 == 0 for i in rows_a) and all(i % 2 == 1 for i in rows_b)
    ref = multihost.one_host_reference(prepared, model, tmp_path / "ref")
    union, reference = {**hs_files(store_a), **hs_files(store_b)}, hs_files(ref)
    assert sorted(union) == sorted(reference)
    assert [n for n in reference if union[n] != reference[n]] == [], "differs from one host's run"
    for h in hosts:  # SGLang as shipped on every host, byte for byte
        assert (h.merged / target).read_bytes() == pristine, h.name

    r3 = run_playbook("site.yml", inv, extravars=xv, tags="sglang,extract")
    assert r3.rc == 0, _why(r3, a, b)
    assert r3.host(a.name)["changed"] == 0 and r3.host(b.name)["changed"] == 0, r3.changed_tasks()
    for h in hosts:
        assert (h.merged / target).read_bytes() == pristine, h.name


def test_a_powered_off_hosts_rows_reassigned_through_sglang_on_request(make_host, run_playbook, tmp_path):
    """Issue 34, on request, the SGLang path: hostB powered off mid-run and left off; ``site.yml --tags
    sglang,extract`` with ``eagle3ops_extract_reassign_from: [hostB]``: hostA's sglang phase patches again (its
    store does not hold its part of hostB's rows yet), its capture server extracts hostB's whole share too, the
    patch is restored; hostA's store alone is one host's run byte for byte; again: changed=0; hostB back: its
    sglang phase leaves it unpatched, the extract phase extracts nothing there and restores the patch the power-off
    left (once), its old part is left as it was; then changed=0 on both, SGLang pristine on both."""
    from eagle3ops.sglang import patch as sglang_patch
    from sglang_standin import pristine_deepseek_v2

    # extract_workers: a host's rank count when it cannot be asked (one capture server each)
    c = _cluster(make_host, tmp_path, {"extract_workers": 1})
    a, b, hosts, inv, xv, env = c.a, c.b, c.hosts, c.inv, c.xv, c.env
    model, prepared, store_a, store_b = c.model, c.prepared, c.store_a, c.store_b
    pristine = pristine_deepseek_v2("0.5.23").read_bytes()
    target = Path(SITE.lstrip("/")) / sglang_patch.TARGET_RELPATH
    _power_off_b_mid_run(c, run_playbook)

    take = {**xv, "eagle3ops_extract_reassign_from": [b.name]}
    r2 = run_playbook("site.yml", inv, extravars=take, tags="sglang,extract")  # hostB still powered off
    assert r2.host(a.name)["failed"] == 0 and r2.host(b.name)["unreachable"] >= 1, _why(r2, a)
    (summary,) = r2.task_results(SUMMARY)
    text = json.dumps(summary["msg"])
    assert f"{b.name}: share RE-ASSIGNED to {a.name}" in text and "all hosts: 16/16 rows done" in text, text
    assert manifest_rows(store_a) == list(range(len(LENGTHS)))
    assert (a.merged / target).read_bytes() == pristine
    r3 = run_playbook("site.yml", inv, extravars=take, tags="sglang,extract")
    assert r3.host(a.name)["changed"] == 0 and r3.host(a.name)["failed"] == 0, r3.changed_tasks(a.name)

    b.start()  # hostB is back with its disk (and the patch its power-off left)
    multihost.link(hosts)
    b.host_vars["sglang_environment"] = env
    inv.write_text(nspawn.inventory_ini(hosts))
    died_with = manifest_rows(store_b, torn_ok=True)
    assert 0 < len(died_with) < 8, died_with
    b_files = hs_files(store_b)
    r4 = run_playbook("site.yml", inv, extravars=take, tags="sglang,extract")
    assert r4.rc == 0, _why(r4, a, b)
    assert r4.host(a.name)["changed"] == 0, r4.changed_tasks(a.name)
    # on hostB: its unit's environment (the test dropped the fault hook from it) and the patch the power-off left
    assert r4.changed_tasks(b.name) == [
        f"{b.name}: SGLang | Install the extraction server units (one per capture server)",
        f"{b.name}: Extract | Restore the capture patch byte-exact (SGLang as shipped; serving needs it)",
    ], r4.changed_tasks(b.name)
    r5 = run_playbook("site.yml", inv, extravars=take, tags="sglang,extract")
    assert r5.rc == 0 and r5.host(a.name)["changed"] == 0 and r5.host(b.name)["changed"] == 0, (
        r5.changed_tasks()
    )
    assert hs_files(store_b) == b_files, "hostB's part is left as it was"
    for h in hosts:
        assert (h.merged / target).read_bytes() == pristine, h.name

    ref = multihost.one_host_reference(prepared, model, tmp_path / "ref")
    assert hs_files(store_a) == hs_files(ref), "hostA's store differs from one host's run"
