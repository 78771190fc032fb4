"""The quality gate for generation: logits, greedy next-token agreement and perplexity against the baseline.

The baseline is the same workload with no lever: fp32 weights, dynamic KV cache, eager, plain greedy decoding.
For each of `--quality-steps` request batches the baseline generates greedily; both sides are then fed the
baseline's tokens one at a time through their own decode path (the candidate's static cache, compiled step,
quantized weights), and their next-token logits are compared: relative error, and greedy agreement where a
disagreement counts only when the baseline's choice won by more than the tolerated error (a near-tie is not a
quality loss). Perplexity on a fixed synthetic set checks the whole distribution. With speculative decoding,
the candidate's own greedy output must equal the baseline's token for token. Tolerances: docs/generate.md.
"""
from __future__ import annotations

import copy
import gc
import math
import time
from typing import Any

import torch

from perflab.models.language import perplexity
from perflab.generation.decode import generate_greedy, teacher_forced_logits
from perflab.workloads.generation import request_shape
from perflab.harness.plan import StepPlan
from perflab.levers.plan import build_plan
from perflab.quality.gate import top1_flips

# Relative error of next-token logits allowed, by precision, then by quantization scheme (the larger applies).
LOGITS_RTOL = {"fp32": 1e-4, "tf32": 5e-3, "bf16": 3e-2, "fp16": 1e-2}
SCHEME_LOGITS_RTOL = {"int8-weight": 5e-2, "fp8": 1e-1, "int4-weight": 2e-1}
# Relative perplexity increase allowed on the fixed synthetic set.
PERPLEXITY_RTOL = {"fp32": 1e-4, "tf32": 1e-3, "bf16": 1e-2, "fp16": 1e-2}
SCHEME_PERPLEXITY_RTOL = {"int8-weight": 2e-2, "fp8": 5e-2, "int4-weight": 1e-1}
BASELINE = "fp32 weights, dynamic KV cache, eager, plain greedy decoding; same seed, weights and prompts"


def tolerances(cfg) -> dict[str, Any]:
    """The logits and perplexity tolerances for this config (--quality-rtol overrides the logits one)."""
    scheme = cfg.quantize
    logits = max(LOGITS_RTOL[cfg.precision], SCHEME_LOGITS_RTOL.get(scheme, 0.0))
    ppl = max(PERPLEXITY_RTOL[cfg.precision], SCHEME_PERPLEXITY_RTOL.get(scheme, 0.0))
    source = f"{cfg.precision}{' + ' + scheme if scheme else ''} default"
    if cfg.quality_rtol is not None:
        logits, source = float(cfg.quality_rtol), "--quality-rtol"
    return {"rtol": logits, "perplexity_rtol": ppl, "source": source}


def run_generation_gate(workload, cfg, device: torch.device) -> dict[str, Any]:
    """Compare the candidate (cfg's levers) with the baseline; returns the verdict and its figures."""
    began = time.perf_counter()
    tolerance = tolerances(cfg)
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(cfg.seed)
        candidate = _plan(workload, cfg, device, levers=None)
        baseline = _plan(workload, cfg, device, levers=[])
        try:
            figures = _compare(baseline, candidate, cfg, workload.generation.eval_sequences.to(device))
        finally:
            candidate.cleanup()
            baseline.cleanup()
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    verdict = judge(figures, tolerance, speculative=cfg.speculative is not None)
    verdict.update(mode="infer", baseline=BASELINE, candidate={"levers": list(candidate.levers),
                                                               "precision": cfg.precision},
                   tolerances=tolerance, batches=cfg.quality_steps, seconds=round(time.perf_counter() - began, 3))
    return verdict


def _plan(workload, cfg, device: torch.device, levers) -> StepPlan:
    private = copy.deepcopy(workload, memo={id(workload.dataset): workload.dataset})
    plan = build_plan(private, cfg, device, levers)
    plan.markers = False
    return plan


def _compare(baseline: StepPlan, candidate: StepPlan, cfg, eval_sequences: torch.Tensor) -> dict[str, Any]:
    base_logits, cand_logits, identical, first_difference = [], [], True, None
    requests: list[tuple[torch.Tensor, int]] = []
    batches = candidate.batches(cfg.seed)
    with candidate.stepping():
        for index in range(cfg.quality_steps):
            prompt, new_tokens = request_shape(candidate.to_device(next(batches)))
            requests.append((prompt, new_tokens))
            reference = baseline.custom_step.generate(prompt, new_tokens)
            base_logits.append(teacher_forced_logits(baseline.custom_step.target, prompt, reference).cpu())
            cand_logits.append(teacher_forced_logits(candidate.custom_step.target, prompt, reference).cpu())
            if cfg.speculative is not None:
                produced = candidate.custom_step.generate(prompt, new_tokens)
                if identical and not torch.equal(produced, reference):
                    identical = False
                    position = int((produced != reference).any(dim=0).nonzero()[0])
                    first_difference = {"request_batch": index, "token": position}
        base_ppl = perplexity(baseline.model, eval_sequences)
        cand_ppl = perplexity(candidate.model, eval_sequences)
        speedup = _speculative_speedup(candidate, requests) if cfg.speculative is not None else {}
    return {"baseline_logits": base_logits, "candidate_logits": cand_logits, "speculative_identical": identical,
            "first_difference": first_difference, "perplexity_baseline": base_ppl, "perplexity_candidate": cand_ppl,
            **speedup}


