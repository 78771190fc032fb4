"""The quality gate for generation: logits, greedy next-token agreement and perplexity against the baseline.

The baseline is the same workload with no lever: fp32 weights, dynamic KV cache, eager, plain greedy decoding.
For each of `--quality-steps` request batches the baseline generates greedily; both sides are then fed the
baseline's tokens one at a time through their own decode path (the candidate's static cache, compiled step,
quantized weights), and their next-token logits are compared: relative error, and greedy agreement where a
disagreement counts only when the baseline's choice won by more than the tolerated error (a near-tie is not a
quality loss). Perplexity on a fixed synthetic set checks the whole distribution. With speculative decoding,
the candidate's own greedy output must equal the baseline's token for token. A baseline too unsure of its own next
tokens (random weights) cannot tell a broken candidate from its own amplified rounding: a failed check is then
"inconclusive", with the reason. Tolerances: docs/generate.md.
"""
from __future__ import annotations

import copy
import gc
import math
import time
from dataclasses import dataclass
from typing import Optional

import torch

from perflab.models.language import perplexity
from perflab.generation.decode import generate_greedy, teacher_forced_logits
from perflab.workloads.generation import request_shape
from perflab.step.plan import StepPlan
from perflab.levers.plan import build_plan
from perflab.quality.outputs import top1_flips
from perflab.results.quality import FirstDifference, GateCandidate, GenerationFigures, QualityVerdict, Tolerance

# Relative error of next-token logits allowed, by precision, then by quantization scheme (the larger applies).
LOGITS_RTOL = {"fp32": 1e-4, "tf32": 5e-3, "bf16": 3e-2, "fp16": 1e-2}
SCHEME_LOGITS_RTOL = {"int8-weight": 5e-2, "fp8": 1e-1, "int4-weight": 2e-1}
# Relative perplexity increase allowed on the fixed synthetic set.
PERPLEXITY_RTOL = {"fp32": 1e-4, "tf32": 1e-3, "bf16": 1e-2, "fp16": 1e-2}
SCHEME_PERPLEXITY_RTOL = {"int8-weight": 2e-2, "fp8": 5e-2, "int4-weight": 1e-1}
# A baseline whose next-token predictions are nearly uniform cannot judge a candidate's greedy tokens, logits or
# perplexity: its top-1 token wins by less than any rounding, and random layers amplify a weight's rounding (int8's
# ~1% per weight: 0.3-0.4% of the logits of llama-tiny trained on the synthetic language, 3-5% at 2-16 random Llama
# layers of width 1024-4096 on a CPU, 19% at llama-8b's 32 random layers on the H200). Random weights give such
# predictions (llama-8b's random logits spread by about 1.3 over 128,256 tokens: a few tenths of a percent for the
# greedy token). A position is confident where the baseline gives its own greedy token at least CONFIDENT_TOP1_PROB
# (more than every other token together); with fewer than MIN_CONFIDENT_SHARE of the positions confident, a failed
# check is inconclusive, never a pass. llama-tiny trained briefly: about 90% of positions confident.
CONFIDENT_TOP1_PROB = 0.5
MIN_CONFIDENT_SHARE = 0.5
BASELINE = "fp32 weights, dynamic KV cache, eager, plain greedy decoding; same seed, weights and prompts"


def tolerances(cfg) -> Tolerance:
    """The logits and perplexity tolerances for this config (--quality-rtol overrides the logits one)."""
    scheme = cfg.quantize
    logits = max(LOGITS_RTOL[cfg.precision], SCHEME_LOGITS_RTOL.get(scheme, 0.0))
    ppl = max(PERPLEXITY_RTOL[cfg.precision], SCHEME_PERPLEXITY_RTOL.get(scheme, 0.0))
    source = f"{cfg.precision}{' + ' + scheme if scheme else ''} default"
    if cfg.quality_rtol is not None:
        logits, source = float(cfg.quality_rtol), "--quality-rtol"
    return Tolerance(rtol=logits, perplexity_rtol=ppl, source=source)


@dataclass
class Compared:
    """What the gate observed on both sides: next-token logits per request batch, perplexities, and with speculative
    decoding whether its output matched plain greedy decoding's (and how much faster it was)."""

    baseline_logits: list[torch.Tensor]
    candidate_logits: list[torch.Tensor]
    perplexity_baseline: float
    perplexity_candidate: float
    speculative_identical: bool = True
    first_difference: Optional[FirstDifference] = None
    speculative_speedup: Optional[float] = None
    plain_s: Optional[float] = None
    speculative_s: Optional[float] = None


