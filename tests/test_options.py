"""The option table: every RunConfig option reaches argparse, validation and argv, from one declaration."""
from __future__ import annotations

import pytest

from perflab import options
from perflab.cli import build_parser
from perflab.config import RunConfig, numerics_fields, run_options
from perflab.errors import PerflabError
from perflab.levers import all_levers, cuda_only_levers


def sample_value(declared: options.Option):
    """A valid value different from the option's default."""
    if declared.key_value:
        return {"image_res": "32"}
    if declared.choices:
        return next(choice for choice in reversed(declared.choices) if choice != declared.default)
    if declared.switch:
        return not declared.default if declared.default is not None else True
    if declared.type is int:
        return int(declared.minimum or 0) + 3
    if declared.type is float:
        return 0.25
    return "x:1" if declared.name == "nsys" else "some/path"


def bad_value(declared: options.Option):
    if declared.choices:
        return "not-a-choice"
    if declared.type is int and declared.minimum is not None:
        return int(declared.minimum) - 1
    if declared.type is float and declared.above is not None:
        return declared.above
    return None


@pytest.mark.parametrize("declared", run_options(), ids=lambda o: o.name)
def test_every_option_reaches_argparse_of_each_command_that_takes_it(declared):
    parser = build_parser()
    for command in declared.commands:
        value = sample_value(declared)
        argv = RunConfig(**{declared.name: value}).to_argv(command) if declared.in_argv else \
            [declared.flag, str(value)]
        args = parser.parse_args([command, *argv])
        parsed = getattr(args, declared.name)
        if declared.key_value:
            assert options.key_values(parsed) == value
        elif command == "sweep" and declared.sweepable:
            assert options._list_values(declared, str(parsed)) == [value]
        else:
            assert parsed == value, (command, declared.flag)


@pytest.mark.parametrize("declared", run_options(), ids=lambda o: o.name)
def test_every_option_round_trips_through_argv(declared):
    if not declared.in_argv:
        pytest.skip(f"{declared.flag} is not part of a reproduced command line (it names where output goes)")
    cfg = RunConfig(**{declared.name: sample_value(declared)})
    args = build_parser().parse_args(["run", *cfg.to_argv("run")]) if "run" in declared.commands else None
    if args is None:
        pytest.skip(f"{declared.flag} is not a run option")
    rebuilt = RunConfig(**options.changes_from_args(RunConfig, args, "run"))
    assert rebuilt == cfg


@pytest.mark.parametrize("declared", [o for o in run_options() if bad_value(o) is not None], ids=lambda o: o.name)
def test_every_constrained_option_is_validated_with_its_flag_named(declared):
    with pytest.raises(PerflabError, match=declared.flag):
        RunConfig(**{declared.name: bad_value(declared)}).validate()


def test_wrongly_typed_values_from_python_are_refused_with_the_flag():
    with pytest.raises(PerflabError, match="--steps must be an integer"):
        RunConfig(steps="3").validate()
    with pytest.raises(PerflabError, match="--channels-last must be on/off"):
        RunConfig(channels_last="yes").validate()


def test_levers_take_flag_cuda_need_and_numerics_from_the_table():
    by_name = {lever.name: lever for lever in all_levers()}
    assert by_name["bf16"].flag == "--precision bf16" and by_name["workers"].flag == "--workers N"
    assert {"tf32", "fp16", "cuda-graphs", "sdpa-flash", "sdpa-efficient", "pin-memory"} <= cuda_only_levers()
    assert "bf16" not in cuda_only_levers()
    # compare's list of numerics-changing options includes the fused optimizer and SDPA backends
    assert {"precision", "compile", "channels_last", "cuda_graphs", "optimizer_impl", "sdpa"} <= set(numerics_fields())
    for lever in all_levers():
        assert lever.is_active(RunConfig(**{lever.option: lever.value if lever.value is not None
                                            else sample_value(lever.declared)})), lever.name
        assert not lever.is_active(RunConfig()), lever.name


