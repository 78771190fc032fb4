"""tune --tune-batch trades memory for batch: once the batch runs out of memory, activation checkpointing with the
larger batch the memory model allows is tried as one candidate, kept only when it wins (fake trials; the out of
memory is a tiny transformer's real step measured against a fake memory limit)."""
import json

import pytest
import torch

from perflab.config import RunConfig
from perflab.memory.step import LIMIT_ENV, measure_step
from perflab.tune import tune
from perflab.tune.settings import TuneConfig
from perflab.tune.trial import OK, OOM, TrialOutcome
from test_tune import diagnosis_of, fake_result

LIMIT_MB = 20.0  # the tiny transformer's step peaks near 12 MiB at batch 8 and 22 MiB at 16; checkpointed, 15 at 32
TINY = {"seq_len": "64", "layers": "4", "dim": "64", "heads": "4", "vocab": "256"}
START = RunConfig(workload="transformer", mode="train", batch_size=4, steps=4, warmup=1, trials=3, device="cpu",
                  workload_options=TINY)


class LimitedTrials:
    """A run trial is out of memory when the real step's peak is over the fake limit; else its throughput is
    planted: batch 8 gains over 4, 12 gains nothing more, and a checkpointed step runs at `checkpointing_factor`."""

    def __init__(self, checkpointing_factor: float):
        self.checkpointing_factor = checkpointing_factor
        self.fits: dict[tuple[int, bool], bool] = {}
        self.runs: list[RunConfig] = []

    def fits_in_limit(self, cfg: RunConfig) -> bool:
        key = (cfg.batch_size, cfg.activation_checkpointing)
        if key not in self.fits:
            try:
                measure_step(cfg, limit_mb=LIMIT_MB, count_autocast=False)
                self.fits[key] = True
            except torch.OutOfMemoryError:
                self.fits[key] = False
        return self.fits[key]

    def throughput(self, cfg: RunConfig) -> float:
        samples_per_s = 100.0 * (1 + (min(cfg.batch_size, 8) - 4) / 8) if cfg.batch_size <= 12 else 100.0 * (1 + cfg.batch_size / 20)
        return samples_per_s * (self.checkpointing_factor if cfg.activation_checkpointing else 1.0)

    def __call__(self, cfg: RunConfig, kind: str, out, time_limit_s=None) -> TrialOutcome:
        out.mkdir(parents=True, exist_ok=True)
        if kind == "run":
            self.runs.append(cfg)
            if not self.fits_in_limit(cfg):
                return TrialOutcome(OOM, 1.0, reason="out of memory under the fake limit")
        fake_result(cfg, self.throughput(cfg)).save(out)
        if kind == "profile":
            (out / "trace.json").write_text("{}")
        from perflab.results import Result
        return TrialOutcome(OK, 1.0, result=Result.load(out))


@pytest.mark.parametrize("checkpointing_factor, kept", [(0.75, True), (0.3, False)])
def test_tune_batch_tries_checkpointing_with_the_larger_batch_it_allows_once_the_batch_runs_out_of_memory(
        tmp_path, monkeypatch, checkpointing_factor, kept):
    monkeypatch.setenv(LIMIT_ENV, str(LIMIT_MB))
    trials = LimitedTrials(checkpointing_factor)
    summary = tune(START, TuneConfig(budget="10m", tune_batch=True, exclude=["bf16", "compile", "channels-last"]),
                   tmp_path / "tune", runner=trials, cpu_count=2, screening=False,
                   diagnoser=lambda trace, result, lost: diagnosis_of(("compute bound", 0.9, [])))
    batch_links = [(link["label"], link["status"]) for link in summary["chain"] if link["lever"] == "batch-size"]
    assert ("batch-size=16", OOM) in batch_links  # the batch search met the fake limit
    largest_ran = max(cfg.batch_size for cfg in trials.runs if not cfg.activation_checkpointing
                      and trials.fits[(cfg.batch_size, False)])
    pairs = [link for link in summary["chain"] if link["label"].startswith("activation-checkpointing+batch-size=")]
    assert len(pairs) == 1
    pair = pairs[0]
    trade = pair["trade"]
    assert trade["batch_tried"] > trade["batch_out_of_memory"] > largest_ran - 1
    assert trade["batch_ran"] == 8 and trade["basis"].startswith("memory model")
    assert pair["status"] == OK and pair["kept"] is kept  # the checkpointed step fits the larger batch
    assert trade["verdict"] in summary["notes"][-1] or any(trade["verdict"] in note for note in summary["notes"])
    saved = json.loads((tmp_path / "tune" / "tune.json").read_text())
    assert saved["chain"][-1]["trade"]["verdict"] == trade["verdict"]
    if kept:
        assert summary["best"]["label"] == pair["label"] and pair["label"] in summary["kept"]
        assert "kept" in trade["verdict"] and pair["label"] in summary["stop_reason"]
    else:
        assert summary["best"]["label"] == "batch-size=8"
        assert "slower: recomputing the activations costs more than the larger batch gains" in trade["verdict"]
        assert "best: batch-size=8" in summary["stop_reason"]
