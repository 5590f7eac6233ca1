"""The sglang role run for real on this machine (ansible-playbook, connection local): the REAL sglang 0.5.23
wheel installed into a fresh venv from an offline wheelhouse (``--no-deps``: its CUDA dependencies cannot
install here, and the role's patch only needs the package's files), eagle3ops installed beside it, the capture
patch applied / idempotent / predicted in check mode / restored byte-exact, the unit file rendered into a test
directory (no systemd here: ``sglang_systemd_reload: false``)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from eagle3ops.extract import sglang_patch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
from sglang_standin import offline_role_inputs, pristine_deepseek_v2

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
SPEC = sglang_patch.SPECS["0.5.23"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory, tiny_target):
    base = tmp_path_factory.mktemp("sglang-role")
    role_vars, inv = offline_role_inputs(base)
    vars_ = {
        **role_vars,
        "sglang_eagle3ops_bin": str(BIN / "eagle3ops"),
        "sglang_model_path": str(tiny_target),
        "sglang_tp_size": 1,
        "sglang_dump_data_dir": str(base / "data"),
        # capture patch state auto: applied because extraction goes through SGLang and base/data is not
        # prepared yet (every row is left); tests/ansible/test_extract_sglang.py covers "nothing left"
        "sglang_extract_backend": "sglang",
    }
    return base, inv, vars_


def _play(setup, *extra, **overrides):
    base, inv, vars_ = setup
    ev = base / f"vars-{len(list(base.glob('vars-*')))}.json"
    ev.write_text(json.dumps({**vars_, **overrides}))
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
        "PATH": f"{BIN}:{os.environ['PATH']}",
        "ANSIBLE_NOCOLOR": "1",
    }
    r = subprocess.run(
        [
            str(BIN / "ansible-playbook"),
            "-i",
            str(inv),
            str(REPO / "playbooks/sglang.yml"),
            "-e",
            f"@{ev}",
            *extra,
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=900,
    )
    m = re.search(r"localhost\s*:\s*ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", r.stdout)
    return r, (int(m.group(2)) if m else None), (int(m.group(4)) if m else None)


def _target(setup):
    base = setup[0]
    (p,) = (base / "sglang-venv").glob("lib/python3*/site-packages/" + sglang_patch.TARGET_RELPATH)
    return p


def _sha(p):
    return hashlib.sha256(p.read_bytes()).hexdigest()


@pytest.mark.slow
def test_install_patch_idempotent_check_mode_restore_refuse(setup):
    base = setup[0]
    r, changed, failed = _play(setup, "--check")  # a fresh host: predicts the install, touches nothing
    assert failed == 0 and changed > 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert "SGLang is not installed" in r.stdout and not (base / "sglang-venv" / "bin" / "python").exists()

    r, changed, failed = _play(setup)
    assert failed == 0 and changed > 0, r.stdout[-4000:] + r.stderr[-2000:]
    target = _target(setup)
    assert _sha(target) == SPEC.patched_sha256
    venv_py = base / "sglang-venv" / "bin" / "python"
    imp = subprocess.run(
        [str(venv_py), "-c", "import eagle3ops.sglang_hook as h; print(h.active_hook())"],
        capture_output=True,
        text=True,
    )
    assert imp.returncode == 0 and imp.stdout.strip() == "None", imp.stderr  # the patch's import works, inert
    unit = (base / "units" / "eagle3ops-sglang-extract.service").read_text()
    assert f"Environment=EAGLE3OPS_SGLANG_DUMP_DIR={base / 'data'}" in unit
    assert "Environment=EAGLE3OPS_SGLANG_LAYER_IDS=2,4,5" in unit  # [2, N//2, N-3] from the 8-layer config
    for flag in (
        "--disable-radix-cache",
        "--chunked-prefill-size -1",
        "--disable-prefill-cuda-graph",
        "--enable-return-aux-hidden-states",
        "--speculative-algorithm EAGLE3",
        "--return-aux-hidden-state-layer-ids 2 4 5",
        "--tp-size 1",
    ):
        assert flag in unit, flag
    if shutil.which("systemd-analyze"):  # systemd's own parser accepts the unit
        v = subprocess.run(
            ["systemd-analyze", "verify", str(base / "units" / "eagle3ops-sglang-extract.service")],
            capture_output=True,
            text=True,
        )
        assert v.returncode == 0, v.stderr

    r, changed, failed = _play(setup)
    assert (changed, failed) == (0, 0), r.stdout[-4000:]

    r, changed, failed = _play(setup, "--check", "--diff", sglang_capture_patch_state="absent")
    assert (changed, failed) == (1, 0), r.stdout[-4000:]
    assert "-            _eagle3ops_hook.on_forward(self, forward_batch, aux_hidden_states)" in r.stdout
    assert _sha(target) == SPEC.patched_sha256  # check mode changed nothing

    r, changed, failed = _play(setup, sglang_capture_patch_state="absent")
    assert (changed, failed) == (1, 0), r.stdout[-4000:]
    assert target.read_bytes() == pristine_deepseek_v2().read_bytes()
    r, changed, failed = _play(setup, sglang_capture_patch_state="absent")
    assert (changed, failed) == (0, 0), r.stdout[-4000:]

    # a hand-modified install is refused, named, and left alone
    original = target.read_bytes()
    try:
        target.write_bytes(original + b"\n# hand edit\n")
        r, _, failed = _play(setup)
        assert failed == 1, r.stdout[-4000:]
        assert "refusing to apply the capture patch" in r.stdout and str(target) in r.stdout
        assert SPEC.pristine_sha256 in r.stdout
        assert target.read_bytes() == original + b"\n# hand edit\n"
    finally:
        target.write_bytes(original)


def test_layer_ids_starting_at_1_are_refused_before_installing(setup):
    r, _, failed = _play(setup, sglang_layer_ids=[1, 3, 5])
    assert "TASK [sglang : SGLang | Install SGLang" not in r.stdout
    assert failed == 1 and "adds 1 to every id" in r.stdout, r.stdout[-3000:]
