"""Throwaway Debian bookworm hosts with real systemd, booted with systemd-nspawn.

The pieces (recipe and gotchas: ``shared/notes/test-hosts.md``):

* :func:`ensure_rootfs` builds a debootstrap root filesystem once and caches it under
  ``/var/cache/eagle3ops-tests/rootfs-<hash>`` (the hash covers the recipe, so changing the package list
  builds a new one). Concurrent builders wait on a lock file.
* :class:`NspawnHost` mounts an overlay (cached rootfs read-only below, a per-host upper directory) and
  boots it with ``systemd-nspawn -b --network-veth --register=no --keep-unit``; the host end of the veth
  gets ``10.213.x.y/30``, the container ``host0`` the next address. ``stop()``/``start()`` keep the
  upper directory (a real restart: what was mounted is gone, what was written stays).
* :func:`allocate_subnet` hands out unique /30s under 10.213.0.0/16 through claim files in
  ``/run/eagle3ops-tests/net`` (a claim whose owner died is reclaimed and its leftovers removed), so
  parallel pytest sessions of several people never collide.
* :class:`LoopDevice` makes a real block device from a sparse file.

The rootfs, the subnets, the stop by PID and the loop devices are in tests/hosts/nspawn_resources.py (their
names are re-exported here: ``nspawn.ensure_rootfs``, ``nspawn.RUN_DIR``, ...).
Everything is torn down by PID: SIGTERM to the nspawn process (clean shutdown), wait, SIGKILL.
Nothing here imports pytest: the fixtures live in ``tests/conftest.py``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

# the harness's resources (CACHE_DIR, RUN_DIR, _is_zombie, ensure_rootfs and unavailable_reason are re-exported:
# nspawn.<name>); always imported as hosts.nspawn (tests/conftest.py puts tests/ on sys.path)
from .nspawn_resources import (  # noqa: F401 - re-exported, as above
    CACHE_DIR,
    RUN_DIR,
    HostError,
    LoopDevice,
    _is_zombie,
    _run,
    _terminate,
    _update_claim,
    allocate_subnet,
    ensure_rootfs,
    host_name,
    release_subnet,
    subnet_ips,
    unavailable_reason,
)


class _InWorkdir:
    """A file of an :class:`NspawnHost`'s work directory as a read-only attribute: ``host.workdir / name``."""

    def __init__(self, name: str):
        self.name = name

    def __get__(self, host, owner=None):
        return self if host is None else host.workdir / self.name

    def __set__(self, host, value):
        raise AttributeError(f"{self.name} is a file of the host's work directory, not settable")


