"""RunConfig: everything that defines a run. Each field is declared once, as an option (perflab/options.py):
its flag, type, choices, default, help, group, and what it needs. Validation, the command line of run,
profile and sweep, the argv that reproduces a run, and the levers' refusals all come from here."""
from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass
from typing import Any, Optional

from perflab import options
from perflab.errors import PerflabError
from perflab.options import Bound, Conflict, Requires, option

MODES = ("train", "infer")
DEVICES = ("auto", "cuda", "cpu")
PRECISIONS = ("fp32", "tf32", "bf16", "fp16")
FULL_PRECISIONS = ("fp32", "tf32")  # fp32 storage and arithmetic (tf32 rounds inside the matmul only)
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune")
PREFETCHERS = ("none", "stream")
AUGMENT_MODES = ("cpu", "gpu", "gpu-stream")
PIPELINES = ("serial", "streams")
OPTIMIZER_IMPLS = ("default", "foreach", "fused", "8bit")
SDPA_BACKENDS = ("auto", "flash", "efficient", "math")
DATA_SOURCES = ("auto", "loader", "device")
KV_CACHES = ("dynamic", "static")
QUANT_SCHEMES = ("int8-weight", "fp8", "int4-weight")
QUANT_KERNELS = ("auto", "torchao", "gemlite")  # perflab/generation/quantize.py: which kernel each means
PARALLEL_KINDS = ("ddp", "fsdp")
COMM_HOOKS = ("bf16", "fp16")
FSDP_DTYPES = ("fp32", "bf16")  # MixedPrecisionPolicy's param_dtype (bf16 only) and reduce_dtype

MAX_COST_PER_HOUR = 1e6  # $/h: far above any machine's price; more is a typo (1e308 would save as inf)
MAX_WORKERS_PER_CPU = 4  # DataLoader workers beyond this many per CPU only contend (and may exhaust memory)

MEASURE = "workload and measurement"
DATA_PATH = "data-path levers"
MODEL = "model and step levers"
GENERATION = "generation levers (--workload generate, or a causal LM through perflab.generation)"
QUALITY = "quality gate"
CHECKPOINTS = "checkpoints (training)"
DISTRIBUTED = "distributed (torchrun underneath; see docs/distributed.md)"
OUTPUT = "output"
SINGLE_RUN = ("run", "profile")
SERVE = ("serve",)
RUN_AND_SERVE = options.RUN_COMMANDS + SERVE
TRAIN = ("train",)
INFER = ("infer",)

NEEDS_RANKS = "needs --nproc 2 or more (a setting of the data-parallel wrapper)"
ONE_PROCESS = "runs in one process; drop --nproc"
FSDP_ONLY = "is an FSDP setting; add --parallel fsdp (and --nproc 2 or more)"
SECOND_STREAM = "a captured step cannot also run work on a second stream; drop --augment gpu-stream/--pipeline"


SLO_KEYS = ("ttft", "tpot")  # --slo: per-request targets of generation (milliseconds)


def is_full_precision(precision: Optional[str]) -> bool:
    """True for a precision that keeps fp32 tensors (fp32, tf32): reduced float formats are still to try."""
    return precision in FULL_PRECISIONS


def parse_slo(text: Optional[str]) -> dict[str, float]:
    """'ttft:200,tpot:50' -> {'ttft': 200.0, 'tpot': 50.0} (milliseconds)."""
    if not text:
        return {}
    slo: dict[str, float] = {}
    for part in text.split(","):
        key, sep, value = part.strip().partition(":")
        try:
            number = float(value)
        except ValueError:
            number = -1.0
        if not sep or key not in SLO_KEYS or number <= 0:
            raise PerflabError(f"--slo expects ttft:MS and/or tpot:MS with positive milliseconds, e.g. "
                               f"--slo ttft:200,tpot:50; got {text!r}")
        slo[key] = number
    return slo


