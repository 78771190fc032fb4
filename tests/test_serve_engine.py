"""The serve copy path: the sample pool is staged once (memory format, pinned on a GPU); each batch is copied
row by row, in one batched call, straight from it into the instance's input buffer, and every query gets the
model's output on its own sample, padded batches and several instances included."""
import threading

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from perflab.config import RunConfig
from perflab.levers.plan import build_plan
from perflab.serve.engine import ModelEngine, buckets
from perflab.serve.loadgen import run_offline, run_scheduled
from perflab.serve.pool import BatchCopier, flat_tensors, stage_pool
from perflab.serve.schedule import poisson_arrivals, sample_order
from perflab.serve.server import Server
from perflab.workloads import Workload

SAMPLES = 12


def conv_workload() -> Workload:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(2), nn.Flatten(),
                          nn.Linear(16, 5))
    images = torch.randn(SAMPLES, 3, 6, 6)
    return Workload(name="tiny-conv", model=model, dataset=TensorDataset(images, torch.zeros(SAMPLES)),
                    loss_fn=nn.CrossEntropyLoss())


def conv_plan(**levers):
    workload = conv_workload()
    cfg = RunConfig(workload="tiny-conv", device="cpu", mode="infer", batch_size=8, **levers)
    return build_plan(workload, cfg, torch.device("cpu")), workload.dataset.tensors[0]


def reference(plan, images: torch.Tensor, sample_ids) -> torch.Tensor:
    with torch.inference_mode():
        return plan.eager_model(images[torch.as_tensor(np.asarray(sample_ids))])


def test_buckets_double_up_to_the_step_then_climb_by_it_to_the_max_batch():
    assert buckets(96, 16) == [1, 2, 4, 8, 16, 32, 48, 64, 80, 96]
    assert buckets(64, 64) == [1, 2, 4, 8, 16, 32, 64]  # a step as large as the max batch: powers of two alone
    assert buckets(10, 16) == [1, 2, 4, 8, 10]
    assert buckets(1, 16) == [1]
    from perflab.serve.engine import batch_shapes
    assert batch_shapes("offline", 96, 16) == [96] and batch_shapes("single-stream", 96, 16) == [1]


def test_batch_copier_puts_each_sample_of_every_tensor_in_its_row_and_leaves_the_rest():
    images = torch.arange(10.0).repeat_interleave(3).view(10, 3)
    tokens = torch.arange(10) * 100
    buffers = [torch.full((6, 3), -1.0), torch.full((6,), -1, dtype=torch.long)]
    copier = BatchCopier(buffers, [images, tokens])
    copier.copy(np.array([4, 5, 0, 9]), non_blocking=False)
    assert buffers[0][:, 0].tolist() == [4, 5, 0, 9, -1, -1]
    assert buffers[1].tolist() == [400, 500, 0, 900, -1, -1]
    copier.copy(np.array([7]), non_blocking=False)
    assert buffers[0][:, 0].tolist() == [7, 5, 0, 9, -1, -1], "a smaller batch rewrites only its own rows"


def test_pool_is_staged_once_in_the_models_memory_format_with_tokens_untouched():
    images, tokens = torch.randn(5, 3, 4, 4), torch.arange(10).view(5, 2)
    pool = stage_pool((images, tokens), 5, torch.device("cpu"), torch.channels_last)
    staged_images, staged_tokens = pool.inputs
    assert staged_images.is_contiguous(memory_format=torch.channels_last) and torch.equal(staged_images, images)
    assert staged_tokens.is_contiguous() and torch.equal(staged_tokens, tokens)
    assert pool.count == 5 and len(pool.tensors) == 2


