"""End-to-end: `perflab run` on real small workloads, its result.json, and its errors."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from perflab.cli import main

ROOT = Path(__file__).resolve().parents[1]
FAST = ["--steps", "3", "--warmup", "1", "--trials", "2"]


def run_cli(*args):
    return main(list(args))


def load(out):
    return json.loads((Path(out) / "result.json").read_text())


def test_run_mlp_writes_a_complete_result(tmp_path, capsys):
    out = tmp_path / "mlp"
    assert run_cli("run", "--workload", "mlp", "--batch", "16", *FAST, "--out", str(out)) == 0
    data = load(out)
    assert data["schema_version"] == 2
    assert data["config"]["workload"] == "mlp" and data["config"]["batch_size"] == 16
    assert data["config"]["device"] == "cpu"
    assert len(data["trials"]) == 2 and all(len(t["step_ms"]) == 3 for t in data["trials"])
    metrics = data["metrics"]
    assert metrics["throughput_samples_per_s"]["median"] > 0
    assert metrics["throughput_samples_per_s"]["n"] == 2
    assert {"p50", "p95", "p99"} <= set(metrics["latency_ms"])
    assert {"data_wait", "h2d", "forward", "backward", "optimizer"} <= set(metrics["phases_ms"])
    # mlp forward: 2 * (1024*512 + 512*10) FLOPs per sample; backward doubles it, except that no input
    # gradient is computed for the first layer (its input does not require grad).
    forward = 2 * (1024 * 512 + 512 * 10)
    backward = 2 * forward - 2 * 1024 * 512
    assert data["workload"]["flops_per_sample"] == pytest.approx(forward + backward)
    for key in ("python", "torch", "cpu_count", "hostname", "cuda_available"):
        assert key in data["environment"]
    assert "throughput" in capsys.readouterr().out


def test_infer_mode_has_only_forward_compute(tmp_path):
    out = tmp_path / "infer"
    assert run_cli("run", "--workload", "mlp", "--mode", "infer", *FAST, "--out", str(out)) == 0
    phases = load(out)["metrics"]["phases_ms"]
    assert "forward" in phases and "backward" not in phases and "optimizer" not in phases


def test_run_driving_at_tiny_size_decodes_camera_frames(tmp_path):
    out = tmp_path / "driving"
    assert run_cli("run", "--workload", "driving", "--batch", "2", "--option", "image_res=32", *FAST,
                   "--out", str(out)) == 0
    data = load(out)
    assert data["workload"]["info"]["cameras"] == 8
    assert data["workload"]["info"]["image_res"] == 32
    assert data["metrics"]["phases_ms"]["data_wait"] > 0


def test_user_workload_file_from_the_readme_runs(tmp_path):
    out = tmp_path / "user"
    assert run_cli("run", "--workload", str(ROOT / "examples" / "my_workload.py") + ":build", *FAST,
                   "--out", str(out)) == 0
    data = load(out)
    assert data["workload"]["name"] == "my-classifier"


def test_readme_shows_the_example_workload_verbatim():
    example = (ROOT / "examples" / "my_workload.py").read_text()
    assert example.strip() in (ROOT / "README.md").read_text()


def test_python_api_returns_a_result():
    import perflab
    result = perflab.run("mlp", perflab.RunConfig(batch_size=8, steps=2, warmup=0, trials=1))
    assert result.throughput > 0 and result.metrics.warmup_s == 0.0


@pytest.mark.parametrize("args, message", [
    (["--workload", "nope"], "unknown workload"),
    (["--workload", "missing_file.py:build"], "does not exist"),
    (["--workload", "mlp", "--batch", "0"], "--batch must be a positive integer"),
    (["--workload", "mlp", "--steps", "-3"], "--steps must be a positive integer"),
    (["--workload", "mlp", "--device", "cuda"], "no CUDA GPU"),
])
def test_bad_input_exits_2_with_one_line_and_leaves_no_run_dir(tmp_path, capsys, args, message):
    out = tmp_path / "run"
    assert run_cli("run", *FAST, *args, "--out", str(out)) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not out.exists()


def test_build_returning_wrong_type_exits_2(tmp_path, capsys):
    bad = tmp_path / "bad.py"
    bad.write_text("def build(cfg):\n    return 'a model'\n")
    assert run_cli("run", "--workload", f"{bad}:build", *FAST, "--out", str(tmp_path / "o")) == 2
    assert "expected a perflab.Workload" in capsys.readouterr().err


def test_unwritable_out_exits_2(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert run_cli("run", "--workload", "mlp", *FAST, "--out", str(blocker / "sub")) == 2
    assert "cannot write to --out" in capsys.readouterr().err


def test_console_script_prints_no_traceback_for_user_mistakes(tmp_path):
    done = subprocess.run([sys.executable, "-m", "perflab", "run", "--workload", "mlp", "--batch", "-1",
                           "--out", str(tmp_path / "o")], capture_output=True, text=True)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr and "--batch" in done.stderr


def test_workloads_and_env_commands_list_what_exists(capsys):
    assert run_cli("workloads") == 0
    listing = capsys.readouterr().out
    assert "driving" in listing and "resnet50" in listing and "mlp" in listing
    assert run_cli("env") == 0
    assert "torch" in capsys.readouterr().out


def test_calibrate_caches_ceilings_and_mfu_uses_them(tmp_path, capsys):
    assert run_cli("calibrate", "--device", "cpu", "--quick") == 0
    out = tmp_path / "mfu"
    assert run_cli("run", "--workload", "mlp", *FAST, "--out", str(out)) == 0
    flops = load(out)["metrics"]["flops"]
    assert flops["peak_source"].startswith("calibrated")
    assert flops["mfu_pct"] == pytest.approx(100 * flops["achieved_tflops"] / flops["peak_tflops"])
