"""Levers that need workload cooperation or CUDA streams: refusals on CPU, equality with serial on CUDA.

The CUDA tests run each lever and its serial version from the same seed, weights and inputs, and compare
every step's loss: a missing stream wait or record would feed a step a half-written batch and show up
as a different loss. Sizes are large enough that the copies and kernels take real time.
"""
import itertools

import pytest
import torch

import perflab
from perflab.config import RunConfig
from perflab.errors import PerflabError
from perflab.harness.loop import run_steps
from perflab.levers.plan import build_plan
from perflab.prepare import resolve_config, resolve_device, seed_everything
from perflab.step.timers import NullTimer
from perflab.levers import all_levers, check_levers
from perflab.workloads import load_workload

CUDA = torch.device("cuda")
CPU = torch.device("cpu")
TINY = {
    "augment": {"image_size": "16", "max_width": "32"},
    "segmentation": {"image_size": "32", "width": "4"},
    "transformer": {"seq_len": "16", "layers": "1", "dim": "32", "heads": "2", "vocab": "64"},
    "mlp": {"in_features": "32", "hidden": "16"},
}


def lever(name: str):
    return next(lever for lever in all_levers() if lever.name == name)


def workload_for(name: str, **changes):
    cfg = RunConfig(workload=name, device="cpu", batch_size=2, workload_options=dict(TINY[name]), **changes)
    return load_workload(name, cfg), cfg


def refusal(lever_name: str, workload_name: str, device=CPU, **changes):
    workload, cfg = workload_for(workload_name, **changes)
    return lever(lever_name).refusal(cfg, workload, device)


# ---------------------------------------------------------------- refusals (CPU)

def test_stream_levers_need_cuda():
    assert "CUDA" in refusal("augment-gpu-stream", "augment", augment="gpu-stream")
    assert "CUDA" in refusal("pipeline-streams", "segmentation", pipeline="streams")
    assert "CUDA" in refusal("sdpa-flash", "transformer", sdpa="flash", precision="bf16")
    assert "CUDA" in refusal("sdpa-efficient", "transformer", sdpa="efficient")


def test_augment_is_refused_for_a_workload_without_augmentations():
    for mode in ("cpu", "gpu", "gpu-stream"):
        reason = refusal(f"augment-{mode}", "mlp", device=CUDA, augment=mode)
        assert "declares no augmentations" in reason


def test_augment_gpu_is_refused_when_the_workload_built_no_batched_augment():
    workload, cfg = workload_for("augment")  # built for --augment cpu: no gpu_augment
    assert "gpu_augment" in lever("augment-gpu").refusal(cfg.replace(augment="gpu"), workload, CPU)


def test_augment_gpu_is_allowed_on_the_cpu_device():
    assert refusal("augment-gpu", "augment", augment="gpu") is None
    assert refusal("augment-cpu", "augment", augment="cpu") is None


def test_augment_gpu_stream_refuses_a_second_feeder_and_pre_staged_batches():
    assert "--prefetcher" in refusal("augment-gpu-stream", "augment", CUDA, augment="gpu-stream", prefetcher="stream")
    assert "--data loader" in refusal("augment-gpu-stream", "augment", CUDA, augment="gpu-stream", data="device")


def test_pipeline_is_refused_without_a_frozen_stage_in_infer_mode_and_with_other_feeders():
    assert "frozen" in refusal("pipeline-streams", "mlp", CUDA, pipeline="streams")
    assert "--mode train" in refusal("pipeline-streams", "segmentation", CUDA, pipeline="streams", mode="infer")
    assert "--prefetcher" in refusal("pipeline-streams", "segmentation", CUDA, pipeline="streams",
                                     prefetcher="stream")
    assert "--data loader" in refusal("pipeline-streams", "segmentation", CUDA, pipeline="streams", data="device")
    assert refusal("pipeline-streams", "segmentation", CUDA, pipeline="streams") is None


def test_activation_checkpointing_needs_checkpointable_blocks_and_training():
    assert "checkpointable" in refusal("activation-checkpointing", "mlp", activation_checkpointing=True)
    assert "--mode train" in refusal("activation-checkpointing", "transformer", activation_checkpointing=True,
                                     mode="infer")
    assert refusal("activation-checkpointing", "transformer", activation_checkpointing=True) is None


def test_sdpa_backends_need_an_attention_workload_and_flash_needs_half_precision():
    for backend in ("flash", "efficient", "math"):
        assert "scaled_dot_product_attention" in refusal(f"sdpa-{backend}", "mlp", CUDA, sdpa=backend,
                                                         precision="bf16")
    assert "bf16" in refusal("sdpa-flash", "transformer", CUDA, sdpa="flash")
    assert refusal("sdpa-flash", "transformer", CUDA, sdpa="flash", precision="bf16") is None
    assert refusal("sdpa-math", "transformer", sdpa="math") is None


def test_a_refused_lever_stops_the_run_before_anything_is_measured():
    with pytest.raises(PerflabError, match="--pipeline streams refused"):
        perflab.run("segmentation", RunConfig(device="cpu", pipeline="streams",
                                              workload_options=dict(TINY["segmentation"])))


