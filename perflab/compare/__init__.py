"""Compare two results: per-metric change with a bootstrap interval, and the accept / reject / no significant
change decision (decision.py) that compare, rerun, tune and the regression gate share."""

from perflab.compare.decision import (  # noqa: F401
    ACCEPT, REJECT, NO_CHANGE, NOT_JUDGED, INCONCLUSIVE, DECISIONS,
    COMPARE_FILE, CONFIDENCE, RESAMPLES, MIN_EFFECT_PCT, METHOD, IGNORED_CONFIG, MetricChange, Comparison,
    ComparedRun, ComparedQuality, PhaseChange,
    load_comparison, load_result, metric_changes, mfu_change, config_changes, comparability_warnings,
    phase_changes, decide, describe_config, contamination,
    compare_results, regression_exceeds, compare_paths
)
from perflab.compare.refusals import non_finite_figures, refuse_non_finite  # noqa: F401
from perflab.compare.kernels import KernelChange, trace_path, kernel_ms_per_step, kernel_changes  # noqa: F401
