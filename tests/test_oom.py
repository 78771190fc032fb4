"""An out-of-memory anywhere is a result, never a traceback: one short block, exit code 3, result.json status oom.

The OOM is simulated on the CPU by a planted workload whose forward raises torch.OutOfMemoryError (with CUDA's
message) above a batch size; every command runs as a real `python -m perflab` process."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from perflab.config import RunConfig

from perflab.errors import EXIT_OUT_OF_MEMORY, OutOfMemoryFailure, is_out_of_memory
from perflab.oom import OutOfMemory

ROOT = Path(__file__).resolve().parents[1]
OOM_WORKLOAD = str(ROOT / "tests/planted/oom_over_batch.py") + ":build"
HEAVY = str(ROOT / "tests/planted/activation_heavy.py") + ":build"
FAST = ["--steps", "2", "--warmup", "1", "--trials", "1"]
BLOCK_HEADING = "most likely to make it fit"


def perflab(*args, cwd=None, env=None):
    env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    env.pop("PERFLAB_DEBUG", None)
    return subprocess.run([sys.executable, "-m", "perflab", *args], capture_output=True, text=True, env=env,
                          cwd=cwd or ROOT, timeout=300)


def assert_one_block(finished):
    text = finished.stdout + finished.stderr
    assert finished.returncode == EXIT_OUT_OF_MEMORY, text
    assert "Traceback" not in text
    assert text.count(BLOCK_HEADING) == 1
    assert "out of memory" in text and "tried to allocate 2.00 GiB" in text
    assert "allocated 70.52 GiB / reserved 77.52 GiB / total 79.19 GiB" in text


def assert_oom_result(folder: Path, batch: int):
    data = json.loads((folder / "result.json").read_text())
    assert data["status"] == "oom"
    record = data["out_of_memory"]
    assert record["batch_size"] == batch and record["tried_mb"] == pytest.approx(2048)
    assert record["total_mb"] == pytest.approx(79.19 * 1024)
    assert record["advice"]


def test_run_out_of_memory_prints_one_block_exits_3_and_records_it(tmp_path):
    out = tmp_path / "run"
    finished = perflab("run", "--workload", OOM_WORKLOAD, "--batch", "16", *FAST, "--out", str(out))
    assert_one_block(finished)
    assert "--batch 8" in finished.stderr
    assert_oom_result(out, 16)


def test_debug_still_shows_the_traceback(tmp_path):
    finished = perflab("run", "--workload", OOM_WORKLOAD, "--batch", "16", *FAST, "--out", str(tmp_path / "d"),
                       "--debug")
    assert finished.returncode == EXIT_OUT_OF_MEMORY
    assert "Traceback" in finished.stderr and "OutOfMemoryError" in finished.stderr
    # the tracebacks were let go of to free the step's memory; their text still names the frame that failed
    assert "oom_over_batch.py" in finished.stderr and "in forward" in finished.stderr
    assert "The above exception was the direct cause" in finished.stderr


def test_an_out_of_memory_lets_go_of_every_layers_input_before_the_breakdown_runs(monkeypatch):
    # torch's module call is a closure over its input, and a cleared frame still holds its function: while a
    # traceback of the failed step lived, every layer's input did (135 GiB of an H200's 139), and the breakdown at
    # half the batch ran out of memory too
    import gc

    from perflab import pipeline

    def batch_tensors() -> set[int]:
        gc.collect()
        return {id(o) for o in gc.get_objects() if type(o) is torch.Tensor and o.dim() == 2 and o.shape[0] == 64}
    before = batch_tensors()  # earlier tests' tensors of that shape: alive before this run, so their ids are taken
    seen: list[int] = []

    def count_batch_tensors(cfg, total_mb):
        seen.append(len(batch_tensors() - before))
        return []

    monkeypatch.setattr("perflab.memory.advice.advice_from_breakdown", count_batch_tensors)
    with pytest.raises(OutOfMemoryFailure):
        pipeline.run(None, RunConfig(workload=OOM_WORKLOAD, batch_size=64, device="cpu", trials=1, steps=2, warmup=1))
    assert seen == [0]


def test_profile_out_of_memory_is_a_result(tmp_path):
    out = tmp_path / "profile"
    assert_one_block(perflab("profile", "--workload", OOM_WORKLOAD, "--batch", "16", "--steps", "6", "--warmup", "1",
                             "--trials", "1", "--out", str(out)))
    assert_oom_result(out, 16)


def test_sweep_records_the_point_prints_its_block_and_exits_3(tmp_path):
    out = tmp_path / "sweep"
    finished = perflab("sweep", "--workload", OOM_WORKLOAD, "--batch", "4,16", *FAST, "--out", str(out))
    assert_one_block(finished)
    rows = [json.loads(line) for line in (out / "sweep.jsonl").read_text().splitlines()]
    assert [row["status"] for row in rows] == ["ok", "oom"]
    assert rows[1]["out_of_memory"]["batch_size"] == 16
    assert_oom_result(out / rows[1]["dir"], 16)


def test_serve_out_of_memory_is_a_result(tmp_path):
    out = tmp_path / "serve"
    finished = perflab("serve", "--workload", OOM_WORKLOAD, "--max-batch", "16", "--scenario", "offline",
                       "--out", str(out))
    assert_one_block(finished)
    assert json.loads((out / "result.json").read_text())["status"] == "oom"


def test_a_script_that_runs_out_of_memory_gets_the_block_and_exit_3(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("import torch\n"
                      "m = torch.nn.Linear(8, 8); opt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
                      "for step in range(20):\n"
                      "    m(torch.randn(4, 8)).sum().backward(); opt.step(); opt.zero_grad()\n"
                      "    if step == 12:\n"
                      "        raise torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 1.50 GiB.')\n")
    out = tmp_path / "script"
    finished = perflab("run", "--out", str(out), "--", "python", str(script))
    assert finished.returncode == EXIT_OUT_OF_MEMORY
    assert "Traceback" not in finished.stderr and "tried to allocate 1.50 GiB" in finished.stderr
    assert json.loads((out / "result.json").read_text())["status"] == "oom"


def test_the_record_parses_torchs_message_and_the_cpu_allocators():
    cuda = OutOfMemory.from_error(torch.OutOfMemoryError(
        "CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 79.19 GiB of which 5.06 MiB "
        "is free. Of the allocated memory 78.52 GiB is allocated by PyTorch, and 148.72 MiB is reserved by PyTorch "
        "but unallocated."), torch.device("cpu"))
    assert cuda.tried_mb == pytest.approx(20) and cuda.allocated_mb == pytest.approx(78.52 * 1024)
    assert cuda.reserved_mb == pytest.approx(78.52 * 1024 + 148.72)
    cpu_error = RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 1073741824 bytes.")
    assert is_out_of_memory(cpu_error)
    assert OutOfMemory.from_error(cpu_error, torch.device("cpu")).tried_mb == pytest.approx(1024)
    failure = cuda.failure()
    assert isinstance(failure, OutOfMemoryFailure) and is_out_of_memory(failure) and failure.exit_code == 3
    assert OutOfMemory.from_dict(failure.record) == cuda


def test_a_tune_trial_that_ran_out_of_memory_is_an_oom_outcome_with_the_records_summary(tmp_path):
    from perflab.pipeline import new_result
    from perflab.tune.trial import OOM, classify

    record = OutOfMemory.from_error(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB."),
                                    torch.device("cpu"))
    record.batch_size = 64
    new_result({"batch_size": 64}, torch.device("cpu"), {"name": "w"}, ["perflab", "run"], status="oom",
               status_reason=record.summary(), out_of_memory=record.to_dict()).save(tmp_path)
    outcome = classify(EXIT_OUT_OF_MEMORY, record.block(), tmp_path, 1.0)
    assert outcome.status == OOM and outcome.reason == record.summary()
    assert outcome.reason.startswith("out of memory at batch 64 allocating 2.00 GiB")


def test_scale_prints_the_block_of_the_point_that_did_not_fit_and_exits_3(tmp_path):
    finished = perflab("scale", "--workload", OOM_WORKLOAD, "--batch", "16", "--nproc", "1", *FAST,
                       "--out", str(tmp_path / "scale"))
    assert_one_block(finished)


def test_an_out_of_memory_in_a_rank_ends_the_run_with_exit_3(tmp_path):
    out = tmp_path / "ranks"
    finished = perflab("run", "--workload", OOM_WORKLOAD, "--batch", "16", "--nproc", "2", *FAST, "--out", str(out))
    assert finished.returncode == EXIT_OUT_OF_MEMORY and "Traceback" not in finished.stderr
    assert finished.stderr.count(BLOCK_HEADING) == 1
    assert json.loads((out / "result.json").read_text())["status"] == "oom"


def test_tune_whose_starting_point_does_not_fit_prints_its_block_and_exits_3(tmp_path):
    finished = perflab("tune", "--workload", OOM_WORKLOAD, "--batch", "16", "--budget", "60",
                       "--out", str(tmp_path / "tune"))
    assert_one_block(finished)
    assert "--batch 8" in finished.stderr


def test_a_profiled_script_that_runs_out_of_memory_gets_the_block_and_exit_3(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("import torch\n"
                      "m = torch.nn.Linear(8, 8)\n"
                      "for step in range(12):\n"
                      "    m(torch.randn(4, 8)).sum().backward()\n"
                      "    if step == 8:\n"
                      "        raise torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 1.50 GiB.')\n")
    finished = perflab("profile", "--out", str(tmp_path / "script"), "--", "python", str(script))
    assert finished.returncode == EXIT_OUT_OF_MEMORY, finished.stderr
    assert "Traceback" not in finished.stderr and "tried to allocate 1.50 GiB" in finished.stderr


def test_the_advice_comes_from_a_breakdown_at_half_the_batch_with_each_levers_predicted_peak(tmp_path):
    env_limit = {"PERFLAB_MEMORY_LIMIT_MB": "13"}  # the step at batch 1024 peaks near 17 MiB, at 512 near 9
    finished = perflab("memory", "--workload", HEAVY, "--batch", "1024", "--option", "size=128",
                       "--out", str(tmp_path / "memory"), env=env_limit)
    assert finished.returncode == EXIT_OUT_OF_MEMORY and "Traceback" not in finished.stderr, finished.stderr
    block = finished.stderr[finished.stderr.index("out of memory"):]
    assert "total 13.0 MiB" in block and "a smaller batch: --batch " in block
    smaller = int(block.split("a smaller batch: --batch ")[1].split()[0])
    assert 512 <= smaller < 1024
    assert "--activation-checkpointing: predicted peak at batch 1024" in block
    assert "--precision bf16: predicted peak at batch 1024" in block and "of 13 MiB (fits)" in block


def test_the_advice_ranks_levers_by_their_predicted_peak_and_keeps_generic_advice_when_it_cannot_explain():
    from perflab.memory.advice import rank_advice
    from perflab.memory.breakdown import Breakdown
    from perflab.memory.levers import LeverSaving

    half = Breakdown(workload="w", mode="train", device="cuda:0", batch_size=8, precision="fp32", peak_mb=500.0,
                     peak_source="test", categories_mb={"parameters": 100.0, "gradients": 0.0, "optimizer_state": 0.0,
                                                        "activations": 400.0, "inputs": 0.0, "temporaries": 0.0},
                     source="test")
    levers = [LeverSaving("bf16 autocast", "--precision bf16", 350.0, 150.0, 12, "", fixed_mb=100.0, per_sample_mb=30.0),
              LeverSaving("activation checkpointing", "--activation-checkpointing", 150.0, 350.0, 50, "",
                          fixed_mb=100.0, per_sample_mb=6.0),
              LeverSaving("gradients set to None", "zero_grad(set_to_none=True)", 500.0, 0.0, None, "")]
    cfg = RunConfig(batch_size=16)
    items = rank_advice(half, levers, 16, 800.0, cfg)  # as it is: 100 + 50 x 16 = 900 MiB > 800
    assert items[0].startswith("a smaller batch: --batch 14")
    assert items[1].startswith("--activation-checkpointing: predicted peak at batch 16 196 MiB of 800 MiB (fits)")
    assert items[2].startswith("--precision bf16: predicted peak at batch 16 580 MiB")
    assert rank_advice(half, levers, 16, 1000.0, cfg) == []  # 900 MiB fits in 1000: not what ran out


def test_cublas_failing_to_allocate_its_handle_on_a_full_device_is_an_out_of_memory():
    # seen on the H100: a memory probe at batch 866 of resnet50 ended in this, not in torch's OutOfMemoryError
    full = RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`")
    assert is_out_of_memory(full)
    assert not is_out_of_memory(RuntimeError("CUDA error: CUBLAS_STATUS_INVALID_VALUE when calling `cublasSgemm`"))


def test_the_advice_falls_back_to_a_quarter_of_the_batch_when_half_of_it_does_not_fit_either(tmp_path):
    # at 2048 the step peaks near 33 MiB and at 1024 near 17, over the 13 MiB limit; at 512 near 9 it fits
    finished = perflab("memory", "--workload", HEAVY, "--batch", "2048", "--option", "size=128",
                       "--out", str(tmp_path / "memory"), env={"PERFLAB_MEMORY_LIMIT_MB": "13"})
    assert finished.returncode == EXIT_OUT_OF_MEMORY and "Traceback" not in finished.stderr, finished.stderr
    block = finished.stderr[finished.stderr.index("out of memory"):]
    assert "--activation-checkpointing: predicted peak at batch 2048" in block, block
    smaller = int(block.split("a smaller batch: --batch ")[1].split()[0])
    assert 512 <= smaller < 1024


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run on the device machine: pytest -m cuda)")
def test_a_real_out_of_memory_on_the_gpu_gets_advice_from_a_breakdown_at_a_smaller_batch(tmp_path):
    # the activation-heavy MLP takes ~0.61 MiB a sample in fp32 (BENCHMARKS.md, issue 27): twice what fits. Before
    # free_after let go of the tracebacks, 135 GiB stayed allocated after the failure and the advice was generic
    total_mib = torch.cuda.get_device_properties(0).total_memory / 2**20
    batch = int(2 * total_mib / 0.61)
    finished = perflab("run", "--workload", HEAVY, "--batch", str(batch), "--device", "cuda", *FAST,
                       "--out", str(tmp_path / "run"))
    assert finished.returncode == EXIT_OUT_OF_MEMORY and "Traceback" not in finished.stderr, finished.stderr
    block = finished.stderr[finished.stderr.index("out of memory"):]
    assert "predicted peak" in block, block  # computed from the breakdown, not the generic advice
