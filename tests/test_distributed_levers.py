"""The levers for exposed communication: each one reaches DDP or FSDP2 as declared (2 gloo ranks on CPU), is refused
with a reason where it cannot act, and tune searches the numeric ones over a few values."""
import socket
from types import SimpleNamespace

import pytest
import torch
import torch.multiprocessing as mp
from torch import nn

from perflab.config import RunConfig
from perflab.errors import PerflabError
from perflab.levers import all_levers
from perflab.levers import parallel_wrap
from perflab.levers.parallel_wrap import mixed_precision_policy, set_prefetch, wrap_ddp, wrap_fsdp
from perflab.tune.candidates import ALTERNATIVES, Proposal, expand

LEVERS = {lever.name: lever for lever in all_levers()}


class Blocks(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(8, 8) for _ in range(3))
        self.head = nn.Linear(8, 2)
        self.register_buffer("running", torch.zeros(8))

    def forward(self, x):
        for block in self.blocks:
            x = torch.relu(block(x))
        return self.head(x)


def _plan(model, options):
    return SimpleNamespace(model=model, device=torch.device("cpu"), parallel_options=options, eager_model=model,
                           optimizer=torch.optim.SGD(model.parameters(), lr=0.1), skip_gradient_sync=None)


def _fsdp_state(module):
    return module._get_fsdp_state()  # noqa: SLF001 - where FSDP2 keeps what fully_shard was told


def _ranks(rank: int, world: int, port: int, found: dict) -> None:
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        torch.manual_seed(0)
        plan = _plan(Blocks(), {"param_dtype": "bf16", "reduce_dtype": "bf16", "no_reshard_last": 1, "prefetch": 2,
                                "compile_blocks": True, "reshard_after_forward": True})
        blocks = list(plan.model.blocks)
        wrap_fsdp(plan)
        compiled = [block._compiled_call_impl is not None for block in blocks]  # noqa: SLF001
        for block in blocks:  # compiling on CPU takes a C++ toolchain and minutes: the wiring is what is tested
            block._compiled_call_impl = None  # noqa: SLF001
        out = plan.model(torch.randn(4, 8))
        out.float().sum().backward()
        plan.optimizer.step()
        groups = [_fsdp_state(block)._fsdp_param_group for block in blocks]  # noqa: SLF001
        ddp = _plan(Blocks(), {"broadcast_buffers": False, "bucket_cap_mb": 1.0})
        wrap_ddp(ddp)
        if rank == 0:
            found.update(
                output_dtype=str(out.dtype),
                reshard=[group.post_forward_mesh_info is not None for group in groups],
                forward_prefetch=[len(_fsdp_state(block)._states_to_forward_prefetch) for block in blocks],  # noqa: SLF001
                backward_prefetch=[len(_fsdp_state(block)._states_to_backward_prefetch) for block in blocks],  # noqa: SLF001
                reduce_dtype=str(groups[0].mp_policy.reduce_dtype),
                compiled_before_sharding=compiled,
                ddp_broadcast_buffers=ddp.model.broadcast_buffers,
                grad_dtype=str(next(plan.model.parameters()).grad.dtype))
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_fsdp_and_ddp_levers_reach_the_wrappers_on_two_gloo_ranks():
    manager = mp.Manager()
    found = manager.dict()
    mp.spawn(_ranks, args=(2, _free_port(), found), nprocs=2)
    assert found["output_dtype"] == "torch.bfloat16"  # parameters all-gathered and computed in bf16
    assert found["reduce_dtype"] == "torch.bfloat16"
    assert found["grad_dtype"] == "torch.float32"  # the sharded master parameters stay fp32
    assert found["reshard"] == [True, True, False]  # the last block keeps its gathered parameters
    assert found["forward_prefetch"] == [2, 1, 0] and found["backward_prefetch"] == [0, 1, 2]
    assert found["compiled_before_sharding"] == [True, True, True]
    assert found["ddp_broadcast_buffers"] is False


def test_bf16_parameters_reduce_in_fp32_unless_told_otherwise():
    policy = mixed_precision_policy("bf16", None)
    assert (policy.param_dtype, policy.reduce_dtype) == (torch.bfloat16, torch.float32)
    assert mixed_precision_policy(None, "bf16").param_dtype is None
    assert mixed_precision_policy(None, None) is None


def test_prefetch_names_the_next_blocks_forward_and_the_previous_ones_backward():
    class Block:
        def set_modules_to_forward_prefetch(self, blocks):
            self.ahead = blocks

        def set_modules_to_backward_prefetch(self, blocks):
            self.behind = blocks
    blocks = [Block() for _ in range(4)]
    set_prefetch(blocks, 2)
    assert blocks[0].ahead == blocks[1:3] and blocks[2].ahead == [blocks[3]] and not hasattr(blocks[3], "ahead")
    assert blocks[3].behind == [blocks[2], blocks[1]] and not hasattr(blocks[0], "behind")


FSDP2 = dict(nproc=2, parallel="fsdp")


@pytest.mark.parametrize("changes, message", [
    (dict(nproc=2, fsdp_prefetch=1), "is an FSDP setting"),
    (dict(nproc=2, fsdp_param_dtype="bf16"), "is an FSDP setting"),
    (dict(fsdp_reduce_dtype="bf16"), "is an FSDP setting"),
    (dict(FSDP2, fsdp_compile_blocks=True, compile="default"), "drop --compile"),
    (dict(FSDP2, fsdp_param_dtype="fp32"), "must be one of bf16"),
])
def test_fsdp_settings_are_refused_where_they_cannot_act(changes, message):
    with pytest.raises(PerflabError, match=message):
        RunConfig(**changes).validate()


