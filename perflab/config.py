"""RunConfig: everything that defines a run, validated with messages a user can act on."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Optional

from perflab.errors import PerflabError

MODES = ("train", "infer")
DEVICES = ("auto", "cuda", "cpu")
PRECISIONS = ("fp32", "tf32", "bf16", "fp16")
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune")
PREFETCHERS = ("none", "stream")
AUGMENT_MODES = ("cpu", "gpu", "gpu-stream")
PIPELINES = ("serial", "streams")
OPTIMIZER_IMPLS = ("default", "foreach", "fused")
SDPA_BACKENDS = ("auto", "flash", "efficient", "math")
DATA_SOURCES = ("auto", "loader", "device")


@dataclass
class RunConfig:
    """One run: the workload, how it is measured, and which levers are on."""

    workload: str = "driving"
    mode: str = "train"
    batch_size: Optional[int] = None  # None: the workload's default for the device
    steps: int = 30
    warmup: int = 5
    trials: int = 3
    device: str = "auto"
    seed: int = 0
    out: Optional[str] = None
    sync_phases: bool = False
    data: str = "auto"  # loader: DataLoader from the dataset; device: pre-staged batches on the device
    workload_options: dict[str, Any] = field(default_factory=dict)

    # data-path levers
    workers: int = 0
    persistent_workers: bool = False
    prefetch_factor: Optional[int] = None
    pin_memory: Optional[bool] = None  # None: on when the device is CUDA
    non_blocking: bool = True
    prefetcher: str = "none"

    # model / step levers
    precision: str = "fp32"
    channels_last: bool = False
    compile: Optional[str] = None
    cuda_graphs: bool = False
    augment: Optional[str] = None
    pipeline: str = "serial"
    activation_checkpointing: bool = False
    optimizer_impl: str = "default"
    sdpa: str = "auto"

    # quality gate: None means "on whenever a lever differs from the fp32 eager baseline"
    check_quality: Optional[bool] = None
    quality_steps: int = 8
    quality_rtol: Optional[float] = None  # inference relative error allowed; None: by precision
    quality_loss_rtol: Optional[float] = None  # training final-loss relative delta; None: by precision

    # training checkpoints (perflab/checkpoint.py): save every N timed steps; resume before warm-up
    checkpoint_every: Optional[int] = None
    resume_from: Optional[str] = None

    def validate(self) -> "RunConfig":
        """Raise PerflabError naming the first bad field and the accepted values."""
        _one_of("mode", self.mode, MODES)
        _one_of("device", self.device, DEVICES)
        _one_of("precision", self.precision, PRECISIONS)
        _one_of("prefetcher", self.prefetcher, PREFETCHERS)
        _one_of("pipeline", self.pipeline, PIPELINES)
        _one_of("optimizer-impl", self.optimizer_impl, OPTIMIZER_IMPLS)
        _one_of("sdpa", self.sdpa, SDPA_BACKENDS)
        _one_of("data", self.data, DATA_SOURCES)
        if self.compile is not None:
            _one_of("compile", self.compile, COMPILE_MODES)
        if self.augment is not None:
            _one_of("augment", self.augment, AUGMENT_MODES)
        if self.batch_size is not None:
            _positive("batch", self.batch_size)
        _positive("steps", self.steps)
        _positive("trials", self.trials)
        _positive("quality-steps", self.quality_steps)
        for name, value in (("quality-rtol", self.quality_rtol), ("quality-loss-rtol", self.quality_loss_rtol)):
            if value is not None and not value > 0:
                raise PerflabError(f"--{name} must be a positive number, got {value!r}")
        if self.checkpoint_every is not None:
            _positive("checkpoint-every", self.checkpoint_every)
        if (self.checkpoint_every or self.resume_from) and self.mode != "train":
            raise PerflabError("--checkpoint-every and --resume-from apply to training runs; use --mode train")
        if self.warmup < 0:
            raise PerflabError(f"--warmup must be 0 or more, got {self.warmup}")
        if self.workers < 0:
            raise PerflabError(f"--workers must be 0 or more, got {self.workers}")
        if self.prefetch_factor is not None:
            _positive("prefetch-factor", self.prefetch_factor)
        return self

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "RunConfig":
        """Build from a saved config, ignoring keys this version does not know."""
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def replace(self, **changes: Any) -> "RunConfig":
        return dataclasses.replace(self, **changes)


def _one_of(name: str, value: Any, allowed: tuple) -> None:
    if value not in allowed:
        raise PerflabError(f"--{name} must be one of {', '.join(allowed)}; got {value!r}")


def _positive(name: str, value: int) -> None:
    if not isinstance(value, int) or value <= 0:
        raise PerflabError(f"--{name} must be a positive integer, got {value!r}")