def test_levers_that_only_reschedule_work_do_not_trigger_the_quality_gate():
    rescheduling = ["augment-cpu", "augment-gpu", "augment-gpu-stream", "pipeline-streams",
                    "activation-checkpointing"]
    assert not any(lever(name).changes_numerics for name in rescheduling)
    assert all(lever(f"sdpa-{b}").changes_numerics for b in ("flash", "efficient", "math"))


# ---------------------------------------------------------------- CPU end to end

def test_pipelined_model_uses_precomputed_features_only_for_the_batch_they_were_made_for():
    from perflab.levers.pipeline import FeatureHandoff, PipelinedModel
    workload, _ = workload_for("segmentation")
    handoff = FeatureHandoff()
    model = PipelinedModel(workload.model, workload.trainable_stage, handoff)
    images = workload.dataset[0][0][None]
    features = workload.frozen_stage(images)
    handoff.inputs, handoff.features = images, features
    torch.testing.assert_close(model(images), workload.trainable_stage(features))
    assert handoff.features is None  # handed over once, then released
    copy = images.clone()  # e.g. the quality gate's cloned batch: the whole model runs
    torch.testing.assert_close(model(copy), workload.model(copy))


def test_sdpa_math_runs_on_cpu_inside_its_kernel_context_and_passes_the_quality_gate():
    cfg = RunConfig(workload="transformer", device="cpu", batch_size=2, steps=2, trials=1, warmup=1, sdpa="math",
                    quality_steps=2, workload_options=dict(TINY["transformer"]))
    result = perflab.run("transformer", cfg)
    assert "sdpa-math" in result.levers
    assert result.quality.verdict == "pass"


def test_a_pinned_sdpa_backend_fails_loudly_where_it_has_no_kernel():
    from perflab.backends import sdpa_context
    query = torch.randn(1, 2, 4, 8)
    with sdpa_context("math")():
        torch.nn.functional.scaled_dot_product_attention(query, query, query)
    with pytest.raises(RuntimeError):  # efficient attention has no CPU kernel: a pinned backend fails loudly
        with sdpa_context("efficient")():
            torch.nn.functional.scaled_dot_product_attention(query, query, query)


def test_activation_checkpointing_runs_end_to_end_on_cpu():
    cfg = RunConfig(workload="transformer", device="cpu", batch_size=2, steps=2, trials=1, warmup=1,
                    activation_checkpointing=True, workload_options=dict(TINY["transformer"]))
    result = perflab.run("transformer", cfg)
    assert "activation-checkpointing" in result.levers


# ---------------------------------------------------------------- CUDA: equal to serial, no race

@pytest.fixture
def deterministic_cuda(monkeypatch):
    monkeypatch.setattr(torch.backends.cudnn, "deterministic", True)
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", False)


class LossRecorder:
    """Wraps a plan's loss: keeps the last loss tensor (for a CUDA graph, the captured static one)."""

    def __init__(self, plan):
        self.loss_fn, self.last = plan.loss_fn, None
        plan.loss_fn = self

    def __call__(self, output, target):
        self.last = self.loss_fn(output, target)
        return self.last


def cuda_plan(workload: str, options: dict, **changes):
    cfg = resolve_config(RunConfig(workload=workload, device="cuda", seed=0, workload_options=options, **changes),
                         None)
    device = resolve_device(cfg.device)
    seed_everything(cfg.seed)
    workload_obj = load_workload(cfg.workload, cfg)
    return build_plan(workload_obj, cfg, device, check_levers(cfg, workload_obj, device)), cfg


def step_losses(plan, batches, steps: int) -> torch.Tensor:
    """Run the timed loop's steps one at a time; the loss each step computed, read after the run."""
    recorder = LossRecorder(plan)
    losses = []
    try:
        for _ in range(steps):
            run_steps(plan, batches, 1, NullTimer())
            losses.append(recorder.last.detach().clone())
        torch.cuda.synchronize()
    finally:
        plan.cleanup()
    return torch.stack(losses).float().cpu()


def losses_of(workload: str, options: dict, steps: int, **changes) -> torch.Tensor:
    plan, cfg = cuda_plan(workload, options, **changes)
    return step_losses(plan, plan.batches(cfg.seed), steps)


def assert_same_losses(candidate: torch.Tensor, serial: torch.Tensor) -> None:
    assert torch.isfinite(serial).all()
    assert len(serial.unique()) > 1, "every step saw the same loss: the comparison would prove nothing"
    torch.testing.assert_close(candidate, serial, rtol=1e-5, atol=1e-6)


BIG_MLP = {"in_features": "8192", "hidden": "4096"}
AUGMENT = {"image_size": "256", "max_width": "1024"}
SEGMENTATION = {"image_size": "256", "width": "32"}


@pytest.mark.cuda
def test_stream_prefetcher_losses_equal_the_plain_loader(deterministic_cuda):
    serial = losses_of("mlp", BIG_MLP, 12, batch_size=1024, data="loader")
    prefetched = losses_of("mlp", BIG_MLP, 12, batch_size=1024, data="loader", prefetcher="stream")
    assert_same_losses(prefetched, serial)


