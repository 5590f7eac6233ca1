"""The sglang role run for real on this machine (ansible-playbook, connection local): the REAL sglang 0.5.23
wheel installed into a fresh venv from an offline wheelhouse (``--no-deps``: its CUDA dependencies cannot
install here, and the role's patch only needs the package's files), eagle3ops installed beside it, the capture
patch applied / idempotent / predicted in check mode / restored byte-exact, the unit file rendered into a test
directory (no systemd here: ``sglang_systemd_reload: false``). And the role on an SGLang installed without a venv
(``sglang_site_packages``, as on the lent H200 box): the REAL 0.5.17 wheel's ``deepseek_v2.py`` and dist-info
unpacked ``pip --target``-style, nothing installed, the patch applied / idempotent / restored there."""

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
from eagle3ops.sglang import patch as sglang_patch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "fixtures"))
from sglang_standin import offline_role_inputs, pristine_deepseek_v2, site_packages

REPO = Path(__file__).resolve().parents[3]
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


def _play_hosts(setup, cases: dict[str, dict]):
    """One play over several local hosts, one a case: each case's variables are its host's (the setup's go as extra
    variables, which a case must not set). Returns the run (tests/hosts/runner.py's result) and, per host, its
    failed count and the words of its failures' messages. One ansible-playbook instead of one per case: each costs
    seconds of CPU, which the suite lacks."""
    from hosts.runner import run_playbook

    base, _, vars_ = setup
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    inv = base / f"cases-{len(list(base.glob('cases-*')))}.json"
    hosts = {name: {**local, **case} for name, case in cases.items()}
    inv.write_text(json.dumps({"all": {"children": {"gpu_hosts": {"hosts": hosts}}}}))
    r = run_playbook("playbooks/sglang.yml", inv, extravars=vars_)
    by_host = {}
    for name in cases:
        mine = [f for f in r.failures() if f.startswith(f"{name}: ")]
        by_host[name] = (r.host(name)["failed"], " ".join(" ".join(mine).split()))
    return r, by_host


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


# sglang_extra_args asking for a layout inside one capture server that the hook cannot dump, the flag named
PARALLEL = [
    (["--enable-dp-attention"], "--enable-dp-attention"),
    (["--dp-size", "2"], "--dp-size > 1"),
    (["--ep-size=8"], "--ep-size > 1"),
    (["--pp-size", "4"], "--pp-size > 1"),
]


def test_layouts_and_layer_ids_the_hook_cannot_dump_are_refused_before_installing(setup):
    """Issue #34: DP attention, data/expert/pipeline parallel inside one capture server are refused by the role,
    naming the flag, before SGLang is installed (tensor parallel is the supported layout: docs/sglang.md). Layer
    ids starting at 1 are refused too (SGLang adds 1 to every id). The refusal reads sizes: --dp-size 1 and
    --ep-size 1 are the defaults written out, not a layout: that host goes past the check (and stops at the layer
    ids refused right after it, before installing anything). One play, a host a case."""
    cases = {f"p{i}": {"sglang_extra_args": args} for i, (args, _) in enumerate(PARALLEL)}
    cases["ids"] = {"sglang_layer_ids": [1, 3, 5]}
    cases["ones"] = {"sglang_extra_args": ["--dp-size", "1", "--ep-size=1"], "sglang_layer_ids": [1, 3, 5]}
    r, by_host = _play_hosts(setup, cases)
    for i, (_, named) in enumerate(PARALLEL):
        failed, words = by_host[f"p{i}"]
        assert failed == 1 and named in words and "sglang_extra_args asks for" in words, (
            named,
            r.stdout[-3000:],
        )
    for name in ("ids", "ones"):
        failed, words = by_host[name]
        assert failed == 1 and "adds 1 to every id" in words, (name, r.stdout[-3000:])
        assert "sglang_extra_args asks for" not in words, name
    assert "TASK [sglang : SGLang | Install SGLang" not in r.stdout
    assert "TASK [sglang : SGLang | Install pinned SGLang" not in r.stdout


