"""The launcher side of a multi-process run: check what can be checked here, then start the ranks with
torch.distributed.run (torchrun's own launcher, in this process) running perflab itself in rank mode:

    python -u -m perflab <run|profile> <the run's options> --out DIR --nproc-rank-mode

Rank 0 writes DIR/result.json; this side loads it. A rank that fails takes the others down (torchrun stops
the group when one worker exits non-zero) and its error, read from torchrun's error files, becomes one
PerflabError here: its message, and its traceback when it was not a user mistake.
"""
from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import sys
import tempfile
from pathlib import Path
from typing import Iterator, Optional, Sequence

import torch

from perflab import options
from perflab.config import RunConfig
from perflab.distributed.rank import RANK_MODE_FLAG, TIMEOUT_ENV, RankError
from perflab.errors import PerflabError, Terminated
from perflab.ranks import LAUNCHER_PID_ENV
from perflab.results import Result
from perflab.levers import active_levers

MONITOR_INTERVAL_S = 0.1  # how often torchrun looks at its ranks: a failure stops the others this fast
PORT_IN_USE = ("address already in use", "eaddrinuse", "errno 98")


class RankFailedError(PerflabError):
    """A rank raised or died: the run is over; `exit_code` is 2 for a user mistake in a rank, 3 for an
    out-of-memory (docs/memory.md), else 1."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


def check_launch(cfg: RunConfig) -> None:
    """What must hold before any rank starts: enough GPUs, NCCL on CUDA, a free rendezvous port on node 0,
    a node rank that fits, and the option table's refusals of the active levers."""
    import torch.distributed as dist
    if not dist.is_available():
        raise PerflabError("--nproc: this torch build has no torch.distributed; install a build with it")
    check_visible_gpus(cfg.nproc, cfg.device)
    if cfg.device == "cuda":
        if not dist.is_nccl_available():
            raise PerflabError("--nproc on CUDA needs NCCL and this torch build has none; install a CUDA build "
                               "of torch with NCCL, or use --device cpu (gloo)")
    if cfg.node_rank >= cfg.nnodes:
        raise PerflabError(f"--node-rank {cfg.node_rank} must be below --nnodes {cfg.nnodes} (nodes count from 0)")
    if cfg.rdzv_endpoint is not None:
        _, port = parse_endpoint(cfg.rdzv_endpoint)
        if cfg.node_rank == 0:
            check_port_free(port, cfg.rdzv_endpoint)
    for lever in active_levers(cfg):
        reason = options.refusal(cfg, lever.option, cfg.device)
        if reason:
            raise PerflabError(f"{lever.flag} refused: {reason}")


def check_visible_gpus(nproc: int, device: str) -> None:
    """One GPU per rank: on CUDA (asked for, or chosen by auto) the node must show at least --nproc GPUs; on CPU
    (gloo) at least --nproc CPUs (more ranks than CPUs measure the scheduler, and 1000 would swamp the machine)."""
    if device == "cpu" or (device == "auto" and not torch.cuda.is_available()):
        cpus = os.cpu_count() or 1
        if nproc > cpus:
            raise PerflabError(f"--nproc {nproc} on CPU starts {nproc} gloo ranks and this machine has {cpus} "
                               f"CPU(s); use --nproc {cpus} or fewer")
        return
    visible = torch.cuda.device_count()
    if nproc > visible:
        raise PerflabError(f"--nproc {nproc} needs {nproc} GPUs on this node and {visible} are visible "
                           f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}); use "
                           f"--nproc {visible} or fewer, or --device cpu" if visible else
                           f"--nproc {nproc} needs {nproc} GPUs on this node and none is visible; use --device cpu")


def parse_endpoint(endpoint: str) -> tuple[str, int]:
    """HOST:PORT -> (host, port), or PerflabError saying the expected form."""
    host, sep, port = endpoint.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise PerflabError(f"--rdzv-endpoint {endpoint!r} must be HOST:PORT, e.g. node0.example:29500")
    return host, int(port)


def check_port_free(port: int, endpoint: str) -> None:
    """Node 0 hosts the rendezvous store on `port`: refuse at once if something already listens there."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a closed socket in TIME_WAIT is not in use
        try:
            probe.bind(("", port))
        except OSError:
            raise PerflabError(f"--rdzv-endpoint {endpoint}: port {port} is already in use on this machine "
                               "(another torchrun or perflab run?); choose a free port") from None


def torchrun_argv(cfg: RunConfig, log_dir: str) -> list[str]:
    """torchrun's own arguments for this run, the module to start being perflab."""
    argv = ["--nproc-per-node", str(cfg.nproc), "--nnodes", str(cfg.nnodes), "--max-restarts", "0",
            "--monitor-interval", str(MONITOR_INTERVAL_S), "--log-dir", log_dir]
    if cfg.rdzv_endpoint is None:
        argv.append("--standalone")  # one node, a free local port chosen by torchrun
    else:
        argv += ["--rdzv-backend", "static", "--rdzv-endpoint", cfg.rdzv_endpoint, "--node-rank", str(cfg.node_rank)]
    return argv + ["--module", "perflab"]


def rank_argv(cfg: RunConfig, command: str, out: Path, extra: Sequence[str]) -> list[str]:
    """The rank's command line after `python -m perflab`: the same command and options, in rank mode."""
    return [command, *cfg.to_argv(command), "--out", str(out), *extra, RANK_MODE_FLAG]


