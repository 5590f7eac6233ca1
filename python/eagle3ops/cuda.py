"""The CUDA devices this process can use, asked without importing torch (~1.5 s of CPU) where there can be none:
the train phase's ``device=auto`` and the extract phase's ``workers=auto`` ask it on every run, also on a run that
only finds its work done."""

from __future__ import annotations

import os
from collections.abc import Sequence

# a GPU torch could use shows one of these: NVIDIA's driver (also inside a container it is passed to), WSL's GPU,
# ROCm's (torch.cuda on AMD)
GPU_DRIVER_NODES = ("/proc/driver/nvidia", "/dev/nvidiactl", "/dev/dxg", "/dev/kfd")


def cuda_device_count(driver_nodes: Sequence[str] = GPU_DRIVER_NODES) -> int:
    """The CUDA devices torch sees (``torch.cuda.device_count()``, 0 without CUDA), without importing torch
    (~1.5 s of CPU) where it could see none: ``CUDA_VISIBLE_DEVICES`` set empty, or no GPU driver node at all."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and not visible.strip():
        return 0
    if not any(os.path.exists(p) for p in driver_nodes):
        return 0
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0
