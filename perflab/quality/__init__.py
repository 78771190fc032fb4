"""The quality gate: a candidate against its baseline on identical inputs and weights.

    gate.py        the gate's runs (candidate, baseline, float64 reference), training loss trajectories, tolerances
    outputs.py     inference outputs judged: relative error, top-1, the float64 reference
    generation.py  generated tokens and perplexity (generation workloads)
    ranks.py       the N-rank loss trajectory against one process on the same global batch
"""

from perflab.quality.gate import (  # noqa: F401
    INFER_RTOL, TRAIN_LOSS_RTOL, ROUNDING_NOISE, NOISE_FACTOR, MAX_NOISE_WIDENING, BASELINE, precision_tolerance,
    run_model_gate, run_candidate, with_noise_floor, gate_plan, observe, judge_losses
)
from perflab.quality.outputs import FP64_MULTIPLIER, Observed, judge_outputs, observe_output, top1_flips  # noqa: F401
from perflab.quality.generation import run_generation_gate
from perflab.quality.ranks import run_distributed_quality_gate
from perflab.ranks import world_size
from perflab.results.quality import QualityVerdict


def run_quality_gate(workload, cfg, device) -> QualityVerdict:
    """Compare the candidate (cfg's levers) with the fp32 eager baseline; returns the verdict and figures."""
    if workload.generation is not None:
        return run_generation_gate(workload, cfg, device)
    if cfg.mode == "train" and world_size() > 1:
        return run_distributed_quality_gate(workload, cfg, device)
    return run_model_gate(workload, cfg, device)
