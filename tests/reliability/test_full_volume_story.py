"""The original run's story, end to end: a data volume that fills up mid-extraction, moved onto a bigger disk by the
storage phase, the dump already on it adopted where it lies, only the rest extracted, and training on all of it.
Nothing lost, nothing redone that was whole, nothing doubled.

1. The first run (before eagle3ops) left a SpecForge-layout dump on /data: ``rows_0-2000/data_{i}.ckpt`` per-sample
   ``torch.save`` dicts of rows 0..DUMPED-1, its last file cut short where that run died.
2. ``eagle3ops extract --adopt-from`` on that volume adopts the dump's whole files and extracts the rest until the
   volume is full: it fails with exit 2 and one line naming the file, nothing torn, nothing half-written.
3. The storage phase (the real role through ansible-runner, as ``--tags storage`` runs it, with
   ``storage_source_volume``: the volume is the container's ``mp0`` on "Ceph RBD") moves /data onto a bigger disk:
   copy, checksum verification, cut-over; the old volume stays mounted at the rollback path, untouched.
4. ``eagle3ops store adopt`` of the dump on the new disk: the same rows, where they lie, no file rewritten.
5. ``eagle3ops extract`` writes exactly the rows still missing (the truncated file's row among them).
6. ``eagle3ops train`` (speculators on CPU, 2 steps, ``--verify overlapped``) reads adopted and extracted rows
   through the one loader (:class:`eagle3ops.store.reader.StoreReader`); the test reads every row through it too
   and compares it with a reference extraction, bit for bit.

Real: loop block devices (an 8 MiB ext4 "data volume", a 512 MiB disk), mkfs, mounts, rsync, the storage role, the
kernel's ENOSPC, the ``eagle3ops`` entry point as a user runs it (extract on CPU with a tiny DeepseekV3 verifier,
store adopt, train with speculators 0.9.0). STAND-INS: the dump's writer is this test (``torch.save`` of the
reference extraction's states in SpecForge's offline layout; SpecForge on GPUs cannot run here), and the volume
fills while the run is held at its 8th rename by tests/reliability/faulthook (``pause:replace:8``) and the test
writes the rest of the volume full from outside, as other writers did to the original run's pool; ``pvesm`` and
``pct`` are tests/fixtures' stand-ins (no PVE host can run here; ``pvesm path`` answers the loop device). Every
path the role touches lives under tmp_path (fstab included).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from eagle3ops.store import HiddenStateStore
from eagle3ops.store import adopted as adopted_record
from eagle3ops.store.reader import StoreReader
from eagle3ops.train.fixtures import make_data_dir, make_tiny_verifier
from hosts.test_storage_local import NEEDS_ROOT_AND_TOOLS, Env, mounted_source, run, sh, snapshot
from hosts.test_storage_pve_volume import pve_host
from rel_common import EAGLE3OPS, ENV, finish, paused_run
from safetensors.torch import load_file

pytestmark = [*NEEDS_ROOT_AND_TOOLS, pytest.mark.slow]

ROWS, DUMPED = 48, 24  # the dump holds rows 0..23; row 23's file is the one cut short
LAYERS = ["--layer-ids", "2", "4", "5"]
# the dump's declaration: SpecForge ids name layer outputs ([1, 3, 4] = inputs [2, 4, 5]), last state pre-norm
SIDECAR = {"layer_ids": [1, 3, 4], "layer_convention": "output", "last_state": "pre-norm"}
# byte-identical files need identical batch shapes on every run; the volume is megabytes: small margins
# (one writer thread: the run held at a rename writes nothing else meanwhile)
EXTRACT = ["--device", "cpu", "--max-batch-size", "1", "--writer-threads", "1", "--margin", "0",
           "--disk-margin-mib", "1", "--no-progress"]  # fmt: skip


def eagle3ops(*argv, timeout=600) -> tuple[int, dict, str]:
    p = subprocess.run([EAGLE3OPS, *map(str, argv), "--json"], capture_output=True, text=True, timeout=timeout,
                       env={**os.environ, **ENV})  # fmt: skip
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    return p.returncode, json.loads(lines[-1]) if lines else {}, p.stderr


def save_specforge(path: Path, sample: dict) -> None:
    """One row as SpecForge's offline dump writes it: input_ids [T], aux_hidden_state [1, T, 3H], hidden_state
    [1, T, H]."""
    hs, t = sample["hidden_states"], sample["hidden_states"].shape[0]
    torch.save({"input_ids": sample["token_ids"], "loss_mask": torch.ones_like(sample["token_ids"]),
                "aux_hidden_state": hs[:, :3].reshape(1, t, -1).clone(), "hidden_state": hs[:, 3][None].clone()},
               path)  # fmt: skip


def fill_until_full(path: Path) -> int:
    """Write 64 KiB blocks until the kernel says ENOSPC; the bytes written."""
    n = 0
    with open(path, "wb") as f:
        while True:
            try:
                f.write(os.urandom(65536))
                f.flush()
                os.fsync(f.fileno())
            except OSError as e:
                assert e.errno == errno.ENOSPC, e
                return n
            n += 65536


def file_ids(root: Path) -> dict[str, tuple]:
    """Each file's inode, mtime and sha256: what "not rewritten" means."""
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file():
            st = p.stat()
            out[str(p)] = (st.st_ino, st.st_mtime_ns, hashlib.sha256(p.read_bytes()).hexdigest())
    return out


