"""The quality gate's verdict, the `quality` object of result.json: typed as the gate builds it (perflab/quality/).

Attribute names are the JSON keys, so result.json reads as before; keys this perflab does not know are kept in each
section's `extra`, and a result.json from an older perflab reads with the keys it lacks at their defaults.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Optional, Union

from perflab.errors import PerflabError
from perflab.results.metrics import Section, optional

NOT_CHECKED = "not checked"


@dataclass
class Tolerance(Section):
    """The tolerance the candidate was judged against: the precision's default (or an override), maybe widened by
    the training's own noise floor (quality/gate.with_noise_floor)."""

    rtol: Optional[float] = None
    source: Optional[str] = None
    perplexity_rtol: Optional[float] = optional()  # generation: relative perplexity increase allowed
    precision_rtol: Optional[float] = optional()  # the tolerance before a noise floor widened it
    noise_floor: Optional[float] = optional()  # None with precision_rtol set: a non-finite nudged run
    noise_factor: Optional[float] = optional()
    widening: Optional[float] = optional()
    max_widening: Optional[float] = optional()

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()
        if self.precision_rtol is not None and self.noise_floor is None:  # measured, but not finite: say so
            out["noise_floor"] = None
        return out


@dataclass
class GateCandidate(Section):
    """What the gate ran as the candidate: its levers and precision (and ranks, for an N-rank training)."""

    levers: list[str] = dataclasses.field(default_factory=list)
    precision: Optional[str] = None
    ranks: Optional[int] = optional()


@dataclass
class GateFigures(Section):
    """Base of the gate's figures: what any of them offers a report."""

    def numbers(self) -> dict[str, float]:
        """The scalar figures by JSON key (compare and the reports show these)."""
        return {key: value for key, value in self.to_dict().items() if isinstance(value, (int, float))}


@dataclass
class OutputFigures(GateFigures):
    """Inference: the candidate's outputs against the baseline's (quality/gate.judge_outputs)."""

    rel_error: Optional[float] = optional()  # the largest per-batch relative error
    rel_error_per_batch: Optional[list[float]] = optional()
    non_finite_candidate: Optional[int] = optional()
    non_finite_baseline: Optional[int] = optional()
    top1_agreement: Optional[float] = optional()  # classifiers only
    top1_samples: Optional[int] = optional()
    top1_flips: Optional[int] = optional()
    top1_decisive_flips: Optional[int] = optional()
    fp64_error_baseline: Optional[float] = optional()  # fp32 eager against a float64 run (read when over tolerance)
    fp64_error_candidate: Optional[float] = optional()


@dataclass
class LossFigures(GateFigures):
    """Training: the candidate's loss trajectory against the baseline's (quality/gate.judge_losses)."""

    baseline_losses: Optional[list[float]] = optional()
    candidate_losses: Optional[list[float]] = optional()
    final_loss_baseline: Optional[float] = optional()
    final_loss_candidate: Optional[float] = optional()
    final_loss_rel_delta: Optional[float] = optional()
    max_loss_rel_delta: Optional[float] = optional()


@dataclass
class FirstDifference(Section):
    """Where speculative decoding's output first left plain greedy decoding's."""

    request_batch: Optional[int] = None
    token: Optional[int] = None


@dataclass
class GenerationFigures(GateFigures):
    """Generation: next-token logits, greedy agreement and perplexity against the baseline (quality/generation.py)."""

    rel_error: Optional[float] = optional()
    rel_error_per_batch: Optional[list[float]] = optional()
    non_finite_candidate: Optional[int] = optional()
    greedy_agreement: Optional[float] = optional()
    tokens_compared: Optional[int] = optional()
    greedy_flips: Optional[int] = optional()
    greedy_decisive_flips: Optional[int] = optional()
    perplexity_baseline: Optional[float] = optional()
    perplexity_candidate: Optional[float] = optional()
    perplexity_rel_delta: Optional[float] = optional()
    baseline_top1_prob_median: Optional[float] = optional()
    baseline_confident_share: Optional[float] = optional()
    vocab: Optional[int] = optional()
    # speculative decoding only
    speculative_identical: Optional[bool] = optional()
    first_difference: Optional[FirstDifference] = None  # None (written as null) while identical
    speculative_speedup: Optional[float] = optional()
    plain_s: Optional[float] = optional()
    speculative_s: Optional[float] = optional()

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()
        if self.speculative_identical is None:  # first_difference belongs to the speculative figures only
            out.pop("first_difference", None)
        return out


AnyGateFigures = Union[OutputFigures, LossFigures, GenerationFigures]


def _own_keys(kind: type) -> set[str]:
    return {item.name for item in dataclasses.fields(kind)} - {"extra"}


_LOSS_KEYS = _own_keys(LossFigures)
_GENERATION_KEYS = _own_keys(GenerationFigures) - _own_keys(OutputFigures)


def gate_figures_from_dict(data: Any) -> Optional[AnyGateFigures]:
    """The figures of a saved verdict, typed by what they hold (losses, generated tokens, or outputs)."""
    if data is None or isinstance(data, GateFigures):
        return data
    if not isinstance(data, dict):
        raise PerflabError(f"the quality gate's figures are not a JSON object ({type(data).__name__}): re-run to "
                           "regenerate them")
    keys = set(data)
    kind = LossFigures if keys & _LOSS_KEYS else GenerationFigures if keys & _GENERATION_KEYS else OutputFigures
    return kind.from_dict(data)


@dataclass
class QualityVerdict(Section):
    """The quality gate's verdict (pass, fail, inconclusive; "see rank 0" on the other ranks), why, and its figures."""

    verdict: str = NOT_CHECKED
    reason: str = ""
    metrics: Optional[AnyGateFigures] = optional()  # the gate's figures ("metrics" in result.json)
    mode: Optional[str] = optional()
    baseline: Optional[str] = optional()  # what the candidate was compared with
    candidate: Optional[GateCandidate] = optional()
    tolerances: Optional[Tolerance] = optional()
    batches: Optional[int] = optional()  # inference: request or input batches compared
    steps: Optional[int] = optional()  # training: steps compared
    world_size: Optional[int] = optional()
    seconds: Optional[float] = optional()
    note: Optional[str] = optional()

    @classmethod
    def from_dict(cls, data: Optional[dict[str, Any]]) -> Optional[QualityVerdict]:
        """The verdict from its JSON object (None stays None); missing keys take their defaults."""
        if data is None or isinstance(data, cls):
            return data
        if not isinstance(data, dict):
            raise PerflabError(f"the quality record is not a JSON object ({type(data).__name__}): re-run to "
                               "regenerate it")
        verdict = super().from_dict({key: value for key, value in data.items() if key != "metrics"})
        verdict.metrics = gate_figures_from_dict(data.get("metrics"))
        return verdict

    @property
    def passed(self) -> bool:
        return self.verdict == "pass"

    @property
    def failed(self) -> bool:
        return self.verdict == "fail"

    @property
    def inconclusive(self) -> bool:
        return self.verdict == "inconclusive"


def verdict_of(quality: Optional[QualityVerdict], default: Optional[str] = NOT_CHECKED) -> Optional[str]:
    """The verdict word of a result's gate, `default` when the gate did not run."""
    return quality.verdict if quality is not None else default
