"""The links between this node's GPUs: all-reduce, reduce-scatter and all-gather over message sizes, as nccl-tests
reports them, measured once inside N ranks (`perflab calibrate --collectives --nproc N`) and cached beside the other
calibration figures (perflab/calibrate.py).

For a message of S bytes (the whole tensor: the all-reduced buffer, the gathered output, the scattered input) that
takes t seconds on the slowest rank:

    algorithm bandwidth  algbw = S / t
    bus bandwidth        busbw = algbw x 2(n-1)/n   (all-reduce)
                         busbw = algbw x (n-1)/n    (reduce-scatter, all-gather)

Bus bandwidth is what each link carries in a ring, so it compares with the link's own figure whatever n is. The
smallest message's time is the latency of one collective. The diagnosis reads the peak bus bandwidth to say how
fast a trace's collectives went against it; the scaling model (perflab/sweep/predict.py) reads both.
"""
from __future__ import annotations

import time
import warnings
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Optional, Sequence

import torch
import torch.distributed as dist

from perflab.calibrate import cache_path, device_key, load_cache
from perflab.results import write_json_atomic

KINDS = ("all_reduce", "reduce_scatter", "all_gather")
MIB = 2**20
CUDA_SIZES_MIB = (1, 4, 16, 64, 256, 1024)
CUDA_QUICK_SIZES_MIB = (1, 16, 256)
CPU_SIZES_BYTES = (4096, 65536, MIB)  # gloo on CPU: the test path, tiny messages
REPEATS = 20
CPU_REPEATS = 5


def bus_factor(kind: str, ranks: int) -> float:
    """nccl-tests' factor from algorithm to bus bandwidth: 2(n-1)/n for all-reduce, (n-1)/n for the others."""
    if kind == "all_reduce":
        return 2 * (ranks - 1) / ranks
    return (ranks - 1) / ranks


def bus_gbps(kind: str, message_bytes: float, seconds: float, ranks: int) -> float:
    """Bus bandwidth in GB/s (1e9 bytes) of one collective of `message_bytes` that took `seconds`."""
    return message_bytes / seconds / 1e9 * bus_factor(kind, ranks)


def collective_seconds(kind: str, message_bytes: float, busbw_gbps: float, latency_s: float, ranks: int) -> float:
    """The inverse: how long a collective of `message_bytes` takes at `busbw_gbps` plus its latency."""
    if ranks <= 1:
        return 0.0
    return latency_s + message_bytes * bus_factor(kind, ranks) / (busbw_gbps * 1e9)


@dataclass
class CollectiveTime:
    """One kind at one message size: its time on the slowest rank and the bandwidths it gives."""

    bytes: int = 0
    time_us: float = 0.0
    algbw_gbps: float = 0.0
    busbw_gbps: float = 0.0


@dataclass
class PeerLink:
    """A GPU's nominal link to its peers, per direction."""

    name: str = ""
    gbps: float = 0.0


@dataclass
class CollectivesCalibration:
    """The collectives measured over `ranks` ranks, as the calibration cache holds them (its key is `device`);
    keys an older cache lacks take their defaults."""

    device: str = ""
    ranks: int = 0
    backend: str = ""
    dtype: str = "fp32"
    measured_utc: str = ""
    repeats: int = 0
    results: dict[str, list[CollectiveTime]] = field(default_factory=dict)  # kind -> one row per message size
    peak_busbw_gbps: dict[str, float] = field(default_factory=dict)
    latency_us: dict[str, float] = field(default_factory=dict)  # kind -> the smallest message's time
    method: str = ""
    link: Optional[PeerLink] = None  # the nominal link, where perflab knows the GPU

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Optional[dict[str, Any]]) -> Optional[CollectivesCalibration]:
        if not data:
            return None
        known = {key: data[key] for key in cls.__dataclass_fields__ if key in data}
        known["results"] = {kind: [CollectiveTime(**{key: row[key] for key in CollectiveTime.__dataclass_fields__
                                                     if key in row}) for row in rows]
                            for kind, rows in (known.get("results") or {}).items()}
        known["link"] = PeerLink(**known["link"]) if known.get("link") else None
        return cls(**known)


def collectives_key(device: torch.device, ranks: int) -> str:
    return f"{device_key(device)} | collectives over {ranks} ranks on one node"


