"""The inference side of the quality gate: a candidate's outputs against the baseline's, and, where the candidate
is over its tolerance, both against a float64 run of the baseline.

    Observed / observe_output   what one step computed, as the gate compares it (float64 CPU copies)
    judge_outputs               NaN/inf, the largest per-batch relative error, decisive top-1 flips
    with_fp64_reference         the tolerance widened to FP64_MULTIPLIER x fp32 eager's own error against float64
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Optional

import torch

from perflab.errors import PerflabError
from perflab.results.quality import LossFigures, OutputFigures, QualityVerdict, Tolerance
from perflab.step.calls import compared_tensors, logits_of

# fp32's 1e-5 is a rule of thumb, and a deep chain of ops rounds more than that in fp32 eager itself (360
# elementwise ops: Inductor's fused kernel was 1.44e-5 from eager, a fail, while both computed the same function).
# So an inference candidate over its tolerance is read once more against a float64 run of the baseline: it passes
# when its own error is within FP64_MULTIPLIER x fp32 eager's (torch._dynamo's accuracy check, `same(...,
# fp64_ref)`, multiplier 2). A user's --quality-rtol is kept as given.
FP64_MULTIPLIER = 2.0


@dataclass
class Observed:
    """One inference step's output as the gate compares it: the floating tensors, and the logits for top-1."""

    tensors: list[torch.Tensor]
    logits: Optional[torch.Tensor] = None


def observe_output(output: Any, output_key: Optional[str]) -> Observed:
    """The compared tensors (all floating ones, or output_key's) and the logits, as float64 CPU copies."""
    def host(tensor: torch.Tensor) -> torch.Tensor:
        return tensor.detach().to("cpu", torch.float64)
    tensors = compared_tensors(output, output_key)
    if not tensors:
        raise PerflabError(f"the model's output ({type(output).__name__}) holds no floating-point tensor for the "
                           "quality gate to compare; return the logits (or set Workload.output_key), or add "
                           "--no-check-quality")
    logits = logits_of(output, output_key)
    return Observed([host(tensor) for tensor in tensors], None if logits is None else host(logits))


def over_tolerance_only(verdict: QualityVerdict) -> bool:
    """Whether an inference verdict failed on its relative error alone (finite outputs, no decisive top-1 flip)."""
    figures = verdict.metrics
    return (verdict.verdict == "fail" and not figures.non_finite_baseline and not figures.non_finite_candidate
            and not figures.top1_decisive_flips and figures.rel_error is not None and math.isfinite(figures.rel_error))


def fp64_errors(baseline: list[Observed], candidate: list[Observed],
                reference: list[Observed]) -> tuple[list[float], list[float]]:
    """Per batch, (fp32 eager's relative error, the candidate's) against the float64 run."""
    return ([_relative_error(ref.tensors, exact.tensors) for ref, exact in zip(baseline, reference)],
            [_relative_error(out.tensors, exact.tensors) for out, exact in zip(candidate, reference)])


def with_fp64_reference(tolerance: Tolerance, errors: tuple[list[float], list[float]]) -> Tolerance:
    """The tolerance widened to FP64_MULTIPLIER x fp32 eager's own error against float64, where that is larger and
    the candidate's own error against float64 stays inside it (recorded as the noise floor it is); `errors` as
    fp64_errors gives them."""
    baseline_errors, candidate_errors = errors
    floor = max(baseline_errors)
    tolerance = Tolerance.from_dict(tolerance)
    widened = FP64_MULTIPLIER * floor
    if not math.isfinite(floor) or widened <= tolerance.rtol or max(candidate_errors) > widened:
        return tolerance
    return dataclasses.replace(tolerance, rtol=widened, precision_rtol=tolerance.rtol, noise_floor=floor,
                               noise_factor=FP64_MULTIPLIER, widening=widened / tolerance.rtol,
                               source=f"{FP64_MULTIPLIER:g} x fp32 eager's own error against float64, {floor:.1e}")


def _non_finite(tensors: list[torch.Tensor]) -> int:
    return int(sum((~torch.isfinite(tensor)).sum() for tensor in tensors))


def _relative_error(out: list[torch.Tensor], ref: list[torch.Tensor]) -> float:
    out_flat = torch.cat([tensor.flatten() for tensor in out])
    ref_flat = torch.cat([tensor.flatten() for tensor in ref])
    if out_flat.shape != ref_flat.shape:
        return math.inf
    diff, norm = float(torch.linalg.vector_norm(out_flat - ref_flat)), float(torch.linalg.vector_norm(ref_flat))
    return diff / norm if norm > 0 else (0.0 if diff == 0 else math.inf)


