"""Issue #10.2: extraction onto a small REAL filesystem (a tmpfs with ``size=``) that fills up mid-run.

Real parts: the tmpfs, the ``eagle3ops`` entry point as a user runs it (a plain subprocess), the real
ENOSPC from the kernel, the real preflight (statvfs of the mount). Test-only: faulthook/sitecustomize.py
pauses the run at its 6th ``os.replace`` (after the preflight passed and 4 samples are on disk) while the
test fills the filesystem from the outside, as another writer would. The resume runs through the zygote
(see rel_common.py).
"""

from __future__ import annotations

import json
import os
import shutil

import pytest
from eagle3ops.store import HiddenStateStore
from rel_common import (
    EXTRACT_ARGS,
    LENGTHS,
    fill_fs,
    finish,
    fresh_data,
    hs_files,
    leftovers,
    manifest_entries,
    paused_run,
)
from safetensors.torch import load_file

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root; CI runs as root"),
]


def test_disk_fills_mid_run_fails_clearly_keeps_every_file_and_resumes(
    small_fs, zygote, tiny_model, prepared, reference, figures, tmp_path
):
    # big enough for the preflight (the need + 5% + the 64 MiB default margin), filled from outside later
    mnt = small_fs("72m")
    data = fresh_data(prepared, mnt / "data")
    argv = ["extract", "--data", data, "--model", tiny_model, *EXTRACT_ARGS]
    with paused_run(argv, tmp_path, "pause:replace:6") as (proc, go):  # its 6th rename
        filler = mnt / "filler"
        assert fill_fs(filler) > 0
        assert shutil.disk_usage(mnt).free < 4096 * 4
        _, out, err = finish(proc, go, timeout=120)
    assert proc.returncode == 2, out + err[-3000:]
    res = json.loads(out.strip().splitlines()[-1])
    msg = res["msg"]
    # names the file, the size, what happened and what to do
    assert res["failed"] is True
    assert "disk full while writing" in msg and str(data / "hidden_states" / "hs_") in msg, msg
    assert "free space" in msg and "re-run" in msg and "KiB" in msg, msg
    assert "still to write" in msg, msg  # the space the rest of the run needs
    assert "Traceback" not in err, err[-3000:]

    # nothing corrupt: every file under its final name loads and is byte-identical to the reference;
    # the manifest names only such files; no temp file is left
    ref = hs_files(reference["data"])
    got = hs_files(data)
    assert 4 <= len(got) < len(LENGTHS), sorted(got)
    for name, blob in got.items():
        load_file(str(data / "hidden_states" / name))
        assert blob == ref[name], name
    store = HiddenStateStore(data)
    for i, e in store.scan_manifest().entries.items():
        assert store.path(i).stat().st_size == e.nbytes
    assert leftovers(data) == [], "a temp file survived the failed write"

    # space freed: the re-run completes, only the missing samples are written
    filler.unlink()
    r = zygote.run(["extract", "--data", data, "--model", tiny_model, *EXTRACT_ARGS])
    assert r.rc == 0, r.stderr[-3000:]
    done = r.json
    assert done["done_before"] + done["adopted"] == len(got) and done["written"] == len(LENGTHS) - len(got)
    final = hs_files(data)
    assert final == ref
    assert manifest_entries(store) == manifest_entries(HiddenStateStore(reference["data"]))
    assert leftovers(data) == []
    figures["faults_injected"] += 1
    figures["runs_resumed"] += 1
    figures["files_compared"] += len(final)
    figures["bytes_compared"] += sum(len(b) for b in final.values())
    figures["files_lost"] += len(set(ref) - set(final))


def test_preflight_refuses_up_front_and_writes_no_sample(small_fs, zygote, tiny_model, prepared, figures):
    mnt = small_fs("16m")  # the states fit, the default 64 MiB margin does not
    data = fresh_data(prepared, mnt / "data")
    r = zygote.run(["extract", "--data", data, "--model", tiny_model, *EXTRACT_ARGS])
    assert r.rc == 2, r.stderr[-3000:]
    msg = r.json["msg"]
    assert f"not enough space on the filesystem of {data / 'hidden_states'}" in msg, msg
    assert "still to" in msg and "free" in msg and "larger disk" in msg, msg
    assert hs_files(data) == {} and leftovers(data) == []
    assert not list((data / "hidden_states").glob("manifest-*"))
    figures["bad_inputs_refused"] += 1
