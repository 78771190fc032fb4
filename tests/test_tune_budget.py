"""tune's promises on the CPU with real trial processes: the budget holds within 5% with a candidate that hangs, and
a compile candidate is compiled once (the quality gate reuses the timed run's compiled graph)."""
import json
import time
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import TensorDataset

from perflab.config import RunConfig
from perflab.report.build import write_report
from perflab.tune import TuneConfig, tune
from perflab.workloads import Workload

ROOT = Path(__file__).resolve().parents[1]
SLEEPY = str(ROOT / "tests/fixtures/sleepy_plugin.py") + ":build"
TINY = dict(steps=4, trials=3, warmup=1, device="cpu", quality_steps=2, batch_size=8)


def test_the_budget_holds_within_five_percent_when_a_candidate_hangs(tmp_path):
    # the compile candidate sleeps 10 minutes before its first step; every other lever is excluded, so the start and
    # its profile (the worker's start, then well under a second each, warm) come before it; it must be stopped at the
    # budget
    from perflab.levers import all_levers
    start = RunConfig(workload=SLEEPY, mode="train", workload_options={"sleep_s": "600"}, **TINY)
    budget_s = 15.0
    others = sorted({lever.name for lever in all_levers()} - {"compile"})
    began = time.perf_counter()
    summary = tune(start, TuneConfig(budget=f"{budget_s:g}s", exclude=others), tmp_path / "tune",
                   report=write_report)
    took_s = time.perf_counter() - began
    assert budget_s * 0.8 <= took_s <= budget_s * 1.05, (took_s, summary["stop_reason"])  # the hang ran to the end
    assert summary["spent_s"] <= budget_s * 1.05
    rows = [json.loads(line) for line in (tmp_path / "tune" / "tune.jsonl").read_text().splitlines()]
    compiled = [row for row in rows if (row.get("config") or {}).get("compile")]
    assert compiled and all(row["status"] == "timeout" for row in compiled), [(r["name"], r["status"]) for r in rows]
    assert summary["stop_reason"].startswith(("budget spent", "inconclusive: no lever won", "no lever won"))
    assert summary["best"]["label"] == "start"
    assert (tmp_path / "tune" / "report.html").is_file() and (tmp_path / "tune" / "recipe.txt").is_file()


class WithDropout(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 4))

    def forward(self, x):
        return self.net(x)


def test_a_compile_candidate_is_compiled_once_the_quality_gate_reuses_the_timed_runs_graph():
    from torch._dynamo.utils import counters

    from perflab.pipeline import run
    gen = torch.Generator().manual_seed(0)
    workload = Workload(name="dropout-net", model=WithDropout(), loss_fn=nn.CrossEntropyLoss(),
                        dataset=TensorDataset(torch.randn(64, 16, generator=gen), torch.randint(0, 4, (64,))),
                        is_classifier=True)
    torch._dynamo.reset()
    counters.clear()
    cfg = RunConfig(mode="infer", compile="default", check_quality=True, min_trial_s=0.0,
                    **{**TINY, "trials": 1, "warmup": 2})
    result = run(workload, cfg)
    assert result.quality.verdict == "pass"
    assert counters["stats"]["unique_graphs"] == 1  # the timed run's compilation, and no second one for the gate