def _on_site_packages(tmp_path_factory, name: str, version: str, model) -> tuple[Path, Path, dict]:
    """A directory for a module's role runs on this machine: SGLang ``version`` as pip --target left it (its real
    files), an inventory of localhost in gpu_hosts, a units directory (no systemd reload); the role's variables
    for that (the caller adds its own)."""
    base = tmp_path_factory.mktemp(name)
    site = site_packages(base / "site", version)
    inv = base / "hosts.yml"
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    inv.write_text(json.dumps({"all": {"children": {"gpu_hosts": {"hosts": {"localhost": local}}}}}))
    (base / "units").mkdir()
    return (
        base,
        inv,
        {
            "sglang_enabled": True,
            "eagle3ops_sglang_site_packages": str(site),
            "eagle3ops_sglang_version": version,
            "sglang_eagle3ops_bin": str(BIN / "eagle3ops"),
            "sglang_model_path": str(model),
            "sglang_dump_data_dir": str(base / "data"),
            "sglang_unit_dir": str(base / "units"),
            "sglang_systemd_reload": False,
        },
    )


@pytest.fixture(scope="module")
def site_setup(tmp_path_factory, tiny_target):
    """sglang_site_packages: SGLang 0.5.17 as pip --target left it (its real files), no venv, no wheelhouse."""
    base, inv, vars_ = _on_site_packages(tmp_path_factory, "sglang-site", "0.5.17", tiny_target)
    vars_ |= {
        "eagle3ops_sglang_venv_dir": str(base / "no-venv"),  # must stay absent: nothing is installed
        "sglang_eagle3ops_wheel_dir": str(base / "no-wheels"),  # likewise never looked at
        "sglang_tp_size": 1,
        "sglang_extract_backend": "sglang",
    }
    return base, inv, vars_


@pytest.mark.slow
def test_site_packages_install_is_patched_in_place_without_installing(site_setup):
    base, _, vars_ = site_setup
    target = Path(vars_["eagle3ops_sglang_site_packages"]) / sglang_patch.TARGET_RELPATH
    spec = sglang_patch.SPECS["0.5.17"]
    pristine = pristine_deepseek_v2("0.5.17").read_bytes()
    assert target.read_bytes() == pristine

    r, changed, failed = _play(site_setup)
    assert failed == 0 and changed > 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert _sha(target) == spec.patched_sha256
    assert "TASK [sglang : SGLang | Capture patch in deepseek_v2.py]" in r.stdout
    assert "TASK [sglang : SGLang | Install SGLang" not in r.stdout  # install.yml never ran
    assert not (base / "no-venv").exists() and not (base / "no-wheels").exists()
    words = " ".join(r.stdout.split())  # the report's message is wrapped by the yaml result format
    assert f"sglang 0.5.17 in {vars_['eagle3ops_sglang_site_packages']}; capture patch applied" in words, (
        words[-3000:]
    )
    unit = (base / "units" / "eagle3ops-sglang-extract.service").read_text()
    assert f"Environment=PYTHONPATH={vars_['eagle3ops_sglang_site_packages']}" in unit
    assert "ExecStart=python3 -m sglang.launch_server" in unit
    assert "--enable-return-aux-hidden-states" not in unit  # 0.5.17: the patch turns the capture on

    r, changed, failed = _play(site_setup)
    assert (changed, failed) == (0, 0), r.stdout[-4000:]
    r, changed, failed = _play(site_setup, "--check", "--diff", sglang_capture_patch_state="absent")
    assert (changed, failed) == (1, 0), r.stdout[-4000:]  # predicted, not done
    assert _sha(target) == spec.patched_sha256

    r, changed, failed = _play(site_setup, sglang_capture_patch_state="absent")
    assert (changed, failed) == (1, 0), r.stdout[-4000:]
    assert target.read_bytes() == pristine and _sha(target) == spec.pristine_sha256

    # another version in the directory than the one pinned: refused before the patch, naming both
    r, _, failed = _play(site_setup, eagle3ops_sglang_version="0.5.23")
    assert failed == 1, r.stdout[-4000:]
    words = " ".join(r.stdout.split())
    assert "holds sglang-0.5.17.dist-info, not sglang-0.5.23.dist-info" in words, words[-3000:]
    assert "TASK [sglang : SGLang | Capture patch in deepseek_v2.py]" not in r.stdout
    assert target.read_bytes() == pristine