def run_generation_gate(workload, cfg, device: torch.device) -> QualityVerdict:
    """Compare the candidate (cfg's levers) with the baseline; returns the verdict and its figures."""
    began = time.perf_counter()
    tolerance = tolerances(cfg)
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(cfg.seed)
        candidate = _plan(workload, cfg, device, levers=None)
        baseline = _plan(workload, cfg, device, levers=[])
        try:
            compared = _compare(baseline, candidate, cfg, workload.generation.eval_sequences.to(device))
        finally:
            candidate.cleanup()
            baseline.cleanup()
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    verdict = judge(compared, tolerance, speculative=cfg.speculative is not None)
    verdict.mode, verdict.baseline, verdict.tolerances = "infer", BASELINE, tolerance
    verdict.batches = cfg.quality_steps
    verdict.candidate = GateCandidate(levers=list(candidate.levers), precision=cfg.precision)
    verdict.seconds = round(time.perf_counter() - began, 3)
    return verdict


def _plan(workload, cfg, device: torch.device, levers) -> StepPlan:
    private = copy.deepcopy(workload, memo={id(workload.dataset): workload.dataset})
    plan = build_plan(private, cfg, device, levers)
    plan.markers = False
    return plan


def _compare(baseline: StepPlan, candidate: StepPlan, cfg, eval_sequences: torch.Tensor) -> Compared:
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
                    first_difference = FirstDifference(request_batch=index, token=position)
        compared = Compared(base_logits, cand_logits, perplexity(baseline.model, eval_sequences),
                            perplexity(candidate.model, eval_sequences), identical, first_difference)
        if cfg.speculative is not None:
            compared.plain_s, compared.speculative_s = _speculative_seconds(candidate, requests)
            compared.speculative_speedup = compared.plain_s / compared.speculative_s
    return compared


def _speculative_seconds(candidate: StepPlan, requests: list[tuple[torch.Tensor, int]]) -> tuple[float, float]:
    """(plain, speculative) seconds: plain greedy vs speculative decoding with the candidate's own target and levers,
    on the gate's requests: wall clock, device synchronised, after one untimed request each (compilation stays out)."""
    step = candidate.custom_step

    def plain(prompt: torch.Tensor, new_tokens: int) -> None:
        generate_greedy(step.target, prompt, new_tokens)

    def speculative(prompt: torch.Tensor, new_tokens: int) -> None:
        step.generate(prompt, new_tokens)
    seconds = []
    for generate in (plain, speculative):
        generate(*requests[0])
        _synchronize(candidate.device)
        began = time.perf_counter()
        for prompt, new_tokens in requests:
            generate(prompt, new_tokens)
        _synchronize(candidate.device)
        seconds.append(time.perf_counter() - began)
    return seconds[0], seconds[1]


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def judge(compared: Compared, tolerance: Tolerance, speculative: bool) -> QualityVerdict:
    """The verdict: NaN/inf fails; speculative output must be identical; then logits, agreement, perplexity, each
    failure inconclusive instead when the baseline's own predictions are too flat to judge them."""
    tolerance = Tolerance.from_dict(tolerance)
    figures = gate_figures(compared, tolerance.rtol, speculative)
    if figures.non_finite_candidate or not math.isfinite(figures.perplexity_candidate):
        return _verdict("fail", f"candidate logits contain {figures.non_finite_candidate} NaN/inf values", figures)
    if speculative and not compared.speculative_identical:
        where = compared.first_difference
        return _verdict("fail", f"speculative decoding's output differs from plain greedy decoding (request batch "
                        f"{where.request_batch}, token {where.token})", figures)
    failure = _failed_check(figures, tolerance)
    flat = _too_flat(figures)
    if failure is not None:
        return _verdict("inconclusive", f"{failure}, but {flat}", figures) if flat else \
            _verdict("fail", failure, figures)
    reason = (f"relative next-token logits error {figures.rel_error:.2e} <= {_limit(tolerance)}; greedy "
              f"agreement {100 * figures.greedy_agreement:.1f}% over {figures.tokens_compared} tokens "
              f"(no decisive flips); perplexity {100 * figures.perplexity_rel_delta:+.3f}%")
    if speculative:
        reason = "speculative output identical to plain greedy decoding; " + reason
    return _verdict("pass", reason, figures)


