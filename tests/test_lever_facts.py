"""Every lever declares every fact once (perflab/levers), and the diagnosis, tune and script advice read them."""
import pytest

from perflab import bottlenecks
from perflab.diagnose.lost_levers import left_when_lost
from perflab.levers import COMPILES, DEVICE_WORK, LOADER_QUEUE, ONE_TRIAL, TuneHints, all_levers, levers_for
from perflab.script.levers import levers_in_code
from perflab.tune import ordering

LEVERS = all_levers()
NAMES = {lever.name for lever in LEVERS}


@pytest.mark.parametrize("lever", LEVERS, ids=lambda lever: lever.name)
def test_every_lever_declares_every_fact(lever):
    assert lever.summary.strip() and lever.needs.strip()
    assert lever.addresses, f"{lever.name} addresses no bottleneck class"
    assert lever.in_code.strip(), f"{lever.name} has no in-code hint for script users"
    assert lever.when_lost.strip(), f"{lever.name} says nothing about what is left when it loses"
    assert isinstance(lever.tune, TuneHints) and lever.tune.cost in (ONE_TRIAL, COMPILES)


@pytest.mark.parametrize("lever", LEVERS, ids=lambda lever: lever.name)
def test_every_lever_fact_uses_the_declared_vocabulary(lever):
    for address in lever.addresses:
        assert address.cls in bottlenecks.CLASSES, f"{lever.name}: unknown class {address.cls!r}"
        assert address.when is None or address.when in bottlenecks.SITUATIONS, f"{lever.name}: {address.when!r}"
        assert address.rank is None or address.rank > 0
    assert lever.tune.partner is None or lever.tune.partner in NAMES
    assert lever.tune.data_path in (None, DEVICE_WORK, LOADER_QUEUE)
    assert set(lever.tune.per_value) <= set(lever.tune.values), f"{lever.name}: hints for values tune never tries"
    assert not (lever.tune.values and lever.tune.ladder), f"{lever.name}: searches both values and a ladder"
    for value in lever.tune.values:
        assert all(cls in bottlenecks.CLASSES for cls in lever.tune.hints_for(value).leads_for)
        assert all(kept in lever.tune.values for kept, _ in lever.tune.hints_for(value).covered_by)


def test_lever_names_are_unique():
    assert len(NAMES) == len(LEVERS)


def test_a_class_rule_ranks_its_levers_by_their_declared_ranks_and_situations():
    assert levers_for(bottlenecks.INPUT_PIPELINE, {bottlenecks.NO_WORKERS}) == [
        "workers", "persistent-workers", "prefetch-factor", "prefetcher-stream"]
    assert levers_for(bottlenecks.INPUT_PIPELINE, {bottlenecks.WITH_WORKERS, bottlenecks.CPU_AUGMENTATION}) == [
        "prefetch-factor", "persistent-workers", "workers", "prefetcher-stream", "augment-gpu", "augment-gpu-stream"]
    assert levers_for(bottlenecks.COMPUTE_BOUND, {bottlenecks.FULL_PRECISION, bottlenecks.CONVOLUTIONS}) == [
        "bf16", "tf32", "fp16", "channels-last", "cudnn-benchmark", "compile"]
    assert levers_for(bottlenecks.MEMORY_BANDWIDTH) == ["compile"]
    assert levers_for(bottlenecks.LAUNCH_OVERHEAD, {bottlenecks.TRAINING}) == [
        "compile", "fused-optimizer", "foreach-optimizer"]  # a step that syncs cannot be graphed
    assert levers_for(bottlenecks.COLLECTIVES, {bottlenecks.FSDP}) == [
        "fsdp-prefetch", "fsdp-no-reshard-last", "fsdp-bf16-reduce", "grad-accum", "fsdp-bf16-params", "fsdp-no-reshard",
        "fsdp-compile-blocks"]


def test_every_lever_a_rule_names_is_a_lever_addressing_that_class():
    for cls in bottlenecks.CLASSES:
        for name in levers_for(cls, bottlenecks.SITUATIONS):
            assert cls in next(lever for lever in LEVERS if lever.name == name).classes


def test_script_advice_and_lost_notes_come_from_the_declarations():
    assert levers_in_code(["cudnn-benchmark", "not-a-lever"]) == {
        "cudnn-benchmark": next(lever.in_code for lever in LEVERS if lever.name == "cudnn-benchmark")}
    assert set(levers_in_code(sorted(NAMES))) == NAMES
    assert left_when_lost("compile").startswith("torch.compile lost")
    assert left_when_lost("not-a-lever") == "not-a-lever lost: it does not address this cost"


