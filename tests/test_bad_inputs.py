"""Every bad input is refused in one line on stderr and exit 2, with no traceback: numbers out of their declared range
(nan, inf, negatives, seeds numpy cannot take) on every command that takes them, plugins that exit or cannot train,
files that hold the wrong JSON, and paths the file system refuses."""
from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from perflab import options
from perflab.cli import build_parser, main
from perflab.config import JudgeConfig, RunConfig
from perflab.profile.capture import CaptureOptions
from perflab.serve.config import ServeConfig
from perflab.tune.settings import TuneConfig

ROOT = Path(__file__).resolve().parents[1]
# if a bad value were ever accepted, the command would run this (a second at most), not a default workload
FAST = ["--workload", "mlp", "--device", "cpu", "--batch", "2", "--steps", "1", "--warmup", "0", "--trials", "1",
        "--option", "hidden=4", "--option", "in_features=4"]
# what each command needs besides the bad option to reach its checks; memory and scale take the run and sweep options
COMMAND_ARGS = {"run": FAST, "profile": FAST, "sweep": FAST, "scale": [*FAST, "--nproc", "1"], "memory": FAST,
                "serve": [*FAST[:4], "--mode", "infer"], "tune": [*FAST, "--budget", "1s"], "compare": ["a", "b"]}
TAKEN_AS = {"run": ("run", "memory"), "sweep": ("sweep", "scale")}
TABLES = (RunConfig, JudgeConfig, ServeConfig, TuneConfig, CaptureOptions)


def bad_numbers(declared: options.Option) -> list[str]:
    """Values the declaration refuses: nan and inf for a float; below its lower bound; above its upper bound."""
    values = ["nan", "inf", "-inf"] if declared.type is float else ["1.5"]
    low = declared.above if declared.above is not None else declared.minimum
    if low is not None:
        values.append(str(int(low) - 1) if declared.type is int else str(low - 1))
    if declared.above is not None:
        values.append("0" if declared.type is int else str(float(declared.above)))
    if declared.maximum is not None:
        values.append(str(int(declared.maximum) + 1))
    return values


def number_cases() -> list:
    cases = []
    for table in TABLES:
        for declared in options.options_of(table):
            if declared.type not in (int, float):
                continue
            for command in declared.commands:
                for taken_by in TAKEN_AS.get(command, (command,)):
                    for value in bad_numbers(declared):
                        if taken_by == "scale" and declared.flag == "--nproc":
                            continue  # scale's --nproc is its list of rank counts (its own check below)
                        cases.append(pytest.param(taken_by, declared.flag, value,
                                                  id=f"{taken_by} {declared.flag} {value}"))
    return cases


def refused(capsys, *argv: str) -> str:
    """Run the CLI in this process; assert exit 2, one line on stderr and no traceback; return that line."""
    try:
        code = main(list(argv))
    except SystemExit as exit_info:
        code = exit_info.code
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip() and "is deprecated; use" not in line]
    assert code == 2, f"exit {code} for {argv}: {err}"
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("error: "), err
    return lines[0]


@pytest.mark.parametrize("command, flag, value", number_cases())
def test_every_number_option_of_every_command_refuses_values_outside_its_declaration(capsys, command, flag, value):
    line = refused(capsys, command, *COMMAND_ARGS[command], flag, value)
    assert flag in line


@pytest.mark.parametrize("argv, says", [
    (["run", "--seed", "4294967296"], "--seed must be from 0 to 4294967295"),
    (["sweep", "--seed", "0,4294967296"], "--seed must be from 0 to 4294967295"),
    (["scale", "--nproc", "1,2", "--seed", "-1"], "--seed must be from 0 to 4294967295"),
    (["serve", "--mode", "infer", "--sample-seed", "4294967296"], "--sample-seed must be from 0"),
    (["run", "--min-trial-s", "nan"], "--min-trial-s must be a finite number, 0 or more, got nan"),
    (["run", "--gpu-cost-per-hour", "inf"], "--gpu-cost-per-hour must be a positive finite number"),
    (["sweep", "--growth-pct", "nan"], "--growth-pct must be a finite number"),
    (["sweep", "--max-p95-ms", "-1"], "--max-p95-ms must be a positive number"),
    (["sweep", "--max-batch", "0"], "--max-auto-batch must be a positive integer"),
    (["sweep", "--min-trial-s", "1,nan"], "--min-trial-s must be a finite number"),
    (["compare", "--min-effect", "nan"], "--min-effect-pct must be a finite number"),
    (["compare", "--fail-on-regression", "inf"], "--fail-on-regression must be a finite number"),
    (["memory", "--fsdp-gpus", "0"], "--fsdp-gpus must be a positive integer"),
    (["memory", "--memory-limit-mb", "nan"], "--memory-limit-mb must be a positive finite number"),
    (["serve", "--mode", "infer", "--qps", "inf"], "--qps must be positive rates"),
    (["serve", "--mode", "infer", "--qps", "nan"], "--qps must be positive rates"),
    (["tune", "--budget", "0s"], "--budget must be more than zero"),
    (["run", "--batch", "many"], "--batch expects an integer, got 'many'"),
])
def test_bad_values_named_in_the_issue_are_one_line(capsys, argv, says):
    command, rest = argv[0], argv[1:]
    assert says in refused(capsys, command, *COMMAND_ARGS[command], *rest)


