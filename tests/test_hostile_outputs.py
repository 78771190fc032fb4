"""Nothing overwritten, nothing written elsewhere (issue 44): a command that derives files from a malformed input
refuses it in one line and leaves the good files as they were; output paths are fixed before user code can change
the working directory; the batch search stops at the dataset's length and says so; messages name the option the
user gave."""
from __future__ import annotations

import gzip
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from perflab.cli import main
from perflab.memory.search import BatchCeiling, Probe, batch_ceiling, find_largest_batch
from perflab.report import build

from tests.test_bad_inputs import COMMAND_ARGS, FAST, ROOT, refused
from tests.test_hostile_accepts import _saved_result
from tests.test_hostile_files import snapshot
from tests.test_out_folders import perflab_env

TRACES = ROOT / "tests" / "fixtures" / "traces" / "cpu"


@pytest.fixture
def diagnosed_run(tmp_path) -> Path:
    """A profiled run folder (recorded trace and result) with its good diagnosis.json written beside them."""
    directory = tmp_path / "run"
    directory.mkdir()
    with gzip.open(TRACES / "compute__big_matmul.json.gz", "rb") as stream:
        (directory / "trace.json").write_bytes(stream.read())
    shutil.copy(TRACES / "compute__big_matmul.result.json", directory / "result.json")
    assert main(["diagnose", str(directory)]) == 0
    return directory


@pytest.mark.parametrize("trace, says", [
    ({"traceEvents": 5}, "traceEvents is the number 5, expected a list of trace events"),
    ({"traceEvents": [1, "x"]}, "traceEvents[0] is the number 1, expected a trace event"),
    ({"traceEvents": [{"name": "step"}]}, "traceEvents[0] is an object with no ph (event phase)"),
    ({"traceEvents": [{"ph": "X", "cat": "cpu_op", "ts": "soon", "dur": 1}]},
     "trace event 1 has ts the string 'soon', expected a number"),
    ({"traceEvents": [{"ph": "X", "cat": "kernel", "ts": 1, "dur": 1, "args": [1]}]},
     "trace event 1 has args a list, expected an object"),
    ({"traceEvents": [{"ph": "X", "cat": 7, "ts": 1, "dur": 1}]}, "trace event 1 has cat the number 7"),
    ({"traceEvents": []}, "holds no trace events"),
])
def test_diagnose_refuses_a_malformed_trace_and_keeps_the_good_diagnosis(diagnosed_run, capsys, trace, says):
    (diagnosed_run / "trace.json").write_text(json.dumps(trace))
    before = snapshot(diagnosed_run)
    capsys.readouterr()
    line = refused(capsys, "diagnose", str(diagnosed_run))
    assert str(diagnosed_run / "trace.json") in line and says in line
    assert snapshot(diagnosed_run) == before


def test_report_keeps_the_old_report_when_building_the_new_one_fails(diagnosed_run, monkeypatch):
    assert main(["report", str(diagnosed_run)]) == 0
    before = snapshot(diagnosed_run)

    def broken(*args, **kwargs):
        raise RuntimeError("html failed")
    monkeypatch.setattr(build, "markdown_to_html", broken)
    with pytest.raises(RuntimeError):
        build.write_report(diagnosed_run)
    assert {path: data for path, data in snapshot(diagnosed_run).items() if path.suffix != ".png"} == \
        {path: data for path, data in before.items() if path.suffix != ".png"}


def test_rerun_into_the_original_folder_is_refused_and_keeps_it(tmp_path, capsys):
    original = _saved_result(tmp_path / "original", 100.0).parent
    before = snapshot(original)
    assert "already holds a perflab output (result.json)" in refused(capsys, "rerun", str(original), "--out",
                                                                     str(original))
    assert snapshot(original) == before


MOVING_PLUGIN = ("import os\nimport torch\nfrom torch.utils.data import TensorDataset\nimport perflab\n"
                 "def build(cfg):\n"
                 "    os.chdir('elsewhere')\n"
                 "    return perflab.Workload(name='mover', model=torch.nn.Linear(4, 2),\n"
                 "        dataset=TensorDataset(torch.randn(8, 4), torch.randn(8, 2)), loss_fn=torch.nn.MSELoss())\n")
MOVING_SCRIPT = ("import os\nimport torch\nos.chdir('elsewhere')\nmodel = torch.nn.Linear(4, 2)\n"
                 "for _ in range(16):\n    model(torch.randn(3, 4))\n")


