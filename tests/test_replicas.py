"""DDP's replicas must hold the same weights after training; a run whose ranks differ skipped its all-reduce."""
import math

import pytest
import torch
from torch import nn

from perflab.distributed.gather import RankReport, merge
from perflab.distributed.replicas import diverged, weights_checksum
from perflab.results.metrics import RankFigures


def test_equal_weights_give_equal_checksums_and_a_changed_one_does_not():
    torch.manual_seed(0)
    model = nn.Linear(16, 4)
    same = weights_checksum(model)
    assert weights_checksum(model) == same
    with torch.no_grad():
        model.weight[0, 0] += 1e-3
    assert diverged([same, weights_checksum(model)]) is not None


@pytest.mark.parametrize("checksums, differ", [
    ([12.5, 12.5], False),
    ([12.5, 12.5 * (1 + 1e-9)], False),  # the float64 sum's own order, not a different model
    ([-59.4584594, -59.4037211], True),  # the two ranks of the silenced static-graph run (gloo, CPU)
    ([12.5, None], False),  # a rank without a checksum: no evidence either way
    ([math.nan, 12.5], False),
    ([3.0], False),
])
def test_replicas_differ_only_beyond_the_sums_rounding(checksums, differ):
    reason = diverged(checksums)
    assert (reason is not None) == differ
    if differ:
        assert "rank 0: -59.4584594" in reason and "not all-reduced" in reason


def _rank(rank: int, checksum):
    from perflab.results.result import Trial
    trial = Trial(wall_s=0.4, steps=4, samples=32, throughput_samples_per_s=80.0, step_ms=[100.0] * 4, phase_ms={})
    return RankReport(RankFigures(rank=rank, step_ms_mean=100.0), [trial], [], checksum)


def test_rank_zero_marks_a_run_with_differing_replicas_invalid_and_says_why(monkeypatch):
    from perflab.distributed import gather
    monkeypatch.setattr(gather.dist, "get_backend", lambda: "gloo")  # merge runs on rank 0 of a live group
    from perflab.results import Result
    from perflab.results.metrics import Metrics
    base = Result(config={"batch_size": 8, "nproc": 2, "parallel": "ddp"}, environment={}, workload={},
                  metrics=Metrics(), trials=[])
    agreed = merge(base, [_rank(0, 5.0), _rank(1, 5.0)])
    assert agreed.status == "complete"
    drifted = merge(base, [_rank(0, 5.0), _rank(1, 5.5)])
    assert drifted.status == "invalid" and "weights differ" in drifted.status_reason
    assert drifted.status_reason in drifted.notes


def test_the_meta_replica_has_the_models_shapes_and_no_storage_and_shares_nothing_with_it():
    from perflab.levers.parallel_wrap import meta_replica
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8))
    replica = meta_replica(model)
    assert [p.shape for p in replica.parameters()] == [p.shape for p in model.parameters()]
    assert all(t.is_meta for t in [*replica.parameters(), *replica.buffers()])
    assert not any(p.is_meta for p in model.parameters())  # the live model is untouched
    assert [p.requires_grad for p in replica.parameters()] == [p.requires_grad for p in model.parameters()]


def test_a_model_that_cannot_be_copied_gets_no_replica_and_so_no_flop_count():
    import threading
    from perflab.levers.parallel_wrap import meta_replica
    model = nn.Linear(4, 4)
    model.lock = threading.Lock()  # deepcopy cannot copy a lock
    assert meta_replica(model) is None