@pytest.fixture
def env(tmp_path):
    e = Env(tmp_path)
    yield e
    e.cleanup()


def test_full_volume_moved_dump_adopted_rest_extracted_and_trained(env, run_playbook, tmp_path):
    # the verifier, the prepared rows, and the reference: one uninterrupted extraction of every row
    verifier = make_tiny_verifier(tmp_path / "verifier")
    prepared = make_data_dir(
        tmp_path / "prepared", verifier, num_samples=ROWS, min_len=16, max_len=64, real=False
    )
    shutil.rmtree(prepared / "hidden_states")
    ref = tmp_path / "reference"
    shutil.copytree(prepared, ref)
    rc, res, err = eagle3ops("extract", "--data", ref, "--model", verifier, *LAYERS, *EXTRACT)
    assert rc == 0 and res["written"] == ROWS, err[-3000:]
    ref_files = {i: (ref / "hidden_states" / f"hs_{i}.safetensors").read_bytes() for i in range(ROWS)}

    # 1. the data volume (container 129's mp0, ceph-rbd:vm-129-disk-1) with what the first run left on it; mounted
    # at the data path as the container sees it
    volume = env.loop("8M")
    sh("mkfs.ext4", "-q", "-m", "0", volume)
    root, pvesm, pct = pve_host(env, volume)
    env.data.mkdir()
    sh("mount", volume, env.data)
    data, dump = env.data / "data", env.data / "dump"
    shutil.copytree(prepared, data)
    (dump / "rows_0-2000").mkdir(parents=True)
    for i in range(DUMPED):
        save_specforge(
            dump / "rows_0-2000" / f"data_{i}.ckpt", load_file(ref / "hidden_states" / f"hs_{i}.safetensors")
        )
    (dump / "eagle3ops-dump.json").write_text(json.dumps(SIDECAR))
    short = dump / "rows_0-2000" / f"data_{DUMPED - 1}.ckpt"
    os.truncate(short, short.stat().st_size // 3)  # where the first run died

    # 2. adopt + extract the rest on that volume: it fills up mid-run (held at its 8th rename meanwhile)
    argv = ["extract", "--data", data, "--model", verifier, *LAYERS, *EXTRACT, "--adopt-from", dump, "--json"]
    with paused_run(argv, tmp_path, "pause:replace:8") as (proc, go):
        assert fill_until_full(env.data / "other-writer.bin") > 0
        rc, out, err = finish(proc, go, timeout=300)
    assert rc == 2, out[-2000:] + err[-3000:]
    failed = json.loads(out.strip().splitlines()[-1])
    assert "disk full" in failed["msg"] and "re-run" in failed["msg"], failed["msg"]
    assert "Traceback" not in err, err[-3000:]
    native_before = {int(p.stem[3:]) for p in (data / "hidden_states").glob("hs_*.safetensors")}
    assert native_before and native_before.isdisjoint(range(DUMPED - 1)), sorted(native_before)
    assert set(adopted_record.read_rows(data / "hidden_states")) == set(range(DUMPED - 1))
    before = snapshot(env.data)
    sh("umount", env.data)  # the container is stopped

    # 3. the storage phase moves the volume's data onto a bigger disk at the data path; the volume is the rollback
    env.disk = env.loop("512M")
    r = run(run_playbook, env, storage_source_volume="ceph-rbd:vm-129-disk-1", storage_source_vmid=129,
            storage_pvesm=pvesm, storage_pct=pct, storage_pve_config_dir=str(root / "etc/pve/lxc"))  # fmt: skip
    assert r.rc == 0, r.summary()
    assert mounted_source(env.data) == f"{env.disk}p1" and mounted_source(env.old) == volume
    assert snapshot(env.data) == before and snapshot(env.old) == before, "nothing lost in the move"

    # 4. adopt the dump where it lies on the new disk
    moved = file_ids(dump)
    rc, res, err = eagle3ops(
        "store", "adopt", "--data", data, "--model", verifier, *LAYERS, "--adopt-from", dump
    )
    assert rc == 0, err[-3000:]
    assert res["adopted"] == DUMPED - 1 and list(res["damaged"]) == [str(short)], res
    assert res["duplicates"] == {} and res["unmatched"] == [] and res["already_in_store"] == 0, res
    rows = adopted_record.read_rows(data / "hidden_states")
    assert {i: r["p"] for i, r in rows.items()} == {
        i: str(dump / "rows_0-2000" / f"data_{i}.ckpt") for i in range(DUMPED - 1)
    }

    # 5. only the rows still missing are extracted
    missing = ROWS - len(rows) - len(native_before)
    rc, res, err = eagle3ops("extract", "--data", data, "--model", verifier, *LAYERS, *EXTRACT)
    assert rc == 0, err[-3000:]
    assert res["written"] == missing and res["done_before"] == len(rows) + len(native_before), res
    scan = HiddenStateStore(data).scan_manifest()
    native = scan.indices()
    assert scan.lines == len(native) and native.isdisjoint(rows), "a row held twice"
    assert native | set(rows) == set(range(ROWS)) and native >= native_before | {DUMPED - 1}
    for i in native:  # the run that filled the disk and the run after the move: the reference's bytes
        assert (data / "hidden_states" / f"hs_{i}.safetensors").read_bytes() == ref_files[i], i

    # 6. train on all of it, then read every row through the same loader
    run_dir = tmp_path / "run"
    rc, res, err = eagle3ops("train", "--data", data, "--verifier", verifier, "--run-dir", run_dir, "--epochs", "1",
                             "--max-steps", "2", "--total-seq-len", "256", "--verify", "overlapped", "--wait",
                             "--timeout", "600", timeout=900)  # fmt: skip
    assert rc == 0, err[-3000:]
    assert json.loads((run_dir / "exit.json").read_text())["status"] == "finished"
    assert not (data / "hidden_states" / adopted_record.REQUEUE).exists(), "the loader skipped a row"
    reader = StoreReader(data / "hidden_states", check_on_read=True)
    for i in range(ROWS):
        got, want = reader.get(i), load_file(ref / "hidden_states" / f"hs_{i}.safetensors")
        assert torch.equal(got["token_ids"], want["token_ids"]), i
        assert torch.equal(got["hidden_states"], want["hidden_states"]), i
    assert reader.skipped == 0
    assert file_ids(dump) == moved, "an adopted file was rewritten"
    assert snapshot(env.old) == before, "the rollback volume changed"