@dataclass
class RunConfig:
    """One run: the workload, how it is measured, and which levers are on."""

    workload: str = option("--workload", str, "built-in name (see `perflab workloads`) or path/file.py:build or "
                           "package.module:build (default: driving)", MEASURE, "driving", metavar="NAME",
                           commands=RUN_AND_SERVE)
    mode: str = option("--mode", str, "train or infer (default: train; serve: infer only)", MEASURE, "train",
                        choices=MODES, commands=RUN_AND_SERVE)
    batch_size: Optional[int] = option("--batch", int, "batch size (default: the workload's, by device)", MEASURE,
                                       minimum=1, metavar="N")
    steps: int = option("--steps", int, "timed steps per trial (default: 30)", MEASURE, 30, minimum=1, metavar="N")
    warmup: int = option("--warmup", int, "untimed warm-up steps (default: 5; serve: per batch size)", MEASURE, 5,
                        minimum=0, metavar="N", commands=RUN_AND_SERVE)
    trials: int = option("--trials", int, "timed trials; medians and spreads are over these (default: 3)", MEASURE,
                         3, minimum=1, metavar="N")
    device: str = option("--device", str, "auto, cuda or cpu (default: auto = cuda if present)", MEASURE, "auto",
                         choices=DEVICES, commands=RUN_AND_SERVE)
    seed: int = option("--seed", int, "random seed for weights, data order and augmentation (default: 0)", MEASURE,
                       0, minimum=0, maximum=options.MAX_SEED, metavar="N", commands=RUN_AND_SERVE)
    min_trial_s: float = option("--min-trial-s", float, "on CUDA, a run fed by a DataLoader runs each trial at "
                                "least this many seconds (more steps than --steps if needed, in whole cycles of "
                                "the workers), so a loader's bursts average out (default: 3; 0: exactly --steps)",
                                MEASURE, 3.0, minimum=0, metavar="S")
    sync_phases: bool = option("--sync-phases", bool, "synchronise at phase boundaries for a host-clock breakdown "
                               "(adds syncs; off by default)", MEASURE, False)
    # loader: DataLoader from the dataset; device: pre-staged batches on the device
    data: str = option("--data", str, "loader: DataLoader over the dataset; device: batches pre-staged on the "
                       "device (default: the workload's)", MEASURE, "auto", choices=DATA_SOURCES)
    workload_options: dict[str, Any] = option("--option", str, "workload-specific setting, e.g. image_res=128 "
                                              "(repeatable)", MEASURE, {}, key_value=True, sweepable=False,
                                              commands=RUN_AND_SERVE)

    # data-path levers
    workers: int = option("--workers", int, "DataLoader worker processes (default: 0)", DATA_PATH, 0, minimum=0,
                          per_cpu=MAX_WORKERS_PER_CPU, metavar="N")
    persistent_workers: bool = option("--persistent-workers", bool, "keep workers alive between epochs", DATA_PATH,
                                      False)
    prefetch_factor: Optional[int] = option("--prefetch-factor", int, "batches loaded ahead per worker", DATA_PATH,
                                            minimum=1, metavar="N")
    pin_memory: Optional[bool] = option("--pin-memory", bool, "page-locked host batches (default: on with CUDA)",
                                        DATA_PATH, negatable=True, needs_cuda=(True,),
                                        commands=RUN_AND_SERVE)
    non_blocking: bool = option("--non-blocking", bool, "asynchronous copies from pinned memory (default: on)",
                                DATA_PATH, True, negatable=True)
    prefetcher: str = option("--prefetcher", str, "stream: copy the next batch on a side CUDA stream", DATA_PATH,
                             "none", choices=PREFETCHERS, needs_cuda=("stream",), conflicts=(
                                 Conflict("pin_memory", "the stream prefetcher needs pinned memory for asynchronous "
                                          "copies; drop --no-pin-memory", value=False),))

    # model / step levers
    precision: str = option("--precision", str, "fp32, tf32, bf16 or fp16 (default: fp32)", MODEL, "fp32",
                            choices=PRECISIONS, changes_numerics=("tf32", "bf16", "fp16"),
                            needs_cuda=("tf32", "fp16"), commands=RUN_AND_SERVE)
    channels_last: bool = option("--channels-last", bool, "NHWC memory format for convolutions", MODEL, False,
                                 changes_numerics=True, commands=RUN_AND_SERVE)
    cudnn_benchmark: bool = option("--cudnn-benchmark", bool, "cuDNN times its convolution algorithms for each "
                                   "new input shape (in warm-up) and keeps the fastest", MODEL, False,
                                   changes_numerics=True, needs_cuda=True, commands=RUN_AND_SERVE)
    compile: Optional[str] = option("--compile", str, "torch.compile the model (mode: default; in a sweep, a list "
                                    "of modes, none for eager)", MODEL, choices=COMPILE_MODES, const="default",
                                    metavar="MODE", changes_numerics=True, commands=RUN_AND_SERVE, conflicts=(
                                        Conflict("cuda_graphs", "--compile reduce-overhead and max-autotune capture "
                                                 "CUDA graphs themselves; with --cuda-graphs use --compile default "
                                                 "(perflab captures the compiled step)",
                                                 when=("reduce-overhead", "max-autotune")),))
    cuda_graphs: bool = option("--cuda-graphs", bool, "capture the step as a CUDA graph and replay it", MODEL, False,
                               changes_numerics=True, needs_cuda=True, commands=RUN_AND_SERVE, conflicts=(
                                   Conflict("augment", SECOND_STREAM, value="gpu-stream"),
                                   Conflict("pipeline", SECOND_STREAM, value="streams")))
    augment: Optional[str] = option("--augment", str, "cpu, gpu or gpu-stream augmentation (workloads that declare "
                                    "it)", MODEL, choices=AUGMENT_MODES, needs_cuda=("gpu-stream",),
                                    read_by_build=True, conflicts=(
                                        Conflict("prefetcher", "gpu-stream already copies each batch on its side "
                                                 "stream; drop --prefetcher stream", value="stream",
                                                 when="gpu-stream"),))
    pipeline: str = option("--pipeline", str, "streams: run a frozen front stage one batch ahead on its own stream",
                           MODEL, "serial", choices=PIPELINES, needs_cuda=("streams",), modes=TRAIN, conflicts=(
                               Conflict("prefetcher", "the pipeline already copies each batch on its side stream; "
                                        "drop --prefetcher stream", value="stream"),
                               Conflict("augment", "device augmentation would run on the pipeline's features, not "
                                        "its images; drop --augment", value=("gpu", "gpu-stream"))))
    activation_checkpointing: bool = option("--activation-checkpointing", bool, "recompute activations in backward",
                                            MODEL, False, modes=TRAIN, read_by_build=True)
    optimizer_impl: str = option("--optimizer-impl", str, "default, foreach, fused, or 8bit (torchao's 8-bit "
                                 "Adam/AdamW: a quarter of the optimizer state)", MODEL, "default",
                                 choices=OPTIMIZER_IMPLS, changes_numerics=("fused", "8bit"), modes=TRAIN)
    sdpa: str = option("--sdpa", str, "attention backend: auto, flash, efficient or math", MODEL, "auto",
                       choices=SDPA_BACKENDS, changes_numerics=("flash", "efficient", "math"),
                       needs_cuda=("flash", "efficient"), commands=RUN_AND_SERVE)

    # generation (perflab/generation/): decode levers and request metrics; docs/generate.md
    kv_cache: str = option("--kv-cache", str, "dynamic: the cache grows every token (default); static: pre-allocated "
                           "to the longest request, so torch.compile / CUDA graphs can capture the decode step",
                           GENERATION, "dynamic", choices=KV_CACHES, changes_numerics=("static",), modes=INFER,
                           commands=RUN_AND_SERVE)
    quantize: Optional[str] = option("--quantize", str, "weight quantization through torchao (pip install "
                                     "'perflab[quant]'): int8-weight, fp8 or int4-weight", GENERATION,
                                     choices=QUANT_SCHEMES, metavar="SCHEME", changes_numerics=True, modes=INFER,
                                     needs_cuda=("fp8", "int4-weight"), commands=RUN_AND_SERVE)
    quantize_kernel: str = option("--quantize-kernel", str, "the matrix products of --quantize's weights: auto "
                                  "(gemlite's Triton kernels for int8-weight on CUDA where gemlite is installed, else "
                                  "torchao's default), torchao (int8-weight: Inductor's generated product; int4-weight: "
                                  "tinygemm) or gemlite (int8-weight, int4-weight; CUDA: pip install 'perflab[quant]'; "
                                  "int4 through gemlite failed the quality gate once: docs/generate.md)",
                                  GENERATION, "auto", choices=QUANT_KERNELS, modes=INFER, commands=RUN_AND_SERVE,
                                  conflicts=(Requires("quantize", "it picks the kernel of --quantize's weights: add "
                                                                  "--quantize int8-weight"),))
    speculative: Optional[int] = option("--speculative", int, "speculative decoding: a draft model proposes K tokens, "
                                        "the target verifies them in one forward (greedy outputs stay identical)",
                                        GENERATION, minimum=1, metavar="K", changes_numerics=True, modes=INFER,
                                        commands=RUN_AND_SERVE)
    draft: Optional[str] = option("--draft", str, "the draft model for --speculative: path/file.py:build_draft or "
                                  "package.module:build_draft, build_draft(cfg) -> a causal LM (default: the built-in "
                                  "draft trained with the target)", GENERATION, metavar="SPEC", sweepable=False,
                                  modes=INFER, commands=RUN_AND_SERVE)
    slo: Optional[str] = option("--slo", str, "per-request latency objectives for goodput, e.g. ttft:200,tpot:50 "
                                "(milliseconds); with perflab serve TTFT counts from each request's scheduled arrival", GENERATION,
                                metavar="ttft:MS,tpot:MS", sweepable=False, modes=INFER, commands=RUN_AND_SERVE)
    # distributed: perflab starts --nproc ranks per node through torch.distributed.run (perflab/distributed/)
    nproc: int = option("--nproc", int, "ranks (processes) per node, one GPU each on CUDA, gloo on CPU; started "
                        "through torchrun's launcher (default: 1, no launcher)", DISTRIBUTED, 1, minimum=1,
                        metavar="N", conflicts=(
                            Conflict("cuda_graphs", "a captured step cannot hold DDP's gradient all-reduce; drop "
                                     "--cuda-graphs"),
                            Conflict("pipeline", "the stream pipeline steps a model of its own, not the "
                                     "data-parallel one; drop --pipeline", value="streams"),
                            Conflict("checkpoint_every", "checkpoints are per process; " + ONE_PROCESS),
                            Conflict("resume_from", "checkpoints are per process; " + ONE_PROCESS),
                            Conflict("nsys", "run nsys around torchrun yourself (docs/distributed.md); drop "
                                     "--nsys")))
    parallel: str = option("--parallel", str, "ddp: DistributedDataParallel (a full replica per rank); fsdp: "
                           "FSDP2 fully_shard (parameters, gradients and optimizer state sharded) (default: ddp)",
                           DISTRIBUTED, "ddp", choices=PARALLEL_KINDS, conflicts=(
                               Conflict("nproc", "--parallel " + NEEDS_RANKS, value=1),
                               Conflict("precision", "FSDP2 with fp16 needs a sharded gradient scaler; use "
                                        "--precision bf16", value="fp16")))
    nnodes: int = option("--nnodes", int, "nodes taking part (run the same command on each; default: 1)",
                         DISTRIBUTED, 1, minimum=1, metavar="N", sweepable=False, conflicts=(
                             Conflict("rdzv_endpoint", "several nodes meet at one address: add --rdzv-endpoint "
                                      "HOST:PORT (node 0's address)", value=(None,)),))
    node_rank: int = option("--node-rank", int, "this node's rank, 0..nnodes-1 (node 0 hosts the rendezvous; "
                            "default: 0)", DISTRIBUTED, 0, minimum=0, metavar="R", sweepable=False, conflicts=(
                                Bound("nnodes", "node ranks run from 0 to --nnodes minus 1; give --node-rank below "
                                      "--nnodes (or raise --nnodes)", strict=True),))
    rdzv_endpoint: Optional[str] = option("--rdzv-endpoint", str, "HOST:PORT where the nodes meet (node 0's "
                                          "address; default: a free local port)", DISTRIBUTED, metavar="HOST:PORT",
                                          sweepable=False)
    rank_timeout_s: float = option("--rank-timeout", float, "seconds a rank waits for the others in a collective "
                                   "before the run ends with a 'stalled rank' error (default: 300; raise it when "
                                   "one rank legitimately works that long alone, e.g. a long first compile)",
                                   DISTRIBUTED, 300.0, above=0, metavar="S", sweepable=False)
    ddp_bucket_mb: Optional[float] = option("--ddp-bucket-mb", float, "DDP gradient bucket size in MiB: smaller "
                                            "starts all-reduces earlier in backward, larger sends fewer "
                                            "(default: DDP's 25)", DISTRIBUTED, above=0, metavar="MB", modes=TRAIN, conflicts=(
                                                Conflict("nproc", "--ddp-bucket-mb " + NEEDS_RANKS, value=1),
                                                Conflict("parallel", "--ddp-bucket-mb is a DDP setting; drop it "
                                                         "or use --parallel ddp", value="fsdp")))
    gradient_as_bucket_view: bool = option("--gradient-as-bucket-view", bool, "gradients are views into DDP's "
                                           "buckets: no copy into them, less memory", DISTRIBUTED, False, modes=TRAIN, conflicts=(
                                               Conflict("nproc", "--gradient-as-bucket-view " + NEEDS_RANKS,
                                                        value=1),
                                               Conflict("parallel", "--gradient-as-bucket-view is a DDP setting",
                                                        value="fsdp")))
    static_graph: bool = option("--static-graph", bool, "tell DDP the graph is the same every step (it can "
                                "reorder buckets and skip unused-parameter search)", DISTRIBUTED, False, modes=TRAIN, conflicts=(
                                    Conflict("nproc", "--static-graph " + NEEDS_RANKS, value=1),
                                    Conflict("parallel", "--static-graph is a DDP setting", value="fsdp")))
    ddp_comm_hook: Optional[str] = option("--ddp-comm-hook", str, "compress gradients to bf16 or fp16 for the "
                                          "all-reduce (half the bytes; changes numerics)", DISTRIBUTED,
                                          choices=COMM_HOOKS, changes_numerics=True, needs_cuda=True, modes=TRAIN, conflicts=(
                                              Conflict("nproc", "--ddp-comm-hook " + NEEDS_RANKS, value=1),
                                              Conflict("parallel", "--ddp-comm-hook is a DDP setting",
                                                       value="fsdp")))
    reshard_after_forward: bool = option("--reshard-after-forward", bool, "FSDP: free gathered parameters after "
                                         "forward and gather them again in backward (--no-...: keep them, one "
                                         "all-gather less per step, more memory) (default: on)", DISTRIBUTED,
                                         True, negatable=True, conflicts=(
                                             Conflict("parallel", "--no-reshard-after-forward is an FSDP setting; "
                                                      "add --parallel fsdp", value="ddp"),))
    broadcast_buffers: bool = option("--broadcast-buffers", bool, "DDP: copy rank 0's buffers (BatchNorm running "
                                     "statistics) to every rank before each forward (--no-...: skip that collective; "
                                     "each rank keeps its own statistics) (default: on)", DISTRIBUTED, True,
                                     negatable=True, modes=TRAIN, conflicts=(
                                         Conflict("nproc", "--no-broadcast-buffers " + NEEDS_RANKS, value=1),
                                         Conflict("parallel", "--no-broadcast-buffers is a DDP setting",
                                                  value="fsdp")))
    fsdp_param_dtype: Optional[str] = option("--fsdp-param-dtype", str, "FSDP2 MixedPrecisionPolicy: parameters "
                                             "all-gathered and computed in bf16 (half the all-gather bytes; the "
                                             "sharded fp32 parameters stay the master copy) (default: the model's "
                                             "dtype)", DISTRIBUTED, choices=FSDP_DTYPES[1:], changes_numerics=True,
                                             conflicts=(Conflict("parallel", "--fsdp-param-dtype " + FSDP_ONLY,
                                                                 value="ddp"),))
    fsdp_reduce_dtype: Optional[str] = option("--fsdp-reduce-dtype", str, "FSDP2 MixedPrecisionPolicy: the dtype "
                                              "gradients are reduce-scattered in: bf16 halves the bytes, fp32 sums "
                                              "exactly (default: fp32 with --fsdp-param-dtype bf16, as torchtitan; "
                                              "else the parameters' dtype)", DISTRIBUTED, choices=FSDP_DTYPES,
                                              changes_numerics=("bf16",), conflicts=(
                                                  Conflict("parallel", "--fsdp-reduce-dtype " + FSDP_ONLY,
                                                           value="ddp"),))
    fsdp_no_reshard_last: int = option("--fsdp-no-reshard-last", int, "FSDP: the last N blocks keep their gathered "
                                       "parameters after forward (backward needs them first, so gathering them "
                                       "again is pure waiting; more memory) (default: 0)", DISTRIBUTED, 0,
                                       minimum=0, metavar="N", conflicts=(
                                           Conflict("parallel", "--fsdp-no-reshard-last " + FSDP_ONLY, value="ddp"),))
    fsdp_prefetch: int = option("--fsdp-prefetch", int, "FSDP2: issue the all-gathers of the next N blocks in "
                                "forward (and the previous N in backward) ahead of time "
                                "(set_modules_to_forward_prefetch / set_modules_to_backward_prefetch; torch >= "
                                "2.5) (default: 0, FSDP's implicit one-block prefetch)", DISTRIBUTED, 0, minimum=0,
                                metavar="N", conflicts=(
                                    Conflict("parallel", "--fsdp-prefetch " + FSDP_ONLY, value="ddp"),))
    fsdp_compile_blocks: bool = option("--fsdp-compile-blocks", bool, "compile each block before sharding it "
                                       "(torchtitan's per-block compile: each block's kernels fused, FSDP's hooks "
                                       "between blocks eager)", DISTRIBUTED, False, conflicts=(
                                           Conflict("parallel", "--fsdp-compile-blocks " + FSDP_ONLY, value="ddp"),
                                           Conflict("compile", "--fsdp-compile-blocks compiles every block already; "
                                                    "drop --compile")))
    grad_accum: int = option("--grad-accum", int, "accumulate gradients over N steps and step the optimizer on the "
                             "last; with --nproc, the first N-1 skip the all-reduce (no_sync) (default: 1)",
                             DISTRIBUTED, 1, minimum=1, metavar="N", modes=TRAIN, conflicts=(
                                 Bound("steps", "the timed steps must hold at least one optimizer step; give --steps "
                                       "at least --grad-accum (or a smaller --grad-accum)"),
                                 Conflict("cuda_graphs", "a captured step always steps the optimizer; drop "
                                          "--cuda-graphs"),
                                 Conflict("pipeline", "the stream pipeline steps the optimizer itself; drop "
                                          "--pipeline", value="streams")))

    # quality gate: None means "on whenever a lever differs from the fp32 eager baseline"
    check_quality: Optional[bool] = option("--check-quality", bool, "compare outputs/losses with the fp32 eager "
                                           "baseline (default: on whenever a lever can change numerics; serve: "
                                           "after its points, at --batcher-max-batch)", QUALITY, negatable=True,
                                           commands=RUN_AND_SERVE)
    quality_steps: int = option("--quality-steps", int, "training steps (train) or batches (infer) the quality gate "
                                "compares (default: 8)", QUALITY, 8, minimum=1, metavar="N",
                                commands=RUN_AND_SERVE)
    quality_rtol: Optional[float] = option("--quality-rtol", float, "inference: relative output error allowed "
                                           "(default by precision: fp32 1e-5, tf32 1e-3, bf16 2e-2, fp16 1e-2; see "
                                           "docs/quality.md)", QUALITY, above=0, metavar="X",
                                           commands=RUN_AND_SERVE)
    quality_loss_rtol: Optional[float] = option("--quality-loss-rtol", float, "training: relative final-loss delta "
                                                "allowed (default by precision; see docs/quality.md)", QUALITY,
                                                above=0, metavar="X")

    # training checkpoints (perflab/checkpoint.py): save every N timed steps; resume before warm-up
    checkpoint_every: Optional[int] = option("--checkpoint-every", int, "save model, optimizer, scaler, RNG states "
                                             "and step to <out>/checkpoint.pt every N timed steps (timed as the "
                                             "'checkpoint' phase)", CHECKPOINTS, minimum=1, metavar="N", modes=TRAIN,
                                             sweepable=False, commands=SINGLE_RUN)
    resume_from: Optional[str] = option("--resume-from", str, "load a checkpoint.pt (or a run directory holding "
                                        "one) before warm-up", CHECKPOINTS, metavar="PATH", modes=TRAIN,
                                        sweepable=False, commands=SINGLE_RUN)

    out: Optional[str] = option("--out", str, "run directory (default: runs/<timestamp>-<workload>)", OUTPUT,
                                metavar="DIR", sweepable=False, in_argv=False,
                                commands=SINGLE_RUN + SERVE)
    nsys: Optional[str] = option("--nsys", str, "call cudaProfilerStart/Stop around ACTIVE timed steps after SKIP "
                                 "(default 2:3), for nsys --capture-range=cudaProfilerApi (see `perflab profile`)",
                                 OUTPUT, const="2:3", metavar="SKIP:ACTIVE", sweepable=False, commands=SINGLE_RUN)
    gpu_cost_per_hour: Optional[float] = option("--gpu-cost-per-hour", float, "price of the GPU (or machine) per "
                                                "hour, in any currency: results add the cost per million samples "
                                                "(serve: per million queries)", OUTPUT, above=0, maximum=MAX_COST_PER_HOUR,
                                                metavar="X",
                                                sweepable=False, commands=RUN_AND_SERVE)

    def validate(self) -> "RunConfig":
        """Raise PerflabError naming the first bad field and the accepted values."""
        options.validate(self)
        if self.draft and self.speculative is None:  # a requirement the option table's conflicts cannot state
            raise PerflabError("--draft is the draft model of speculative decoding: add --speculative K")
        parse_slo(self.slo)
        return self

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_argv(self, command: str = "run") -> list[str]:
        """The command-line options that reproduce this config (defaults omitted; --out not included)."""
        return options.to_argv(self, command)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "RunConfig":
        """Build from a saved config, ignoring keys this version does not know."""
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def replace(self, **changes: Any) -> "RunConfig":
        return dataclasses.replace(self, **changes)

    def pins_memory(self, device_type: str) -> bool:
        """Whether host batches are page-locked on `device_type`: --pin-memory / --no-pin-memory, else on with CUDA."""
        return device_type == "cuda" if self.pin_memory is None else self.pin_memory

    def run_config(self) -> "RunConfig":
        """Just the run options: a script's or serve's saved config without the fields only they record."""
        return RunConfig(**{name: getattr(self, name) for name in RUN_FIELDS})


