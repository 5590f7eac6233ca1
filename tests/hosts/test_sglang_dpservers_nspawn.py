"""Issue #34, several capture servers on one host (data parallel), on a real host: ``eagle3ops_sglang_servers: 2``
makes the sglang phase install two systemd units (``eagle3ops-sglang-extract-0``/``-1``: their own port and
manifest rank), the extract phase starts both through systemd, sends each its half of the rows (row i to server
i mod 2), stops both; the store is one server's run byte for byte (the transformers backend's one-host run, which
tests/unit/sglang/test_sglang_client.py and test_sglang_shards.py prove equal to one capture server's), the patch is
restored once the host's rows are done; a second run is ``changed=0``.

Real: a booted Debian host (systemd PID 1, sshd), Ansible over ssh with ``site.yml --tags sglang,extract``, the roles,
the units as rendered and started/stopped by systemd, the client, the in-server hook, the store, SGLang 0.5.23's
real ``deepseek_v2.py`` patched and restored. STAND-IN, as in tests/hosts/test_sglang_multihost_nspawn.py (whose
shim this test reuses): each server is tests/fixtures/sglang_standin_server.py behind ``python -m
sglang.launch_server`` (SGLang's runtime needs CUDA), and the host has no GPU: ``sglang_gpu_count: 2`` stands in
for its /dev/nvidia<N> nodes (each unit's ``CUDA_VISIBLE_DEVICES`` is rendered, and unused on CPU).
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from store_helpers import hs_files, manifest_rows

from hosts import multihost, nspawn
from hosts.runner import EXTRACT_POLL_S
from hosts.test_sglang_multihost_nspawn import LAUNCH_SERVER, SGLANG_NSPAWN_MARKS, SITE

pytestmark = SGLANG_NSPAWN_MARKS  # with the multi-host SGLang tests, on one worker (says why there)

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "unit"))
sys.path.insert(0, str(REPO / "tests" / "fixtures"))
LENGTHS = [5, 17, 33, 9, 12, 2, 21, 7, 14, 3, 26]
UNITS = ["eagle3ops-sglang-extract-0", "eagle3ops-sglang-extract-1"]
EXTRACT_TASK = "Extract | Collect the result of the extraction through SGLang"


def test_two_servers_on_one_host_through_their_units_equal_one_server(make_host, run_playbook, tmp_path):
    from eagle3ops.sglang import patch as sglang_patch
    from sglang_standin import pristine_deepseek_v2, site_packages
    from tinymodels import build_prepared_dataset, build_tiny_target

    model = build_tiny_target(tmp_path / "model")
    prepared = build_prepared_dataset(tmp_path / "prepared", LENGTHS)
    site = site_packages(tmp_path / "sglang-site", "0.5.23")
    ro = multihost.ro_binds({model: "/srv/model", REPO / "tests" / "fixtures": "/opt/e3/fixtures"})
    path = f"{SITE}:/opt/e3/python:/opt/e3/fixtures"
    env = {"PYTHONPATH": path, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    h = make_host(ro_binds=ro, groups=("gpu_hosts",),
                  host_vars={**multihost.HOST_VARS, "sglang_environment": env})  # fmt: skip
    multihost.link([h])
    multihost.install_cli([h])
    shutil.copytree(prepared, h.merged / "srv/e3/data")
    shutil.copytree(site, h.merged / SITE.lstrip("/"))
    h.put(f"{SITE}/sglang/launch_server.py", LAUNCH_SERVER)
    inv = tmp_path / "inventory.ini"
    inv.write_text(nspawn.inventory_ini([h]))
    xv = {
        "eagle3ops_extract_backend": "sglang",
        "eagle3ops_model_path": "/srv/model",
        "eagle3ops_data_dir": "/srv/e3/data",
        "eagle3ops_sglang_site_packages": SITE,
        "eagle3ops_sglang_version": "0.5.23",
        "eagle3ops_sglang_servers": 2,  # the one setting: both phases follow it
        "eagle3ops_bin": multihost.EXE,
        "runtime_eagle3ops_bin": multihost.EXE,
        "sglang_enabled": True,
        "sglang_python": f"{multihost.VENV}/bin/python",
        "sglang_tp_size": 1,
        "sglang_gpu_count": 2,
        "extract_sglang_python": f"{multihost.VENV}/bin/python",
        "extract_sglang_concurrency": 2,
        "extract_sglang_health_timeout": 600,
        "extract_poll_interval": EXTRACT_POLL_S,
    }
    store = h.merged / "srv/e3/data"
    target = h.merged / SITE.lstrip("/") / sglang_patch.TARGET_RELPATH

    r1 = run_playbook("site.yml", inv, extravars=xv, tags="sglang,extract")
    assert r1.rc == 0, r1.summary()
    units = {u: (h.merged / f"etc/systemd/system/{u}.service").read_text() for u in UNITS}
    assert not (h.merged / "etc/systemd/system/eagle3ops-sglang-extract.service").exists()
    for i, (u, text) in enumerate(units.items()):
        assert f"--port {30000 + i} " in text and f"EAGLE3OPS_SGLANG_MANIFEST_RANK={i}\n" in text, u
        assert f"CUDA_VISIBLE_DEVICES={i}\n" in text, u
        assert h.ssh(f"systemctl is-active {u}", check=False).stdout.strip() == "inactive", u  # stopped after
        # each unit ran once: the client started it through systemd
        log = h.ssh(f"journalctl -a -u {u} --no-pager", check=False).stdout
        assert f"Started {u}.service" in log and f"Stopped {u}.service" in log, log[-2000:]
    (res,) = [x for x in r1.task_results(EXTRACT_TASK) if x]
    assert res["written"] == len(LENGTHS) and not res.get("failed"), res
    assert manifest_rows(store) == list(range(len(LENGTHS)))  # every row once over both manifests
    assert res["urls"] == ["http://127.0.0.1:30000", "http://127.0.0.1:30001"], res
    for rank in (0, 1):  # each server wrote its half of the rows into its own manifest
        lines = (store / "hidden_states" / f"manifest-rank{rank}.jsonl").read_text().splitlines()
        rows = [json.loads(ln)["i"] for ln in lines]
        assert sorted(rows) == list(range(rank, len(LENGTHS), 2)), (rank, rows)
    assert (
        target.read_bytes() == pristine_deepseek_v2("0.5.23").read_bytes()
    )  # restored once the rows are done

    ref = multihost.one_host_reference(prepared, model, tmp_path / "ref")
    got, reference = hs_files(store), hs_files(ref)
    assert sorted(got) == sorted(reference)
    assert [n for n in reference if got[n] != reference[n]] == [], "differs from one server's run"

    r2 = run_playbook("site.yml", inv, extravars=xv, tags="sglang,extract")
    assert r2.rc == 0 and r2.host(h.name)["changed"] == 0, r2.changed_tasks(h.name)
    assert target.read_bytes() == pristine_deepseek_v2("0.5.23").read_bytes()

    # a capture server that stops: the client's message carries the end of its unit's journal (here the launch
    # shim refusing SGLang as shipped), so the user reads why without another command
    h.ssh(
        f"systemctl start {UNITS[0]}; for i in $(seq 120); do systemctl is-failed -q {UNITS[0]} && break; sleep 1; done"
    )
    code = f"from eagle3ops.sglang.client import server_gone; print(server_gone(unit='{UNITS[0]}'))"
    why = h.ssh(f'PYTHONPATH=/opt/e3/python {multihost.VENV}/bin/python -c "{code}"', check=False).stdout
    assert f"its systemd unit {UNITS[0]} is failed" in why and "is not patched" in why, why
