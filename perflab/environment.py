"""The environment a result was measured in: software versions, the GPU, the CPU, the user's git commit."""
from __future__ import annotations

import os
import platform
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional

import torch

from perflab.version import __version__


def usable_cpus(cgroup_cpu_max: Path = Path("/sys/fs/cgroup/cpu.max")) -> int:
    """CPUs this process may run on (DataLoader workers beyond that only contend): its affinity, or
    os.cpu_count, capped by a container's cgroup v2 CPU quota ("200000 100000" is 2 CPUs; "max" is none)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        quota, period = cgroup_cpu_max.read_text().split()[:2]
        if quota != "max":
            cpus = min(cpus, max(1, int(int(quota) / int(period))))
    except (OSError, ValueError):
        pass  # no cgroup v2 quota readable: the affinity is the limit
    return cpus


def _git_commit(path: str) -> Optional[str]:
    try:
        out = subprocess.run(["git", "-C", path, "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=5, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    dirty = subprocess.run(["git", "-C", path, "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True, timeout=5, check=False).stdout.strip()
    return out.stdout.strip() + ("-dirty" if dirty else "")


def _driver_version() -> Optional[str]:
    try:
        import pynvml
        pynvml.nvmlInit()
        try:
            version = pynvml.nvmlSystemGetDriverVersion()
        finally:
            pynvml.nvmlShutdown()
        return version.decode() if isinstance(version, bytes) else version
    except Exception:  # no driver, no NVML: the field is simply unknown
        return None


def gpu_info(index: int = 0) -> dict[str, Any]:
    props = torch.cuda.get_device_properties(index)
    return {
        "name": props.name,
        "memory_mb": props.total_memory / 2**20,
        "capability": f"{props.major}.{props.minor}",
        "multiprocessors": props.multi_processor_count,
    }


def collect_environment(device: Optional[torch.device] = None) -> dict[str, Any]:
    """Everything needed to judge whether two results are comparable."""
    cuda = torch.cuda.is_available()
    index = device.index if device is not None and device.type == "cuda" and device.index is not None else 0
    env: dict[str, Any] = {
        "perflab": __version__,
        "python": platform.python_version(),
        "python_executable": sys.executable,
        "torch": torch.__version__,
        "cuda_runtime": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if cuda else None,
        "cuda_available": cuda,
        "driver": _driver_version() if cuda else None,
        "gpu": gpu_info(index) if cuda else None,
        "gpu_count": torch.cuda.device_count() if cuda else 0,
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "platform": platform.platform(),
        "hostname": socket.gethostname(),
        "git_commit": _git_commit(os.getcwd()),
    }
    return env


def describe_device(env: dict[str, Any], device_type: str) -> str:
    """A short label for tables: the GPU name, or the CPU."""
    if device_type == "cuda" and env.get("gpu"):
        return env["gpu"]["name"]
    return f"CPU ({env.get('cpu_count')} cores)"
