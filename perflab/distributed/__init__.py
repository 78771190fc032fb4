"""Multi-process runs: perflab starts N ranks through torchrun's launcher; each rank runs the same harness.

    launch.py       the parent: checks, then torch.distributed.run with `python -m perflab <command> ...` as ranks
    rank.py         inside a rank: process group (NCCL on CUDA, gloo on CPU), device, failures to the error file
    wrap.py         DDP or FSDP2 fully_shard around the plan's model (through the data-parallel lever)
    gather.py       rank 0 gathers every rank's figures into one result.json
    quality.py      the N-rank loss trajectory against one process on the same global batch

Which rank this process is (perflab/ranks.py), the trace analysis of collectives (perflab/diagnose/communication.py)
and `perflab scale` (perflab/sweep/scale.py) live with the stages that use them.
"""