@pytest.mark.cuda
def test_stream_prefetcher_batches_equal_the_host_batches_under_load():
    from perflab.levers.prefetcher import StreamPrefetcher
    host = [torch.randn(4096, 4096).pin_memory() for _ in range(6)]
    prefetcher = StreamPrefetcher(iter(host), CUDA)
    sums = []
    for _ in range(len(host) - 1):  # the prefetcher reads one batch ahead
        batch = next(prefetcher)
        busy = batch @ batch  # keeps the compute stream busy while the next copy runs
        sums.append(batch.double().sum() + 0 * busy[0, 0])
    torch.cuda.synchronize()
    for got, expected in zip(sums, host):
        torch.testing.assert_close(got.cpu(), expected.double().sum())


@pytest.mark.cuda
def test_gpu_augmentation_on_cuda_equals_the_same_parameters_on_cpu():
    from perflab.workloads.augment import BatchAugment
    images = torch.randint(0, 256, (64, 3, 256, 256), dtype=torch.uint8)
    augmenter = BatchAugment(256, seed=0)
    params = augmenter.draw(images.to(CUDA))
    on_gpu = augmenter.apply(images.to(CUDA), params)
    on_cpu = augmenter.apply(images, {name: value.cpu() for name, value in params.items()})
    assert on_gpu.shape == (64, 3, 256, 256) and on_gpu.dtype == torch.float32
    differs = (on_gpu.cpu() - on_cpu).abs() > 1e-3
    # A few pixels exactly on a rotated crop edge may fall on either side of it on either device.
    assert differs.float().mean() < 1e-4


@pytest.mark.cuda
def test_gpu_augmentation_trains_and_gpu_stream_losses_equal_it(deterministic_cuda):
    serial = losses_of("augment", AUGMENT, 10, batch_size=64, augment="gpu")
    streamed = losses_of("augment", AUGMENT, 10, batch_size=64, augment="gpu-stream")
    assert_same_losses(streamed, serial)


@pytest.mark.cuda
def test_gpu_stream_augmented_batches_equal_serial_augmentation():
    serial_plan, cfg = cuda_plan("augment", AUGMENT, batch_size=64, augment="gpu")
    stream_plan, _ = cuda_plan("augment", AUGMENT, batch_size=64, augment="gpu-stream")
    serial_batches, streamed_batches = serial_plan.batches(cfg.seed), stream_plan.batches(cfg.seed)
    for _ in range(6):
        expected = serial_plan.gpu_transform(serial_plan.to_device(next(serial_batches)))
        got = next(streamed_batches)
        torch.nn.functional.conv2d(got[0], torch.randn(64, 3, 7, 7, device=CUDA))  # compute-stream load
        torch.testing.assert_close(got[0], expected[0])
        torch.testing.assert_close(got[1], expected[1])


@pytest.mark.cuda
@pytest.mark.parametrize("batch", [8, 32])
def test_pipelined_encoder_losses_equal_the_serial_step(deterministic_cuda, batch):
    serial = losses_of("segmentation", SEGMENTATION, 8, batch_size=batch)
    pipelined = losses_of("segmentation", SEGMENTATION, 8, batch_size=batch, pipeline="streams")
    assert_same_losses(pipelined, serial)


@pytest.mark.cuda
def test_pipelined_decoder_weights_equal_the_serial_ones(deterministic_cuda):
    plans = [cuda_plan("segmentation", SEGMENTATION, batch_size=16, **changes)
             for changes in ({}, {"pipeline": "streams"})]
    for plan, cfg in plans:
        run_steps(plan, plan.batches(cfg.seed), 6, NullTimer())
        plan.cleanup()
    torch.cuda.synchronize()
    (serial, _), (pipelined, _) = plans
    for a, b in zip(serial.workload.trainable_stage.parameters(), pipelined.workload.trainable_stage.parameters()):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)


@pytest.mark.cuda
def test_cuda_graph_replays_equal_eager_steps(deterministic_cuda):
    options = {"in_features": "4096", "hidden": "2048"}
    graph_plan, cfg = cuda_plan("mlp", options, batch_size=512, data="device", cuda_graphs=True)
    batches = list(itertools.islice(graph_plan.batches(cfg.seed), 8))
    graphed = step_losses(graph_plan, iter(batches), len(batches))
    eager_plan, _ = cuda_plan("mlp", options, batch_size=512, data="device")
    # The eager iterations the graph needs before capture are undone, so step for step the same training.
    eager = step_losses(eager_plan, iter(batches), len(batches))
    assert_same_losses(graphed, eager)


@pytest.mark.cuda
def test_sdpa_backends_agree_with_math_on_cuda():
    from perflab.backends import sdpa_context
    q, k, v = (torch.randn(4, 8, 512, 64, device=CUDA, dtype=torch.bfloat16) for _ in range(3))
    with sdpa_context("math")():
        reference = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    for backend in ("flash", "efficient"):
        with sdpa_context(backend)():
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        torch.testing.assert_close(out, reference, atol=2e-2, rtol=2e-2)