def _speculative_speedup(candidate: StepPlan, requests: list[tuple[torch.Tensor, int]]) -> dict[str, Any]:
    """Plain greedy vs speculative decoding with the candidate's own target and levers, on the gate's requests:
    wall clock, device synchronised, after one untimed request each (compilation stays out)."""
    step = candidate.custom_step

    def plain(prompt: torch.Tensor, new_tokens: int) -> None:
        generate_greedy(step.target, prompt, new_tokens)

    def speculative(prompt: torch.Tensor, new_tokens: int) -> None:
        step.generate(prompt, new_tokens)
    seconds = {}
    for name, generate in (("plain", plain), ("speculative", speculative)):
        generate(*requests[0])
        _synchronize(candidate.device)
        began = time.perf_counter()
        for prompt, new_tokens in requests:
            generate(prompt, new_tokens)
        _synchronize(candidate.device)
        seconds[name] = time.perf_counter() - began
    return {"speculative_speedup": seconds["plain"] / seconds["speculative"], "plain_s": seconds["plain"],
            "speculative_s": seconds["speculative"]}


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def judge(figures: dict[str, Any], tolerance: dict[str, Any], speculative: bool) -> dict[str, Any]:
    """The verdict: NaN/inf fails; speculative output must be identical; then logits, agreement, perplexity."""
    rtol = tolerance["rtol"]
    errors, flips, decisive, samples, non_finite = [], 0, 0, 0, 0
    for cand, base in zip(figures["candidate_logits"], figures["baseline_logits"]):
        cand, base = cand.double(), base.double()
        non_finite += int((~torch.isfinite(cand)).sum())
        errors.append(float(torch.linalg.vector_norm(cand - base) / torch.linalg.vector_norm(base)))
        count, flipped, decisive_flips = top1_flips(cand.flatten(0, 1), base.flatten(0, 1), rtol)
        samples, flips, decisive = samples + count, flips + flipped, decisive + decisive_flips
    base_ppl, cand_ppl = figures["perplexity_baseline"], figures["perplexity_candidate"]
    ppl_delta = (cand_ppl - base_ppl) / base_ppl
    gate_figures = {"rel_error": max(errors), "rel_error_per_batch": errors, "non_finite_candidate": non_finite,
               "greedy_agreement": 1 - flips / samples, "tokens_compared": samples, "greedy_flips": flips,
               "greedy_decisive_flips": decisive, "perplexity_baseline": base_ppl,
               "perplexity_candidate": cand_ppl, "perplexity_rel_delta": ppl_delta}
    if speculative:
        gate_figures.update(speculative_identical=figures["speculative_identical"],
                       first_difference=figures["first_difference"],
                       speculative_speedup=figures["speculative_speedup"], plain_s=figures["plain_s"],
                       speculative_s=figures["speculative_s"])
    if non_finite or not math.isfinite(cand_ppl):
        return _verdict("fail", f"candidate logits contain {non_finite} NaN/inf values", gate_figures)
    if speculative and not figures["speculative_identical"]:
        where = figures["first_difference"]
        return _verdict("fail", f"speculative decoding's output differs from plain greedy decoding (request batch "
                        f"{where['request_batch']}, token {where['token']})", gate_figures)
    limit = f"{rtol:.1e} ({tolerance['source']})"
    if gate_figures["rel_error"] > rtol:
        return _verdict("fail", f"relative next-token logits error {gate_figures['rel_error']:.2e} > {limit}",
                        gate_figures)
    if decisive:
        return _verdict("fail", f"greedy next token changed at {decisive} of {samples} positions where the baseline "
                        "was not a near-tie", gate_figures)
    if ppl_delta > tolerance["perplexity_rtol"]:
        return _verdict("fail", f"perplexity {cand_ppl:.4g} vs baseline {base_ppl:.4g}: +{100 * ppl_delta:.2f}% > "
                        f"{100 * tolerance['perplexity_rtol']:.2g}%", gate_figures)
    reason = (f"relative next-token logits error {gate_figures['rel_error']:.2e} <= {limit}; greedy agreement "
              f"{100 * gate_figures['greedy_agreement']:.1f}% over {samples} tokens (no decisive flips); perplexity "
              f"{100 * ppl_delta:+.3f}%")
    if speculative:
        reason = "speculative output identical to plain greedy decoding; " + reason
    return _verdict("pass", reason, gate_figures)


def _verdict(verdict: str, reason: str, gate_figures: dict[str, Any]) -> dict[str, Any]:
    return {"verdict": verdict, "reason": reason, "metrics": gate_figures}
