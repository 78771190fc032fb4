"""This machine's ceilings: matmul TFLOP/s per precision, memory bandwidth, host-to-device bandwidth.

`perflab calibrate` measures them once and caches them per device and torch version; MFU divides
achieved FLOP/s by the cached peak, or by a datasheet value that is labelled as such.
"""
from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import torch

from perflab.backends import set_tf32
from perflab.results import write_json_atomic

# Dense (no sparsity) datasheet peaks in TFLOP/s and memory bandwidth in GB/s; a fallback only.
DATASHEET = {
    "H100 PCIe": {"fp32": 51.2, "tf32": 378.0, "bf16": 756.0, "fp16": 756.0, "memory_gbps": 2000.0},
    "H100": {"fp32": 66.9, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4, "memory_gbps": 3350.0},
    "H200": {"fp32": 66.9, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4, "memory_gbps": 4800.0},
    "A100": {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0, "memory_gbps": 2039.0},
    "L4": {"fp32": 30.3, "tf32": 60.0, "bf16": 121.0, "fp16": 121.0, "memory_gbps": 300.0},
}
MATMUL_DTYPES = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
# A reduced precision whose matmul runs slower than this fraction of fp32 has no fast path on this device
# (most CPUs emulate bf16): it is recorded as not supported rather than as a peak no kernel could reach.
SUPPORTED_FRACTION_OF_FP32 = 0.5


CEILING_TOO_LOW = "ceiling too low: recalibrate (`perflab calibrate`)"


def percent_of_ceiling(achieved: Optional[float], ceiling: Optional[float], what: str
                       ) -> tuple[Optional[float], Optional[str]]:
    """achieved as a % of a measured ceiling (MFU, % of the bandwidth bound), or (None, why) when it is over 100%:
    no run beats its machine's ceiling, so such a figure says the ceiling was measured too low, and is not shown."""
    if achieved is None or not ceiling:
        return None, None
    pct = 100 * achieved / ceiling
    if pct <= 100:
        return pct, None
    return None, (f"{CEILING_TOO_LOW}: {what} is {pct:.0f}% of the ceiling ({achieved:.3g} vs {ceiling:.3g}), which "
                  "no run can reach; the ceiling was measured too low (or does not describe this run's kernels)")


def cache_path() -> Path:
    root = os.environ.get("PERFLAB_CACHE_DIR") or Path.home() / ".cache" / "perflab"
    return Path(root) / "calibration.json"


def device_key(device: torch.device) -> str:
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    else:
        name = f"cpu {platform.processor() or platform.machine()} x{os.cpu_count()}"
    return f"{name} | torch {torch.__version__.split('+')[0]}"