def top1_flips(out: torch.Tensor, ref: torch.Tensor, rtol: float) -> tuple[int, int, int]:
    """(samples, argmax disagreements, decisive disagreements) for (N, classes) logits.

    A disagreement is decisive when the baseline preferred its own class over the candidate's by more than
    rtol × ‖baseline logits of that sample‖: a flip between classes closer than the tolerated error is a
    near-tie, not a quality loss (common with random-init classifiers, whose logits are nearly equal).
    """
    ref_top, out_top = ref.argmax(dim=1), out.argmax(dim=1)
    flipped = ref_top != out_top
    rows = torch.arange(ref.shape[0])
    margin = ref[rows, ref_top] - ref[rows, out_top]
    decisive = flipped & (margin > rtol * torch.linalg.vector_norm(ref, dim=1))
    return ref.shape[0], int(flipped.sum()), int(decisive.sum())


def judge_outputs(baseline: list[Observed], candidate: list[Observed], rtol: float, source: str,
                  is_classifier: bool, fp64_errors: Optional[tuple[list[float], list[float]]] = None
                  ) -> QualityVerdict:
    """Inference verdict: NaN/inf fails; then max per-batch relative error, then decisive top-1 flips.
    `fp64_errors`: fp32 eager's and the candidate's errors against a float64 run, recorded beside."""
    errors = [_relative_error(out.tensors, ref.tensors) for out, ref in zip(candidate, baseline)]
    figures = OutputFigures(rel_error=max(errors), rel_error_per_batch=errors,
                            non_finite_candidate=sum(_non_finite(out.tensors) for out in candidate),
                            non_finite_baseline=sum(_non_finite(ref.tensors) for ref in baseline))
    if fp64_errors is not None:
        figures.fp64_error_baseline, figures.fp64_error_candidate = max(fp64_errors[0]), max(fp64_errors[1])
    top1 = _top1(baseline, candidate, rtol) if is_classifier else None
    if top1 is not None:
        samples, flips, decisive = top1
        figures.top1_agreement, figures.top1_samples = 1 - flips / samples, samples
        figures.top1_flips, figures.top1_decisive_flips = flips, decisive
    limit = f"{rtol:.1e} ({source})"
    if figures.non_finite_baseline:
        return verdict_with("fail", f"the fp32 eager baseline itself produced {figures.non_finite_baseline} "
                            "NaN/inf values: the workload is unstable, not the lever", figures)
    if figures.non_finite_candidate:
        return verdict_with("fail", f"candidate outputs contain {figures.non_finite_candidate} NaN/inf values "
                            "(overflow? fp16 tops out at 65504)", figures)
    against_fp64 = ("" if figures.fp64_error_candidate is None else
                    f" (against float64: the candidate {figures.fp64_error_candidate:.1e}, fp32 eager "
                    f"{figures.fp64_error_baseline:.1e})")
    if figures.rel_error > rtol:
        return verdict_with("fail", f"relative output error {figures.rel_error:.2e} > {limit} tolerance"
                            f"{against_fp64}", figures)
    if figures.top1_decisive_flips:
        return verdict_with("fail", f"top-1 class changed on {figures.top1_decisive_flips} of {figures.top1_samples}"
                            " samples where the baseline was not a near-tie", figures)
    reason = f"relative output error {figures.rel_error:.2e} <= {limit}{against_fp64}"
    if top1 is not None:
        reason += f"; top-1 agreement {100 * figures.top1_agreement:.1f}% over {figures.top1_samples} samples"
    return verdict_with("pass", reason, figures)


def _top1(baseline: list[Observed], candidate: list[Observed], rtol: float) -> Optional[tuple[int, int, int]]:
    """(samples, flips, decisive flips) over every batch, when the logits are (N, classes) and there are samples."""
    totals = (0, 0, 0)
    for out, ref in zip(candidate, baseline):
        if ref.logits is None or out.logits is None or ref.logits.dim() != 2 or out.logits.shape != ref.logits.shape:
            return None
        totals = tuple(a + b for a, b in zip(totals, top1_flips(out.logits, ref.logits, rtol)))
    return totals if totals[0] else None


def verdict_with(verdict: str, reason: str, gate_figures: OutputFigures | LossFigures) -> QualityVerdict:
    return QualityVerdict(verdict=verdict, reason=reason, metrics=gate_figures)
