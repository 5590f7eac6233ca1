"""STAND-IN for the ``pynvml`` module, for tests and the CPU smoke run of bench/gpu_free_release.py.

There is no GPU on the CPU test machines. ``StandInNVML`` has the functions ``eagle3ops.gpu_free`` calls
(count, handles, UUID, name, minor number, v1/v2 memory info, compute/graphics process lists,
shutdown) and uses pynvml's own error class and structs; it needs nothing but ``pynvml`` (a single
file, so it can be copied onto a test host). Its holders are real processes: see the class docstring.
"""

from __future__ import annotations

from pathlib import Path

import pynvml

MIB = 1024 * 1024


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


class _Proc:
    def __init__(self, pid, mib):
        self.pid = pid
        self.usedGpuMemory = None if mib is None else int(mib * MIB)


class StandInNVML:
    """STAND-IN for the pynvml module (no GPU on this host).

    ``gpus``: one dict per GPU: ``total`` MiB, ``reserved`` MiB (what the driver keeps; counted in
    the v1 struct's ``used``, reported apart by v2), ``other`` MiB used by nobody NVML lists, and
    ``procs`` {pid: MiB}. A PID is listed (and its memory counted) only while that real process is
    alive, except the PIDs in ``foreign``: they stand for processes of another PID namespace and stay
    listed, and the PIDs in ``aliases`` {NVML's PID: local PID}: listed under the PID the driver sees
    (absent from our /proc) while the local process lives, as inside an LXC container.
    ``v2=False`` makes the v2 memory call fail as an old driver does.
    """

    NVMLError = pynvml.NVMLError
    nvmlMemory_v2 = pynvml.nvmlMemory_v2

    def __init__(self, gpus, v2=True, foreign=(), aliases=None):
        self.gpus = gpus
        self.v2 = v2
        self.foreign = set(foreign)
        self.aliases = dict(aliases or {})
        self.calls = {"v1": 0, "v2": 0}

    def _procs(self, h):
        procs = self.gpus[h].get("procs", {})
        return {p: m for p, m in procs.items() if p in self.foreign or alive(self.aliases.get(p, p))}

    def nvmlDeviceGetCount(self):
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i):
        if not 0 <= i < len(self.gpus):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return i

    def nvmlDeviceGetUUID(self, h):
        return f"GPU-standin-{h:04d}"

    def nvmlDeviceGetName(self, h):
        return "Stand-in H200"

    def nvmlDeviceGetMinorNumber(self, h):
        return h

    def nvmlDeviceGetMemoryInfo(self, h, version=None):
        g = self.gpus[h]
        used = g.get("other", 0) + sum(m or 0 for m in self._procs(h).values())
        total, reserved = g.get("total", 143771), g.get("reserved", 615)
        if version:
            if not self.v2:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
            self.calls["v2"] += 1
            s = pynvml.c_nvmlMemory_v2_t()
            s.total, s.reserved, s.used = total * MIB, reserved * MIB, int(used * MIB)
            s.free = s.total - s.reserved - s.used
            return s
        self.calls["v1"] += 1
        s = pynvml.c_nvmlMemory_t()
        s.total, s.used = total * MIB, int((used + reserved) * MIB)
        s.free = s.total - s.used
        return s

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        return [_Proc(p, m) for p, m in self._procs(h).items()]

    def nvmlDeviceGetGraphicsRunningProcesses(self, h):
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def nvmlShutdown(self):
        pass


def load(path):
    """A StandInNVML from a JSON file ``{"gpus": [{..., "procs": {"PID": MiB}}], "foreign": [PID],
    "aliases": {"NVML PID": "local PID"}}`` (a bare list is taken as the "gpus")."""
    import json

    cfg = json.loads(Path(path).read_text())
    if isinstance(cfg, list):
        cfg = {"gpus": cfg}
    for g in cfg["gpus"]:
        g["procs"] = {int(k): v for k, v in g.get("procs", {}).items()}
    aliases = {int(k): int(v) for k, v in cfg.get("aliases", {}).items()}
    return StandInNVML(cfg["gpus"], foreign=cfg.get("foreign", ()), aliases=aliases)


LAUNCHER = """#!{python}
# STAND-IN eagle3ops launcher (tests): the real CLI and eagle3ops.gpu_free, with NVML replaced by
# nvml_standin.StandInNVML read from {config} and /dev by {dev}.
import sys
sys.path[:0] = {paths!r}
import nvml_standin
from eagle3ops import cli
from eagle3ops.gpu_free import check as gpu
gpu.load_nvml = lambda: nvml_standin.load({config!r})
gpu.ensure_free.__kwdefaults__["dev_dir"] = {dev!r}
sys.exit(cli.main())
"""


def write_launcher(path, *, python, paths, config, dev) -> None:
    """Write an executable stand-in ``eagle3ops`` at ``path`` (``paths``: where eagle3ops and this module are)."""
    p = Path(path)
    p.write_text(
        LAUNCHER.format(python=python, paths=[str(x) for x in paths], config=str(config), dev=str(dev))
    )
    p.chmod(0o755)
