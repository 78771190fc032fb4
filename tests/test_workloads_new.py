"""The seed-004 and attention workloads: they run end to end, and their parts do what they claim."""
import pytest
import torch
import torchvision.transforms.v2.functional as TF
from torch.utils.data import default_collate

import perflab
from perflab.config import RunConfig
from perflab.workloads import BUILTIN_MODULES, builtin_descriptions, default_batch
from perflab.workloads import augment as augment_workload
from perflab.workloads import driving, segmentation, transformer
from perflab.workloads.augment import BatchAugment

TINY = {
    "segmentation": {"image_size": "32", "width": "4"},
    "augment": {"image_size": "16", "max_width": "32"},
    "transformer": {"seq_len": "16", "layers": "1", "dim": "32", "heads": "2", "vocab": "64"},
    "driving": {"image_res": "32", "width": "8"},
}


def tiny_config(workload: str, mode: str = "train", **changes) -> RunConfig:
    return RunConfig(workload=workload, mode=mode, device="cpu", batch_size=2, steps=2, trials=2, warmup=1,
                     workload_options=dict(TINY[workload]), **changes)


@pytest.mark.parametrize("name", ["segmentation", "augment", "transformer"])
def test_new_workloads_are_registered_with_description_and_default_batches(name):
    assert name in BUILTIN_MODULES
    assert builtin_descriptions()[name]
    assert default_batch(name, "cpu") <= default_batch(name, "cuda")


@pytest.mark.parametrize("mode", ["train", "infer"])
@pytest.mark.parametrize("name, levers", [
    ("segmentation", {}),
    ("augment", {}),
    ("augment", {"augment": "gpu"}),
    ("transformer", {}),
    ("driving", {"augment": "gpu"}),
])
def test_workload_runs_end_to_end_on_cpu(name, levers, mode):
    result = perflab.run(name, tiny_config(name, mode, **levers))
    assert result.throughput > 0
    assert result.workload["name"] == name
    if levers.get("augment") == "gpu":
        assert "augment-gpu" in result.levers
        assert result.metrics.phases_ms["augment"] > 0


def test_augment_cpu_pipeline_runs_in_dataloader_workers():
    result = perflab.run("augment", tiny_config("augment", augment="cpu", workers=1))
    assert {"workers", "augment-cpu"} <= set(result.levers)


def test_segmentation_encoder_is_frozen_and_stays_in_eval_mode_while_training():
    workload = segmentation.build(tiny_config("segmentation"))
    workload.model.train()
    assert workload.frozen_stage is workload.model.encoder and workload.trainable_stage is workload.model.decoder
    assert not workload.frozen_stage.training and workload.trainable_stage.training
    assert not any(p.requires_grad for p in workload.frozen_stage.parameters())
    assert all(p.requires_grad for p in workload.trainable_stage.parameters())
    images, labels = default_collate([workload.dataset[i] for i in range(2)])
    assert images.dtype == torch.uint8 and labels.shape == (2, 32, 32)
    logits = workload.model(images)
    assert logits.shape == (2, 10, 32, 32)
    torch.testing.assert_close(logits, workload.trainable_stage(workload.frozen_stage(images)))


def test_batched_augment_gives_each_sample_its_own_crop_rotation_and_blur():
    same_image = torch.randint(0, 256, (1, 3, 32, 32), dtype=torch.uint8).expand(6, 3, 32, 32).contiguous()
    augmenter = BatchAugment(32, seed=0)
    params = augmenter.draw(same_image)
    out = augmenter.apply(same_image, params)
    assert out.shape == (6, 3, 32, 32) and out.dtype == torch.float32
    for name in ("top", "left", "angle_deg", "sigma"):
        assert params[name].unique().numel() > 1, f"{name} is the same for every sample"
    assert params["angle_deg"].abs().max() <= 45 and params["sigma"].min() >= 0.1
    flat = out.flatten(1)
    assert all(not torch.allclose(flat[0], flat[i]) for i in range(1, 6))


def test_batched_augment_is_reproducible_from_its_seed():
    images = torch.randint(0, 256, (4, 3, 16, 16), dtype=torch.uint8)
    torch.testing.assert_close(BatchAugment(16, seed=3).augment(images), BatchAugment(16, seed=3).augment(images))
    assert not torch.allclose(BatchAugment(16, seed=3).augment(images), BatchAugment(16, seed=4).augment(images))