# ---- several capture servers on one host (issue #34: data parallel) -------------------------------------------


@pytest.fixture(scope="module")
def dp_setup(tmp_path_factory, tiny_target):
    """The role on an SGLang installed without a venv (nothing to install: fast), the patch only queried; the
    host's GPUs given as a number (no GPU here: sglang_gpu_count stands in for the /dev/nvidia<N> nodes)."""
    base, inv, vars_ = _on_site_packages(tmp_path_factory, "sglang-dp", "0.5.23", tiny_target)
    vars_ |= {
        "sglang_tp_size": 4,
        "sglang_gpu_count": 8,
        "sglang_capture_patch_state": "query",
    }
    return base, inv, vars_


def _units(base: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted((base / "units").glob("*.service"))}


def _env(unit: str, name: str) -> str | None:
    m = re.search(rf"^Environment={name}=(.*)$", unit, re.M)
    return m.group(1) if m else None


@pytest.mark.slow
def test_several_servers_one_unit_each_idempotent_check_mode_and_a_layout_change(dp_setup):
    """sglang_servers: 2 with TP 4 on an 8-GPU host renders two units - their own names, ports, GPUs and manifest
    ranks, every other line the one server's; a re-run is changed=0; check mode predicts a new layout and changes
    nothing; going from one server to two removes the one server's unit, and back."""
    base = dp_setup[0]
    r, changed, failed = _play(dp_setup)  # one server first: today's unit, no CUDA_VISIBLE_DEVICES
    assert failed == 0 and changed > 0, r.stdout[-4000:] + r.stderr[-2000:]
    one = _units(base)
    assert list(one) == ["eagle3ops-sglang-extract.service"]
    assert _env(one["eagle3ops-sglang-extract.service"], "CUDA_VISIBLE_DEVICES") is None

    r, changed, failed = _play(dp_setup, "--check", "--diff", sglang_servers=2)
    assert failed == 0 and changed > 0, r.stdout[-4000:]
    assert _units(base) == one  # predicted, not done

    r, changed, failed = _play(dp_setup, sglang_servers=2)
    assert failed == 0 and changed > 0, r.stdout[-4000:] + r.stderr[-2000:]
    units = _units(base)
    assert list(units) == ["eagle3ops-sglang-extract-0.service", "eagle3ops-sglang-extract-1.service"]
    for i, (name, text) in enumerate(units.items()):
        assert _env(text, "CUDA_VISIBLE_DEVICES") == ",".join(map(str, range(4 * i, 4 * i + 4))), name
        assert _env(text, "EAGLE3OPS_SGLANG_MANIFEST_RANK") == str(i), name
        assert f"--port {30000 + i} " in text and "--tp-size 4 " in text, name
        assert _env(text, "EAGLE3OPS_SGLANG_DUMP_DIR") == str(base / "data")
        if shutil.which("systemd-analyze"):
            v = subprocess.run(
                ["systemd-analyze", "verify", str(base / "units" / name)], capture_output=True, text=True
            )
            assert v.returncode == 0, v.stderr
    # apart from the server's own lines, each unit is the one server's unit
    own = re.compile(
        r"^(#.*|Description=.*|Environment=(CUDA_VISIBLE_DEVICES|EAGLE3OPS_SGLANG_MANIFEST_RANK)=.*)$"
    )

    def rest(t):
        return [ln.replace("--port 30001", "--port 30000") for ln in t.splitlines() if not own.match(ln)]

    assert rest(units["eagle3ops-sglang-extract-1.service"]) == rest(one["eagle3ops-sglang-extract.service"])
    words = " ".join(r.stdout.split())
    assert "units eagle3ops-sglang-extract-0.service (port 30000, GPUs 0,1,2,3, manifest-rank0)" in words, (
        words[-3000:]
    )

    r, changed, failed = _play(dp_setup, sglang_servers=2)
    assert (changed, failed) == (0, 0), r.stdout[-4000:]

    # an explicit list of GPU groups: the same two units with other GPUs
    r, changed, failed = _play(dp_setup, sglang_servers=[[4, 5, 6, 7], [0, 1, 2, 3]])
    assert (changed, failed) == (1, 0), r.stdout[-4000:]  # the units task, its two items
    assert _env(_units(base)["eagle3ops-sglang-extract-0.service"], "CUDA_VISIBLE_DEVICES") == "4,5,6,7"

    r, changed, failed = _play(dp_setup)  # back to one server: the two units go
    assert failed == 0 and changed > 0, r.stdout[-4000:]
    assert _units(base) == one


