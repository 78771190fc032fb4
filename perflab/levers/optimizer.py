"""--optimizer-impl foreach|fused: multi-tensor or fused optimizer kernels instead of a per-parameter loop."""
from __future__ import annotations

from perflab.errors import PerflabError
from perflab.bottlenecks import LAUNCH_OVERHEAD, SINGLE_TENSOR_UPDATES, TRAINING
from perflab.levers import ONE_TRIAL, Address, Lever, TuneHints


def rebuild_optimizer(optimizer, impl: str):
    """The same optimizer class and hyper-parameters with `foreach` or `fused` chosen."""
    groups = []
    for group in optimizer.param_groups:
        if "fused" not in group and "foreach" not in group:
            raise PerflabError(f"{type(optimizer).__name__} has no foreach/fused implementation; "
                               "drop --optimizer-impl")
        group = dict(group)
        group["foreach"] = impl == "foreach"
        if "fused" in group:
            group["fused"] = impl == "fused" or None
        groups.append(group)
    if impl == "fused" and "fused" not in optimizer.param_groups[0]:
        raise PerflabError(f"{type(optimizer).__name__} has no fused implementation in torch; "
                           "use --optimizer-impl foreach")
    try:
        return type(optimizer)(groups)  # a group's own keys override the class defaults
    except (RuntimeError, ValueError, TypeError) as err:
        raise PerflabError(f"--optimizer-impl {impl} is not available here: {err}") from None


def _apply(plan, cfg) -> None:
    plan.optimizer = rebuild_optimizer(plan.optimizer, cfg.optimizer_impl)


LEVERS = [
    Lever("foreach-optimizer", "optimizer_impl", "foreach", "multi-tensor (foreach) optimizer step",
          "--mode train",
          (Address(LAUNCH_OVERHEAD, 4, TRAINING), Address(LAUNCH_OVERHEAD, 2, SINGLE_TENSOR_UPDATES)), 40, _apply,
          in_code="the optimizer with foreach=True",
          when_lost="the foreach optimizer lost: the optimizer step is not the cost",
          tune=TuneHints(ONE_TRIAL)),
    Lever("fused-optimizer", "optimizer_impl", "fused", "one fused kernel per optimizer step",
          "--mode train; an optimizer with a fused implementation",
          (Address(LAUNCH_OVERHEAD, 3, TRAINING), Address(LAUNCH_OVERHEAD, 1, SINGLE_TENSOR_UPDATES)), 40,
          _apply,
          in_code="the optimizer with fused=True (Adam, AdamW, SGD on CUDA)",
          when_lost="the fused optimizer lost: the optimizer step is not the cost",
          tune=TuneHints(ONE_TRIAL)),
]