def test_no_broadcast_buffers_is_a_ddp_setting_with_ranks():
    lever = LEVERS["no-broadcast-buffers"]
    cpu = torch.device("cpu")
    assert "DDP setting" in lever.refusal(RunConfig(**FSDP2, broadcast_buffers=False), None, cpu)
    assert "--nproc 2 or more" in lever.refusal(RunConfig(broadcast_buffers=False), None, cpu)
    assert lever.refusal(RunConfig(nproc=2, broadcast_buffers=False), None, cpu) is None


def test_explicit_prefetch_is_refused_with_a_reason_on_a_torch_without_it(monkeypatch):
    from perflab.levers import distributed
    monkeypatch.setattr(distributed, "has_explicit_prefetch", lambda: False)
    reason = LEVERS["fsdp-prefetch"].refusal(RunConfig(**FSDP2, fsdp_prefetch=1), None, torch.device("cpu"))
    assert "torch 2.5 or later" in reason
    assert parallel_wrap.has_explicit_prefetch()  # this torch has it


def test_per_block_compile_keeps_compilation_out_of_the_numbers():
    reason = LEVERS["fsdp-compile-blocks"].refusal(RunConfig(**FSDP2, fsdp_compile_blocks=True, warmup=1), None,
                                                   torch.device("cpu"))
    assert "--warmup 2" in reason


def test_tune_searches_the_bucket_size_and_the_prefetch_depth_over_a_few_values():
    start = RunConfig(nproc=2)
    bucket = expand(Proposal("ddp-bucket-size", "collectives", 0.9, 40.0), LEVERS["ddp-bucket-size"], start, 2)
    assert [c.value for c in bucket] == [5.0, 50.0, 100.0] and {c.search for c in bucket} == {ALTERNATIVES}
    prefetch = expand(Proposal("fsdp-prefetch", "collectives", 0.9, 40.0), LEVERS["fsdp-prefetch"],
                      RunConfig(**FSDP2, fsdp_prefetch=1), 2)
    assert [c.value for c in prefetch] == [2]


def test_fsdp_levers_run_end_to_end_in_two_gloo_ranks(tmp_path):
    from perflab.cli import main
    from perflab.results import Result
    out = tmp_path / "run"
    assert main(["run", "--workload", "transformer", "--option", "size=tiny", "--option", "seq_len=16", "--batch", "2",
                 "--steps", "2", "--warmup", "1", "--trials", "1", "--device", "cpu", "--nproc", "2",
                 "--parallel", "fsdp", "--fsdp-param-dtype", "bf16", "--fsdp-reduce-dtype", "bf16",
                 "--fsdp-prefetch", "1", "--fsdp-no-reshard-last", "1", "--no-check-quality", "--out", str(out)]) == 0
    result = Result.load(out)
    assert result.world_size == 2
    assert {"fsdp-bf16-params", "fsdp-bf16-reduce", "fsdp-prefetch", "fsdp-no-reshard-last"} <= set(result.levers)


@pytest.mark.cuda
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs (device kind nvidia-h100-x2)")
def test_two_gpus_run_fsdp2_with_every_lever_and_profile_its_collectives_by_kind(tmp_path):
    import json
    from perflab.cli import main
    out = tmp_path / "fsdp"
    assert main(["profile", "--workload", "transformer", "--option", "size=tiny", "--nproc", "2", "--device", "cuda",
                 "--parallel", "fsdp", "--precision", "bf16", "--fsdp-param-dtype", "bf16", "--fsdp-prefetch", "1",
                 "--fsdp-no-reshard-last", "1", "--fsdp-compile-blocks", "--no-check-quality", "--batch", "4",
                 "--steps", "8", "--warmup", "2", "--trials", "1", "--out", str(out)]) == 0
    result = json.loads((out / "result.json").read_text())
    by_kind = result["metrics"]["collectives"]["by_kind"]
    assert "all_gather" in by_kind and "reduce_scatter" in by_kind
    assert {"fsdp-compile-blocks", "fsdp-prefetch"} <= set(result["levers"])


def test_ddp_with_every_lever_still_all_reduces_on_two_gloo_ranks(tmp_path):
    """static_graph=True once went silent after perflab's FLOP count (a backward through the unwrapped module before
    DDP's first forward): no all-reduce at all, the replicas drifted apart, and the run looked 2x faster."""
    from perflab.cli import main
    from perflab.results import Result
    out = tmp_path / "ddp"
    assert main(["run", "--workload", "transformer", "--option", "size=tiny", "--option", "seq_len=16", "--batch", "2",
                 "--steps", "3", "--warmup", "1", "--trials", "1", "--device", "cpu", "--nproc", "2",
                 "--static-graph", "--gradient-as-bucket-view", "--ddp-bucket-mb", "1", "--no-check-quality",
                 "--out", str(out)]) == 0
    result = Result.load(out)
    assert result.status == "complete", result.status_reason
    assert {"static-graph", "gradient-as-bucket-view"} <= set(result.levers)


@pytest.mark.cuda
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs (device kind nvidia-h100-x2)")
def test_two_gpus_run_ddp_with_every_lever_and_its_all_reduce_is_in_the_trace(tmp_path):
    import json
    from perflab.cli import main
    out = tmp_path / "ddp"
    assert main(["profile", "--workload", "transformer", "--option", "size=tiny", "--nproc", "2", "--device", "cuda",
                 "--precision", "bf16", "--static-graph", "--gradient-as-bucket-view", "--ddp-comm-hook", "bf16",
                 "--no-check-quality", "--batch", "4", "--steps", "8", "--warmup", "2", "--trials", "1",
                 "--out", str(out)]) == 0
    result = json.loads((out / "result.json").read_text())
    assert result["status"] == "complete", result["status_reason"]
    assert "all_reduce" in result["metrics"]["collectives"]["by_kind"]