def test_batched_crop_and_resize_match_torchvision_per_sample():
    images = torch.randint(0, 256, (4, 3, 32, 32), dtype=torch.uint8)
    plain = BatchAugment(32, seed=0, degrees=0.0, blur_kernel=1, mean=(0, 0, 0), std=(1, 1, 1))
    params = plain.draw(images)
    out = plain.apply(images, params)
    for i in range(4):
        crop = TF.crop(images[i].float() / 255, int(params["top"][i]), int(params["left"][i]), 16, 16)
        torch.testing.assert_close(out[i], TF.resize(crop, [32, 32], antialias=True), atol=1e-5, rtol=0)


def test_batched_blur_matches_torchvision_gaussian_blur_per_sample():
    images = torch.randint(0, 256, (3, 3, 16, 16), dtype=torch.uint8)
    augmenter = BatchAugment(16, seed=0)
    pixels = images.float() / 255
    sigma = torch.tensor([0.3, 1.0, 2.0])
    out = augmenter.blur(pixels, sigma)
    for i in range(3):
        expected = TF.gaussian_blur(pixels[i], [7, 7], [float(sigma[i])] * 2)
        torch.testing.assert_close(out[i], expected, atol=1e-5, rtol=0)


def test_batched_augment_matches_the_cpu_pipeline_in_distribution():
    pool = augment_workload.RandomImages(pool=16, image_size=32, classes=10, seed=0)
    images = pool.images
    cpu = augment_workload.cpu_pipeline(32)
    torch.manual_seed(0)
    per_sample = torch.stack([cpu(image) for image in images])
    batched = BatchAugment(32, seed=0).augment(images)
    assert per_sample.shape == batched.shape
    assert abs(per_sample.mean() - batched.mean()) < 0.05
    assert abs(per_sample.std() / batched.std() - 1) < 0.05


def test_driving_device_preprocessing_equals_the_per_sample_cpu_path():
    cfg = tiny_config("driving")
    on_cpu = driving.build(cfg)
    on_device = driving.build(cfg.replace(augment="gpu"))
    assert on_device.supports_augment and on_device.gpu_augment is not None
    raw = default_collate([on_device.dataset[i] for i in range(3)])
    assert raw[0]["images"].dtype == torch.uint8
    inputs, target = on_device.gpu_augment(raw)
    expected = default_collate([on_cpu.dataset[i] for i in range(3)])
    torch.testing.assert_close(inputs["images"], expected[0]["images"], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(target, expected[1])


def test_transformer_honours_seq_len_and_predicts_the_next_token():
    workload = transformer.build(tiny_config("transformer"))
    tokens, targets = workload.dataset[5]
    assert tokens.shape == (16,) and torch.equal(tokens[1:], targets[:-1])
    logits = workload.model(tokens[None])
    assert logits.shape == (1, 16, 64)
    assert workload.uses_attention and workload.supports_activation_checkpointing


def test_transformer_attention_is_causal():
    workload = transformer.build(tiny_config("transformer"))
    workload.model.eval()
    tokens = workload.dataset[0][0][None]
    changed = tokens.clone()
    changed[0, -1] = (changed[0, -1] + 1) % 64
    torch.testing.assert_close(workload.model(tokens)[:, :-1], workload.model(changed)[:, :-1])


def test_activation_checkpointing_gives_the_same_loss_and_gradients():
    def loss_and_grads(checkpointing: bool):
        torch.manual_seed(0)
        workload = transformer.build(tiny_config("transformer", activation_checkpointing=checkpointing))
        tokens, targets = default_collate([workload.dataset[i] for i in range(2)])
        loss = workload.loss_fn(workload.model(tokens), targets)
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in workload.model.parameters()]

    plain_loss, plain_grads = loss_and_grads(False)
    ckpt_loss, ckpt_grads = loss_and_grads(True)
    torch.testing.assert_close(ckpt_loss, plain_loss)
    for ckpt, plain in zip(ckpt_grads, plain_grads):
        torch.testing.assert_close(ckpt, plain)


def test_activation_checkpointing_recomputes_blocks_in_backward(monkeypatch):
    calls = []
    workload = transformer.build(tiny_config("transformer", activation_checkpointing=True))
    block = workload.model.blocks[0]
    original = block.forward
    monkeypatch.setattr(block, "forward", lambda x: calls.append(1) or original(x))
    tokens, targets = default_collate([workload.dataset[i] for i in range(2)])
    workload.loss_fn(workload.model(tokens), targets).backward()
    assert len(calls) == 2  # forward, then again in backward