# sglang_servers that do not fit the host (sglang_gpu_count 8, sglang_tp_size 4), and what the refusal names
LAYOUTS = [
    ([[0, 1, 2, 3], [3, 4, 5, 6]], {}, "groups 0 and 1 share GPUs [3]"),
    ([[0, 1], [2, 3]], {}, "has 2 GPUs, but each server is sglang_tp_size 4"),
    (3, {}, "need GPU 11, but the host has 8 GPUs"),
    ([[4, 5, 6, 7], [8, 9, 10, 11]], {}, "need GPU 11, but the host has 8 GPUs"),
    (0, {}, "not a count of 1 or more"),
    ("two", {}, "not a count of 1 or more"),
    ([[0, 1, 2, "x"]], {}, "is not a list of GPU indices"),
    (2, {"sglang_environment": {"CUDA_VISIBLE_DEVICES": "0"}}, "sets CUDA_VISIBLE_DEVICES"),
]


def test_server_layouts_that_do_not_fit_are_refused_before_installing(dp_setup):
    """Each layout of LAYOUTS on a host of its own, in one play: each refused naming its fault and its host, before
    anything is checked or installed; no unit written."""
    cases = {
        f"l{i}": {"sglang_servers": servers, **overrides} for i, (servers, overrides, _) in enumerate(LAYOUTS)
    }
    r, by_host = _play_hosts(dp_setup, cases)
    for i, (_, _, named) in enumerate(LAYOUTS):
        failed, words = by_host[f"l{i}"]
        assert failed == 1 and named in words, (named, words[-3000:] or r.stdout[-3000:])
        assert f"sglang_servers (default eagle3ops_sglang_servers) on l{i}:" in words, words[-3000:]
    assert "TASK [sglang : SGLang | Check the SGLang already installed" not in r.stdout
    assert not list((dp_setup[0] / "units").glob("*-[0-9].service"))


@pytest.mark.slow
def test_manifest_ranks_count_the_servers_of_the_hosts_before(dp_setup, tmp_path):
    """Two hosts in one play, two servers on the first and one on the second: the manifest ranks are 0, 1 and 2
    (every server of every host its own manifest, so stores gathered into one never share a manifest name)."""
    base, _, vars_ = dp_setup
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    hosts = {
        "h0": {**local, "sglang_unit_dir": str(tmp_path / "h0"), "sglang_servers": 2},
        "h1": {**local, "sglang_unit_dir": str(tmp_path / "h1"), "sglang_servers": 1},
    }
    for h in hosts:
        (tmp_path / h).mkdir()
    inv = tmp_path / "hosts.yml"
    inv.write_text(json.dumps({"all": {"children": {"gpu_hosts": {"hosts": hosts}}}}))
    common = {k: v for k, v in vars_.items() if k != "sglang_unit_dir"}
    r, _, _ = _play((base, inv, common))
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    ranks = {
        p.name: _env(p.read_text(), "EAGLE3OPS_SGLANG_MANIFEST_RANK")
        for h in hosts
        for p in sorted((tmp_path / h).glob("*.service"))
    }
    assert ranks == {
        "eagle3ops-sglang-extract-0.service": "0",
        "eagle3ops-sglang-extract-1.service": "1",
        "eagle3ops-sglang-extract.service": "2",
    }, ranks