def launch(cfg: RunConfig, command: str, out: Path, extra: Sequence[str] = (),
           recorded_command: Optional[list[str]] = None) -> Optional[Result]:
    """Start the ranks of `perflab <command>` for a resolved config and return rank 0's gathered result
    (None on a node other than node 0: node 0 writes the result)."""
    check_launch(cfg)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    _torchrun(cfg, rank_argv(cfg, command, out, extra))
    if cfg.node_rank != 0:
        return None
    result = Result.load(out)
    result.command = list(recorded_command if recorded_command is not None else sys.argv)
    result.save(out)
    return result


def start_ranks(cfg: RunConfig, rank_args: Sequence[str]) -> None:
    """Check, then run `python -m perflab <rank_args>` in cfg.nproc ranks per node through torchrun, until every
    rank has finished; the first rank's failure is raised as one RankFailedError. `rank_args` ends in rank mode
    (RANK_MODE_FLAG); `perflab calibrate --collectives` starts its ranks here too."""
    check_launch(cfg)
    _torchrun(cfg, rank_args)


def _torchrun(cfg: RunConfig, rank_args: Sequence[str]) -> None:
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    with tempfile.TemporaryDirectory(prefix="perflab-torchrun-") as log_dir, _launcher_environment(cfg):
        args = torchrun.parse_args(torchrun_argv(cfg, log_dir))
        # set after parsing: torchrun's parser would read the rank's --nproc as an abbreviation of its own
        args.training_script_args = list(rank_args)
        try:
            torchrun.run(args)
        except ChildFailedError as err:
            raise rank_failure(err) from None
        except _signal_exception() as err:  # torchrun's own handlers caught SIGINT or SIGTERM
            raise (Terminated() if getattr(err, "sigval", None) == signal.SIGTERM else KeyboardInterrupt()) from err
        except Exception as err:  # rendezvous and store errors arrive as several torch types
            if any(text in str(err).lower() for text in PORT_IN_USE):
                raise PerflabError(f"the rendezvous port is in use ({cfg.rdzv_endpoint or 'local'}): choose "
                                   "another --rdzv-endpoint port") from None
            raise


def rank_failure(err) -> RankFailedError:
    """The first rank to fail (by the time its error was recorded), as one message. A rank ended by SIGTERM with no
    error file was stopped by the launcher because another had failed: it comes last whatever its time (torch
    records that time in whole seconds, which can sort it before the failure that caused it)."""
    failures = err.failures
    rank = min(failures, key=lambda r: (_stopped_by_launcher(failures[r]), _failure_time(failures[r])))
    failure = failures[rank]
    error = _rank_error(failure)
    if error is None:  # no error file: killed by a signal, or died before it could write one
        return RankFailedError(f"rank {rank} (pid {failure.pid}) died: {failure.message}", 1)
    if error.rank_stalled:  # a timeout is not a user mistake: exit 1, one line
        return RankFailedError(f"rank {rank}: {error.message.partition(': ')[2]}", 1)
    if error.perflab_error:
        exit_code = int(error.exit_code) if error.exit_code is not None else 2
        return RankFailedError(f"rank {rank}: {error.message.partition(': ')[2]}", exit_code)
    callstack = (error.py_callstack or error.message).rstrip()
    return RankFailedError(f"rank {rank} (pid {failure.pid}) failed with exit code {failure.exitcode}; its "
                           f"traceback:\n{callstack}", 1)


def _stopped_by_launcher(failure) -> bool:
    return not isinstance(failure.message, dict) and failure.exitcode == -signal.SIGTERM


def _rank_error(failure) -> Optional[RankError]:
    """The rank's error file as the launcher read it; None where it wrote none."""
    return RankError.from_dict(failure.message) if isinstance(failure.message, dict) else None


def _failure_time(failure) -> float:
    error = _rank_error(failure)
    return float((error.time_ns if error is not None else None) or failure.timestamp * 1e9)


def _signal_exception():
    from torch.distributed.elastic.multiprocessing.api import SignalException
    return SignalException


@contextlib.contextmanager
def _launcher_environment(cfg: RunConfig) -> Iterator[None]:
    """What the launch wears: CPU threads shared between the ranks (torchrun would say 1 and warn), its
    logging silenced (the one message is ours), and this process's signal handlers restored afterwards.

    NCCL_NVLS_ENABLE / TORCH_SYMM_MEM_DISABLE_MULTICAST and every other variable pass to the ranks as set."""
    saved_env = {name: os.environ.get(name) for name in ("OMP_NUM_THREADS", "PYTHONPATH", TIMEOUT_ENV,
                                                         LAUNCHER_PID_ENV)}
    os.environ[TIMEOUT_ENV] = repr(float(cfg.rank_timeout_s))
    os.environ[LAUNCHER_PID_ENV] = str(os.getpid())  # torchrun starts the ranks from this process
    saved_handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    if saved_env["OMP_NUM_THREADS"] is None:
        os.environ["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // cfg.nproc))
    # the ranks import this perflab, wherever it was imported from (an installed package or a checkout)
    source = str(Path(__file__).resolve().parents[2])  # perflab/distributed/launch.py -> the folder holding perflab
    os.environ["PYTHONPATH"] = os.pathsep.join([source, *filter(None, [saved_env["PYTHONPATH"]])])
    logging.disable(logging.ERROR)
    try:
        yield
    finally:
        logging.disable(logging.NOTSET)
        for sig, handler in saved_handlers.items():
            signal.signal(sig, handler)
        for name, value in saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
