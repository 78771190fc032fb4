"""GPU utilisation, memory, SM clock and throttle reasons, sampled by NVML in a background thread."""
from __future__ import annotations

import threading
from typing import Optional

import numpy as np

try:
    import pynvml
except ImportError:  # nvidia-ml-py is a dependency, but perflab still runs without it
    pynvml = None

SAMPLE_INTERVAL_S = 0.05


def device_handle(torch_index: int):
    """NVML's handle of torch's CUDA device `torch_index`. NVML numbers every GPU of the host, torch only those
    CUDA_VISIBLE_DEVICES shows: with CUDA_VISIBLE_DEVICES=2, torch's device 0 is NVML's 2. Found by the device's
    UUID; where torch does not report one, torch's own mapping; the index itself only where nothing is hidden."""
    import torch
    uuid = getattr(torch.cuda.get_device_properties(torch_index), "uuid", None)
    if uuid is not None:
        try:
            return pynvml.nvmlDeviceGetHandleByUUID(f"GPU-{uuid}")
        except pynvml.NVMLError:
            pass
    mapping = getattr(torch.cuda, "_get_nvml_device_index", None)
    return pynvml.nvmlDeviceGetHandleByIndex(mapping(torch_index) if mapping else torch_index)


def _throttle_reason_names() -> dict[int, str]:
    names = {}
    for attr in dir(pynvml):
        for prefix in ("nvmlClocksEventReason", "nvmlClocksThrottleReason"):
            if attr.startswith(prefix) and attr[len(prefix):] not in ("All", "None", "Unknown"):
                value = getattr(pynvml, attr)
                if isinstance(value, int) and value:
                    names.setdefault(value, attr[len(prefix):])
    return names


class NvmlSampler:
    """Context manager: samples the GPU while the body runs; `summary()` afterwards. A no-op without NVML."""

    def __init__(self, device_index: Optional[int]):
        self.device_index = device_index
        self.handle = None
        self.samples: list[tuple[float, float, float, int]] = []
        self.error: Optional[str] = None
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def __enter__(self) -> "NvmlSampler":
        if self.device_index is None or pynvml is None:
            return self
        try:
            pynvml.nvmlInit()
            self.handle = device_handle(self.device_index)
        except pynvml.NVMLError as err:
            self.error = f"NVML unavailable: {err}"
            return self
        self._thread = threading.Thread(target=self._sample_loop, name="perflab-nvml", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            pynvml.nvmlShutdown()

    def _sample_loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.samples.append(self._read())
            except pynvml.NVMLError as err:
                self.error = f"NVML sampling stopped: {err}"
                return
            self._stop.wait(SAMPLE_INTERVAL_S)

    def _read(self) -> tuple[float, float, float, int]:
        util = pynvml.nvmlDeviceGetUtilizationRates(self.handle)
        memory = pynvml.nvmlDeviceGetMemoryInfo(self.handle)
        clock = pynvml.nvmlDeviceGetClockInfo(self.handle, pynvml.NVML_CLOCK_SM)
        try:
            reasons = pynvml.nvmlDeviceGetCurrentClocksEventReasons(self.handle)
        except (AttributeError, pynvml.NVMLError):
            reasons = pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(self.handle)
        return float(util.gpu), memory.used / 2**20, float(clock), int(reasons)

    def summary(self) -> Optional[dict]:
        if not self.samples:
            return {"error": self.error} if self.error else None
        util, used_mb, clock, reasons = (np.array(column) for column in zip(*self.samples))
        seen = 0
        for value in reasons:
            seen |= int(value)
        names = _throttle_reason_names()
        return {
            "samples": len(self.samples),
            "util_mean_pct": float(util.mean()),
            "util_min_pct": float(util.min()),
            "util_max_pct": float(util.max()),
            "memory_used_max_mb": float(used_mb.max()),
            "sm_clock_median_mhz": float(np.median(clock)),
            "sm_clock_min_mhz": float(clock.min()),
            "sm_clock_max_mhz": float(clock.max()),
            "clock_event_reasons": sorted({name for bit, name in names.items() if seen & bit}),
            "error": self.error,
        }
