"""NVML access for the VRAM-free check: the library (``nvidia-ml-py``/``pynvml``, never nvidia-smi output), the
devices selected by index or UUID, and their memory (the v2 struct where the driver has it, else v1 minus an
allowance for the driver's own reservation: :mod:`eagle3ops.gpu_free.check`'s docstring says why)."""

from __future__ import annotations

import socket
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from eagle3ops.errors import WithDetails

MIB = 1024 * 1024
# the v1 struct's share the driver reserves for itself (an idle H200: 615 MiB); gpu_free.options checks this
DEFAULT_V1_RESERVED_ALLOWANCE_MIB = 1024


class GpuFreeError(WithDetails, Exception):
    """The GPUs are not free (or cannot be read); ``details`` is the full report."""


class NoDriver(GpuFreeError):
    """NVML cannot be loaded or initialised on this host."""


def load_nvml():
    """Import ``pynvml`` and initialise NVML; raise NoDriver with what to do when that fails."""
    host = socket.gethostname()
    try:
        import pynvml
    except ImportError as e:
        raise NoDriver(
            f"nvidia-ml-py is not installed for {sys.executable} on {host} ({e}); install the "
            "workload requirements (runtime phase) or set gpu_free_gpu_required: false on hosts without GPUs",
            reason=f"nvidia-ml-py is not installed on {host}",
        ) from e
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        raise NoDriver(
            f"NVML could not initialise on {host}: {e}. Install/load the NVIDIA driver (host) or pass "
            "/dev/nvidia* into the container (container phase); on a CPU-only host set "
            "gpu_free_gpu_required: false",
            reason=f"no usable NVIDIA driver on {host} (NVML: {e})",
        ) from e
    return pynvml


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@dataclass
class Memory:
    total_mib: float
    used_mib: float
    reserved_mib: float
    source: str  # "v2" or "v1-minus-allowance"
    raw_used_mib: float  # what the struct itself said


class Device:
    """One GPU as NVML shows it; remembers whether the v2 memory call works for it."""

    def __init__(self, nvml, index: int, v1_allowance_mib: float):
        self.nvml = nvml
        self.index = index
        self.handle = nvml.nvmlDeviceGetHandleByIndex(index)
        self.uuid = _text(nvml.nvmlDeviceGetUUID(self.handle))
        try:
            self.name = _text(nvml.nvmlDeviceGetName(self.handle))
        except Exception:
            self.name = "?"
        try:
            self.minor = int(nvml.nvmlDeviceGetMinorNumber(self.handle))
        except Exception:
            self.minor = index
        self.v1_allowance_mib = v1_allowance_mib
        self._v2 = getattr(nvml, "nvmlMemory_v2", None) is not None

    def memory(self) -> Memory:
        if self._v2:
            try:
                m = self.nvml.nvmlDeviceGetMemoryInfo(self.handle, version=self.nvml.nvmlMemory_v2)
                return Memory(m.total / MIB, m.used / MIB, m.reserved / MIB, "v2", m.used / MIB)
            except (self.nvml.NVMLError, TypeError):
                self._v2 = False  # driver (or binding) without the v2 struct: v1 from now on
        m = self.nvml.nvmlDeviceGetMemoryInfo(self.handle)
        raw = m.used / MIB
        allowance = min(raw, self.v1_allowance_mib)
        return Memory(m.total / MIB, raw - allowance, allowance, "v1-minus-allowance", raw)

    def processes(self) -> dict[int, float | None]:
        """PID -> MiB (None where NVML does not say) over compute and graphics processes."""
        found: dict[int, float | None] = {}
        for fn in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
            try:
                procs = getattr(self.nvml, fn)(self.handle)
            except self.nvml.NVMLError:
                continue  # e.g. graphics processes not supported on this GPU
            for p in procs:
                mib = None if p.usedGpuMemory is None else p.usedGpuMemory / MIB
                prev = found.get(p.pid)
                found[p.pid] = mib if prev is None else prev + (mib or 0)
        return found


def select_devices(nvml, gpus: Sequence[str | int] | None, v1_allowance_mib: float) -> list[Device]:
    count = nvml.nvmlDeviceGetCount()
    all_devices = [Device(nvml, i, v1_allowance_mib) for i in range(count)]
    wanted = [str(g).strip() for g in (gpus or ["all"]) if str(g).strip()]
    if not wanted or "all" in wanted:
        return all_devices
    chosen: list[Device] = []
    for w in wanted:
        match = [d for d in all_devices if (w.isdigit() and d.index == int(w)) or d.uuid == w]
        if not match:
            listing = ", ".join(f"{d.index}={d.uuid}" for d in all_devices) or "none"
            raise GpuFreeError(
                f"GPU {w!r} is not on {socket.gethostname()}: NVML sees {count} GPU(s) ({listing}); "
                "fix gpu_free_gpus (indices or UUIDs, or 'all')"
            )
        if match[0] not in chosen:
            chosen.append(match[0])
    return chosen
