"""tune.jsonl rows and tune.json, typed: written as the same keys, read back tolerating older files."""
import json

from perflab.report.tune import tune_report
from perflab.tune.decision import Decision
from perflab.tune.journal import Journal
from perflab.tune.rows import MemoryTrade, TrialRow
from perflab.tune.summary import ChainLink, TuneSummary

BENCHMARK_KEYS = ("start", "best", "speedup", "kept", "screened", "trials", "spent_s", "budget_s", "stop_reason")


def test_a_row_written_to_tune_jsonl_reads_back_as_the_same_row(tmp_path):
    row = TrialRow(index=3, key="run-abc", name="03-compile", kind="run", label="compile=default", dir="trials/03",
                   status="ok", wall_s=12.5, throughput=410.0, throughput_ci95=[400.0, 420.0], lever="compile",
                   stage="confirm", confirmation={"trials": 2, "full": False}, config={"workload": "mlp"},
                   trade=MemoryTrade(16, 32, 48, "conservative"),
                   decision=Decision(True, "accept", "faster", gain_pct=12.0, ci95_pct=[8.0, 16.0]))
    journal = Journal(tmp_path, resume=False)
    journal.append(row)
    line = json.loads((tmp_path / "tune.jsonl").read_text())
    assert line["decision"]["kept"] is True and line["trade"]["batch_tried"] == 48 and "extra" not in line
    assert Journal(tmp_path, resume=True).get("run-abc") == row


def test_a_row_from_an_older_tune_jsonl_loads_with_its_missing_keys_defaulted_and_unknown_keys_kept():
    old = {"index": 0, "key": "run-k", "name": "00-start", "kind": "run", "label": "start", "status": "ok",
           "wall_s": 3.0, "throughput": 100.0, "decision": {"kept": False, "verdict": "reject"}, "future_key": 7}
    row = TrialRow.from_dict(old)
    assert row.throughput == 100.0 and row.config == {} and row.stage is None and not row.kept and row.judged
    assert row.decision.why == "" and row.decision.reasons == []
    assert row.to_dict()["future_key"] == 7


def test_a_chain_link_says_what_its_trial_and_decision_say():
    row = TrialRow(name="02-bf16", label="bf16", lever="precision", status="ok", throughput=150.0,
                   decision=Decision(False, "no significant change", "inside the noise", judged=False))
    link = ChainLink.of(row)
    assert (link.label, link.figure("throughput"), link.kept, link.judged, link.why) == \
        ("bf16", 150.0, False, False, "inside the noise")
    assert "objective" not in link.to_dict()  # the max-qps keys only for a max-qps decision
    assert ChainLink.from_dict(link.to_dict()) == link


def test_tune_json_keeps_the_keys_the_benchmarks_read():
    record = TuneSummary().to_dict()
    assert all(key in record for key in BENCHMARK_KEYS)
    assert TuneSummary.from_dict(record) == TuneSummary()


def test_an_older_tune_json_with_only_some_keys_still_makes_a_report(tmp_path):
    # no objective, no screens, no recipe, no diagnoses: what an early tune.json held
    meta = {"start": {"name": "00-start", "label": "start", "throughput": 100.0},
            "best": {"name": "02-bf16", "label": "bf16", "throughput": 150.0}, "speedup": 1.5,
            "chain": [{"name": "02-bf16", "label": "bf16", "kept": True, "measured_gain_pct": 50.0,
                       "throughput": 150.0}],
            "kept": ["bf16"], "trials": 3, "spent_s": 20.0, "budget_s": 60.0, "stop_reason": "no lever won"}
    (tmp_path / "tune.json").write_text(json.dumps(meta))
    text = tune_report(tmp_path, tmp_path)
    assert "**100.0 → 150.0 samples/s** (1.50×)" in text
    assert "**kept**" in text and "stopped: no lever won" in text


def test_a_ctrl_c_while_a_row_is_being_synced_leaves_the_trial_known_to_the_tune(tmp_path, monkeypatch):
    # the line may already be visible to a reader when the interrupt lands: the tune that catches it must still find
    # the finished trial (its start) and write tune.json for it
    import pytest
    from perflab.tune import journal as journal_module
    journal = Journal(tmp_path, resume=False)
    row = TrialRow.from_dict({"key": "run-start", "name": "00-start", "status": "ok"})

    def interrupted(fileno):
        raise KeyboardInterrupt
    monkeypatch.setattr(journal_module.os, "fsync", interrupted)
    with pytest.raises(KeyboardInterrupt):
        journal.append(row)
    assert journal.get("run-start") is row