# --------------------------------------------------------------------------------------------------
# A host
# --------------------------------------------------------------------------------------------------
@dataclass
class NspawnHost:
    """One booted container. Reach it with :meth:`ssh`, Ansible with :attr:`inventory`, testinfra with
    :meth:`testinfra_host`. ``binds`` maps host device/path -> guest path (``{"/dev/loop7": "/dev/vdb"}``).
    """

    idx: int
    rootfs: Path
    workdir: Path
    key: Path
    binds: dict[str, str] = field(default_factory=dict)
    # host path -> guest path, bound read-only (e.g. the controller's venv and its interpreter, at the same paths)
    ro_binds: dict[str, str] = field(default_factory=dict)
    groups: tuple[str, ...] = ("testhosts",)
    host_vars: dict = field(default_factory=dict)
    pid: int = 0
    boot_seconds: float = 0.0

    @property
    def name(self) -> str:
        return host_name(self.idx)

    @property
    def controller_ip(self) -> str:
        return subnet_ips(self.idx)[0]

    @property
    def ip(self) -> str:
        return subnet_ips(self.idx)[1]

    # files of the host's work directory, as attributes (``host.log``: a Path)
    merged = _InWorkdir("merged")  # the overlay's root: the container's file system
    ssh_config = _InWorkdir("ssh_config")
    inventory = _InWorkdir("inventory.ini")
    log = _InWorkdir("console.log")

    # ---- lifecycle ------------------------------------------------------------------------------
    def _mount(self) -> None:
        for d in ("upper", "work", "merged"):
            (self.workdir / d).mkdir(parents=True, exist_ok=True)
        if not os.path.ismount(self.merged):
            _run([
                "mount", "-t", "overlay", "overlay", "-o",
                f"lowerdir={self.rootfs},upperdir={self.workdir / 'upper'},workdir={self.workdir / 'work'}",
                str(self.merged),
            ])  # fmt: skip

    def _write_guest_config(self) -> None:
        m = self.merged
        (m / "etc/hostname").write_text(self.name + "\n")
        (m / "etc/hosts").write_text(f"127.0.0.1 localhost\n127.0.1.1 {self.name}\n")
        net = m / "etc/systemd/network/10-host0.network"
        net.parent.mkdir(parents=True, exist_ok=True)
        net.write_text(
            f"[Match]\nName=host0\n\n[Network]\nAddress={self.ip}/30\nLinkLocalAddressing=no\nIPv6AcceptRA=no\n"
        )
        ssh_dir = m / "root/.ssh"
        ssh_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        (ssh_dir / "authorized_keys").write_text(Path(f"{self.key}.pub").read_text())
        os.chmod(ssh_dir / "authorized_keys", 0o600)

    def write_files(self) -> None:
        """ssh config + one-host INI inventory for Ansible/testinfra."""
        self.ssh_config.write_text(
            f"Host {self.name} {self.ip}\n  HostName {self.ip}\n  User root\n  IdentityFile {self.key}\n"
            "  IdentitiesOnly yes\n  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n"
            "  LogLevel ERROR\n  ConnectTimeout 5\n"
        )
        self.inventory.write_text(inventory_ini([self]))

    def start(self, timeout: float = 120.0) -> NspawnHost:
        """Mount, boot and wait until ``systemctl is-system-running`` answers running/degraded."""
        t0 = time.monotonic()
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / ".e3t-host").write_text(self.name)
        self._mount()
        self._write_guest_config()
        self.write_files()
        veth = f"ve-{self.name}"
        _run(["ip", "link", "del", veth], check=False)
        cmd = [
            "systemd-nspawn", "-q", "-D", str(self.merged), "-M", self.name, "-b",
            "--network-veth", "--register=no", "--keep-unit", "--console=read-only",
        ]  # fmt: skip
        for src, dst in self.binds.items():
            cmd.append(f"--bind={src}:{dst}")
        for src, dst in self.ro_binds.items():
            cmd.append(f"--bind-ro={src}:{dst}")
        with open(self.log, "ab") as logf:
            proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.pid = proc.pid
        self._proc = proc
        _update_claim(
            self.idx, nspawn_pid=self.pid, merged=self.merged, workdir=self.workdir,
            loops=",".join(s for s in self.binds if s.startswith("/dev/loop")),
        )  # fmt: skip
        deadline = time.monotonic() + timeout
        configured = False
        last = ""
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise HostError(
                    f"systemd-nspawn for {self.name} exited {proc.returncode}; console:\n{self.tail()}"
                )
            if not configured and Path(f"/sys/class/net/{veth}").exists():
                _run(["ip", "addr", "replace", f"{self.controller_ip}/30", "dev", veth])
                _run(["ip", "link", "set", veth, "up"])
                configured = True
            if configured:
                p = self.ssh("systemctl is-system-running --wait", check=False, timeout=30)
                last = (p.stdout + p.stderr).strip()
                if p.stdout.strip() in ("running", "degraded"):
                    self.boot_seconds = time.monotonic() - t0
                    return self
            time.sleep(0.2)
        raise HostError(
            f"{self.name} ({self.ip}) not ready after {timeout:.0f}s (last answer: {last!r}); console:\n{self.tail()}"
        )

    def stop(self) -> None:
        """Shut the container down (SIGTERM, wait, SIGKILL); the overlay's upper layer stays."""
        if self.pid:
            _terminate(self.pid)
            proc = getattr(self, "_proc", None)
            if proc is not None:
                with contextlib.suppress(Exception):
                    proc.wait(timeout=5)
            self.pid = 0
        _run(["ip", "link", "del", f"ve-{self.name}"], check=False)
        if os.path.ismount(self.merged):
            p = _run(["umount", str(self.merged)], check=False)
            if p.returncode != 0:
                _run(["umount", "-l", str(self.merged)], check=False)

    def restart(self, timeout: float = 120.0) -> NspawnHost:
        self.stop()
        return self.start(timeout=timeout)

    def destroy(self) -> None:
        self.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no console log)"

    # ---- access ---------------------------------------------------------------------------------
    def ssh(self, command: str, *, check: bool = True, timeout: float = 120, input: str | None = None):
        """Run a shell command on the host as root; returns CompletedProcess (text)."""
        p = subprocess.run(
            ["ssh", "-F", str(self.ssh_config), "-o", "BatchMode=yes", self.name, command],
            input=input, capture_output=True, text=True, timeout=timeout, check=False,
        )  # fmt: skip
        if check and p.returncode != 0:
            raise HostError(
                f"{self.name}: `{command}` exited {p.returncode}:\n{p.stderr[-2000:]}{p.stdout[-2000:]}"
            )
        return p

    def put(self, path: str, content: str | bytes, mode: str = "0644") -> None:
        """Write a file on the host over ssh (parents created)."""
        data = content.encode() if isinstance(content, str) else content
        p = subprocess.run(
            ["ssh", "-F", str(self.ssh_config), "-o", "BatchMode=yes", self.name,
             f"mkdir -p {shlex.quote(os.path.dirname(path))} && cat > {shlex.quote(path)} && chmod {mode} {shlex.quote(path)}"],
            input=data, capture_output=True, timeout=60, check=False,
        )  # fmt: skip
        if p.returncode != 0:
            raise HostError(f"{self.name}: writing {path} failed: {p.stderr.decode(errors='replace')}")

    def install_unit(self, name: str, text: str, *, directory: str = "/etc/systemd/system",
                     enable: bool = True, start: bool = True) -> None:  # fmt: skip
        """Install a unit file and (by default) enable and start it, like a hand-installed vLLM unit."""
        self.put(f"{directory}/{name}", text)
        self.ssh("systemctl daemon-reload")
        if enable or start:
            flags = " ".join(x for x, on in (("enable", enable),) if on)
            if enable:
                self.ssh(f"systemctl {flags} {'--now' if start else ''} {shlex.quote(name)}")
            else:
                self.ssh(f"systemctl start {shlex.quote(name)}")

    def testinfra_host(self, backend: str = "ssh"):
        """A testinfra Host for this container (``ssh`` or ``ansible`` backend)."""
        import testinfra

        if backend == "ansible":
            return testinfra.get_host(f"ansible://{self.name}", ansible_inventory=str(self.inventory))
        return testinfra.get_host(f"ssh://{self.name}", ssh_config=str(self.ssh_config))


