"""Issue #21: extraction shared by several hosts of the inventory, one host killed mid-run, re-run.

Real: the phase playbook (playbooks/extract.yml) through ansible-runner, the extract role's share maths
(global ranks = every host's workers summed in inventory order, from ``hostvars``), the module, the CLI
(``extract --world-size W --first-rank R``, a host with 2 workers), the stores, a real tiny DeepseekV3 target
on CPU, a real SIGKILL of one host's extraction (its lock holder's PID; its workers die with it).
STAND-IN: the two "hosts" are two inventory hosts with ``ansible_connection: local`` on this machine, each with
its own data directory (its own store), as two machines with local disks would be. The same role on two
nspawn hosts over ssh: tests/hosts/test_multihost_nspawn.py.

Proves: disjoint shares (each store holds exactly its ranks' rows), the killed host's rows picked up by it on
the re-run while the other host does nothing (changed=0), no row extracted twice (each row in exactly one
manifest line over both stores), the union byte-identical to a one-host run, and `eagle3ops extract-status` over both
stores (complete, nothing done twice).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import run_cache

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
sys.path.insert(0, str(REPO / "tests" / "hosts"))
sys.path.insert(0, str(REPO / "tests" / "unit"))
from runner import cpu_extract_vars, run_playbook
from store_helpers import hs_files, manifest_rows
from tinymodels import build_prepared_dataset

pytestmark = [pytest.mark.slow]

LENGTHS = [5, 17, 33, 9, 12, 2, 21, 7, 14, 3, 26, 11]
WAIT = "Extract | Collect the extraction's result (a host lost meanwhile drops out; the others go on)"
SUMMARY = "Extract | Sum up the extraction over every host that shares the rows"
ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}


def _inventory(
    tmp: Path, stores: dict[str, tuple[Path, int]], executables: dict[str, Path] | None = None
) -> Path:
    hosts = {
        name: {
            "ansible_connection": "local",
            "ansible_python_interpreter": sys.executable,
            "extract_data_dir": str(data),
            "extract_workers": str(workers),
            "extract_executable": str((executables or {}).get(name, BIN / "eagle3ops")),
        }
        for name, (data, workers) in stores.items()
    }
    inv = tmp / "inventory.json"
    inv.write_text(json.dumps({"all": {"children": {"gpu_hosts": {"hosts": hosts}}}}))
    return inv


def _paused_eagle3ops(tmp: Path) -> tuple[Path, Path]:
    """An ``eagle3ops`` for one host of the inventory whose extraction workers each stop before their 3rd file's
    rename until GO exists (tests/reliability/faulthook, ``pause:replace:3``): that host cannot finish its share
    before the test kills it, however slow the test's own polling is (a loaded machine let it finish first).
    Returns the executable and GO (``GO.paused`` appears when a worker waits there)."""
    go = tmp / "go-paused"
    exe = tmp / "eagle3ops-paused"
    faulthook = REPO / "tests" / "reliability" / "faulthook"
    exe.write_text(
        "#!/bin/sh\n"
        f'export PYTHONPATH="{faulthook}${{PYTHONPATH:+:$PYTHONPATH}}" E3_FAULT=pause:replace:3 E3_FAULT_GO="{go}"\n'
        f'exec "{BIN / "eagle3ops"}" "$@"\n'
    )
    exe.chmod(0o755)
    return exe, go


def _kill_when_written(data: Path, rows: int, killed: dict, paused: Path) -> None:
    """SIGKILL the extraction holding ``data`` once it has recorded ``rows`` rows and a worker waits at its
    pause (``paused`` exists; its lock's holder PID: the workers die with it)."""
    from eagle3ops.runlock import holder

    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if (
            paused.exists()
            and (data / "hidden_states").is_dir()
            and len(manifest_rows(data, torn_ok=True)) >= rows
        ):
            h = holder(data)
            if h and h.get("pid"):
                os.kill(int(h["pid"]), signal.SIGKILL)  # the extraction this test's playbook started
                killed.update(h)
                return
        time.sleep(0.05)


def test_two_hosts_share_the_rows_a_killed_host_resumes_its_own(tmp_path, tmp_path_factory):
    model = run_cache.tiny_target(tmp_path_factory)  # once per run, shared with tests/unit (read-only here)
    prepared = build_prepared_dataset(tmp_path / "prepared", LENGTHS)
    a, b, ref = (tmp_path / h / "data" for h in ("hostA", "hostB", "ref"))
    for d in (a, b, ref):
        d.parent.mkdir(parents=True)
        subprocess.run(["cp", "-r", str(prepared), str(d)], check=True)
    # hostA brings 1 worker (global rank 0), hostB 2 (ranks 1, 2): world 3; hostB's workers pause mid-share
    paused_exe, go = _paused_eagle3ops(tmp_path)
    inv = _inventory(tmp_path, {"hostA": (a, 1), "hostB": (b, 2)}, {"hostB": paused_exe})
    xv = cpu_extract_vars(model)
    env = {**os.environ, **ENV}
    killed: dict = {}
    killer = threading.Thread(
        target=_kill_when_written, args=(b, 2, killed, Path(f"{go}.paused")), daemon=True
    )
    killer.start()
    r1 = run_playbook(
        REPO / "playbooks" / "extract.yml", inv, extravars=xv, envvars=ENV, private_data_dir=tmp_path / "r1"
    )
    killer.join(timeout=60)
    assert killed, f"hostB's extraction was never seen writing: {r1.summary()}"
    assert r1.host("hostA")["failed"] == 0 and r1.host("hostB")["failed"] == 1, r1.summary()
    (summary,) = r1.task_results(SUMMARY)
    text = json.dumps(summary["msg"])
    assert "hostB: ranks [1, 2] of 3" in text and "FAILED" in text and "missing on hostB" in text, text
    assert "hostA: ranks [0] of 3, 4/4 rows done, 0 missing" in text, text
    assert manifest_rows(a) == list(range(0, len(LENGTHS), 3))
    left = [i for i in range(len(LENGTHS)) if i % 3 and i not in manifest_rows(b, torn_ok=True)]
    assert left, "hostB finished before it was killed: the test proves nothing about the re-run"

    # the re-run: hostA has nothing to do, hostB extracts only what it had left (with the plain eagle3ops)
    inv = _inventory(tmp_path, {"hostA": (a, 1), "hostB": (b, 2)})
    r2 = run_playbook(
        REPO / "playbooks" / "extract.yml", inv, extravars=xv, envvars=ENV, private_data_dir=tmp_path / "r2"
    )
    assert r2.rc == 0, r2.summary()
    assert r2.host("hostA")["changed"] == 0, r2.changed_tasks("hostA")
    (res_b,) = r2.task_results(WAIT, host="hostB")
    assert res_b["written"] + res_b["adopted"] == len(left), res_b
    assert res_b["ranks"] == [1, 2] and res_b["world_size"] == 3, res_b
    (summary,) = r2.task_results(SUMMARY)
    assert "all hosts: 12/12 rows done" in json.dumps(summary["msg"]), summary

    # disjoint and complete: every row in exactly one manifest line over both stores, each on its own host
    rows_a, rows_b = manifest_rows(a), manifest_rows(b, torn_ok=True)  # b was killed mid-append
    assert sorted(rows_a + rows_b) == list(range(len(LENGTHS))), (rows_a, rows_b)
    assert all(i % 3 == 0 for i in rows_a) and all(i % 3 for i in rows_b)
    assert json.loads((b / "hidden_states" / "shard.json").read_text())["ranks"] == [1, 2]

    # identical to one host's uninterrupted run
    one = subprocess.run(
        [str(BIN / "eagle3ops"), "extract", "--data", str(ref), "--model", str(model), "--device", "cpu",
         "--max-batch-tokens", "1", "--writer-threads", "1", "--json", "--no-progress"],
        env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert one.returncode == 0, one.stderr[-3000:]
    union = {**hs_files(a), **hs_files(b)}
    reference = hs_files(ref)
    assert sorted(union) == sorted(reference)
    different = [n for n in reference if union[n] != reference[n]]
    assert not different, f"files differ from the one-host run: {different}"

    # one view over both stores
    st = subprocess.run(
        [str(BIN / "eagle3ops"), "extract-status", "--data", str(a), "--data", str(b), "--json"],
        env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert st.returncode == 0, st.stderr
    view = json.loads(st.stdout.strip().splitlines()[-1])
    assert view["complete"] is True and view["done"] == 12 and view["done_twice"] == 0, view
    assert [(s["ranks"], s["done"], s["missing"]) for s in view["stores"]] == [([0], 4, 0), ([1, 2], 8, 0)]
