"""The generation quality gate's judge (perflab/quality/generation.py): a baseline too flat to judge by makes a
failed check inconclusive, with the reason; a confident one fails the same candidate."""
import math

import torch

from perflab.quality.generation import CONFIDENT_TOP1_PROB, Compared, baseline_confidence, judge
from perflab.results.quality import Tolerance

TOLERANCE = Tolerance(rtol=5e-2, perplexity_rtol=2e-2, source="int8-weight test")


def logits(confident: bool, seed: int = 0, positions: int = 16, vocab: int = 512) -> torch.Tensor:
    """(1, positions, vocab) logits: spread thin like a random model's, or one token far ahead like a trained one's."""
    gen = torch.Generator().manual_seed(seed)
    values = torch.randn(1, positions, vocab, generator=gen)
    if confident:
        values[0, torch.arange(positions), torch.randint(0, vocab, (positions,), generator=gen)] += 12.0
    return values


def figures(base: torch.Tensor, cand: torch.Tensor, ppl_delta: float = 0.0) -> Compared:
    return Compared(baseline_logits=[base], candidate_logits=[cand], perplexity_baseline=100.0,
                    perplexity_candidate=100.0 * (1 + ppl_delta))


def noisy(base: torch.Tensor, relative: float, seed: int = 1) -> torch.Tensor:
    noise = torch.randn(base.shape, generator=torch.Generator().manual_seed(seed))
    return base + noise * relative * base.norm() / noise.norm()


def test_a_failed_check_is_inconclusive_with_the_reason_when_the_baseline_is_too_flat():
    base = logits(confident=False)
    verdict = judge(figures(base, noisy(base, 0.2)), TOLERANCE, speculative=False)
    assert verdict.verdict == "inconclusive"
    assert verdict.reason.startswith("relative next-token logits error 2.00e-01 > 5.0e-02")
    assert "too flat to judge" in verdict.reason and "weights=trained" in verdict.reason
    assert verdict.metrics.baseline_confident_share == 0.0 and verdict.metrics.vocab == 512


def test_the_same_error_on_a_confident_baseline_fails():
    base = logits(confident=True)
    verdict = judge(figures(base, noisy(base, 0.2)), TOLERANCE, speculative=False)
    assert verdict.verdict == "fail" and "too flat" not in verdict.reason
    assert verdict.metrics.baseline_confident_share == 1.0


def test_a_flat_baseline_still_passes_a_candidate_inside_every_tolerance():
    base = logits(confident=False)
    verdict = judge(figures(base, noisy(base, 1e-3)), TOLERANCE, speculative=False)
    assert verdict.verdict == "pass"


def test_nan_fails_whatever_the_baseline():
    base = logits(confident=False)
    cand = base.clone()
    cand[0, 3, 7] = math.nan
    assert judge(figures(base, cand), TOLERANCE, speculative=False).verdict == "fail"


def test_perplexity_failure_on_a_flat_baseline_is_inconclusive_too():
    base = logits(confident=False)
    verdict = judge(figures(base, base.clone(), ppl_delta=0.05), TOLERANCE, speculative=False)
    assert verdict.verdict == "inconclusive" and verdict.reason.startswith("perplexity")


def test_confidence_is_the_probability_the_baseline_gives_its_own_greedy_token():
    certain = torch.full((1, 4, 10), -30.0)
    certain[0, :, 2] = 0.0  # token 2 takes all the probability at every position
    median, share = baseline_confidence([certain, logits(confident=False, positions=4, vocab=10) * 0])
    # 4 certain positions and 4 uniform ones (probability 0.1 each): median between, half confident
    assert share == 0.5 and 0.1 <= median <= 1.0 and CONFIDENT_TOP1_PROB == 0.5