def test_each_query_gets_the_models_output_on_its_own_sample_in_padded_batches():
    plan, images = conv_plan(channels_last=True)
    served, addresses = [], []

    def on_results(ids, out):
        served.append((ids.copy(), out.clone()))
        addresses.append(out.data_ptr())
    pool = stage_pool(images, SAMPLES, plan.device, plan.memory_format)
    engine = ModelEngine(plan, pool, 8, buckets(8, 16), graphs=False, on_results=on_results)
    assert engine.input_buffers[0].is_contiguous(memory_format=torch.channels_last)
    batches = [np.array([3]), np.array([5, 1, 11]), np.array([0, 1, 2, 3, 4, 9]), np.array([7, 7])]
    with plan.stepping():
        for ids in batches:
            engine.serve(ids)
    assert engine.padded_samples == 0 + 1 + 2 + 0, "3 -> 4 and 6 -> 8 rows"
    for (ids, out), asked in zip(served, batches):
        np.testing.assert_array_equal(ids, asked)
        assert out.shape == (len(asked), 5), "padding rows are not handed back"
        torch.testing.assert_close(out, reference(plan, images, asked))
    assert len(set(addresses)) == 1, "results land in the instance's one output buffer, batch after batch"


def test_several_instances_answer_every_query_with_the_output_of_its_sample():
    plan, images = conv_plan()
    pool = stage_pool(images, SAMPLES, plan.device, plan.memory_format)
    answers: list[tuple[int, int, torch.Tensor]] = []
    lock = threading.Lock()

    def collect(instance: int):
        def on_results(ids, out):
            with lock:
                answers.extend((instance, int(sample), row.clone()) for sample, row in zip(ids, out))
        return on_results
    engines = [ModelEngine(plan, pool, 4, buckets(4, 16), graphs=False, on_results=collect(i)) for i in range(2)]
    server = Server(engines, plan.stepping)
    try:
        arrivals = poisson_arrivals(400.0, 0.3, 60, seed=2)
        order = sample_order(len(arrivals), SAMPLES, seed=1)
        log = run_scheduled(server, arrivals, order, max_batch=4, timeout_s=0.002)
        offline = run_offline(server, 40, sample_order(40, SAMPLES, seed=3), max_batch=4, timeout_s=0.002)
    finally:
        server.close()
    assert log.completed.all() and offline.completed.all()
    assert len(answers) == len(arrivals) + 40
    assert {instance for instance, _, _ in answers} == {0, 1}, "both instances served"
    samples = [sample for _, sample, _ in answers]
    expected = reference(plan, images, samples)
    torch.testing.assert_close(torch.stack([row for _, _, row in answers]), expected)


@pytest.mark.cuda
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compile-default"])
def test_gpu_batches_go_from_the_pinned_pool_to_the_device_buffer_and_graphs_replay_on_it(compiled):
    workload = conv_workload()
    device = torch.device("cuda")
    cfg = RunConfig(workload="tiny-conv", device="cuda", mode="infer", batch_size=8, channels_last=True,
                    cuda_graphs=True, compile="default" if compiled else None)  # compiled: the engine captures it
    plan = build_plan(workload, cfg, device)
    images = workload.dataset.tensors[0]
    pool = stage_pool(images, SAMPLES, device, plan.memory_format)
    served = []
    engine = ModelEngine(plan, pool, 8, buckets(8, 16), graphs=True,
                         on_results=lambda ids, out: served.append((ids.copy(), out.clone())))
    assert all(t.is_pinned() for t in pool.tensors), "the pool is pinned once, at load"
    assert all(buffer.is_cuda for buffer in engine.input_buffers), "no host gather buffer: inputs go to the device"
    host_tensors = [value for value in vars(engine).values() if isinstance(value, torch.Tensor) and not value.is_cuda]
    assert host_tensors == []
    with plan.stepping():
        engine.warm_up(1)
        served.clear()
        for ids in (np.array([3]), np.array([5, 1, 11]), np.array([2, 3, 4, 5, 6, 7, 8, 9])):
            copy_in_s, copy_out_s = engine.serve(ids)
            assert copy_in_s >= 0 and copy_out_s >= 0
        graph_input = flat_tensors(engine.inputs(8))[0]
        assert graph_input.data_ptr() == engine.input_buffers[0].data_ptr()
    assert all(buffer.is_pinned() for buffer in engine.output_buffers)
    for ids, out in served:
        torch.testing.assert_close(out.float(), reference(plan, images.to(device), ids).float().cpu(),
                                   rtol=2e-2, atol=2e-2)