RUN_FIELDS = tuple(f.name for f in dataclasses.fields(RunConfig))
SCRIPT_FIELDS = ("workload", "mode", "batch_size", "precision", "device", "warmup", "steps", "trials", "workers",
                 "sync_phases", "script", "step_source")


@dataclass
class ScriptConfig(RunConfig):
    """A script run's config (`perflab run -- python train.py`): what perflab saw the script do, not what it set.
    The other run options keep their defaults (perflab turned no lever on); result.json holds SCRIPT_FIELDS only."""

    precision: Optional[str] = None  # the script chooses its own
    script: dict[str, Any] = dataclasses.field(default_factory=dict)  # perflab.script.command.ScriptCommand.to_dict()
    step_source: Optional[str] = None  # where the step boundaries were found

    def to_dict(self) -> dict[str, Any]:
        return {name: copy.deepcopy(getattr(self, name)) for name in SCRIPT_FIELDS}


@dataclass
class ServeRunConfig(RunConfig):
    """A `perflab serve` result's config: the run options plus the serve settings (ServeConfig.to_dict())."""

    serve: dict[str, Any] = dataclasses.field(default_factory=dict)


def saved_config(data: dict[str, Any]) -> RunConfig:
    """The config a result.json holds: a ScriptConfig for a script run, a ServeRunConfig for serve, else a RunConfig
    (keys this version does not know are ignored; missing ones, as in older results, take their defaults)."""
    if "script" in data:
        return ScriptConfig.from_dict(data)
    if "serve" in data:
        return ServeRunConfig.from_dict(data)
    return RunConfig.from_dict(data)


