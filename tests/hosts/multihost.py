"""Several nspawn hosts as one cluster (issue #21 tests): what the multi-host tests share.

STAND-INS, said here and in each test's docstring: the hosts run the controller's venv (torch, transformers)
and this checkout's ``python/`` bound read-only at the same paths (the runtime phase would install them; tests/
hosts/test_runtime_remote.py proves that part), through the ``/opt/e3/eagle3ops`` wrapper. The hosts reach each
other through this machine: the harness gives each its own veth /30; :func:`link` routes 10.213.0.0/16 via the
controller in each guest and turns on forwarding on those veth interfaces only (removed with them).
"""

from __future__ import annotations

import os
import shlex
import signal
import sys
import threading
import time
from pathlib import Path

from hosts import nspawn

REPO = Path(__file__).resolve().parents[2]
VENV = Path(sys.prefix)  # the controller's venv, bound into the hosts at the same path
BASE = Path(os.path.realpath(sys.base_prefix))  # its interpreter's installation
# a host that is gone: ssh gives up connecting after 10 s, and an open (multiplexed) connection to it after
# 3 unanswered keep-alives 5 s apart, instead of waiting on TCP for many minutes (docs/scale.md)
SSH_ARGS = (
    "'-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o IdentitiesOnly=yes -o LogLevel=ERROR "
    "-o ServerAliveInterval=5 -o ServerAliveCountMax=3'"
)
HOST_VARS = {"ansible_ssh_timeout": 10, "ansible_ssh_common_args": SSH_ARGS}
EXE = "/opt/e3/eagle3ops"


def ro_binds(extra: dict | None = None) -> dict[str, str]:
    """The read-only binds of a cluster host: the venv, its interpreter, this checkout's ``python/`` at
    /opt/e3/python, and ``extra`` (controller path -> guest path)."""
    binds = {str(BASE): str(BASE), str(VENV): str(VENV), str(REPO / "python"): "/opt/e3/python"}
    binds.update({str(src): str(dst) for src, dst in (extra or {}).items()})
    return binds


def install_cli(hosts, *, pythonpath: tuple[str, ...] = (), env: dict | None = None) -> None:
    """``EXE`` on each host: the controller venv's ``python -m eagle3ops`` with this checkout's ``python/``,
    offline; ``pythonpath`` entries after it and ``env`` on top (a test's fault hook, tests/reliability/faulthook)."""
    exports = {"PYTHONPATH": ":".join(("/opt/e3/python", *pythonpath)), "HF_HUB_OFFLINE": "1",
               "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1", **(env or {})}  # fmt: skip
    wrapper = (
        "#!/bin/sh\nexport "
        + " ".join(f"{k}={v}" for k, v in exports.items())
        + f'\nexec {VENV}/bin/python -m eagle3ops "$@"\n'
    )
    for h in hosts:
        h.put(EXE, wrapper, mode="0755")


def link(hosts) -> None:
    """Route the hosts to each other through this machine (forwarding on their veth interfaces only)."""
    for h in hosts:
        nspawn._run(["sysctl", "-q", "-w", f"net.ipv4.conf.ve-{h.name}.forwarding=1"])
        h.ssh(f"ip route replace 10.213.0.0/16 via {h.controller_ip}")


def name(hosts) -> None:
    """Every host resolves every other's name (torchrun hands its workers the rank-0 node's name as
    MASTER_ADDR; DNS in a cluster)."""
    names = "".join(f"{h.ip} {h.name}\n" for h in hosts)
    for h in hosts:
        h.ssh(f"printf %s {shlex.quote(names)} >> /etc/hosts")


def trust(hosts) -> None:
    """Root on every host may ssh to every other, checking their host keys (a cluster's keys and
    known_hosts): the harness key as root's own key, every host's ed25519 host key in known_hosts."""
    key = Path(hosts[0].key).read_text()
    known = ""
    for h in hosts:
        kind, b64 = (h.merged / "etc/ssh/ssh_host_ed25519_key.pub").read_text().split()[:2]
        known += f"{h.ip} {kind} {b64}\n"
    for h in hosts:
        h.put("/root/.ssh/id_ed25519", key, mode="0600")
        h.put("/root/.ssh/known_hosts", known, mode="0644")


def power_off_when(host, ready, timeout: float = 600) -> threading.Thread:
    """A started thread that powers ``host`` off once ``ready()`` is true (polled every 50 ms, up to ``timeout``
    s): SIGKILL to the host's PID 1 (nspawn's child), so the kernel kills every process of its PID namespace at
    once, as in a power loss (SIGKILL to nspawn alone would leave the container running); then the harness's
    cleanup of what is left on this side (veth, overlay mount). ``host.pid`` is 0 afterwards."""

    def run():
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if ready():
                init = int(Path(f"/proc/{host.pid}/task/{host.pid}/children").read_text().split()[0])
                os.kill(init, signal.SIGKILL)
                host._proc.wait(timeout=60)
                host.stop()
                return
            time.sleep(0.05)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def one_host_reference(prepared: Path, model: Path, out: Path) -> Path:
    """The rows of ``prepared`` extracted by one host's transformers backend on this machine, one row a batch and one
    writer thread, as the stand-in capture servers compute them (another thread count sums in another order: other
    low bits): the store every multi-host or multi-server run must equal byte for byte. Returns its data directory."""
    import shutil
    import subprocess

    ref = shutil.copytree(prepared, out)
    one = subprocess.run(
        [sys.executable, "-m", "eagle3ops", "extract", "--data", str(ref), "--model", str(model), "--device",
         "cpu", "--max-batch-tokens", "1", "--writer-threads", "1", "--json", "--no-progress"],
        env={**os.environ, "PYTHONPATH": str(REPO / "python"), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"},
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert one.returncode == 0, one.stderr[-3000:]
    return Path(ref)
