"""What the nspawn test hosts (tests/hosts/nspawn.py) take from this machine: whether it can run them at all,
the cached debootstrap root filesystem (built once under ``CACHE_DIR``, behind a lock file), the /30 subnets
claimed through files under ``RUN_DIR/net`` (a dead owner's claim reaped with what it left: its nspawn process,
overlay mount, veth, loop devices), the stop of a process by PID (SIGTERM, wait, SIGKILL) and loop devices.

Nothing here imports pytest; tests/hosts/nspawn.py re-exports what the tests use (``nspawn.CACHE_DIR``, ...).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from eagle3ops.runlock import pid_alive

CACHE_DIR = Path(os.environ.get("E3T_CACHE_DIR", "/var/cache/eagle3ops-tests"))
RUN_DIR = Path(os.environ.get("E3T_RUN_DIR", "/run/eagle3ops-tests"))
SUITE = "bookworm"
NET_PREFIX = (10, 213)  # /16; each host gets a /30 inside it
MAX_SUBNETS = 16383
# Packages of the cached root filesystem. Changing this list (or RECIPE_VERSION) builds a new rootfs.
PACKAGES = (
    "systemd,systemd-sysv,dbus,openssh-server,python3,python3-venv,python3-packaging,python3-apt,rsync,"
    "iproute2,xfsprogs,e2fsprogs,util-linux,patch,sudo,procps,gdisk,parted,kmod"
)
RECIPE_VERSION = "1"


class HostError(RuntimeError):
    """A test host could not be built, booted or reached; the message says what to look at."""


def _run(cmd, *, check=True, timeout=None, **kw) -> subprocess.CompletedProcess:
    kw.setdefault("capture_output", True)
    kw.setdefault("text", True)
    p = subprocess.run(cmd, check=False, timeout=timeout, **kw)
    if check and p.returncode != 0:
        raise HostError(
            f"{' '.join(map(str, cmd))} exited {p.returncode}:\n{(p.stderr or '')[-3000:]}{(p.stdout or '')[-1000:]}"
        )
    return p


# --------------------------------------------------------------------------------------------------
# Can this machine run test hosts at all?
# --------------------------------------------------------------------------------------------------
def unavailable_reason() -> str | None:
    """Why nspawn test hosts cannot run here (None when they can). Used as the pytest skip reason."""
    if os.geteuid() != 0:
        return "needs root (systemd-nspawn, overlay mounts, veth, loop devices); CI runs as root"
    for tool in ("systemd-nspawn", "debootstrap", "ip", "ssh", "ssh-keygen", "losetup", "mount"):
        if not shutil.which(tool):
            return f"{tool} is missing: run `make system-deps` (tests/hosts/install-system-deps.sh)"
    try:
        fs = Path("/proc/filesystems").read_text()
    except OSError:
        fs = ""
    if "overlay" not in fs:
        with contextlib.suppress(Exception):
            _run(["modprobe", "overlay"], check=False, timeout=20)
        if "overlay" not in Path("/proc/filesystems").read_text():
            return "the kernel has no overlayfs (needed for per-host copies of the cached rootfs)"
    return None


def apt_mirror() -> str:
    """The Debian mirror apt already uses on this machine (E3T_MIRROR overrides)."""
    if os.environ.get("E3T_MIRROR"):
        return os.environ["E3T_MIRROR"]
    candidates: list[str] = []
    src_dir = Path("/etc/apt/sources.list.d")
    for f in sorted(src_dir.glob("*.sources")) if src_dir.is_dir() else []:
        for block in f.read_text().split("\n\n"):
            uris = re.search(r"^URIs:\s*(\S+)", block, re.M)
            suites = re.search(r"^Suites:\s*(.+)$", block, re.M)
            if uris and suites and SUITE in suites.group(1).split():
                candidates.append(uris.group(1))
    sl = Path("/etc/apt/sources.list")
    if sl.is_file():
        for line in sl.read_text().splitlines():
            m = re.match(r"^deb\s+(?:\[[^\]]*\]\s+)?(\S+)\s+(\S+)", line.strip())
            if m and m.group(2) == SUITE:
                candidates.append(m.group(1))
    return candidates[0] if candidates else "http://deb.debian.org/debian"


# --------------------------------------------------------------------------------------------------
# Cached root filesystem
# --------------------------------------------------------------------------------------------------
def rootfs_path() -> Path:
    h = hashlib.sha256(f"{RECIPE_VERSION}|{SUITE}|{PACKAGES}".encode()).hexdigest()[:12]
    return CACHE_DIR / f"rootfs-{h}"


@contextlib.contextmanager
def _flock(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield fh
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def ensure_rootfs(log=print) -> Path:
    """Return the cached rootfs, building it (debootstrap, 1–3 min) when missing."""
    dest = rootfs_path()
    if (dest / ".e3t-ready").exists():
        return dest
    with _flock(CACHE_DIR / ".build.lock"):
        if (dest / ".e3t-ready").exists():
            return dest
        tmp = dest.with_name(dest.name + f".tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        mirror = apt_mirror()
        log(f"eagle3ops test hosts: building {dest} with debootstrap from {mirror} (once; 1-3 min)")
        t0 = time.monotonic()
        _run(
            ["debootstrap", "--variant=minbase", f"--include={PACKAGES}", SUITE, str(tmp), mirror],
            timeout=1800,
        )
        _configure_rootfs(tmp)
        (tmp / ".e3t-ready").write_text(f"built in {time.monotonic() - t0:.0f}s from {mirror}\n")
        if dest.exists():  # a half-built leftover without the ready mark
            shutil.rmtree(dest)
        tmp.rename(dest)
        log(f"eagle3ops test hosts: rootfs ready in {time.monotonic() - t0:.0f}s")
    return dest


def _configure_rootfs(root: Path) -> None:
    """Host-independent settings baked into the cached rootfs."""
    _run(["systemctl", f"--root={root}", "enable", "systemd-networkd.service", "ssh.service"])
    # Timers and jobs that would only add noise (and load) to a throwaway host.
    for unit in ("apt-daily.timer", "apt-daily-upgrade.timer", "e2scrub_all.timer", "fstrim.timer"):
        _run(["systemctl", f"--root={root}", "mask", unit], check=False)
    (root / "etc/ssh/sshd_config.d").mkdir(parents=True, exist_ok=True)
    (root / "etc/ssh/sshd_config.d/e3t.conf").write_text(
        "PermitRootLogin prohibit-password\nPasswordAuthentication no\nUseDNS no\n"
    )
    # The guest has no resolver and no route out: keep apt/pip from waiting on DNS.
    (root / "etc/resolv.conf").unlink(missing_ok=True)
    (root / "etc/resolv.conf").write_text("# eagle3ops test host: no resolver (air-gapped on purpose)\n")
    # securetty-free login on the console, for debugging with `nsenter`.
    (root / "etc/hostname").write_text("e3t\n")
    # Let apt in the guest fail fast instead of hanging on a mirror it cannot reach.
    (root / "etc/apt/apt.conf.d/99e3t").write_text('Acquire::Retries "0";\nAcquire::http::Timeout "3";\n')


# --------------------------------------------------------------------------------------------------
# Subnets: one /30 per host, claimed through files under /run
# --------------------------------------------------------------------------------------------------
def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def host_name(idx: int) -> str:
    return f"e3t{idx}"  # "ve-" + this stays within the 15-character interface name limit


def subnet_ips(idx: int) -> tuple[str, str]:
    """(controller side, guest side) addresses of subnet ``idx``."""
    base = idx * 4
    a, b = NET_PREFIX
    return f"{a}.{b}.{base >> 8}.{(base & 255) + 1}", f"{a}.{b}.{base >> 8}.{(base & 255) + 2}"


def _reap_stale_claim(claim: Path) -> None:
    """Remove what a dead owner left behind: its nspawn process (if it is still ours), mount, veth."""
    info = dict(line.split("=", 1) for line in claim.read_text().splitlines() if "=" in line)
    nspawn_pid = int(info.get("nspawn_pid") or 0)
    name = info.get("name", "")
    if nspawn_pid and pid_alive(nspawn_pid):
        cmd = _cmdline(nspawn_pid)
        if cmd and "systemd-nspawn" in cmd[0] and name in cmd:
            _terminate(nspawn_pid)
    merged = info.get("merged")
    if merged and os.path.ismount(merged):
        _run(["umount", "-l", merged], check=False)
    if name:
        _run(["ip", "link", "del", f"ve-{name}"], check=False)
    for loop in filter(None, info.get("loops", "").split(",")):
        _run(["losetup", "-d", loop], check=False)
    workdir = info.get("workdir")
    if workdir and Path(workdir).is_dir() and Path(workdir, ".e3t-host").exists():
        shutil.rmtree(workdir, ignore_errors=True)


def _claim_owner(claim: Path) -> int:
    try:
        return int(dict(x.split("=", 1) for x in claim.read_text().splitlines() if "=" in x)["owner"])
    except (OSError, KeyError, ValueError):
        return 0


def reap_stale_claims() -> list[int]:
    """Reap every claim whose owner process is gone (a session killed without finalizers); return them.
    Call with the allocation lock held."""
    reaped = []
    claims = RUN_DIR / "net"
    for claim in sorted(claims.glob("[0-9]*")) if claims.is_dir() else []:
        owner = _claim_owner(claim)
        if owner and pid_alive(owner):
            continue
        with contextlib.suppress(Exception):
            _reap_stale_claim(claim)
        claim.unlink(missing_ok=True)
        reaped.append(int(claim.name))
    return reaped


def allocate_subnet() -> int:
    """Claim a free /30 index for this process (``release_subnet`` gives it back)."""
    claims = RUN_DIR / "net"
    claims.mkdir(parents=True, exist_ok=True)
    with _flock(RUN_DIR / "net.lock"):
        reap_stale_claims()
        for idx in range(1, MAX_SUBNETS + 1):
            if (claims / str(idx)).exists():
                continue
            if Path(f"/sys/class/net/ve-{host_name(idx)}").exists():
                continue  # somebody else's interface by that name: leave it alone
            (claims / str(idx)).write_text(f"owner={os.getpid()}\nname={host_name(idx)}\n")
            return idx
    raise HostError(f"no free /30 left under {NET_PREFIX}: clean stale claims in {claims}")


def _update_claim(idx: int, **info) -> None:
    claim = RUN_DIR / "net" / str(idx)
    cur = dict(x.split("=", 1) for x in claim.read_text().splitlines() if "=" in x) if claim.exists() else {}
    cur.update({k: str(v) for k, v in info.items()})
    claim.write_text("".join(f"{k}={v}\n" for k, v in cur.items()))


def release_subnet(idx: int) -> None:
    """Drop this process's claim on ``idx`` (never another session's)."""
    claim = RUN_DIR / "net" / str(idx)
    if _claim_owner(claim) == os.getpid():
        claim.unlink(missing_ok=True)


def _terminate(pid: int, timeout: float = 20.0) -> None:
    """SIGTERM (nspawn shuts the container down cleanly), wait, then SIGKILL."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not pid_alive(pid) or _is_zombie(pid):
            break
        time.sleep(0.1)
    else:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        time.sleep(0.5)


def _is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


# --------------------------------------------------------------------------------------------------
# Loop devices
# --------------------------------------------------------------------------------------------------
@dataclass
class LoopDevice:
    """A real block device backed by a sparse file; ``detach()`` frees it (idempotent)."""

    backing: Path
    size: str = "1G"
    device: str = ""

    def attach(self) -> LoopDevice:
        self.backing.parent.mkdir(parents=True, exist_ok=True)
        _run(["truncate", "-s", self.size, str(self.backing)])
        self.device = _run(["losetup", "-f", "--show", str(self.backing)]).stdout.strip()
        if not self.device.startswith("/dev/loop"):
            raise HostError(f"losetup gave {self.device!r} for {self.backing}")
        return self

    def detach(self) -> None:
        if self.device:
            _run(["losetup", "-d", self.device], check=False)
            self.device = ""
        self.backing.unlink(missing_ok=True)
