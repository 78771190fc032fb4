"""Does fp16 training skip optimizer steps at the start? Counts GradScaler's skipped steps on resnet50.

    python -m benchmarks.fp16_scaler_check     (CUDA only; prints one line per step)

Backs the explanation of the quality gate's fp16 training failure in BENCHMARKS.md.
"""
from __future__ import annotations

import torch

import perflab
from perflab.levers.plan import build_plan
from perflab.prepare import resolve_config, resolve_device, seed_everything
from perflab.workloads import load_workload


def main() -> None:
    cfg = resolve_config(perflab.RunConfig(workload="resnet50", batch_size=32, precision="fp16"), None)
    device = resolve_device(cfg.device)
    seed_everything(cfg.seed)
    plan = build_plan(load_workload("resnet50", cfg), cfg, device)
    batches = plan.batches(cfg.seed)
    skipped = 0
    for step in range(8):
        inputs, target = next(batches)
        with plan.autocast():
            loss = plan.loss_fn(plan.model(inputs), target)
        plan.scaler.scale(loss).backward()
        scale_before = plan.scaler.get_scale()
        plan.scaler.step(plan.optimizer)
        plan.scaler.update()
        plan.optimizer.zero_grad(set_to_none=True)
        was_skipped = plan.scaler.get_scale() < scale_before  # update() halves the scale after an overflow
        skipped += was_skipped
        print(f"step {step}: loss {loss.item():.4f} scale {scale_before:.0f} -> {plan.scaler.get_scale():.0f}"
              f"{' (skipped: inf/NaN gradients)' if was_skipped else ''}", flush=True)
    print(f"fp16 resnet50 batch 32: {skipped} of 8 optimizer steps skipped by the gradient scaler")
    plan.cleanup()


if __name__ == "__main__":
    torch.backends.cudnn.benchmark = False
    main()