def _median_seconds(fn: Callable[[], None], device: torch.device, repeats: int) -> float:
    fn()  # warm-up: handles, autotuning, allocator growth
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            began = time.perf_counter()
            fn()
            times.append(time.perf_counter() - began)
    times.sort()
    return times[len(times) // 2]


def measure_matmul_tflops(device: torch.device, precision: str, size: int, min_run_s: float = 0.5) -> float:
    """The matmul ceiling: torch.utils.benchmark's blocked_autorange (it synchronises CUDA and repeats the call in
    blocks long enough for the clock to resolve), on every thread this process uses, best block taken: noise can only
    slow a block down, and a ceiling is what the machine reaches, not its typical moment."""
    # imported here: torch.utils.benchmark loads cpp_extension, which warns on stderr on machines without CUDA
    import torch.utils.benchmark as benchmark
    a = torch.randn(size, size, device=device).to(MATMUL_DTYPES[precision])
    b = torch.randn(size, size, device=device).to(MATMUL_DTYPES[precision])
    restore = set_tf32(precision == "tf32")
    try:
        torch.mm(a, b)  # warm-up: handles, autotuning, allocator growth
        timer = benchmark.Timer("torch.mm(a, b)", globals={"torch": torch, "a": a, "b": b},
                                num_threads=torch.get_num_threads())
        seconds = min(timer.blocked_autorange(min_run_time=min_run_s).times)
    finally:
        restore()
    return 2 * size**3 / seconds / 1e12


def measure_copy_gbps(device: torch.device, megabytes: int, repeats: int = 10) -> float:
    """Device-memory bandwidth of a large copy, counting bytes read plus bytes written."""
    source = torch.randn(megabytes * 2**20 // 4, device=device)
    target = torch.empty_like(source)
    seconds = _median_seconds(lambda: target.copy_(source), device, repeats)
    return 2 * source.numel() * 4 / seconds / 1e9


def measure_h2d_gbps(device: torch.device, megabytes: int, pinned: bool, repeats: int = 10) -> float:
    host = torch.randn(megabytes * 2**20 // 4)
    if pinned:
        host = host.pin_memory()
    target = torch.empty_like(host, device=device)
    seconds = _median_seconds(lambda: target.copy_(host, non_blocking=pinned), device, repeats)
    return host.numel() * 4 / seconds / 1e9


@dataclass
class MeasuredCeilings:
    """One device's measured ceilings, as calibrate's cache holds them (keys an older cache lacks take defaults)."""

    device: str = ""
    matmul_size: int = 0
    measured_utc: str = ""
    tflops: dict[str, Optional[float]] = field(default_factory=dict)  # None: the precision has no fast path here
    quick: bool = False
    unsupported: dict[str, str] = field(default_factory=dict)  # precision -> why it is not supported
    memory_gbps: Optional[float] = None
    h2d_pinned_gbps: Optional[float] = None  # CUDA only
    h2d_pageable_gbps: Optional[float] = None

    def to_dict(self) -> dict[str, Any]:
        """The cache's entry: the host-to-device figures only where they were measured."""
        entry = asdict(self)
        return {key: value for key, value in entry.items() if value is not None or not key.startswith("h2d_")}

    @classmethod
    def from_dict(cls, data: Optional[dict[str, Any]]) -> Optional[MeasuredCeilings]:
        return cls(**{key: data[key] for key in cls.__dataclass_fields__ if key in data}) if data else None


def measure_ceilings(device: torch.device, quick: bool = False,
                     progress: Optional[Callable[[str], None]] = None) -> MeasuredCeilings:
    """Measure this device's ceilings (not cached: `store_ceilings`)."""
    say = progress or (lambda _msg: None)
    cuda = device.type == "cuda"
    # Sizes that reach the ceiling: a CPU matmul below ~1024 spends a large part of its time outside the FMA loops
    size = (4096 if quick else 8192) if cuda else (1024 if quick else 2048)
    precisions = ("fp32", "tf32", "bf16", "fp16") if cuda else ("fp32", "bf16")
    ceilings = MeasuredCeilings(device=device_key(device), matmul_size=size, measured_utc=_now(), quick=quick)
    for precision in precisions:
        say(f"matmul {precision} {size}x{size}")
        ceilings.tflops[precision] = measure_matmul_tflops(device, precision, size)
    fp32 = ceilings.tflops["fp32"]
    for precision in ("bf16", "fp16"):
        value = ceilings.tflops.get(precision)
        if value is not None and value < SUPPORTED_FRACTION_OF_FP32 * fp32:
            ceilings.tflops[precision] = None
            ceilings.unsupported[precision] = (f"{value:.3g} TFLOP/s, slower than fp32 ({fp32:.3g}): no fast "
                                               f"{precision} matmul on this device")
    say("device memory copy")
    ceilings.memory_gbps = measure_copy_gbps(device, 1024 if cuda else 128)
    if cuda:
        say("host-to-device copy (pinned)")
        ceilings.h2d_pinned_gbps = measure_h2d_gbps(device, 256, True)
        say("host-to-device copy (pageable)")
        ceilings.h2d_pageable_gbps = measure_h2d_gbps(device, 256, False)
    return ceilings


def calibrate(device: torch.device, quick: bool = False,
              progress: Optional[Callable[[str], None]] = None) -> dict:
    """Measure this device's ceilings and store them in the cache; returns the entry (MeasuredCeilings.to_dict()).

    The entry says how the cache was updated (`cache`), or why it could not be (`cache_error`): the figures
    are returned either way. A quick calibration never replaces a full one."""
    ceilings = measure_ceilings(device, quick, progress)
    entry = ceilings.to_dict()
    try:
        entry["cache"] = store_ceilings(ceilings)
    except OSError as err:
        entry["cache_error"] = cache_error(err)
    return entry


def cache_error(err: OSError) -> str:
    return f"cannot write {cache_path()}: {err.strerror}"


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def store_ceilings(ceilings: MeasuredCeilings) -> str:
    """Put the entry in the cache unless it is quick and a full calibration is there; says what happened."""
    path = cache_path()
    cache = load_cache()
    previous = MeasuredCeilings.from_dict(cache.get(ceilings.device))
    if ceilings.quick and previous and not previous.quick:
        return f"kept the full calibration of {previous.measured_utc} in {path} (a --quick one never replaces it)"
    path.parent.mkdir(parents=True, exist_ok=True)
    cache[ceilings.device] = ceilings.to_dict()
    write_json_atomic(path, cache)
    return f"cached in {path}"


def load_cache() -> dict:
    """The calibration cache file: entry key -> entry (ceilings, and collectives: perflab/calibrate_collectives.py)."""
    path = cache_path()
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}


def cached_ceilings(device: torch.device) -> Optional[dict]:
    """The cache's entry for `device` as stored (for scripts); perflab reads `measured_ceilings`."""
    return load_cache().get(device_key(device))


def measured_ceilings(device: torch.device) -> Optional[MeasuredCeilings]:
    """The ceilings `perflab calibrate` measured on `device`, typed; None where it has not run."""
    return MeasuredCeilings.from_dict(cached_ceilings(device))


def measured_ceilings_named(gpu_name: str) -> list[MeasuredCeilings]:
    """The ceilings measured on a GPU of this name (a trace's deviceProperties), under any torch version."""
    return [MeasuredCeilings.from_dict(entry) for key, entry in load_cache().items()
            if key.startswith(f"{gpu_name} |") and " | collectives over " not in key and entry]


def datasheet_ceilings(device: torch.device) -> Optional[dict]:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for model in DATASHEET:  # ordered: "H100 PCIe" before "H100"
        if all(part in name for part in model.split()):
            return {"model": model, **DATASHEET[model]}
    return None


def peak_tflops(device: torch.device, precision: str) -> tuple[Optional[float], str]:
    """(peak TFLOP/s for this precision, where it came from: 'calibrated', 'datasheet ...' or 'none')."""
    measured = measured_ceilings(device)
    if measured and precision in measured.unsupported:
        return None, f"not supported here: {measured.unsupported[precision]} (calibrated {measured.measured_utc})"
    if measured and measured.tflops.get(precision):
        return measured.tflops[precision], f"calibrated {measured.measured_utc}"
    sheet = datasheet_ceilings(device)
    if sheet:
        return sheet[precision], f"datasheet ({sheet['model']}, dense); run `perflab calibrate` to measure"
    return None, "none: run `perflab calibrate` once on this machine"


def memory_bandwidth(device: torch.device) -> tuple[Optional[float], str]:
    """(device-memory GB/s, where it came from: 'calibrated ...', 'datasheet ...' or 'none: ...')."""
    measured = measured_ceilings(device)
    if measured and measured.memory_gbps:
        return measured.memory_gbps, f"calibrated {measured.measured_utc} (copy, read + write)"
    sheet = datasheet_ceilings(device)
    if sheet:
        return sheet["memory_gbps"], f"datasheet ({sheet['model']}); run `perflab calibrate` to measure"
    return None, "none: run `perflab calibrate` once on this machine"
