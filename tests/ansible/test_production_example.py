"""inventory/production.example is safe as shipped (issue 16, section 6).

Read the way Ansible reads it (``ansible-inventory --list``: group_vars and host_vars merged per host):

1. every GPU host fails the verification checkpoint on a broken driver (``gpu_free_gpu_required: true``; the
   role default ``false`` exists for the CPU-only local default, where a missing driver is expected);
2. the new disk is a decision the user must make: ``storage_disk: /dev/disk/by-id/...`` is shown, commented,
   in the PVE host's host_vars, so the shipped example migrates nothing (the storage phase skips);
3. the workload variables apply to ``gpu_hosts`` only, not to the PVE host; each decision a production user
   must take is present in the example, set or commented;
4. the example passes every role's ``meta/argument_specs.yml`` in every play of ``site.yml``: the roles'
   own validation tasks (tagged ``always``) run with the example's values merged over the role defaults,
   on the controller (``ansible_connection=local``: the example's addresses are documentation addresses);
   a wrong type in the example fails that run (proven with one bad value);
5. the GPU profile for 8x RTX PRO 6000 Blackwell 96 GB (``group_vars/rtx_pro_6000.yml``, applied by making the
   container a member of ``rtx_pro_6000``): every value carries its reason in a comment, the merged values are the
   sm_120 backends, the reduced context and fractions, NCCL over PCIe; and they pass the serve, sglang and
   regenerate roles' argument specs (the memory arithmetic itself: tests/unit/core/test_memory_fit.py).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "hosts"))
from runner import run_playbook

REPO = Path(__file__).resolve().parents[2]
INV = REPO / "inventory" / "production.example"
LOCAL = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
WORKLOAD_PREFIXES = ("services_", "runtime_", "sglang_", "regenerate_", "prepare_", "extract_", "gpu_free_",
                     "train_", "serve_", "benchmark_", "eagle3ops_")  # fmt: skip
# What a production user must decide; each must appear in the example (set, or commented with its default).
DECISIONS = {
    "group_vars/gpu_hosts.yml": [
        "gpu_free_gpu_required", "gpu_free_stop_units", "services_units", "runtime_wheelhouse",
        "regenerate_enabled", "regenerate_backend", "regenerate_urls",
        "eagle3ops_model_path", "eagle3ops_conversations", "eagle3ops_extract_backend", "eagle3ops_tp_size",
        "prepare_inputs", "prepare_max_length", "eagle3ops_trust_remote_code", "prepare_rows", "extract_layer_ids", "train_epochs",
        "train_total_seq_len",
        "train_nproc", "serve_tp_size", "serve_state", "benchmark_prompts", "eagle3ops_heldout_prompts",
    ],
    "group_vars/proxmox_hosts.yml": [
        "container_vmid", "container_cores", "container_memory_mb",
        "container_gpus", "container_data_host_path", "container_restart",
        "container_on_stale_mount",
    ],
    "host_vars/pve1.yml": ["storage_disk", "storage_fstype", "storage_cutover", "storage_force"],
}  # fmt: skip


def _inventory(inv: Path = INV) -> dict:
    p = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-inventory"), "-i", str(inv), "--list"],
        capture_output=True, text=True, check=False, cwd=REPO,
        env={**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg")},
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def _members(inv: dict, group: str) -> set[str]:
    g = inv.get(group, {})
    out = set(g.get("hosts", []))
    for child in g.get("children", []):
        out |= _members(inv, child)
    return out


def test_gpu_hosts_require_a_gpu_and_the_disk_is_a_documented_decision():
    inv = _inventory()
    hv = inv["_meta"]["hostvars"]
    gpu, pve = _members(inv, "gpu_hosts"), _members(inv, "proxmox_hosts")
    assert gpu and pve, inv
    for h in sorted(gpu):
        assert hv[h].get("gpu_free_gpu_required") is True, (
            f"{h}: gpu_free_gpu_required is {hv[h].get('gpu_free_gpu_required')!r}: a broken driver would pass "
            "the checkpoint before training"
        )
    for h in sorted(pve):
        text = (INV / "host_vars" / f"{h}.yml").read_text()
        assert re.search(r"^# storage_disk: /dev/disk/by-id/\S+", text, flags=re.M), text
        assert hv[h].get("storage_disk", "") == "", "the shipped example must not name a disk to wipe"
        leaked = sorted(k for k in hv[h] if k.startswith(WORKLOAD_PREFIXES))
        assert not leaked, f"workload variables reach the PVE host {h}: {leaked}"


# what only the user can provide (group_vars/gpu_hosts.yml marks each REQUIRED; README.md says how it gets onto
# /data): the benchmark phase, the last one, needs held-out prompts, and empty they failed a full run at its end
REQUIRED = ("eagle3ops_model_path", "eagle3ops_conversations", "eagle3ops_heldout_prompts")


def test_the_required_inputs_are_set_marked_and_documented():
    inv = _inventory()
    hv = inv["_meta"]["hostvars"]
    text = (INV / "group_vars" / "gpu_hosts.yml").read_text()
    readme = (INV / "README.md").read_text()
    for h in sorted(_members(inv, "gpu_hosts")):
        for name in REQUIRED:
            value = hv[h].get(name)
            assert value, f"{h}: {name} is empty: the run would fail at the phase that reads it"
            assert re.search(rf"^# REQUIRED: [^\n]*\n(#[^\n]*\n)*{name}: ", text, flags=re.M), (
                f"{name} is not marked REQUIRED right above it"
            )
            for path in value if isinstance(value, list) else [value]:
                assert f"`{path}`" in readme and f"`{name}`" in readme, (
                    f"README.md does not say {name}: {path}"
                )
        # the benchmark reads them unless the inventory names other prompts (benchmark_prompts' default)
        assert hv[h].get("benchmark_prompts", hv[h]["eagle3ops_heldout_prompts"]), h
    for how in ("rsync", "huggingface-cli", "--tags storage"):
        assert how in readme, f"README.md does not say how the inputs get onto /data ({how})"


def test_no_internal_notes_in_the_example():
    """The example is for users: no references to the project's own bookkeeping (issue numbers, session notes,
    the user-pain list)."""
    for f in sorted(p for p in INV.rglob("*") if p.is_file()):
        text = f.read_text()
        hits = re.findall(r"users?-pain[^\n]*|issue #?\d+[^\n]*|session \d+[^\n]*", text, flags=re.I)
        assert not hits, f"{f.relative_to(REPO)}: {hits}"


def test_every_decision_is_present_set_or_commented():
    for rel, names in DECISIONS.items():
        text = (INV / rel).read_text()
        missing = [n for n in names if not re.search(rf"^(# )?{n}:", text, flags=re.M)]
        assert not missing, f"{rel} does not show {missing}"


def test_example_passes_every_roles_argument_specs(tmp_path):
    r = run_playbook(
        "site.yml", INV, tags="e3-argspec-only", extravars=LOCAL, private_data_dir=tmp_path / "ok"
    )
    assert r.rc == 0, r.summary()
    ran = {
        (ev["event_data"].get("host"), ev["event_data"].get("role"))
        for ev in r.events
        if ev.get("event") == "runner_on_ok"
        and str(ev["event_data"].get("task", "")).startswith("Validating arguments against arg spec")
    }
    # the storage play runs on storage_hosts (pve1) only: test_each_phase_targets_its_group
    # (eagle3ops: the shared variables, a dependency of every workload phase but services)
    roles = ["services", "runtime", "sglang", "regenerate", "prepare", "extract", "gpu_free", "train", "serve",
             "benchmark", "eagle3ops"]  # fmt: skip
    assert ran == {("pve1", "container"), ("pve1", "storage")} | {("ct129", x) for x in roles}, ran

    # the same validation fails on a value of the wrong type (so the run above could have failed)
    bad = run_playbook(
        "playbooks/gpu_free.yml", INV, tags="e3-argspec-only", private_data_dir=tmp_path / "bad",
        extravars={**LOCAL, "gpu_free_gpu_required": "maybe"},
    )  # fmt: skip
    assert bad.rc != 0 and "gpu_free_gpu_required" in bad.stdout, bad.summary()


def test_each_phase_targets_its_group():
    """The storage play runs on ``storage_hosts`` only (the disk's owner), not on the container as well; the
    container play on the PVE host; the workload plays on ``gpu_hosts``."""
    out = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(INV), str(REPO / "site.yml"),
         "--list-hosts"],
        capture_output=True, text=True, check=True, cwd=REPO,
        env={**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg")},
    ).stdout  # fmt: skip
    plays = re.findall(r"play #\d+ \(([^)]*)\): ([^\t\n]+).*?hosts \(\d+\):\n((?:\s+\S+\n)+)", out, re.S)
    hosts = {name.split(" - ")[0].strip(): sorted(h.split()) for _pattern, name, h in plays}
    pve = ("Storage", "Container")
    assert all(hosts[k] == ["pve1"] for k in pve), hosts
    assert all(v == ["ct129"] for k, v in hosts.items() if k not in pve), hosts


def _blackwell(tmp_path) -> Path:
    """A copy of the example with the container made a member of rtx_pro_6000, as its hosts.yml says to."""
    inv = tmp_path / "production"
    shutil.copytree(INV, inv)
    hosts = inv / "hosts.yml"
    text = hosts.read_text()
    assert text.count("# ct129:") == 1, "hosts.yml no longer shows the commented rtx_pro_6000 member"
    hosts.write_text(text.replace("# ct129:", "ct129:"))
    return inv


def test_the_rtx_pro_6000_profile_gives_reasons_and_sm120_settings(tmp_path):
    text = (INV / "group_vars" / "rtx_pro_6000.yml").read_text()
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if re.match(r"^[a-z_0-9]+:", line):
            assert lines[i - 1].startswith("#"), (
                f"rtx_pro_6000.yml: {line.split(':')[0]} has no reason above it"
            )
    shipped = _inventory()["_meta"]["hostvars"]["ct129"]
    assert shipped.get("serve_attention_backend") is None, "the H200 profile is the one shipped"
    hv = _inventory(_blackwell(tmp_path))["_meta"]["hostvars"]["ct129"]
    cap, srv = hv["sglang_extra_args"], hv["serve_extra_args"]

    def flag(args, name):
        return args[args.index(name) + 1]

    assert flag(cap, "--attention-backend") == "triton" and hv["serve_attention_backend"] == "triton"
    assert hv["serve_draft_attention_backend"] == "triton"
    assert int(flag(cap, "--context-length")) < int(flag(srv, "--context-length")) < 262144
    assert float(flag(cap, "--mem-fraction-static")) < hv["serve_mem_fraction_static"] < 0.9
    assert "--disable-custom-all-reduce" in cap and "--disable-custom-all-reduce" in srv
    assert hv["sglang_environment"]["NCCL_IB_DISABLE"] == "1" == hv["serve_environment"]["NCCL_IB_DISABLE"]
    assert not any(a.startswith(("--ep", "--expert-parallel")) for a in cap + srv)
    assert hv["eagle3ops_tp_size"] == 8 == hv["serve_tp_size"] and hv["eagle3ops_trust_remote_code"] is True
    assert hv["regenerate_concurrency"] < shipped["regenerate_concurrency"]
    # fewer CUDA-graph sizes than SGLang's 512, the vision tower's attention off FA3 (no sm_120 build), no
    # DeepGEMM (no sm_120 kernels), the kimi_k2 parsers for thinking and tool calls
    assert int(flag(cap, "--cuda-graph-max-bs")) == int(flag(srv, "--cuda-graph-max-bs")) < 512
    assert flag(cap, "--mm-attention-backend") == "sdpa" == flag(srv, "--mm-attention-backend")
    for env in (hv["sglang_environment"], hv["serve_environment"]):
        assert env["SGLANG_ENABLE_JIT_DEEPGEMM"] == "0"
    assert flag(srv, "--reasoning-parser") == "kimi_k2" == flag(srv, "--tool-call-parser")
    assert int(flag(cap, "--max-prefill-tokens")) <= 8192 and int(flag(srv, "--chunked-prefill-size")) <= 4096


def test_the_rtx_pro_6000_profile_passes_the_roles_argument_specs(tmp_path):
    inv = _blackwell(tmp_path)
    for play in ("playbooks/sglang.yml", "playbooks/serve.yml", "playbooks/regenerate.yml"):
        r = run_playbook(
            play, inv, tags="e3-argspec-only", extravars=LOCAL, private_data_dir=tmp_path / Path(play).stem
        )
        assert r.rc == 0, (play, r.summary())
        role = Path(play).stem
        assert any(
            ev.get("event") == "runner_on_ok"
            and ev["event_data"].get("role") == role
            and str(ev["event_data"].get("task", "")).startswith("Validating arguments against arg spec")
            for ev in r.events
        ), f"{play}: the {role} role's argument specs were not validated"