def test_conflicts_and_modes_come_from_the_table():
    with pytest.raises(PerflabError, match="capture CUDA graphs themselves"):
        RunConfig(compile="max-autotune", cuda_graphs=True).validate()
    RunConfig(compile="default", cuda_graphs=True).validate()  # perflab captures the compiled step
    with pytest.raises(PerflabError, match="training runs"):
        RunConfig(mode="infer", optimizer_impl="fused").validate()
    assert RunConfig(augment="cpu", prefetcher="stream").validate()  # only gpu-stream conflicts


def test_sweep_parses_lists_and_none_for_unset_options():
    args = build_parser().parse_args(["sweep", "--batch", "4,8", "--compile", "none,default", "--channels-last",
                                      "on,off"])
    configs, swept = options.grid_from_args(RunConfig, args)
    assert swept == ["batch_size", "channels_last", "compile"]
    assert {(c.batch_size, c.compile, c.channels_last) for c in configs} == {
        (b, m, cl) for b in (4, 8) for m in (None, "default") for cl in (True, False)}


def test_options_outside_a_command_are_not_offered_to_it():
    sweep_help = build_parser().parse_args(["sweep"])
    assert not hasattr(sweep_help, "checkpoint_every") and not hasattr(sweep_help, "nsys")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["sweep", "--nsys"])


def test_argparse_rejects_an_ill_typed_value_in_one_line(capsys):
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["run", "--steps", "many"])
    assert exit_info.value.code == 2
    assert "--steps expects an integer, got 'many'" in capsys.readouterr().err


def test_option_declarations_are_single_sources():
    names = [o.name for o in run_options()]
    flags = [o.flag for o in run_options()]
    assert len(set(names)) == len(names) and len(set(flags)) == len(flags)
    with pytest.raises(KeyError):
        options.option_named(RunConfig, "no_such_option")


# ---------------------------------------------------------------------------------------------- the other tables

def test_profiler_options_come_from_one_table_for_the_parser_the_ranks_and_scripts():
    from perflab.cli._script import PROFILER_OPTIONS
    from perflab.cli.profile import capture_options_from_args
    from perflab.profile.capture import CaptureOptions, capture_argv

    capture = CaptureOptions(wait=0, warmup=1, active=4, record_shapes=False, with_stack=True, gzip=True)
    args = build_parser().parse_args(["profile", "--warmup", "7", *capture_argv(capture)])
    assert capture_options_from_args(args) == capture and args.warmup == 7  # --warmup-steps is not --warmup
    assert PROFILER_OPTIONS == {spelling for declared in options.options_of(CaptureOptions)
                                for spelling in declared.spellings}
    assert "--no-record-shapes" in PROFILER_OPTIONS


def test_the_judging_options_are_declared_once_for_compare_and_tune():
    from perflab.config import JudgeConfig
    from perflab.tune.settings import TuneConfig

    judging = {declared.flag: declared for declared in options.options_of(JudgeConfig)}
    assert set(judging) == {"--min-effect-pct", "--accept-noisy", "--fail-on-not-judged"}
    for command in ("compare", "tune"):
        assert all(command in declared.commands for declared in judging.values())
    assert {declared.flag: declared for declared in options.options_of(TuneConfig)
            if declared.flag in judging} == judging
    compare = build_parser().parse_args(["compare", "a", "b", "--min-effect-pct", "5", "--accept-noisy",
                                         "--fail-on-not-judged"])
    assert (compare.min_effect_pct, compare.accept_noisy, compare.fail_on_not_judged) == (5.0, True, True)


@pytest.mark.parametrize("command, old, new, dest", [
    (["sweep", "--auto-batch"], "--max-batch", "--max-auto-batch", "max_auto_batch"),
    (["serve"], "--max-batch", "--batcher-max-batch", "max_batch"),
    (["tune"], "--max-batch", "--batcher-max-batch", "max_batch"),
    (["compare", "a", "b"], "--min-effect", "--min-effect-pct", "min_effect_pct"),
])
def test_an_old_spelling_still_works_with_a_one_line_deprecation_note(command, old, new, dest, capsys):
    assert getattr(build_parser().parse_args([*command, new, "64"]), dest) == 64
    assert capsys.readouterr().err == ""
    assert getattr(build_parser().parse_args([*command, old, "64"]), dest) == 64
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and old in err and new in err and "deprecated" in err
