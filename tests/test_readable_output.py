"""What perflab prints reads whole at 80 columns (a piped output is 80 columns): every number of result.json in the
tables, never cut to "1,0…"; a generate run's report carries its generation figures; the quality gate shows that
it is running."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from rich.console import Console

from perflab.cli import main
from perflab.report.progress import RichReporter
from perflab.report.terminal import fmt
from perflab.report.tune_live import LiveTuneTable
from perflab.results import Result

ROOT = Path(__file__).resolve().parents[1]
MLP = ["--workload", "mlp", "--device", "cpu", "--warmup", "1", "--option", "hidden=16", "--option", "in_features=8"]


def perflab_at_80_columns(*argv: str, cwd: Path) -> str:
    """stdout of a real `perflab ...` process whose output is piped (80 columns, as rich sees a pipe)."""
    env = {**os.environ, "COLUMNS": "80", "PYTHONPATH": str(ROOT)}
    process = subprocess.run([sys.executable, "-m", "perflab", *argv], cwd=cwd, capture_output=True, text=True,
                             env=env, timeout=300)
    assert process.returncode == 0, process.stderr
    assert all(len(line) <= 80 for line in process.stdout.splitlines())
    assert "…" not in process.stdout.replace("… (", "")  # an ellipsis only where perflab writes one in a sentence
    return process.stdout


def test_a_sweep_at_80_columns_prints_every_points_figures_whole(tmp_path):
    out = perflab_at_80_columns("sweep", *MLP, "--batch", "4,8", "--steps", "2", "--trials", "1", "--precision",
                                "fp32,bf16", "--out", "s", cwd=tmp_path)
    rows = [json.loads(line) for line in (tmp_path / "s" / "sweep.jsonl").read_text().splitlines()]
    assert len(rows) == 4
    for row in rows:
        for key, digits in (("throughput", 1), ("p50_ms", 2), ("p95_ms", 2)):
            assert fmt(row[key], digits) in out, (key, fmt(row[key], digits))
        for value in row["params"].values():
            assert str(value) in out


def test_serve_at_80_columns_prints_every_points_figures_whole(tmp_path):
    out = perflab_at_80_columns("serve", *MLP, "--batcher-max-batch", "8", "--qps", "100,200", "--duration", "0.5",
                                "--min-queries", "40", "--out", "v", cwd=tmp_path)
    points = Result.load(tmp_path / "v").metrics.serve.points
    assert len(points) == 2
    table = out[out.index("perflab serve ·"):]  # the tables, after the lines printed as each point finished
    for point in points:
        latency = point.latency_ms
        for figure in (fmt(point.offered_qps, 0), fmt(point.achieved_qps, 0), fmt(latency["p50"], 2),
                       fmt(latency["p99"], 2), fmt(latency["p99.9"], 2), fmt(point.batch_mean)):
            assert figure in table, figure


def test_the_live_tune_table_at_80_columns_stacks_columns_rather_than_cut_a_number():
    console = Console(width=80, record=True, color_system=None, force_terminal=False)
    live = LiveTuneTable(console)
    rows = [{"name": f"t{i}", "kind": "candidate", "label": "--compile max-autotune --cuda-graphs --channels-last",
             "throughput": 67587.123 + i, "predicted_gain_pct": 12.0, "wall_s": 1034.0, "status": "ok",
             "decision": {"kept": i == 1, "verdict": "no significant change", "gain_pct": 601.25,
                          "ci95_pct": [590.0, 612.0], "quality": "pass"}} for i in range(3)]
    live.rows = [(row, False) for row in rows]
    console.print(live._render())
    text = console.export_text()
    assert all(len(line) <= 80 for line in text.splitlines())
    for figure in ("67,587.1", "67,588.1", "67,589.1", "+601.2%", "1,034", "+12%"):
        assert figure in text, figure


def test_a_generate_runs_report_has_ttft_tpot_tokens_per_second_and_the_bandwidth_bound(tmp_path, capsys):
    out = tmp_path / "g"
    assert main(["run", "--workload", "generate", "--mode", "infer", "--option", "size=tiny", "--device", "cpu",
                 "--steps", "2", "--warmup", "1", "--trials", "1", "--out", str(out)]) == 0
    assert main(["report", str(out)]) == 0
    generation = Result.load(out).metrics.generation
    for name in ("report.md", "report.html"):
        text = (out / name).read_text()
        assert f"TTFT p50 {fmt(generation.ttft_ms.p50, 2)} ms" in text, name
        assert f"TPOT p50 {fmt(generation.tpot_ms.p50, 3)} ms" in text, name
        assert f"{fmt(generation.output_tokens_per_s)} tokens/s" in text, name
        assert "bandwidth bound" in text, name


def test_the_quality_gate_prints_a_start_and_an_end_line_when_piped(tmp_path):
    out = perflab_at_80_columns("run", *MLP, "--batch", "8", "--steps", "2", "--trials", "1", "--check-quality",
                                "--out", "q", cwd=tmp_path)
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("quality gate: baseline vs candidate"))
    assert lines[start + 1].startswith("quality gate: done in ")


def test_the_quality_gate_shows_a_bar_with_its_time_on_a_terminal():
    console = Console(width=80, record=True, force_terminal=True, color_system=None)
    with RichReporter(console) as reporter, reporter.stage("quality gate: baseline vs candidate"):
        pass
    text = console.export_text()
    assert "quality gate: baseline vs candidate" in text and "0:00:0" in text