def test_a_model_with_no_parameters_cannot_train_and_is_told_to_infer(tmp_path, capsys):
    plugin = tmp_path / "relu.py"
    plugin.write_text("import torch\nfrom torch import nn\nfrom torch.utils.data import TensorDataset\nimport perflab\n"
                      "def build(cfg):\n    data = TensorDataset(torch.randn(8, 4), torch.randint(0, 4, (8,)))\n"
                      "    return perflab.Workload(name='relu', model=nn.ReLU(), dataset=data, "
                      "loss_fn=nn.CrossEntropyLoss())\n")
    line = refused(capsys, "run", "--workload", f"{plugin}:build", *FAST[2:], "--out", str(tmp_path / "o"))
    assert f"{plugin}:build" in line and "no" in line and "--mode infer" in line
    assert main(["run", "--workload", f"{plugin}:build", *FAST[2:], "--mode", "infer", "--out",
                 str(tmp_path / "i")]) == 0


def test_a_draft_whose_build_raises_shows_the_users_frames(tmp_path, capsys):
    draft = tmp_path / "draft.py"
    draft.write_text("def build_draft(cfg):\n    raise ValueError('no draft here')\n")
    code = main(["run", "--workload", "generate", "--mode", "infer", "--option", "size=tiny", "--device", "cpu",
                 "--batch", "1", "--steps", "1", "--warmup", "0", "--trials", "1", "--speculative", "2",
                 "--draft", f"{draft}:build_draft", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert f"running your {draft}:build_draft (build_draft(cfg)) raised ValueError: no draft here" in err
    assert f"{draft}:2 in build_draft" in err and "raise ValueError('no draft here')" in err


@pytest.mark.parametrize("name", ["result.json", "compare.json", "sweep.jsonl", "sweep.json", "tune.json",
                                  "memory.json"])
def test_report_on_a_record_holding_a_json_string_is_one_line(tmp_path, capsys, name):
    (tmp_path / name).write_text('"just a string"\n')
    if name == "sweep.json":
        (tmp_path / "sweep.jsonl").write_text("")
    assert str(tmp_path) in refused(capsys, "report", str(tmp_path))


def test_no_help_text_shows_a_doubled_percent_sign(capsys):
    parser = build_parser()
    commands = parser._subparsers._group_actions[0].choices  # every registered command
    for name, subparser in [("perflab", parser), *commands.items()]:
        text = subparser.format_help()
        assert "%%" not in text, f"{name} --help shows %%"
    assert "95% bootstrap" in " ".join(commands["compare"].format_help().split())


def perflab_process(*argv: str, cwd: Path, file_size_limit: int = 0) -> subprocess.CompletedProcess:
    def limit_file_size() -> None:  # as a full disk: a write past the limit fails (EFBIG) rather than kill
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (file_size_limit, file_size_limit))
    env_path = {"PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "perflab", *argv], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env={**os.environ, **env_path},
                          preexec_fn=limit_file_size if file_size_limit else None)


def assert_one_line(process: subprocess.CompletedProcess, code: int = 2) -> str:
    lines = [line for line in process.stderr.splitlines() if line.strip()]
    assert process.returncode == code, process.stderr
    assert "Traceback" not in process.stderr
    return "\n".join(lines)


def test_a_plugin_whose_build_calls_sys_exit_is_an_error_naming_it(tmp_path):
    (tmp_path / "quits.py").write_text("import sys\ndef build(cfg):\n    sys.exit(0)\n")
    process = perflab_process("run", "--workload", "quits.py:build", *FAST[2:], "--out", "o", cwd=tmp_path)
    err = assert_one_line(process)
    assert "running your quits.py:build (build(cfg)) raised SystemExit: 0" in err
    assert "quits.py:3 in build" in err and not (tmp_path / "o").exists()


def test_an_out_path_too_long_for_the_file_system_is_one_line(tmp_path):
    too_long = "x" * 300
    process = perflab_process("run", *FAST, "--out", too_long, cwd=tmp_path)
    err = assert_one_line(process)
    assert len(err.splitlines()) == 1 and too_long in err and "File name too long" in err


def test_a_full_disk_while_profile_writes_its_trace_is_one_line_and_keeps_the_earlier_run(tmp_path):
    first = perflab_process("profile", *FAST, "--steps", "6", "--out", "p", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    earlier = (tmp_path / "p" / "result.json").read_text()
    process = perflab_process("profile", *FAST, "--steps", "6", "--out", "p", "--overwrite", cwd=tmp_path,
                              file_size_limit=20_000)
    err = assert_one_line(process)
    assert len(err.splitlines()) == 1
    assert f"cannot write the trace to {tmp_path / 'p' / 'trace.json'}: File too large" in err  # resolved once
    assert (tmp_path / "p" / "result.json").read_text() == earlier