def _buffers(kind: str, message_bytes: int, ranks: int, device: torch.device, dtype: torch.dtype):
    """(input, output) of one collective whose whole tensor is `message_bytes` (a multiple of ranks elements)."""
    size = torch.tensor([], dtype=dtype).element_size()
    elements = max(ranks, message_bytes // size // ranks * ranks)
    full = torch.rand(elements, device=device, dtype=torch.float32).to(dtype)  # never time on all-zero inputs
    shard = torch.empty(elements // ranks, device=device, dtype=dtype)
    if kind == "all_reduce":
        return full, None
    if kind == "reduce_scatter":
        return full, shard
    return shard.normal_(), full


def _issue(kind: str, tensors) -> None:
    source, target = tensors
    with warnings.catch_warnings():  # torch >= 2.12 renames all_gather_into_tensor; 2.4-2.11 have only this name
        warnings.simplefilter("ignore", FutureWarning)
        _call(kind, source, target)


def _call(kind: str, source: torch.Tensor, target: Optional[torch.Tensor]) -> None:
    if kind == "all_reduce":
        dist.all_reduce(source)
    elif kind == "reduce_scatter":
        dist.reduce_scatter_tensor(target, source)
    else:
        dist.all_gather_into_tensor(target, source)


def time_collective(kind: str, message_bytes: int, device: torch.device, repeats: int,
                    dtype: torch.dtype = torch.float32) -> float:
    """Seconds per collective, the slowest rank's (every rank waits for it), after one warm-up call."""
    ranks = dist.get_world_size()
    tensors = _buffers(kind, message_bytes, ranks, device, dtype)
    _issue(kind, tensors)  # warm-up: communicator set-up, buffers registered
    _synchronize(device)
    dist.barrier()
    began = time.perf_counter()
    for _ in range(repeats):
        _issue(kind, tensors)
    _synchronize(device)
    elapsed = torch.tensor([(time.perf_counter() - began) / repeats], dtype=torch.float64,
                           device=device if device.type == "cuda" else "cpu")
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    return float(elapsed.item())


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def message_sizes(device: torch.device, quick: bool, max_mib: Optional[float] = None) -> list[int]:
    """The message sizes in bytes: 1 MiB to 1 GiB by 4x on CUDA (fewer with --quick), a few KiB on CPU."""
    if device.type != "cuda":
        return list(CPU_SIZES_BYTES)
    sizes = [mib * MIB for mib in (CUDA_QUICK_SIZES_MIB if quick else CUDA_SIZES_MIB)]
    return [size for size in sizes if max_mib is None or size <= max_mib * MIB] or sizes[:1]


def measure_collectives(device: torch.device, sizes: Sequence[int],
                        progress: Optional[Callable[[str], None]] = None) -> CollectivesCalibration:
    """Inside a rank: every kind at every size; the entry rank 0 caches (every rank returns it)."""
    say = progress or (lambda _msg: None)
    ranks = dist.get_world_size()
    repeats = REPEATS if device.type == "cuda" else CPU_REPEATS
    results: dict[str, list[CollectiveTime]] = {}
    for kind in KINDS:
        rows = []
        for size in sizes:
            say(f"{kind} {size / MIB:g} MiB")
            seconds = time_collective(kind, size, device, repeats)
            rows.append(CollectiveTime(bytes=size, time_us=seconds * 1e6, algbw_gbps=size / seconds / 1e9,
                                       busbw_gbps=bus_gbps(kind, size, seconds, ranks)))
        results[kind] = rows
    return CollectivesCalibration(
        device=collectives_key(device, ranks), ranks=ranks, backend=dist.get_backend(), dtype="fp32",
        measured_utc=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), repeats=repeats, results=results,
        peak_busbw_gbps={kind: max(row.busbw_gbps for row in rows) for kind, rows in results.items()},
        latency_us={kind: rows[0].time_us for kind, rows in results.items()},
        method="nccl-tests' convention: S = the whole tensor's bytes, algbw = S / t (slowest rank), busbw = "
               "algbw x 2(n-1)/n (all-reduce) or x (n-1)/n (reduce-scatter, all-gather); latency = the "
               "smallest message's time")


def store_collectives(entry: CollectivesCalibration) -> str:
    """Put the entry in the calibration cache (a file of its own key per device and rank count)."""
    path = cache_path()
    cache = load_cache()
    cache[entry.device] = entry.to_dict()
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, cache)
    return f"cached in {path}"


def measured_collectives(device: torch.device, ranks: Optional[int] = None) -> Optional[CollectivesCalibration]:
    """The cached collectives of this device type: at `ranks`, or at the most ranks measured."""
    cache = load_cache()
    if ranks is not None:
        return CollectivesCalibration.from_dict(cache.get(collectives_key(device, ranks)))
    prefix = f"{device_key(device)} | collectives over "
    found = [CollectivesCalibration.from_dict(entry) for key, entry in cache.items() if key.startswith(prefix)]
    return max(found, key=lambda entry: entry.ranks) if found else None


def cached_collectives(device: torch.device, ranks: Optional[int] = None) -> Optional[dict]:
    """measured_collectives as the cache stores it (for scripts)."""
    entry = measured_collectives(device, ranks)
    return entry.to_dict() if entry is not None else None


# A GPU's nominal link to its peers, per direction (what bus bandwidth compares with); the scaling model's stated
# intra-node figure where no collectives were measured. Ordered: "H100 PCIe" before "H100".
NOMINAL_LINKS = {
    "H100 PCIe": ("PCIe Gen5 x16, per direction", 64.0),
    "H100": ("NVLink 4 (H100 SXM), per direction", 450.0),
    "H200": ("NVLink 4 (H200 SXM), per direction", 450.0),
    "A100": ("NVLink 3 (A100 SXM), per direction", 300.0),
}


def peer_link(device: torch.device) -> Optional[PeerLink]:
    """This GPU's nominal peer link, or None (a CPU, an unknown GPU)."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for model, (link, gbps) in NOMINAL_LINKS.items():
        if all(part in name for part in model.split()):
            return PeerLink(link, gbps)
    return None


def nominal_link(device: torch.device) -> Optional[dict]:
    """peer_link as {'name', 'gbps'} (for scripts)."""
    link = peer_link(device)
    return asdict(link) if link is not None else None


def cached_collectives_named(gpu_name: Optional[str], ranks: Optional[int] = None
                             ) -> Optional[CollectivesCalibration]:
    """The cached collectives of a GPU by its name (a trace's deviceProperties; any torch version): at `ranks` when
    measured there, else at the most ranks measured."""
    if not gpu_name:
        return None
    found = [CollectivesCalibration.from_dict(entry) for key, entry in load_cache().items()
             if key.startswith(f"{gpu_name} | torch ") and " | collectives over " in key]
    if not found:
        return None
    exact = [entry for entry in found if entry.ranks == ranks]
    return (exact or sorted(found, key=lambda entry: entry.ranks))[-1]
