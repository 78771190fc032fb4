"""Multi-process runs: perflab starts N ranks through torchrun's launcher; each rank runs the same harness.

    launch.py       the parent: checks, then torch.distributed.run with `python -m perflab <command> ...` as ranks
    rank.py         inside a rank: process group (NCCL on CUDA, gloo on CPU), device, failures to the error file
    gather.py       rank 0 gathers every rank's figures into one result.json

Which rank this process is (perflab/ranks.py), the DDP / FSDP2 wrapping (perflab/levers/parallel_wrap.py), the
N-rank quality gate (perflab/quality/ranks.py), the trace analysis of collectives (perflab/diagnose/communication.py)
and `perflab scale` (perflab/sweep/scale.py) live with the stages that use them.
"""
