"""Area "quality": the quality gate's figures for each numerics-changing lever on the GPU (issue 3).

For each case the gate compares the candidate with the fp32 eager baseline (same weights, seed and
inputs) and we record the verdict, the measured error (inference: max per-batch relative output error;
training: final-loss relative delta), the tolerance applied and, in training, the baseline's own noise
floor. These are the numbers docs/quality.md's tolerances should be checked against (tf32 and fp16 can
only be measured on a GPU). On CPU (--quick) it runs the bf16 and channels-last cases at tiny sizes.
"""
from __future__ import annotations

import time

import torch

from benchmarks.common import Rows, parse_args
from perflab.config import RunConfig
from perflab.prepare import resolve_config, resolve_device, seed_everything
from perflab.quality import run_quality_gate
from perflab.workloads import load_workload


def cases(cuda: bool, quick: bool) -> list[tuple[str, dict]]:
    """(label, RunConfig fields) of every case to gate."""
    if not cuda:
        small = {"workload_options": {"image_res": "32"}, "batch_size": 4}
        return [("mlp train bf16", {"workload": "mlp", "precision": "bf16"}),
                ("resnet50 infer bf16", {"workload": "resnet50", "mode": "infer", "precision": "bf16", **small}),
                ("resnet50 infer channels-last", {"workload": "resnet50", "mode": "infer", "channels_last": True,
                                                  **small})]
    resnet = {"workload": "resnet50", "batch_size": 32}
    driving = {"workload": "driving", "batch_size": 8}
    found = []
    for mode in ("infer", "train"):
        found += [
            (f"resnet50 {mode} tf32", {**resnet, "mode": mode, "precision": "tf32"}),
            (f"resnet50 {mode} bf16", {**resnet, "mode": mode, "precision": "bf16"}),
            (f"resnet50 {mode} fp16", {**resnet, "mode": mode, "precision": "fp16"}),
            (f"resnet50 {mode} channels-last", {**resnet, "mode": mode, "channels_last": True}),
            (f"resnet50 {mode} bf16 channels-last", {**resnet, "mode": mode, "precision": "bf16",
                                                      "channels_last": True}),
            (f"resnet50 {mode} cuda-graphs", {**resnet, "mode": mode, "cuda_graphs": True}),
            (f"driving {mode} bf16", {**driving, "mode": mode, "precision": "bf16"}),
            (f"mlp {mode} cuda-graphs", {"workload": "mlp", "mode": mode, "cuda_graphs": True}),
        ]
    found.append(("mlp train fused", {"workload": "mlp", "optimizer_impl": "fused"}))
    if not quick:
        found.append(("resnet50 infer compile", {**resnet, "mode": "infer", "compile": "default", "warmup": 2}))
    return found


def main() -> None:
    args = parse_args()
    rows = Rows("quality", args.out)
    cuda = torch.cuda.is_available()
    for label, fields in cases(cuda, args.quick):
        cfg = resolve_config(RunConfig(device="cuda" if cuda else "cpu", check_quality=True, **fields), None)
        seed_everything(cfg.seed)
        began = time.perf_counter()
        try:
            quality = run_quality_gate(load_workload(cfg.workload, cfg), cfg, resolve_device(cfg.device))
        except Exception as err:  # one failing case must not cost the area's other rows
            rows.add(label, "error", None, note=f"{type(err).__name__}: {err}")
            continue
        gate_figures, tolerance = quality.metrics, quality.tolerances
        error_name = "rel_error" if cfg.mode == "infer" else "final_loss_rel_delta"
        rows.add(label, "verdict_pass", float(quality.passed), note=quality.reason)
        rows.add(label, error_name, getattr(gate_figures, error_name))
        rows.add(label, "tolerance", tolerance.rtol, note=tolerance.source)
        if tolerance.precision_rtol is not None:  # the noise floor was measured (training)
            rows.add(label, "noise_floor", tolerance.noise_floor)
        if getattr(gate_figures, "top1_agreement", None) is not None:
            rows.add(label, "top1_agreement", gate_figures.top1_agreement)
        rows.add(label, "gate_s", time.perf_counter() - began, "s")


if __name__ == "__main__":
    main()
