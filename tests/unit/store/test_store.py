"""The hidden-state store: atomic files, torn manifests, resume planning, disk-space preflight."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest
import torch
from eagle3ops.store import (
    DiskSpaceError,
    HiddenStateStore,
    ManifestEntry,
    StoreError,
    preflight_disk,
    read_safetensors_header,
    sample_nbytes,
    serialize_sample,
)

K1, H = 4, 8


def _payload(seq_len: int, seed: int = 0) -> bytes:
    g = torch.Generator().manual_seed(seed)
    return serialize_sample(
        torch.arange(seq_len), torch.randn(seq_len, K1, H, generator=g).to(torch.bfloat16)
    )


def _fill(store: HiddenStateStore, lens: dict[int, int]) -> None:
    entries = [store.write_sample(i, _payload(n, i), n) for i, n in lens.items()]
    store.append_manifest(entries)
    store.close()


def test_sample_size_prediction_is_exact_upper_bound(tmp_path):
    """The preflight's per-sample estimate never under-counts and is within 1% + header of the real file."""
    for n in (1, 7, 300):
        real = len(_payload(n))
        est = sample_nbytes(n, K1, H, "bfloat16")
        assert real <= est <= real + 256, (n, real, est)


def test_kill_between_temp_write_and_rename_leaves_no_final_file(tmp_path):
    """A writer SIGKILLed after its temp file is complete but before os.replace leaves no final-name file."""
    script = textwrap.dedent(
        f"""
        import os, sys, time
        from eagle3ops.store import HiddenStateStore
        real = os.replace
        def stalled(src, dst):
            print("READY", flush=True); time.sleep(60); real(src, dst)
        os.replace = stalled
        HiddenStateStore({str(tmp_path)!r}).dir.mkdir(parents=True, exist_ok=True)
        HiddenStateStore({str(tmp_path)!r}).write_sample(3, b"x" * 4096, 10)
        """
    )
    p = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "READY"
    p.send_signal(signal.SIGKILL)
    p.wait()
    store = HiddenStateStore(tmp_path)
    assert not store.path(3).exists()
    tmps = [n for n in os.listdir(store.dir) if n.endswith(".tmp")]
    assert len(tmps) == 1
    assert store.clean_temp_files() == tmps
    assert os.listdir(store.dir) == []


def test_torn_manifest_line_is_ignored_and_repaired(tmp_path):
    store = HiddenStateStore(tmp_path)
    _fill(store, {0: 5, 1: 6})
    with open(store.manifest_path(), "a") as f:
        f.write('{"i":2,"n":7,"b":1')  # kill -9 mid-append
    scan = store.scan_manifest()
    assert sorted(scan.entries) == [0, 1]
    assert len(scan.torn_lines) == 1 and scan.torn_lines[0].endswith(":3")
    # the next writer truncates the torn tail before appending, so lines never glue together
    store.append_manifest([ManifestEntry(2, 7, 123)])
    store.close()
    assert sorted(store.scan_manifest().entries) == [0, 1, 2]
    assert store.scan_manifest().torn_lines == []


def test_corrupt_line_in_the_middle_is_an_error_naming_file_and_line(tmp_path):
    store = HiddenStateStore(tmp_path)
    _fill(store, {0: 5})
    with open(store.manifest_path(), "a") as f:
        f.write("garbage\n" + ManifestEntry(1, 5, 9).to_line())
    with pytest.raises(StoreError, match=r"manifest-rank0\.jsonl:2: corrupt manifest line"):
        store.scan_manifest()


def test_resume_plans_exactly_the_missing_indices(tmp_path):
    lens = [5, 6, 7, 8, 9, 10]
    store = HiddenStateStore(tmp_path)
    _fill(store, {0: 5, 2: 7})
    # a complete file whose manifest line was lost (crash after rename): adopted by header check
    store.path(4).write_bytes(_payload(9))
    # a truncated file under a final name (e.g. copied by a non-atomic tool): re-extracted
    store.path(5).write_bytes(_payload(10)[:-20])
    # a file with the wrong shape (another model): re-extracted
    store.path(3).write_bytes(
        serialize_sample(torch.arange(8), torch.zeros(8, K1, H + 1, dtype=torch.bfloat16))
    )
    plan = store.plan(lens, num_states=K1, hidden_size=H, dtype="bfloat16")
    assert plan.remaining == [1, 3, 5]
    assert plan.adopted == 1 and plan.done == 3
    assert set(plan.invalid) == {3, 5}
    assert "truncated" in plan.invalid[5]
    assert plan.bytes_needed == sum(sample_nbytes(lens[i], K1, H, "bfloat16") for i in (1, 3, 5))
    # adoption was recorded, so the next plan does not re-check index 4
    assert 4 in store.scan_manifest().entries


def test_lengths_come_from_the_manifest(tmp_path):
    store = HiddenStateStore(tmp_path)
    _fill(store, {0: 5, 1: 11})
    other = HiddenStateStore(tmp_path, rank=1)
    _fill(other, {2: 3})
    assert store.lengths() == {0: 5, 1: 11, 2: 3}  # ranks merged on read


def test_meta_mismatch_refuses_to_mix(tmp_path):
    store = HiddenStateStore(tmp_path)
    store.ensure_meta({"layer_ids": [2, 4, 5], "hidden_size": 64, "dtype": "bfloat16"})
    store.ensure_meta({"layer_ids": [2, 4, 5], "hidden_size": 64, "dtype": "bfloat16"})  # same: fine
    with pytest.raises(StoreError, match=r"layer_ids: stored \[2, 4, 5\] vs requested \[1, 3, 5\]"):
        store.ensure_meta({"layer_ids": [1, 3, 5], "hidden_size": 64, "dtype": "bfloat16"})


def test_header_reader_rejects_truncation(tmp_path):
    p = tmp_path / "x.safetensors"
    p.write_bytes(_payload(4))
    assert read_safetensors_header(p)["hidden_states"]["shape"] == [4, K1, H]
    p.write_bytes(_payload(4)[:-1])
    with pytest.raises(ValueError, match="truncated"):
        read_safetensors_header(p)


def test_preflight_refuses_when_it_cannot_fit(tmp_path):
    free = preflight_disk(tmp_path, 1)["free_bytes"]
    with pytest.raises(DiskSpaceError, match=str(tmp_path)):
        preflight_disk(tmp_path, free * 2)


@pytest.mark.root
@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root")
def test_preflight_on_a_real_small_filesystem(tmp_path):
    """A real 2 MiB tmpfs (no patched statvfs): the exact need is refused before anything is written."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)], check=True)
    try:
        store = HiddenStateStore(mnt)
        lens = [2000] * 4  # 4 × 2000 tokens × 4 states × 8 × 2 B ≈ 256 KiB + ids: fits
        plan = store.plan(lens, num_states=K1, hidden_size=H, dtype="bfloat16")
        preflight_disk(store.dir, plan.bytes_needed, margin_bytes=0)
        lens = [2000] * 40  # ≈ 2.6 MiB: does not
        plan = store.plan(lens, num_states=K1, hidden_size=H, dtype="bfloat16")
        with pytest.raises(DiskSpaceError, match="not enough space") as e:
            preflight_disk(store.dir, plan.bytes_needed, margin_bytes=0)
        assert "nothing was written" in str(e.value)
        assert not store.dir.exists() or os.listdir(store.dir) == []
        assert json.dumps(plan.remaining)  # plan itself wrote nothing either
    finally:
        subprocess.run(["umount", str(mnt)], check=True)