@pytest.mark.parametrize("argv", [
    ["run", "--workload", "mover.py:build", "--device", "cpu", "--batch", "4", "--steps", "2", "--trials", "1",
     "--warmup", "0", "--out", "o/run"],
    ["profile", "--out", "o/run", "--", "python", "script.py"],
])
def test_user_code_that_changes_directory_does_not_move_perflabs_files(tmp_path, argv):
    (tmp_path / "mover.py").write_text(MOVING_PLUGIN)
    (tmp_path / "script.py").write_text(MOVING_SCRIPT)
    (tmp_path / "elsewhere").mkdir()
    finished = subprocess.run([sys.executable, "-m", "perflab", *argv], cwd=tmp_path, env=perflab_env(),
                              capture_output=True, text=True, timeout=120)
    assert finished.returncode == 0, finished.stderr
    saved = tmp_path / "o" / "run"
    assert (saved / "result.json").is_file() and not (saved / ".perflab.lock").exists()
    if argv[0] == "profile":
        assert (saved / "trace.json").is_file() and (saved / "diagnosis.json").is_file()
    assert list((tmp_path / "elsewhere").iterdir()) == []
    assert str(saved) in finished.stdout  # the folder it names is the folder it wrote


def test_the_batch_search_stops_at_the_dataset_and_says_it_is_the_limit():
    ran = []
    search = find_largest_batch(lambda batch: ran.append(batch) or Probe(batch, "ok", 1.0), start=8, known_fits=4,
                                ceiling=batch_ceiling(100))
    assert ran == [8, 16, 32, 64, 100]
    assert search.largest_fits == 100 and search.smallest_oom is None
    assert search.limited_by == "the dataset, 100 items"


def test_the_batch_search_never_starts_beyond_its_ceiling():
    ran = []
    search = find_largest_batch(lambda batch: ran.append(batch) or Probe(batch, "ok", 1.0), start=92_088_054_355,
                                ceiling=BatchCeiling())
    assert ran == [BatchCeiling().batch] and search.limited_by == BatchCeiling().reason


def test_a_batch_that_is_the_whole_dataset_needs_no_probe():
    search = find_largest_batch(lambda batch: pytest.fail("probed"), start=9, known_fits=8, ceiling=batch_ceiling(8))
    assert search.probes == [] and search.largest_fits == 8 and search.limited_by == "the dataset, 8 items"


SMALL_DATASET_PLUGIN = ("import torch\nfrom torch.utils.data import TensorDataset\nimport perflab\n"
                        "def build(cfg):\n"
                        "    return perflab.Workload(name='small', model=torch.nn.Linear(4, 2),\n"
                        "        dataset=TensorDataset(torch.randn(16, 4), torch.randn(16, 2)),"
                        " loss_fn=torch.nn.MSELoss())\n")


def test_find_max_batch_with_a_huge_limit_answers_the_dataset_length(tmp_path, capsys):
    plugin = tmp_path / "small.py"
    plugin.write_text(SMALL_DATASET_PLUGIN)
    out = tmp_path / "memory"
    assert main(["memory", "--workload", f"{plugin}:build", "--device", "cpu", "--batch", "4", "--find-max-batch",
                 "--memory-limit-mb", "1e9", "--out", str(out)]) == 0
    printed = " ".join(capsys.readouterr().out.split())
    assert "largest batch that fits (measured): 16 (limited by the dataset, 16 items, not by memory)" in printed
    search = json.loads((out / "memory.json").read_text())["search"]
    assert [probe["batch"] for probe in search["probes"]] == [16]
    assert search["largest_fits"] == 16 and search["limited_by"] == "the dataset, 16 items"
    assert "limited by the dataset, 16 items" in (out / "report.md").read_text()


def test_serve_names_the_batcher_option_when_the_batch_outgrows_the_dataset(capsys):
    line = refused(capsys, "serve", *COMMAND_ARGS["serve"], "--batcher-max-batch", "100000")
    assert "fewer than one batch of 100000; use --batcher-max-batch 4096 or less" in line


def test_resuming_a_copied_sweep_names_the_copy(tmp_path, capsys):
    original, copy = tmp_path / "sweep", tmp_path / "copy"
    assert main(["sweep", *FAST, "--out", str(original)]) == 0
    shutil.copytree(original, copy)
    capsys.readouterr()
    assert main(["sweep", "--resume", "--out", str(copy)]) == 0
    printed = " ".join(capsys.readouterr().out.split())
    assert f"--out {copy}" in printed and str(original) not in printed
    recorded = json.loads((copy / "sweep.json").read_text())["command"]
    assert recorded[-2:] == ["--out", str(copy)] and str(original) not in recorded