def test_tune_reads_partners_from_the_declarations():
    assert ordering.partner_of("bf16") == "channels-last" and ordering.partner_of("tf32") is None
    assert ordering.partner_of("batch-size") is None


# The lists each rule named before the levers declared their ranks (perflab 0.x, diagnose/*.py): derived now, unchanged.
FULL, CONV, ATTN = bottlenecks.FULL_PRECISION, bottlenecks.CONVOLUTIONS, bottlenecks.ATTENTION
RULE_LISTS_BEFORE = [
    (bottlenecks.COMPUTE_BOUND, {FULL, CONV, ATTN},
     ["bf16", "tf32", "fp16", "channels-last", "cudnn-benchmark", "sdpa-flash", "compile"]),
    (bottlenecks.COMPUTE_BOUND, set(), ["compile"]),
    (bottlenecks.MEMORY_BANDWIDTH, {FULL, CONV}, ["compile", "channels-last", "cudnn-benchmark", "bf16", "fp16"]),
    (bottlenecks.ACTIVATION_MEMORY, {FULL}, ["activation-checkpointing", "bf16", "fp16"]),
    (bottlenecks.ACTIVATION_MEMORY, set(), ["activation-checkpointing"]),
    (bottlenecks.INPUT_PIPELINE, {bottlenecks.NO_WORKERS, bottlenecks.CPU_AUGMENTATION},
     ["workers", "persistent-workers", "prefetch-factor", "prefetcher-stream", "augment-gpu", "augment-gpu-stream"]),
    (bottlenecks.H2D_COPIES, {bottlenecks.PAGEABLE_COPIES}, ["pin-memory", "prefetcher-stream", "augment-gpu"]),
    (bottlenecks.H2D_COPIES, set(), ["prefetcher-stream", "augment-gpu"]),
    (bottlenecks.LAUNCH_OVERHEAD, {bottlenecks.NO_HOST_SYNCS, bottlenecks.TRAINING},
     ["cuda-graphs", "compile", "fused-optimizer", "foreach-optimizer"]),
    (bottlenecks.COLLECTIVES, {bottlenecks.DDP},
     ["ddp-bucket-size", "gradient-as-bucket-view", "static-graph", "grad-accum", "bf16-comm-hook",
      "no-broadcast-buffers"]),
    (bottlenecks.INFERENCE_QUEUE, set(), ["compile", "cuda-graphs"]),
]
DECODE_LISTS_BEFORE = [
    (bottlenecks.COMPUTE_BOUND, bottlenecks.DECODE_COMPUTE_BOUND, ["bf16", "fp8"]),
    (bottlenecks.MEMORY_BANDWIDTH, bottlenecks.DECODE_BANDWIDTH_BOUND,
     ["int8-weight", "int4-weight", "fp8", "speculative"]),
    (bottlenecks.MEMORY_BANDWIDTH, bottlenecks.DECODE_KERNEL_EFFICIENCY, ["int8-weight", "speculative"]),
    (bottlenecks.LAUNCH_OVERHEAD, bottlenecks.DECODE_LAUNCH_BOUND, ["kv-cache-static", "compile"]),
]


@pytest.mark.parametrize("cls, situations, before", RULE_LISTS_BEFORE)
def test_the_trace_rules_name_what_they_named_before(cls, situations, before):
    assert levers_for(cls, situations) == before


@pytest.mark.parametrize("cls, regime, before", DECODE_LISTS_BEFORE)
def test_the_decode_rule_names_what_it_named_before(cls, regime, before):
    assert levers_for(cls, {regime}, always=False) == before


def test_tune_tries_a_precision_only_above_the_current_one_as_the_levers_declare():
    from perflab.config import RunConfig
    before = {"fp32": 0, "tf32": 1, "bf16": 2, "fp16": 2}  # the table tune/ordering.py held before
    start = RunConfig(workload="mlp", device="cuda")
    for current, value in ((c, v) for c in before for v in before if c != v):
        best = start.replace(precision=current)
        refused = ordering.replaces_kept("precision", value, best, start) is not None
        assert refused == (before[value] <= before[current] or current != "fp32"), (current, value)


def test_the_levers_tune_screens_unasked_are_declared_once_each_with_its_own_place():
    from perflab.tune.screen_order import INSURANCE

    places = [lever.tune.screen_always for lever in all_levers() if lever.tune.screen_always is not None]
    assert len(places) == len(set(places)) == len(INSURANCE)
    assert INSURANCE == ("cuda-graphs", "bf16", "channels-last", "compile", "workers")
