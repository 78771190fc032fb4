"""Which rank this process is, and decisions every rank must take alike. Outside a multi-process run: rank 0 of 1.

Read by every stage (the harness sizes trials alike on all ranks, the pipeline gathers on rank 0, the CLI prints
on rank 0), so it depends on nothing of perflab's.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

# The launcher's pid, in every rank's environment: a rank whose parent it no longer is exits
# (distributed/rank.py), and the interference probe counts the launcher's other ranks as this run's own work
LAUNCHER_PID_ENV = "PERFLAB_LAUNCHER_PID"


def in_rank() -> bool:
    """True inside a rank that perflab launched (the process group is up)."""
    return dist.is_available() and dist.is_initialized()


def world_size() -> int:
    """Ranks in this run (1 outside a rank)."""
    return dist.get_world_size() if in_rank() else 1


def is_primary() -> bool:
    """Rank 0, or a single-process run: the process that writes results and prints."""
    return not in_rank() or dist.get_rank() == 0


def needs_launch(cfg) -> bool:
    """A config that asks for several ranks, seen from outside a rank: the launcher must start them."""
    return (cfg.nproc > 1 or cfg.nnodes > 1) and not in_rank()


def agree_any(flag: bool) -> bool:
    """True on every rank when it is True on any rank (a decision that changes how many steps run)."""
    return bool(_all_reduce_max(int(flag))) if in_rank() else flag


def agree_max(value: int) -> int:
    """The largest of the ranks' values, on every rank (e.g. steps per trial sized by time)."""
    return _all_reduce_max(value) if in_rank() else value


def _all_reduce_max(value: int) -> int:
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else "cpu"
    tensor = torch.tensor([value], dtype=torch.int64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return int(tensor.item())