MIN_EFFECT_PCT = 2.0  # the smallest significant throughput change that counts as a win or a loss, in percent
JUDGING = ("compare", "tune")
JUDGE = "judging a candidate against its baseline (compare; every trial of tune)"


@dataclass
class JudgeConfig:
    """How a candidate is judged against its baseline: `perflab compare`'s decision and every `perflab tune` trial's
    (TuneConfig is a JudgeConfig). Each option is declared here once for both commands."""

    min_effect_pct: float = option("--min-effect-pct", float, "smallest significant throughput change that counts "
                                   "as a win or a loss, in percent; tune keeps a lever only for a larger gain "
                                   f"(default: {MIN_EFFECT_PCT:g})", JUDGE, MIN_EFFECT_PCT, minimum=0, metavar="PCT",
                                   commands=JUDGING, deprecated=("--min-effect",))
    accept_noisy: bool = option("--accept-noisy", bool, "judge the speed even when a run was taken beside other busy "
                                "processes or did not finish cleanly; otherwise compare does not judge it and tune "
                                "does not count such a trial's lever as lost", JUDGE, False, commands=JUDGING)
    fail_on_not_judged: bool = option("--fail-on-not-judged", bool, "exit 1 when no verdict could be reached: "
                                      "compare's decision is 'not judged' (contaminated timings) or 'inconclusive' "
                                      "(too few trials, an inconclusive quality gate); in tune, when any trial was",
                                      JUDGE, False, commands=JUDGING)


def run_options() -> tuple[options.Option, ...]:
    """Every run option, in declaration order."""
    return options.options_of(RunConfig)


def numerics_fields() -> list[str]:
    """The options that may change a run's outputs (what compare and the quality gate care about)."""
    return [declared.name for declared in run_options() if declared.changes_numerics]