def gate_figures(compared: Compared, rtol: float, speculative: bool) -> GenerationFigures:
    """Logits error, greedy agreement and its decisive flips, perplexities, and how confident the baseline is."""
    errors, flips, decisive, samples, non_finite = [], 0, 0, 0, 0
    for cand, base in zip(compared.candidate_logits, compared.baseline_logits):
        cand, base = cand.double(), base.double()
        non_finite += int((~torch.isfinite(cand)).sum())
        errors.append(float(torch.linalg.vector_norm(cand - base) / torch.linalg.vector_norm(base)))
        count, flipped, decisive_flips = top1_flips(cand.flatten(0, 1), base.flatten(0, 1), rtol)
        samples, flips, decisive = samples + count, flips + flipped, decisive + decisive_flips
    base_ppl, cand_ppl = compared.perplexity_baseline, compared.perplexity_candidate
    top1_median, confident_share = baseline_confidence(compared.baseline_logits)
    figures = GenerationFigures(
        rel_error=max(errors), rel_error_per_batch=errors, non_finite_candidate=non_finite,
        greedy_agreement=1 - flips / samples, tokens_compared=samples, greedy_flips=flips,
        greedy_decisive_flips=decisive, perplexity_baseline=base_ppl, perplexity_candidate=cand_ppl,
        perplexity_rel_delta=(cand_ppl - base_ppl) / base_ppl, baseline_top1_prob_median=top1_median,
        baseline_confident_share=confident_share, vocab=compared.baseline_logits[0].shape[-1])
    if speculative:
        figures.speculative_identical, figures.first_difference = compared.speculative_identical, \
            compared.first_difference
        figures.speculative_speedup, figures.plain_s, figures.speculative_s = \
            compared.speculative_speedup, compared.plain_s, compared.speculative_s
    return figures


def baseline_confidence(baseline_logits: list[torch.Tensor]) -> tuple[float, float]:
    """(median probability the baseline gives its own greedy token, share of positions where that is at least
    CONFIDENT_TOP1_PROB), over every compared position."""
    top1 = torch.cat([logits.double().softmax(dim=-1).amax(dim=-1).flatten() for logits in baseline_logits])
    return float(top1.median()), float((top1 >= CONFIDENT_TOP1_PROB).double().mean())


def _failed_check(figures: GenerationFigures, tolerance: Tolerance) -> Optional[str]:
    """Why the candidate fails the logits, agreement or perplexity check; None when it passes all three."""
    if figures.rel_error > tolerance.rtol:
        return f"relative next-token logits error {figures.rel_error:.2e} > {_limit(tolerance)}"
    if figures.greedy_decisive_flips:
        return (f"greedy next token changed at {figures.greedy_decisive_flips} of "
                f"{figures.tokens_compared} positions where the baseline was not a near-tie")
    if figures.perplexity_rel_delta > tolerance.perplexity_rtol:
        return (f"perplexity {figures.perplexity_candidate:.4g} vs baseline "
                f"{figures.perplexity_baseline:.4g}: +{100 * figures.perplexity_rel_delta:.2f}% > "
                f"{100 * tolerance.perplexity_rtol:.2g}%")
    return None


def _too_flat(figures: GenerationFigures) -> Optional[str]:
    """Why the baseline's predictions are too flat to judge the candidate by; None when they are confident enough."""
    share = figures.baseline_confident_share
    if share >= MIN_CONFIDENT_SHARE:
        return None
    return (f"the baseline is too flat to judge: it gives its own greedy token a probability of at least "
            f"{CONFIDENT_TOP1_PROB:g} at {100 * share:.0f}% of {figures.tokens_compared} positions (median "
            f"{figures.baseline_top1_prob_median:.2g}; a uniform guess over {figures.vocab} tokens is "
            f"{1 / figures.vocab:.2g}), and random weights amplify any rounding; judge on trained weights "
            f"(generate: --option weights=trained)")


def _limit(tolerance: Tolerance) -> str:
    return f"{tolerance.rtol:.1e} ({tolerance.source})"


def _verdict(verdict: str, reason: str, figures: GenerationFigures) -> QualityVerdict:
    return QualityVerdict(verdict=verdict, reason=reason, metrics=figures)