def _ini_value(v) -> str:
    """Strings as given (quote them yourself if they hold spaces); other values as single-quoted JSON
    literals (the INI inventory shlex-splits the line, then reads the value as a Python literal)."""
    if isinstance(v, str):
        return v
    text = json.dumps(v, separators=(",", ":"))
    if "'" in text:
        raise ValueError(f"inventory value {text} holds a single quote; pass it as a prepared string")
    return f"'{text}'"


def inventory_ini(hosts: list[NspawnHost], extra_vars: dict | None = None) -> str:
    """An INI inventory for the given hosts: group ``testhosts`` plus each host's own groups."""
    groups: dict[str, list[NspawnHost]] = {}
    for h in hosts:
        for g in h.groups:
            groups.setdefault(g, []).append(h)
    lines = []
    for g, members in groups.items():
        lines.append(f"[{g}]")
        for h in members:
            hv = {
                "ansible_host": h.ip,
                "ansible_user": "root",
                "ansible_ssh_private_key_file": str(h.key),
                "ansible_ssh_common_args": "'-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null "
                "-o IdentitiesOnly=yes -o LogLevel=ERROR'",
                "ansible_python_interpreter": "/usr/bin/python3",
                **h.host_vars,
            }
            lines.append(h.name + " " + " ".join(f"{k}={_ini_value(v)}" for k, v in hv.items()))
        lines.append("")
    if extra_vars:
        lines.append("[all:vars]")
        lines.extend(f"{k}={v}" for k, v in extra_vars.items())
        lines.append("")
    return "\n".join(lines)


def make_ssh_key(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    key = directory / "id_ed25519"
    if not key.exists():
        _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "eagle3ops-tests", "-f", str(key)])
    return key


class HostFactory:
    """Creates hosts and tears every one of them down in :meth:`cleanup` (also on test failure)."""

    def __init__(self, basedir: Path, key: Path, rootfs: Path):
        self.basedir = basedir
        self.key = key
        self.rootfs = rootfs
        self.hosts: list[NspawnHost] = []
        self.loops: list[LoopDevice] = []

    def loop_device(self, size: str = "1G") -> LoopDevice:
        loop = LoopDevice(self.basedir / f"disk-{uuid.uuid4().hex[:10]}.img", size).attach()
        self.loops.append(loop)
        return loop

    def create(self, *, binds: dict[str, str] | None = None, groups=("testhosts",), host_vars=None,
               start: bool = True, ro_binds: dict[str, str] | None = None) -> NspawnHost:  # fmt: skip
        idx = allocate_subnet()
        try:
            h = NspawnHost(
                idx=idx, rootfs=self.rootfs, workdir=self.basedir / host_name(idx), key=self.key,
                binds=dict(binds or {}), groups=tuple(groups), host_vars=dict(host_vars or {}),
                ro_binds=dict(ro_binds or {}),
            )  # fmt: skip
            self.hosts.append(h)
            if start:
                h.start()
            return h
        except BaseException:
            self._destroy(self.hosts.pop() if self.hosts and self.hosts[-1].idx == idx else None)
            release_subnet(idx)
            raise

    def _destroy(self, h: NspawnHost | None) -> None:
        if h is None:
            return
        try:
            h.destroy()
        finally:
            release_subnet(h.idx)

    def cleanup(self) -> None:
        errors = []
        while self.hosts:
            try:
                self._destroy(self.hosts.pop())
            except Exception as e:
                errors.append(e)
        while self.loops:
            self.loops.pop().detach()
        if errors:
            raise HostError(f"teardown errors: {errors}")
