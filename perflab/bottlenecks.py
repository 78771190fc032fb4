"""The bottleneck map's vocabulary, declared once: the classes diagnosis names and levers address, and the
situations a rule reports that decide which of a class's levers it proposes.

It imports nothing of perflab, so levers (which address classes) and diagnose (which names them) both read it.
"""
from __future__ import annotations

# The classes of the bottleneck map (docs/diagnose.md)
INPUT_PIPELINE = "input pipeline"
H2D_COPIES = "host-to-device copies"
LAUNCH_OVERHEAD = "launch / framework overhead"
HOST_DEVICE_SYNC = "host-device sync"
MEMORY_BANDWIDTH = "memory bandwidth"
COMPUTE_BOUND = "compute bound"
ACTIVATION_MEMORY = "activation memory"
COLLECTIVES = "collectives"
INFERENCE_QUEUE = "inference queue"
NO_CLEAR_BOTTLENECK = "no clear bottleneck"

CLASSES = (INPUT_PIPELINE, H2D_COPIES, LAUNCH_OVERHEAD, HOST_DEVICE_SYNC, MEMORY_BANDWIDTH, COMPUTE_BOUND,
           ACTIVATION_MEMORY, COLLECTIVES, INFERENCE_QUEUE)

# Short names for file names and the command line (fixtures are named <slug>__<what>.json.gz).
CLASS_SLUGS = {
    "input_pipeline": INPUT_PIPELINE, "h2d": H2D_COPIES, "launch": LAUNCH_OVERHEAD, "sync": HOST_DEVICE_SYNC,
    "memory_bandwidth": MEMORY_BANDWIDTH, "compute": COMPUTE_BOUND, "activation_memory": ACTIVATION_MEMORY,
    "collectives": COLLECTIVES, "queue": INFERENCE_QUEUE, "none": NO_CLEAR_BOTTLENECK,
}

# Situations: what a rule saw in this run that makes a lever worth naming (a lever's Address may require one).
# The rule for a class reports the situations that hold; `perflab.levers.levers_for` keeps the levers whose
# address asks for none of the others.
FULL_PRECISION = "the run computes in fp32 or tf32"
CONVOLUTIONS = "the model runs convolutions"
ATTENTION = "the model runs attention"
TRAINING = "the step runs an optimizer"
NO_HOST_SYNCS = "the step does not wait for the device"
PAGEABLE_COPIES = "most input copies come from pageable memory"
CPU_AUGMENTATION = "the augmentations run per item on the CPU"
NO_WORKERS = "the DataLoader has no workers"
WITH_WORKERS = "the DataLoader has workers"
# What an anti-pattern rule (perflab/diagnose/patterns.py) found: it names the levers whose address asks for it.
UNFUSED_CHAINS = "elementwise ops run one after another, unfused"
HAND_WRITTEN_ATTENTION = "attention is written as matmul, softmax, matmul"
SINGLE_TENSOR_UPDATES = "the optimizer updates one tensor at a time"
FP32_MATMULS = "matmuls and convs run in fp32 with TF32 off"
DDP = "the ranks train through DDP"
FSDP = "the ranks train through FSDP"
# The decode rule's regimes (perflab/diagnose/decode.py): it names only the levers that ask for its regime.
DECODE_BANDWIDTH_BOUND = "the decode step reads its weights near the memory bandwidth"
DECODE_KERNEL_EFFICIENCY = "the decode step replays as one CUDA graph, its kernels reading below the bandwidth"
DECODE_LAUNCH_BOUND = "the decode step waits for the host to launch its kernels"
DECODE_COMPUTE_BOUND = "the decode step's matmuls need longer than its reads"
DECODE_REGIMES = (DECODE_BANDWIDTH_BOUND, DECODE_KERNEL_EFFICIENCY, DECODE_LAUNCH_BOUND, DECODE_COMPUTE_BOUND)

SITUATIONS = (FULL_PRECISION, CONVOLUTIONS, ATTENTION, TRAINING, NO_HOST_SYNCS, PAGEABLE_COPIES, CPU_AUGMENTATION,
              NO_WORKERS, WITH_WORKERS, DDP, FSDP, UNFUSED_CHAINS, HAND_WRITTEN_ATTENTION, SINGLE_TENSOR_UPDATES,
              FP32_MATMULS) + DECODE_REGIMES
